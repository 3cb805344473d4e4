// The variables exported to every rank, in a fixed order so that the printed command is
// reproducible: TNT_LAUNCHER=1, the runtime options given as flags, every TNT_* variable
// of the launcher's environment, then the -x pairs. A flag beats the same TNT_* variable
// inherited from the environment; -x beats an inherited one too.
#pragma once

#include "cli.hpp"
#include "environment.hpp"

#include <string>
#include <utility>
#include <vector>

namespace tnt::launcher {

using EnvVar = std::pair<std::string, std::string>;

std::vector<EnvVar> rank_exports(const Options& options, const Environment& env);

}  // namespace tnt::launcher
