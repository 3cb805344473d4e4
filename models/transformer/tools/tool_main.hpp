// What the text tools share: --help text with examples, parsing, and the exit statuses
// (0 done, 1 bad input such as a missing or malformed file, 2 a command line that does not
// parse). The tools are single-process programs; they do not start MPI.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include <cxxopts.hpp>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <tarantella/check.hpp>

#include <exception>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace tnt_tools {

inline constexpr int kExitBadInput = 1;
inline constexpr int kExitBadCommandLine = 2;

inline std::string help_text(const std::string& summary, const std::vector<std::string>& examples) {
  std::string text = summary + "\n\nExamples:\n";
  for (const auto& e : examples) text += "  " + e + "\n";
  return text;
}

// Parses; returns an exit status when the tool should end here (--help, a bad command line).
inline std::optional<int> parse(const std::string& tool, cxxopts::Options& cli, int argc, char** argv,
                                 cxxopts::ParseResult& args) {
  cli.add_options()("h,help", "this help");
  try {
    args = cli.parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << (tool + ": " + e.what() + " (see --help)\n") << std::flush;  // one write
    return kExitBadCommandLine;
  }
  if (args.count("help")) {
    std::cout << cli.help() << "\n";
    return 0;
  }
  return std::nullopt;
}

// A bad command line found after parsing (a missing flag, a bad value).
inline int usage_error(const std::string& tool, const std::string& what) {
  std::cerr << (tool + ": " + what + " (see --help)\n") << std::flush;  // one write
  return kExitBadCommandLine;
}

// Runs body; an InputError (or any other error) becomes "<tool>: error: ..." and exit 1.
inline int run(const std::string& tool, const std::function<void()>& body) {
  try {
    body();
    return 0;
  } catch (const tnt::InputError& e) {
    std::cerr << tool << ": error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << tool << ": internal error: " << e.what() << "\n";
    return kExitBadInput;
  }
}

}  // namespace tnt_tools
