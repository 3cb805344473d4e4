// Hostfiles (`host`, `host slots=N`, `host:N`, comments) and -H lists.
#include "fuzz_input.hpp"
#include "error.hpp"
#include "hostfile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tnt::launcher;
  std::string_view text = tnt::fuzz::as_text(data, size);
  try {
    HostList list = parse_hostfile(text, "fuzz-hostfile");
    for (const HostEntry& h : list.hosts) {
      if (h.name.empty()) __builtin_trap();                 // an accepted host has a name
      if (h.slots && *h.slots <= 0) __builtin_trap();       // and positive slots
    }
  } catch (const InputError&) {
  }
  try {
    (void)parse_host_list(text);
  } catch (const InputError&) {
  }
  return 0;
}
