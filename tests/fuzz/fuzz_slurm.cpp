// SLURM's compressed node lists ("node[01-04,07],gpu5") and task counts ("4(x2),2").
// The input's first line is a node list, the rest a task count.
#include "fuzz_input.hpp"
#include "slurm.hpp"

#include "error.hpp"

// The launcher's bound is 200,000 nodes; inputs within it made lists that large (985 MB at
// peak, 133 executions a second). The same code with a bound of 1,000 explores the same
// paths, including the refusals at the bound, at full speed.
constexpr size_t kFuzzMaxNodes = 1000;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tnt::launcher;
  std::string_view text = tnt::fuzz::as_text(data, size);
  size_t nl = text.find('\n');
  std::string_view nodes = text.substr(0, nl);
  std::string_view tasks = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
  try {
    for (const std::string& n : expand_nodelist(nodes, kFuzzMaxNodes))
      if (n.empty()) __builtin_trap();
  } catch (const InputError&) {
  }
  try {
    for (int t : parse_tasks_per_node(tasks, "SLURM_TASKS_PER_NODE", kFuzzMaxNodes))
      if (t <= 0) __builtin_trap();
  } catch (const InputError&) {
  }
  return 0;
}
