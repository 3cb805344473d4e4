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

#include "common/flags.hpp"

#include <tarantella/check.hpp>

#include <exception>
#include <functional>
#include <iostream>
#include <map>
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
// `kinds`: each flag's kind, as the programs' FlagAdder records them (the tools add their
// flags through it): a bad value is named as in the programs ("--train_shards=abc:
// expected a whole number"), not as cxxopts does ("Argument 'abc' failed to parse"), and
// what cxxopts would read otherwise than the programs (0x10 as 16) is refused.
inline std::optional<int> parse(const std::string& tool, cxxopts::Options& cli,
                                 std::map<std::string, tnt_models::FlagKind>& kinds, int argc, char** argv,
                                 cxxopts::ParseResult& args) {
  tnt_models::FlagAdder(cli.add_options(), kinds)("h,help", "this help");
  std::string error = tnt_models::first_flag_problem(kinds, argc, argv);
  if (error.empty()) {
    try {
      args = cli.parse(argc, argv);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!error.empty()) {
    std::cerr << (tool + ": " + error + " (see --help)\n") << std::flush;  // one write
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
