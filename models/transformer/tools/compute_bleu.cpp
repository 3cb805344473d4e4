// compute_bleu: BLEU of a translation against a reference, uncased and cased, as the
// TensorFlow Transformer tutorial reports it (tarantella/text/bleu.hpp has the rules).
#include "tool_main.hpp"

#include <tarantella/text/bleu.hpp>

#include <fmt/format.h>

int main(int argc, char** argv) {
  const std::string tool = "compute_bleu";
  cxxopts::Options cli(tool, tnt_tools::help_text(
      "Prints the BLEU score of a translation file against a reference file (one sentence per line,\n"
      "UTF-8), uncased and cased, computed as TensorFlow's official Transformer does (its\n"
      "compute_bleu.py: mteval-v14 tokenization, 4-grams, brevity penalty), on a 0-100 scale.",
      {"build/bin/compute_bleu --reference=newstest2014.de --translation=model/translations.txt"}));
  // clang-format off
  std::map<std::string, tnt_models::FlagKind> kinds;
  tnt_models::FlagAdder(cli.add_options(), kinds)
    ("reference", "reference file", cxxopts::value<std::string>())
    ("translation", "translation file (the same number of lines)", cxxopts::value<std::string>());
  // clang-format on
  cxxopts::ParseResult args;
  if (auto status = tnt_tools::parse(tool, cli, kinds, argc, argv, args)) return *status;
  // A stray word first: "compute_bleu ref.de out.de" is files given without their flags.
  if (!args.unmatched().empty()) {
    return tnt_tools::usage_error(tool, "unexpected argument '" + args.unmatched()[0] +
                                            "': give the files as --reference=FILE --translation=FILE");
  }
  if (!args.count("reference")) return tnt_tools::usage_error(tool, "--reference is required");
  if (!args.count("translation")) return tnt_tools::usage_error(tool, "--translation is required");
  return tnt_tools::run(tool, [&] {
    tnt::BleuScores s = tnt::bleu_on_files(args["reference"].as<std::string>(), args["translation"].as<std::string>());
    fmt::print("Bleu score (uncased): {}\nBleu score (cased): {}\n", tnt::format_bleu(s.uncased),
               tnt::format_bleu(s.cased));
  });
}
