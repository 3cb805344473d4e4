// Dataset::from_csv (the format and the rules are in tarantella/dataset.hpp). The file is
// read whole and split into records by a small RFC 4180 state machine that counts physical
// lines, so every error can name the line a record starts on; the selected columns are then
// parsed into one (N, F) feature tensor and one label tensor, and the dataset is
// from_tensors over them.
#include "tarantella/check.hpp"
#include "tarantella/files.hpp"
#include "tarantella/dataset.hpp"

#include <cerrno>
#include <cfloat>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string_view>

namespace tnt {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in = open_text_file(path, "CSV file");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) TNT_INPUT_ERROR("CSV file '{}': read error", path);
  return text;
}

struct Record {
  std::vector<std::string> fields;
  int64_t line = 0;  // 1-based physical line the record starts on
};

// Splits the text into records. A quoted field may span lines; `line_` counts every line
// break, so a record's number is its first physical line, as an editor shows it.
class RecordReader {
 public:
  RecordReader(const std::string& path, const std::string& text, char delimiter, char comment)
      : path_(path), text_(text), delimiter_(delimiter), comment_(comment) {}

  // The next record, or false at the end of the text.
  bool next(Record& record) {
    skip_blank_and_comment_lines();
    if (pos_ >= text_.size()) return false;
    record.fields.clear();
    record.line = line_;
    for (;;) {
      record.fields.push_back(field(record));
      if (pos_ >= text_.size()) return true;
      const char c = text_[pos_];
      if (c == delimiter_) {
        ++pos_;
        continue;
      }
      end_of_line();  // field() stops only at a delimiter, a line end or the end
      return true;
    }
  }

 private:
  [[noreturn]] void fail(int64_t line, size_t column, const std::string& what) const {
    TNT_INPUT_ERROR("CSV file '{}', line {}, column {}: {}", path_, line, column, what);
  }

  // LF, CRLF, or a CR that ends the text.
  bool at_line_end() const {
    if (pos_ >= text_.size()) return false;
    if (text_[pos_] == '\n') return true;
    return text_[pos_] == '\r' && (pos_ + 1 == text_.size() || text_[pos_ + 1] == '\n');
  }

  void end_of_line() {
    if (text_[pos_] == '\r') ++pos_;
    if (pos_ < text_.size()) ++pos_;  // '\n'
    ++line_;
  }

  // Lines that hold only spaces, tabs and CR, and lines that start with the comment
  // character, between records.
  void skip_blank_and_comment_lines() {
    while (pos_ < text_.size()) {
      size_t end = text_.find('\n', pos_);
      if (end == std::string::npos) end = text_.size();
      const std::string_view line(text_.data() + pos_, end - pos_);
      const bool blank = line.find_first_not_of(" \t\r") == std::string_view::npos;
      const bool comment = comment_ != '\0' && !line.empty() && line[0] == comment_;
      if (!blank && !comment) return;
      pos_ = end < text_.size() ? end + 1 : end;
      if (end < text_.size()) ++line_;
    }
  }

  std::string field(const Record& record) {
    const size_t column = record.fields.size();
    std::string out;
    if (pos_ < text_.size() && text_[pos_] == '"') {
      const int64_t opened = line_;
      ++pos_;
      for (;;) {
        if (pos_ >= text_.size()) fail(opened, column, "a quoted field is never closed");
        const char c = text_[pos_++];
        if (c == '"') {
          if (pos_ < text_.size() && text_[pos_] == '"') {  // "" stands for one quote
            out.push_back('"');
            ++pos_;
            continue;
          }
          break;
        }
        if (c == '\n') ++line_;
        out.push_back(c);
      }
      if (pos_ < text_.size() && text_[pos_] != delimiter_ && !at_line_end()) {
        fail(line_, column, fmt::format("'{}' after the closing quote of a field (expected the delimiter '{}' or "
                                        "the end of the line)",
                                        text_[pos_], delimiter_));
      }
      return out;
    }
    while (pos_ < text_.size() && text_[pos_] != delimiter_ && !at_line_end()) {
      if (text_[pos_] == '"') fail(line_, column, "a quote inside a field that does not start with one");
      out.push_back(text_[pos_++]);
    }
    return out;
  }

  const std::string& path_;
  const std::string& text_;
  char delimiter_;
  char comment_;
  size_t pos_ = 0;
  int64_t line_ = 1;
};

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

// The columns of the file: their names (from the header) and count.
struct Columns {
  std::vector<std::string> names;  // empty without a header
  size_t count = 0;
  int64_t defined_on = 0;  // the line of the record that fixed the count

  std::string describe(size_t c) const {
    return names.empty() ? fmt::format("{}", c) : fmt::format("{} ('{}')", c, names[c]);
  }
};

class CsvParser {
 public:
  CsvParser(const std::string& path, const Dataset::CsvOptions& options) : path_(path), options_(options) {}

  Dataset parse() {
    TNT_INPUT_CHECK(options_.label_dtype == DType::i32 || options_.label_dtype == DType::f32,
                    "CSV file '{}': label_dtype must be i32 or f32, got {}", path_, dtype_name(options_.label_dtype));
    TNT_INPUT_CHECK(options_.delimiter != '"' && options_.delimiter != '\n' && options_.delimiter != '\r',
                    "CSV file '{}': the delimiter cannot be a quote or a line break", path_);
    const std::string text = read_text(path_);
    // Classic Mac line ends (a bare CR, no LF anywhere): one line to this reader, which would
    // report a header without rows, or one of many columns.
    const size_t cr = text.find('\r');
    TNT_INPUT_CHECK(cr == std::string::npos || cr + 1 == text.size() || text.find('\n') != std::string::npos,
                    "CSV file '{}': its lines end in a bare CR (classic Mac OS); lines end in LF or CRLF here: "
                    "convert it (e.g. tr '\\r' '\\n')",
                    path_);
    RecordReader reader(path_, text, options_.delimiter, options_.comment);
    Record record;
    if (!reader.next(record)) TNT_INPUT_ERROR("CSV file '{}': empty (no header and no data rows)", path_);
    columns_.count = record.fields.size();
    columns_.defined_on = record.line;
    bool have_row = !options_.header;
    if (options_.header) columns_.names = record.fields;
    select_columns();
    int64_t rows = 0;
    while (have_row || reader.next(record)) {
      have_row = false;
      add_row(record);
      ++rows;
    }
    if (rows == 0) TNT_INPUT_ERROR("CSV file '{}': a header (line {}) but no data rows", path_, columns_.defined_on);
    return make_dataset(rows);
  }

 private:
  [[noreturn]] void fail(int64_t line, size_t column, const std::string& what) const {
    TNT_INPUT_ERROR("CSV file '{}', line {}, column {}: {}", path_, line, columns_.describe(column), what);
  }

  size_t resolve(const Dataset::CsvColumn& c, const char* role) const {
    if (c.name.empty()) {
      TNT_INPUT_CHECK(c.index >= 0 && static_cast<size_t>(c.index) < columns_.count,
                      "CSV file '{}': {} column index {} is out of range: line {} has {} columns (0 to {})", path_,
                      role, c.index, columns_.defined_on, columns_.count, columns_.count - 1);
      return static_cast<size_t>(c.index);
    }
    TNT_INPUT_CHECK(options_.header, "CSV file '{}': {} column '{}' is chosen by name, but the options say the file "
                    "has no header (header = false): choose it by index", path_, role, c.name);
    std::vector<size_t> found;
    for (size_t i = 0; i < columns_.names.size(); ++i)
      if (columns_.names[i] == c.name) found.push_back(i);
    if (found.empty()) {
      TNT_INPUT_ERROR("CSV file '{}': no {} column '{}' in the header (line {}), which has: {}", path_, role, c.name,
                      columns_.defined_on, fmt::join(columns_.names, ", "));
    }
    TNT_INPUT_CHECK(found.size() == 1, "CSV file '{}': {} column '{}' is ambiguous: the header (line {}) names "
                    "columns {} and {} so (0-based); choose one by index", path_, role, c.name, columns_.defined_on,
                    found[0], found[1]);
    return found[0];
  }

  void select_columns() {
    std::map<size_t, std::string> taken;  // column -> its role, to refuse choosing one twice
    auto take = [&](size_t c, const char* role) {
      auto [it, fresh] = taken.emplace(c, role);
      TNT_INPUT_CHECK(fresh, "CSV file '{}': column {} is chosen twice (as a {} and as a {})", path_,
                      columns_.describe(c), it->second, role);
      return c;
    };
    for (const auto& c : options_.labels) labels_.push_back(take(resolve(c, "label"), "label"));
    for (const auto& c : options_.features) features_.push_back(take(resolve(c, "feature"), "feature"));
    if (options_.features.empty()) {
      for (size_t c = 0; c < columns_.count; ++c)
        if (!taken.count(c)) features_.push_back(c);
    }
    TNT_INPUT_CHECK(!features_.empty(), "CSV file '{}': no feature column (every one of the {} columns is a label)",
                    path_, columns_.count);
  }

  void add_row(const Record& r) {
    if (r.fields.size() != columns_.count) {
      TNT_INPUT_ERROR("CSV file '{}', line {}: {} fields, expected {} (as on line {})", path_, r.line,
                      r.fields.size(), columns_.count, columns_.defined_on);
    }
    for (size_t c : features_) features_data_.push_back(parse_float(r, c));
    for (size_t c : labels_) {
      if (options_.label_dtype == DType::i32) {
        i32_labels_.push_back(parse_i32(r, c));
      } else {
        f32_labels_.push_back(parse_float(r, c));
      }
    }
  }

  // The number in field c, or an error naming the problem. Parsed in double (a decimal
  // that underflows f32 becomes 0 or a denormal, as when the file was written).
  double parse_number(const Record& r, size_t c) const {
    std::string_view s = trim(r.fields[c]);
    if (s.empty()) fail(r.line, c, "the field is empty (a missing value)");
    const std::string_view shown = s;
    if (s.front() == '+') s.remove_prefix(1);
    double v = 0;
    const std::from_chars_result res = std::from_chars(s.data(), s.data() + s.size(), v);
    if (res.ec == std::errc::invalid_argument || res.ptr != s.data() + s.size()) {
      fail(r.line, c, fmt::format("'{}' is not a number", shown));
    }
    // Out of range: too large for a double, or so small that it is 0 (not an error).
    // from_chars leaves v alone then; strtod tells the two apart (HUGE_VAL or ~0).
    if (res.ec == std::errc::result_out_of_range) {
      v = std::strtod(std::string(s).c_str(), nullptr);
      if (std::fabs(v) > 1.0) fail(r.line, c, fmt::format("'{}' is outside the f64 range", shown));
    }
    if (!std::isfinite(v)) fail(r.line, c, fmt::format("'{}' is not a finite number", shown));
    return v;
  }

  float parse_float(const Record& r, size_t c) const {
    const double v = parse_number(r, c);
    if (std::fabs(v) > static_cast<double>(FLT_MAX)) {
      fail(r.line, c, fmt::format("'{}' is outside the f32 range", trim(r.fields[c])));
    }
    return static_cast<float>(v);
  }

  int32_t parse_i32(const Record& r, size_t c) const {
    const double v = parse_number(r, c);
    if (v != std::floor(v)) fail(r.line, c, fmt::format("label '{}' is not an integer", trim(r.fields[c])));
    if (v < static_cast<double>(INT32_MIN) || v > static_cast<double>(INT32_MAX)) {
      fail(r.line, c, fmt::format("label '{}' is outside the i32 range [{}, {}]", trim(r.fields[c]), INT32_MIN,
                                  INT32_MAX));
    }
    return static_cast<int32_t>(v);
  }

  Dataset make_dataset(int64_t rows) const {
    const int64_t f = static_cast<int64_t>(features_.size()), l = static_cast<int64_t>(labels_.size());
    std::vector<Tensor> columns{Tensor::from_vector(features_data_, {rows, f})};  // (N, F)
    if (l == 0) return Dataset::from_tensors(std::move(columns));
    const Shape label_shape = l == 1 ? Shape{rows} : Shape{rows, l};  // (N) or (N, L)
    if (options_.label_dtype == DType::i32) {
      columns.push_back(Tensor::from_data(i32_labels_.data(), label_shape));
    } else {
      columns.push_back(Tensor::from_vector(f32_labels_, label_shape));
    }
    return Dataset::from_tensors(std::move(columns));
  }

  const std::string& path_;
  const Dataset::CsvOptions& options_;
  Columns columns_;
  std::vector<size_t> features_, labels_;  // selected columns, in the order asked for
  std::vector<float> features_data_;       // (N, F)
  std::vector<int32_t> i32_labels_;        // (N, L)
  std::vector<float> f32_labels_;          // (N, L)
};

}  // namespace

Dataset Dataset::from_csv(const std::string& path) { return from_csv(path, CsvOptions{}); }

Dataset Dataset::from_csv(const std::string& path, const CsvOptions& options) {
  return CsvParser(path, options).parse();
}

}  // namespace tnt
