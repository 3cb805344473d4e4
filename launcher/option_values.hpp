// The values of the launcher's options that need more than a number: ranks per node, the
// log level, -x KEY=VALUE. Each throws InputError naming the option and a valid value.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace tnt::launcher {

int parse_ranks_per_node(const std::string& flag, const std::string& text);
std::string normalize_log_level(const std::string& text);  // DEBUG|INFO|WARNING|ERROR (WARN too)
bool valid_env_name(std::string_view name);
std::pair<std::string, std::string> parse_export(const std::string& text);  // -x KEY=VALUE

}  // namespace tnt::launcher
