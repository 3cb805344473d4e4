#include "comm/collective_scope.hpp"

#include "tarantella/check.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

namespace tnt::detail {

namespace {
thread_local const char* t_label = nullptr;
thread_local const SomeRanksRegion* t_region = nullptr;

void erase_all(std::string& text, const std::string& part) {
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at)) text.erase(at, part.size());
}
}  // namespace

CollectiveLabel::CollectiveLabel(const char* what) : previous_(t_label) {
  refuse_collective_here(what);
  t_label = what;
}

CollectiveLabel::~CollectiveLabel() { t_label = previous_; }

SomeRanksRegion::SomeRanksRegion(const std::string& where, const char* runs_on)
    : previous_(t_region), where_(where), runs_on_(runs_on) {
  t_region = this;
}

SomeRanksRegion::~SomeRanksRegion() { t_region = previous_; }

const char* current_collective_label() { return t_label; }

bool inside_some_ranks_region() { return t_region != nullptr; }

void refuse_collective_here(const std::string& call) {
  if (t_region == nullptr) return;
  TNT_INPUT_ERROR("{} is a collective (every rank must call it), but it was called from {}, which runs on {}: the "
                  "other ranks would wait for it until TNT_COLLECTIVE_TIMEOUT. Construct the callback with "
                  "Callback::Ranks::all, or call {} on every rank outside it",
                  call, t_region->where_, t_region->runs_on_, call);
}

void refuse_replica_change_here(const std::string& call) {
  if (t_region == nullptr) return;
  TNT_INPUT_ERROR("{} changes what every rank's replica must have alike, but it was called from {}, which runs on "
                  "{}: the ranks would train on with different values and their weights drift apart. Construct the "
                  "callback with Callback::Ranks::all (or use a LearningRateSchedule)",
                  call, t_region->where_, t_region->runs_on_);
}

std::string readable_type_name(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string name = status == 0 && demangled ? demangled.get() : mangled;
  erase_all(name, "(anonymous namespace)::");
  if (name.rfind("tnt::", 0) == 0) name.erase(0, 5);
  return name;
}

}  // namespace tnt::detail
