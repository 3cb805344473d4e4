// A snapshot of the environment as a value, so that planning is a pure function of its
// inputs and tests can hand in any SLURM_* / TNT_* combination without touching the
// process environment.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace tnt::launcher {

using Environment = std::map<std::string, std::string>;

Environment current_environment();

// gethostname(): the name the launcher plans with and ranks report under.
std::string this_host_name();

// The cores this process may run on (its affinity mask), or 0 when unknown.
long usable_cores();

inline std::optional<std::string> lookup(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

}  // namespace tnt::launcher
