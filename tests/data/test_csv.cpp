// Dataset::from_csv: good files (header or not, columns by name and index, quoting, comments,
// blank lines, CRLF, i32 and f32 labels) read back element by element, and bad files, each
// an InputError naming the file, the line and the column.
#include "temp_dir.hpp"

#include "tarantella/check.hpp"
#include "tarantella/dataset.hpp"

#include <cmath>
#include <functional>
#include <string>

using namespace tnt;

namespace {

std::string write_csv(const test::TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.file(name);
  test::write_bytes(path, test::Bytes(text.begin(), text.end()));
  return path;
}

std::vector<Element> elements(const Dataset& d) {
  std::vector<Element> out;
  auto it = d.iterate(0);
  while (auto e = it.next()) out.push_back(*e);
  return out;
}

std::string input_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("no InputError");
  return "";
}

}  // namespace

TEST_CASE("csv: header, features and a label by name, i32 labels", "[csv]") {
  test::TempDir dir;
  const std::string path = write_csv(dir, "iris.csv",
                                     "sepal,petal,species,note\n"
                                     "5.1,1.4,0,first\n"
                                     "  -4.9 , +0.25 ,2,text is not read\n"
                                     "1e-3,3,1.0,x\n");
  Dataset::CsvOptions o;
  o.features = {"petal", "sepal"};  // in the order asked for, not the file's
  o.labels = {"species"};
  const Dataset d = Dataset::from_csv(path, o);
  CHECK(d.cardinality() == 3);
  const std::vector<Element> e = elements(d);
  REQUIRE(e.size() == 3);
  REQUIRE(e[0].size() == 2);
  CHECK(e[0][0].shape() == Shape{2});
  CHECK(e[0][0].dtype() == DType::f32);
  CHECK(e[0][1].shape() == Shape{});
  CHECK(e[0][1].dtype() == DType::i32);
  CHECK(e[0][0].to_vector() == std::vector<float>{1.4f, 5.1f});
  CHECK(e[1][0].to_vector() == std::vector<float>{0.25f, -4.9f});
  CHECK(e[2][0].to_vector() == std::vector<float>{3.0f, 1e-3f});
  CHECK(e[0][1].data<int32_t>()[0] == 0);
  CHECK(e[1][1].data<int32_t>()[0] == 2);
  CHECK(e[2][1].data<int32_t>()[0] == 1);  // "1.0" is the integer 1
}

TEST_CASE("csv: a UTF-8 byte-order mark at the start is not part of the first column", "[csv]") {
  // Excel's "CSV UTF-8" and Windows editors write one; before, the first header was
  // "\xEF\xBB\xBFa" (refused as "no label column 'a'" while the message showed 'a'), and
  // without a header the first number did not read.
  test::TempDir dir;
  Dataset::CsvOptions by_name;
  by_name.features = {"b"};
  by_name.labels = {"a"};
  const std::vector<Element> e = elements(Dataset::from_csv(write_csv(dir, "bom.csv", "\xEF\xBB\xBF" "a,b\n1,2.5\n"), by_name));
  REQUIRE(e.size() == 1);
  CHECK(e[0][0].to_vector() == std::vector<float>{2.5f});
  CHECK(e[0][1].data<int32_t>()[0] == 1);
  Dataset::CsvOptions no_header;
  no_header.header = false;
  const std::vector<Element> f = elements(Dataset::from_csv(write_csv(dir, "bom2.csv", "\xEF\xBB\xBF" "1,2\n"), no_header));
  REQUIRE(f.size() == 1);
  CHECK(f[0][0].to_vector() == std::vector<float>{1.0f, 2.0f});
  // Only at the start: elsewhere it is a field's content (and not a number).
  CHECK_THAT(input_error([&] { Dataset::from_csv(write_csv(dir, "bom3.csv", "1,2\n\xEF\xBB\xBF" "3,4\n"), no_header); }),
             Catch::Contains("line 2, column 0"));
}

TEST_CASE("csv: no header, columns by index, several f32 labels, defaults", "[csv]") {
  test::TempDir dir;
  const std::string path = write_csv(dir, "plain.csv", "1,2,3,4\n5,6,7,8\n");
  Dataset::CsvOptions o;
  o.header = false;
  o.labels = {3, 0};
  o.label_dtype = DType::f32;
  const std::vector<Element> e = elements(Dataset::from_csv(path, o));
  REQUIRE(e.size() == 2);
  // features: every column that is not a label, in file order
  CHECK(e[1][0].to_vector() == std::vector<float>{6, 7});
  CHECK(e[1][1].shape() == Shape{2});
  CHECK(e[1][1].to_vector() == std::vector<float>{8, 5});
  // Only a path: a header line, every column a feature, no label.
  const std::string with_header = write_csv(dir, "h.csv", "a,b\n1,2\n");
  const std::vector<Element> f = elements(Dataset::from_csv(with_header));
  REQUIRE(f.size() == 1);
  REQUIRE(f[0].size() == 1);
  CHECK(f[0][0].to_vector() == std::vector<float>{1, 2});
}

TEST_CASE("csv: RFC 4180 quoting, CRLF, comments, blank lines, line numbers across quoted breaks", "[csv]") {
  test::TempDir dir;
  const std::string text =
      "# a comment before the header\r\n"
      "\"x, with comma\",\"say \"\"hi\"\"\",label\r\n"
      "\r\n"
      "\"1.5\",\"a\r\nmulti-line\ntext\",7\r\n"  // lines 4 to 6
      "   \t\r\n"
      "# another comment\n"
      "2,\"\",8";  // line 9, no final line break
  const std::string path = write_csv(dir, "quoted.csv", text);
  Dataset::CsvOptions o;
  o.features = {"x, with comma"};
  o.labels = {"label"};
  const std::vector<Element> e = elements(Dataset::from_csv(path, o));
  REQUIRE(e.size() == 2);
  CHECK(e[0][0].to_vector() == std::vector<float>{1.5f});
  CHECK(e[0][1].data<int32_t>()[0] == 7);
  CHECK(e[1][0].to_vector() == std::vector<float>{2.0f});
  CHECK(e[1][1].data<int32_t>()[0] == 8);
  // The quoted header name with doubled quotes, and the line count through the quoted
  // breaks: a record whose quoted field spans lines 4-6 is reported as line 4.
  o.features = {"say \"hi\""};
  CHECK_THAT(input_error([&] { Dataset::from_csv(path, o); }),
             Catch::Contains("line 4") && Catch::Contains("column 1 ('say \"hi\"')") &&
                 Catch::Contains("is not a number"));
  // Header line 1, a record on lines 2-3, blank lines 4-9, the bad record on line 10.
  const std::string bad = write_csv(dir, "bad10.csv", "a,b\n\"x\ny\",1\n\n\n\n\n\n\n2,z\n");
  Dataset::CsvOptions b;
  b.features = {"b"};
  CHECK_THAT(input_error([&] { Dataset::from_csv(bad, b); }),
             Catch::Contains("line 10") && Catch::Contains("'z' is not a number"));
  // Comments off: a '#' line is data.
  const std::string hash = write_csv(dir, "hash.csv", "a\n#1\n");
  Dataset::CsvOptions no_comment;
  no_comment.comment = '\0';
  CHECK_THAT(input_error([&] { Dataset::from_csv(hash, no_comment); }),
             Catch::Contains("line 2") && Catch::Contains("'#1' is not a number"));
  // Another delimiter.
  const std::string semi = write_csv(dir, "semi.csv", "a;b\n1,5;2\n");
  Dataset::CsvOptions s;
  s.delimiter = ';';
  s.features = {"b"};
  CHECK(elements(Dataset::from_csv(semi, s))[0][0].to_vector() == std::vector<float>{2});
}

TEST_CASE("csv: bad files name the file, the line and the column", "[csv]") {
  test::TempDir dir;
  struct Case {
    const char* what;
    std::string text;
    Dataset::CsvOptions options;
    std::vector<std::string> expected;  // parts of the message
  };
  Dataset::CsvOptions xy;
  xy.features = {"x"};
  xy.labels = {"y"};
  Dataset::CsvOptions no_header;
  no_header.header = false;
  no_header.features = {"x"};
  Dataset::CsvOptions index7;
  index7.features = {7};
  Dataset::CsvOptions twice;
  twice.features = {"x", 0};
  Dataset::CsvOptions dup;
  dup.features = {"x"};
  Dataset::CsvOptions all_labels;
  all_labels.labels = {"x", "y"};
  Dataset::CsvOptions f32_labels = xy;
  f32_labels.label_dtype = DType::f32;
  Dataset::CsvOptions i64_labels = xy;
  i64_labels.label_dtype = DType::i64;
  const std::vector<Case> cases = {
      {"non-numeric", "x,y\n1,2\nabc,3\n", xy, {"line 3", "column 0 ('x')", "'abc' is not a number"}},
      {"trailing text", "x,y\n1.5kg,2\n", xy, {"line 2", "'1.5kg' is not a number"}},
      {"missing field", "x,y\n1,2\n ,3\n", xy, {"line 3", "column 0 ('x')", "empty"}},
      {"wrong column count", "x,y\n1,2\n1,2,3\n", xy, {"line 3", "3 fields, expected 2", "line 1"}},
      {"too few columns", "x,y\n1\n", xy, {"line 2", "1 fields, expected 2"}},
      {"unknown column name", "x,z\n1,2\n", xy, {"no label column 'y'", "line 1", "x, z"}},
      {"empty file", "", xy, {"empty"}},
      {"only comments", "# nothing\n\n", xy, {"empty"}},
      {"header, no rows", "x,y\n# a comment\n", xy, {"no data rows", "line 1"}},
      {"label above i32", "x,y\n1,2147483648\n", xy, {"line 2", "column 1 ('y')", "outside the i32 range"}},
      {"label below i32", "x,y\n1,-2147483649\n", xy, {"outside the i32 range"}},
      {"fractional label", "x,y\n1,2.5\n", xy, {"line 2", "'2.5' is not an integer"}},
      {"NaN feature", "x,y\n1,2\nnan,3\n", xy, {"line 3", "'nan' is not a finite number"}},
      {"infinite f32 label", "x,y\n1,inf\n", f32_labels, {"line 2", "column 1 ('y')", "not a finite number"}},
      {"f32 overflow", "x,y\n1e39,1\n", xy, {"line 2", "outside the f32 range"}},
      {"f64 overflow", "x,y\n1e999,1\n", xy, {"line 2", "outside the f64 range"}},
      {"unclosed quote", "x,y\n1,2\n\"3,4\n5,6\n", xy, {"line 3", "never closed"}},
      {"text after a quote", "x,y\n\"1\"2,3\n", xy, {"line 2", "column 0", "after the closing quote"}},
      {"quote inside a field", "x,y\n1\"2,3\n", xy, {"line 2", "column 0", "quote inside"}},
      {"name without a header", "1,2\n", no_header, {"'x'", "by name", "no header"}},
      {"index out of range", "x,y\n1,2\n", index7, {"index 7", "out of range", "2 columns"}},
      {"column chosen twice", "x,y\n1,2\n", twice, {"column 0 ('x')", "twice"}},
      {"ambiguous name", "x,x\n1,2\n", dup, {"'x'", "ambiguous", "0 and 1"}},
      {"no feature left", "x,y\n1,2\n", all_labels, {"no feature column"}},
      {"label dtype", "x,y\n1,2\n", i64_labels, {"label_dtype", "i64"}},
      // Before: "a header (line 1) but no data rows", or one line of many columns.
      {"bare CR line ends", "x,y\r1,2\r3,4\r", xy, {"bare CR", "LF or CRLF"}},
      // A NUL byte quoted from the file is shown as \0; what() once ended there.
      {"NUL in a field", std::string("x,y\n1,2\na\0b,3\n", 14), xy, {"'a\\0b' is not a number", "line 3"}},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const std::string path = write_csv(dir, "bad.csv", c.text);
    const std::string m = input_error([&] { Dataset::from_csv(path, c.options); });
    CHECK_THAT(m, Catch::Contains(path));
    for (const std::string& part : c.expected) CHECK_THAT(m, Catch::Contains(part));
  }
  const std::string missing = dir.file("missing.csv");
  CHECK_THAT(input_error([&] { Dataset::from_csv(missing); }), Catch::Contains(missing) && Catch::Contains("no such"));
}

TEST_CASE("csv: values at the edges of i32 and f32 are read exactly", "[csv]") {
  test::TempDir dir;
  const std::string path =
      write_csv(dir, "edges.csv", "x,y\n3.4028234e38,2147483647\n-1e-50,-2147483648\n0.1,0\n");
  Dataset::CsvOptions o;
  o.features = {"x"};
  o.labels = {"y"};
  const std::vector<Element> e = elements(Dataset::from_csv(path, o));
  REQUIRE(e.size() == 3);
  CHECK(e[0][0].to_vector()[0] == 3.4028234e38f);
  CHECK(e[0][1].data<int32_t>()[0] == 2147483647);
  CHECK(e[1][0].to_vector()[0] == 0.0f);  // underflows to (negative) zero
  CHECK(e[1][1].data<int32_t>()[0] == -2147483648);
  CHECK(e[2][0].to_vector()[0] == 0.1f);  // the float nearest to 0.1
}
