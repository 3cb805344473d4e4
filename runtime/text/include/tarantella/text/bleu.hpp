// BLEU as TensorFlow's official Transformer reports it (its compute_bleu.py, whose n-gram
// part is the tensor2tensor bleu_hook), so that scores compare with the tutorial's:
//
//   lines     the whole file, stripped of leading and trailing whitespace, split into lines
//             at Python's line boundaries (\n, \r\n, \r, \v, \f, \x1c-\x1e, \x85, U+2028,
//             U+2029); both files must then have the same number of lines
//   uncased   both sides lower-cased (Python's str.lower())
//   tokenize  spaces around a punctuation character (Unicode P*) unless a decimal digit is
//             on the side that rule looks at (a preceding non-digit, then a following
//             non-digit: "1,000.5" stays whole), spaces around every symbol (S*), split at
//             whitespace (the mteval-v14 rules)
//   score     one reference per line, n-grams of order 1..4, clipped counts summed over the
//             corpus; an order with matches has precision m/n; an order with n-grams but no
//             match has 1/(2^k n) for its k-th such order; an order with no n-gram at all has
//             precision 0 and drops out of the log sum, which is still divided by 4; brevity
//             penalty exp(1 - r/c) when the translation is shorter (c < r), 0 when it is
//             empty; rounded to float32 (the reference returns np.float32), then times 100
//             in double (what NumPy 1 makes of np.float32 * 100, and what it prints).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tnt {

struct BleuScores {
  double uncased = 0.0;  // 0-100
  double cased = 0.0;
};

// The tokens of one line (UTF-8), before any lower-casing.
std::vector<std::string> bleu_tokenize(std::string_view line);

// Corpus BLEU in [0, 1] of tokenized sentences (references[i] is translations[i]'s single
// reference), as the double the reference computes before rounding to float32.
double compute_bleu(const std::vector<std::vector<std::string>>& references,
                    const std::vector<std::vector<std::string>>& translations, int max_order = 4,
                    bool use_brevity_penalty = true);

// The reference's BLEU of two lists of lines: lower-cased unless case_sensitive, tokenized,
// scored, rounded to float32, x100. Throws InputError when the counts differ.
double bleu_on_lines(const std::vector<std::string>& reference_lines,
                    const std::vector<std::string>& translation_lines, bool case_sensitive);

// A file's lines as the reference reads them (see above). Errors name the file (and the
// line of invalid UTF-8).
std::vector<std::string> read_bleu_lines(const std::string& path);

// Both scores for two files; errors name the files and their line counts.
BleuScores bleu_on_files(const std::string& reference_path, const std::string& translation_path);

// A score as the reference prints it (Python's repr of a float: the shortest digits that
// read back as the same double, at least one decimal), e.g. "27.31987237930298".
std::string format_bleu(double score);

}  // namespace tnt
