// Shell word rules, both ways: --mpi-args "..." is split the way a shell would split it,
// and the command printed by --dry-run is quoted so that pasting it into a shell runs
// exactly what the launcher runs.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tnt::launcher {

// Whitespace separates words; '...' is literal, "..." allows \" \\ \$ \`, and a backslash
// outside quotes escapes the next character. Throws InputError on an unclosed quote.
std::vector<std::string> split_shell_words(std::string_view text);

std::string shell_quote(std::string_view word);
std::string shell_join(const std::vector<std::string>& words);

}  // namespace tnt::launcher
