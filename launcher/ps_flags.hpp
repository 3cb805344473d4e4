// The parameter-server flags as the command line gives them (ps_plan.hpp turns them into
// roles once the launch plan exists). Apart from ps_plan.hpp so that the command line's
// parser does not depend on the plan, which depends on the parsed options.
#pragma once

#include <string>
#include <vector>

namespace tnt::launcher {

// --parameter-servers' value: an integer >= 1. Throws InputError naming the flag.
int parse_parameter_servers(const std::string& text);
// --ps-hosts' value: comma-separated host names, none empty or repeated. Throws InputError.
std::vector<std::string> parse_ps_hosts(const std::string& text);

}  // namespace tnt::launcher
