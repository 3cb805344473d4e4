// Subword text encoding in the format of TensorFlow's official Transformer (its
// "subtokenizer" and the vocab.ende.32768 files that data_download.py writes).
//
// Vocabulary file: one subtoken per line in single quotes, UTF-8, e.g.
//     '<pad>'       id 0 (PAD)    the reserved tokens come first, wherever the file has them
//     '<EOS>'       id 1 (EOS)
//     'the_'        '_' ends a word (a token, see below)
//     'ing'         no '_': the middle of a word
//     '\u'  '\\'  '\233;'   escapes: '_' in the text, '\' in the text, and a character
//                  outside the vocabulary's alphabet (its decimal code point)
//
// Encoding a line:
//  1. Split it into tokens, runs of alphanumeric characters (Unicode categories L* and N*)
//     and runs of the rest; a token that is a single space between two others is dropped
//     (decoding puts it back between two alphanumeric tokens).
//  2. Escape each token: '\' -> "\\", '_' -> "\u", a character that appears in no
//     subtoken (or '\n') -> "\<code point>;"; then append '_'.
//  3. Cut the escaped token greedily into the longest subtokens of the vocabulary,
//     left to right.
// Decoding concatenates the subtokens, splits at '_', unescapes each piece and joins them,
// with a space only between two tokens that both start with an alphanumeric character.
// So decode(encode(s)) == s for any text s made of whole tokens (every line of text is).
//
// Vocabulary building (build_vocabulary) follows the same reference: count the tokens of a
// sample of each file, then, for a given min_count, 4 rounds of "split every token with the
// current subtokens, count every substring that starts at a subtoken boundary, keep those
// counted at least min_count times (longest first, discounting their prefixes), order by
// count"; min_count is found by binary search in [1, 1000] for the list closest to the
// target size (within a threshold). Same input, same vocabulary, id for id.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tnt {

inline constexpr int64_t kPadId = 0;
inline constexpr int64_t kEosId = 1;
inline constexpr const char* kPadToken = "<pad>";
inline constexpr const char* kEosToken = "<EOS>";

// encode and decode are const and use no shared state: safe on several threads at once.
class Subtokenizer {
 public:
  // subtokens: UTF-8, escaped as in a vocabulary file but without the quotes. "<pad>" and
  // "<EOS>" are moved to ids 0 and 1 (and dropped where else they appear), as when reading
  // a file. Throws InputError for an empty subtoken, invalid UTF-8 or a duplicate.
  explicit Subtokenizer(const std::vector<std::string>& subtokens);
  // Reads a vocabulary file. Errors name the file and line: a line that is not a quoted
  // subtoken, invalid UTF-8, a duplicate.
  static Subtokenizer from_file(const std::string& path);

  // text: UTF-8 (InputError naming the byte otherwise). add_eos appends kEosId. Throws
  // InputError when a character cannot be written with this vocabulary (the escape
  // characters \ u ; 0-9 are missing from it), which no generated vocabulary does.
  std::vector<int64_t> encode(std::string_view text, bool add_eos = false) const;
  // Ids outside [0, vocab_size()) are skipped (as the reference does), except that a
  // negative id is an InputError. PAD and EOS decode to "<pad>" and "<EOS>"; see
  // trim_at_eos for model output.
  std::string decode(const std::vector<int64_t>& ids) const;

  int64_t vocab_size() const { return static_cast<int64_t>(subtokens_.size()); }
  const std::string& subtoken(int64_t id) const;          // as in the file, unquoted
  const std::vector<std::string>& subtokens() const { return subtokens_; }
  // One quoted subtoken per line; written to a temporary and renamed into place.
  void save(const std::string& path) const;

 private:
  std::vector<std::string> subtokens_;  // UTF-8
  std::vector<std::u32string> subtokens32_;
  std::unordered_map<std::u32string, int64_t> ids_;
  std::unordered_set<char32_t> alphabet_;  // every character of every subtoken
  size_t max_subtoken_length_ = 0;   // in code points
};

// The ids before the first EOS (all of them when there is none), as the reference does
// before decoding a translation.
std::vector<int64_t> trim_at_eos(const std::vector<int64_t>& ids);

// ---- the pieces of the algorithm, public for tests and tools (UTF-8 in and out)
// Python's str.strip(): Unicode whitespace removed at both ends (how the reference reads
// each line of text). InputError for invalid UTF-8.
std::string strip_whitespace(std::string_view text);
std::vector<std::string> split_to_tokens(std::string_view text);
std::string join_tokens(const std::vector<std::string>& tokens);
// alphabet: the characters allowed unescaped (UTF-8 string of them); '\n' never is.
std::string escape_token(std::string_view token, std::string_view alphabet);
// "\u" -> '_', "\\" -> '\', "\N;" -> code point N (U+3013 when N is not a valid scalar
// value); anything else is kept as it is.
std::string unescape_token(std::string_view escaped);

// ---- building a vocabulary
struct VocabularyOptions {
  int64_t target_size = 32768;  // data_download.py's 32768 ...
  int64_t threshold = 327;      // ... accepted within 327
  int64_t min_count = 0;        // > 0: use this min_count; 0: binary search for target_size
  double file_byte_limit = 1e6; // characters sampled per file (spread over the file)
  int iterations = 4;
};

// Token counts of a sample of each file, as the reference samples: it skips
// int(file bytes / (2 * limit)) lines between the lines it reads, strips each read line
// and stops once the stripped lines exceed the limit (in characters). Errors name the file
// and line.
std::unordered_map<std::string, int64_t> count_tokens(const std::vector<std::string>& files,
                                                      double file_byte_limit = 1e6);

// The subtoken list (reserved tokens first) for these token counts. log, when given,
// receives one line per step of the search ("min_count=6: 8123 subtokens").
std::vector<std::string> build_vocabulary(const std::unordered_map<std::string, int64_t>& token_counts,
                                          const VocabularyOptions& options = {},
                                          std::vector<std::string>* log = nullptr);

}  // namespace tnt
