// subtokenizer: encodes text into subtoken ids, or decodes ids into text, with a vocabulary
// file in TensorFlow's subtokenizer format. One line in, one line out.
#include "tool_main.hpp"

#include <tarantella/text/subtokenizer.hpp>

#include <charconv>
#include <iostream>
#include <string>

namespace {

// A line of ids: integers separated by spaces or tabs.
std::vector<int64_t> parse_ids(const std::string& line, int64_t line_no, int64_t vocab_size) {
  std::vector<int64_t> ids;
  size_t i = 0;
  while (i < line.size()) {
    if (line[i] == ' ' || line[i] == '\t' || line[i] == '\r') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
    int64_t v = 0;
    auto [end, ec] = std::from_chars(line.data() + i, line.data() + j, v);
    if (ec != std::errc() || end != line.data() + j)
      TNT_INPUT_ERROR("stdin line {}: \"{}\" is not a subtoken id (a non-negative integer)", line_no,
                      line.substr(i, j - i));
    if (v < 0 || v >= vocab_size)
      TNT_INPUT_ERROR("stdin line {}: id {} is outside the vocabulary's [0, {})", line_no, v, vocab_size);
    ids.push_back(v);
    i = j;
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string tool = "subtokenizer";
  cxxopts::Options cli(tool, tnt_tools::help_text(
      "Encodes text (UTF-8, one sentence per line) into subtoken ids, or decodes ids into text, with a\n"
      "vocabulary file in TensorFlow's subtokenizer format (e.g. vocab.ende.32768). Reads stdin, writes\n"
      "stdout, one output line per input line. Encoded lines are ids separated by spaces; decoding stops\n"
      "at the first EOS id (1) of a line, as the Transformer does with its translations.",
      {"echo 'Hello world!' | build/bin/subtokenizer --vocab_file=data/vocab.ende.32768 encode",
       "build/bin/subtokenizer --vocab_file=V --add_eos encode < newstest2014.en > ids.txt",
       "build/bin/subtokenizer --vocab_file=V decode < ids.txt"}));
  // clang-format off
  std::map<std::string, tnt_models::FlagKind> kinds;
  tnt_models::FlagAdder(cli.add_options(), kinds)
    ("vocab_file", "vocabulary file (one 'subtoken' per line)", cxxopts::value<std::string>())
    ("add_eos", "encode: end every line with the EOS id 1", cxxopts::value<bool>()->default_value("false"))
    ("keep_eos", "decode: decode the whole line, EOS and what follows included", cxxopts::value<bool>()->default_value("false"))
    ("mode", "encode or decode", cxxopts::value<std::string>());
  // clang-format on
  cli.parse_positional({"mode"});
  cli.positional_help("encode|decode");
  cxxopts::ParseResult args;
  if (auto status = tnt_tools::parse(tool, cli, kinds, argc, argv, args)) return *status;
  if (!args.count("vocab_file")) return tnt_tools::usage_error(tool, "--vocab_file is required");
  if (!args.count("mode")) return tnt_tools::usage_error(tool, "say encode or decode");
  if (!args.unmatched().empty()) return tnt_tools::usage_error(tool, "unexpected argument '" + args.unmatched()[0] + "'");
  std::string mode = args["mode"].as<std::string>();
  if (mode != "encode" && mode != "decode")
    return tnt_tools::usage_error(tool, "mode '" + mode + "': must be encode or decode");
  // A flag of the other mode would be ignored: said, as it would be in another order.
  if (mode == "decode" && args["add_eos"].as<bool>()) return tnt_tools::usage_error(tool, "--add_eos is for encode, not decode");
  if (mode == "encode" && args["keep_eos"].as<bool>()) return tnt_tools::usage_error(tool, "--keep_eos is for decode, not encode");

  return tnt_tools::run(tool, [&] {
    std::ios::sync_with_stdio(false);
    tnt::Subtokenizer sub = tnt::Subtokenizer::from_file(args["vocab_file"].as<std::string>());
    bool add_eos = args["add_eos"].as<bool>();
    bool keep_eos = args["keep_eos"].as<bool>();
    std::string line, out;
    int64_t line_no = 0;
    while (std::getline(std::cin, line)) {
      ++line_no;
      out.clear();
      if (mode == "encode") {
        std::vector<int64_t> ids;
        try {
          ids = sub.encode(line, add_eos);
        } catch (const tnt::InputError& e) {
          TNT_INPUT_ERROR("stdin line {}: {}", line_no, e.what());
        }
        for (size_t i = 0; i < ids.size(); ++i) {
          if (i) out += ' ';
          out += std::to_string(ids[i]);
        }
      } else {
        std::vector<int64_t> ids = parse_ids(line, line_no, sub.vocab_size());
        out = sub.decode(keep_eos ? ids : tnt::trim_at_eos(ids));
      }
      out += '\n';
      std::cout << out;
    }
    std::cout.flush();
    if (!std::cout) TNT_INPUT_ERROR("cannot write to stdout");
  });
}
