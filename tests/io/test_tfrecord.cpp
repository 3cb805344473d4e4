// tarantella/tfrecord.hpp: TFRecord framing (writer, reader, corruption, truncation) and
// tf.train.Example records. The expected bytes are made here by code independent of the
// library: a bitwise CRC-32C and a hand-written protobuf encoder, following the published
// formats (TFRecord framing; protobuf wire format with TensorFlow's field numbers).
#include "tarantella/check.hpp"
#include "tarantella/tfrecord.hpp"
#include "temp_dir.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cstring>
#include <functional>
#include <filesystem>

namespace fs = std::filesystem;
using namespace tnt;
using tnt::test::Bytes;
using tnt::test::read_bytes;
using tnt::test::TempDir;
using tnt::test::write_bytes;

namespace {

// Bit at a time, straight from the definition (reflected polynomial 0x82F63B78).
uint32_t crc32c_bitwise(const uint8_t* p, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}
uint32_t masked(const uint8_t* p, size_t n) {
  uint32_t c = crc32c_bitwise(p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// A minimal protobuf encoder for the test's expected bytes.
std::string varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}
std::string field(uint32_t number, const std::string& payload) {  // wire type 2
  return varint(number << 3 | 2) + varint(payload.size()) + payload;
}
std::string fixed32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(u >> (8 * i));
  return out;
}
// Features map entry: key = 1, value (Feature) = 2.
std::string entry(const std::string& key, const std::string& feature) {
  return field(1, field(1, key) + field(2, feature));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

std::vector<std::string> read_all(const std::string& path, std::vector<uint64_t>* offsets = nullptr) {
  TFRecordReader in(path);
  std::vector<std::string> out;
  std::string record;
  for (uint64_t at = in.offset(); in.next(record); at = in.offset()) {
    out.push_back(record);
    if (offsets) offsets->push_back(at);
  }
  if (offsets) offsets->push_back(in.offset());
  return out;
}

}  // namespace

TEST_CASE("TFRecord: records round trip, offsets, and the exact bytes of the framing") {
  TempDir tmp("tnt-tfrecord");
  const std::string path = (tmp.path / "r.tfrecord").string();
  std::vector<std::string> records = {"hello", "", std::string("a\0b\xff", 4), std::string(100000, 'x')};
  {
    TFRecordWriter out(path);
    for (const auto& r : records) out.write(r);
    out.write(Bytes{1, 2, 3});
    records.push_back("\x01\x02\x03");
  }  // the destructor closes
  std::vector<uint64_t> offsets;
  CHECK(read_all(path, &offsets) == records);
  REQUIRE(offsets.size() == records.size() + 1);
  uint64_t expect = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    CHECK(offsets[i] == expect);
    expect += 12 + records[i].size() + 4;
  }
  CHECK(offsets.back() == expect);
  CHECK(fs::file_size(path) == expect);

  // Record 0 byte by byte: length 5 little-endian, masked CRCs computed bit by bit here.
  Bytes file = read_bytes(path);
  Bytes len = {5, 0, 0, 0, 0, 0, 0, 0};
  CHECK(Bytes(file.begin(), file.begin() + 8) == len);
  auto u32_at = [&](size_t at) {
    return uint32_t{file[at]} | uint32_t{file[at + 1]} << 8 | uint32_t{file[at + 2]} << 16 |
           uint32_t{file[at + 3]} << 24;
  };
  CHECK(u32_at(8) == masked(len.data(), 8));
  CHECK(std::string(file.begin() + 12, file.begin() + 17) == "hello");
  CHECK(u32_at(17) == masked(reinterpret_cast<const uint8_t*>("hello"), 5));

  // close() twice is harmless; write after close is a programming error.
  TFRecordWriter again(path);
  again.close();
  again.close();
  CHECK_THROWS_AS(again.write("x"), Error);
  CHECK(fs::file_size(path) == 0);  // truncated on open
  CHECK(read_all(path).empty());
}

TEST_CASE("TFRecord: flush leaves whole records for a reader while the writer is open") {
  TempDir tmp("tnt-tfrecord");
  const std::string path = (tmp.path / "live.tfrecord").string();
  TFRecordWriter out(path);
  out.write("one");
  out.write("two");
  out.flush();
  CHECK(read_all(path) == std::vector<std::string>{"one", "two"});
  out.write("three");
  out.flush();
  CHECK(read_all(path) == std::vector<std::string>{"one", "two", "three"});
}

TEST_CASE("TFRecord: between flushes the file holds whole records only (a killed writer leaves no cut one)") {
  // 50-byte records (66 with the framing) written without flush: whatever reached the file
  // is a whole number of records at every moment. Before, stdio's 4 KiB buffer went to the
  // file whenever it filled, mid-record, and a kill -9 then left a record cut short.
  TempDir tmp("tnt-tfrecord");
  const std::string path = (tmp.path / "unflushed.tfrecord").string();
  TFRecordWriter out(path);
  const std::string record(50, 'x');
  constexpr uintmax_t kFramed = 50 + 16;
  bool grew = false;
  for (int i = 0; i < 5000; ++i) {
    out.write(record);
    const uintmax_t size = fs::file_size(path);
    INFO("after record " << i << ": " << size << " bytes on disk");
    REQUIRE(size % kFramed == 0);
    grew = grew || size > 0;
  }
  CHECK(grew);  // written as it goes, not only at the end
  out.close();
  CHECK(fs::file_size(path) == 5000 * kFramed);
}

TEST_CASE("TFRecord: corruption and truncation name the file and the byte offset") {
  TempDir tmp("tnt-tfrecord");
  const std::string path = (tmp.path / "bad.tfrecord").string();
  {
    TFRecordWriter out(path);
    for (int i = 0; i < 4; ++i) out.write(fmt::format("record number {}", i));
    out.close();
  }
  std::vector<uint64_t> offsets;
  read_all(path, &offsets);
  const Bytes good = read_bytes(path);

  // A flipped bit in record 2's data: records 0 and 1 read, then the error.
  Bytes bad = good;
  bad[offsets[2] + 12 + 3] ^= 0x04;
  write_bytes(path, bad);
  {
    TFRecordReader in(path);
    std::string r;
    REQUIRE(in.next(r));
    REQUIRE(in.next(r));
    CHECK(r == "record number 1");
    CHECK_THAT(error_of([&] { in.next(r); }), Catch::Contains(path) &&
                                                  Catch::Contains(fmt::format("byte offset {}", offsets[2])) &&
                                                  Catch::Contains("data CRC"));
  }
  // A flipped bit in record 1's length.
  bad = good;
  bad[offsets[1]] ^= 0x01;
  write_bytes(path, bad);
  CHECK_THAT(error_of([&] { read_all(path); }), Catch::Contains(path) &&
                                                    Catch::Contains(fmt::format("byte offset {}", offsets[1])) &&
                                                    Catch::Contains("length CRC"));
  // A flipped bit in record 3's data CRC.
  bad = good;
  bad[offsets[4] - 1] ^= 0x80;
  write_bytes(path, bad);
  CHECK_THAT(error_of([&] { read_all(path); }),
             Catch::Contains(fmt::format("byte offset {}", offsets[3])) && Catch::Contains("data CRC"));

  // Cut inside the last record's data, inside its footer, and inside its header.
  for (uint64_t cut : {offsets[3] + 14, offsets[4] - 2, offsets[3] + 5}) {
    bad.assign(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut));
    write_bytes(path, bad);
    INFO("file cut at " << cut);
    CHECK_THAT(error_of([&] { read_all(path); }),
               Catch::Contains(path) && Catch::Contains(fmt::format("byte offset {}", offsets[3])));
  }
  // Cut inside the last record's CRC only: the data fit, and the message says so (before:
  // "length ... runs past the end of the file").
  bad.assign(good.begin(), good.end() - 2);
  write_bytes(path, bad);
  CHECK_THAT(error_of([&] { read_all(path); }),
             Catch::Contains("end 2 byte(s) before the file does, short of their 4-byte CRC-32C") &&
                 Catch::Contains("cut short"));
  // Cut exactly between records: a clean end.
  bad.assign(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(offsets[3]));
  write_bytes(path, bad);
  CHECK(read_all(path).size() == 3);

  // A huge length with a valid CRC must not be trusted (no giant allocation).
  Bytes huge(12 + 4, 0);
  for (int i = 0; i < 8; ++i) huge[i] = 0xEE;
  uint32_t m = masked(huge.data(), 8);
  for (int i = 0; i < 4; ++i) huge[8 + i] = static_cast<uint8_t>(m >> (8 * i));
  write_bytes(path, huge);
  CHECK_THAT(error_of([&] { read_all(path); }), Catch::Contains("byte offset 0") && Catch::Contains("past the end"));
}

TEST_CASE("TFRecord: files that cannot be created or opened") {
  TempDir tmp("tnt-tfrecord");
  const std::string missing_dir = (tmp.path / "no" / "such" / "dir" / "f.tfrecord").string();
  CHECK_THAT(error_of([&] { TFRecordWriter w(missing_dir); }), Catch::Contains(missing_dir));
  const std::string missing = (tmp.path / "absent.tfrecord").string();
  CHECK_THAT(error_of([&] { TFRecordReader r(missing); }), Catch::Contains(missing) && Catch::Contains("no such file"));
  CHECK_THAT(error_of([&] { TFRecordReader r(tmp.path.string()); }), Catch::Contains("not a regular file"));
}

TEST_CASE("tf.train.Example: bytes written by independent code parse, and ours are the same bytes") {
  // Example { features { feature { "b": bytes_list ["hi", ""] }
  //                      feature { "label": int64_list [7, -1] (packed) }
  //                      feature { "x": float_list [1.5, -2] (packed) } } }
  // Keys in sorted order (the order a deterministic serializer writes a map in).
  std::string b_feature = field(1, field(1, "hi") + field(1, ""));
  std::string label_feature = field(3, field(1, varint(7) + varint(static_cast<uint64_t>(int64_t{-1}))));
  std::string x_feature = field(2, field(1, fixed32(1.5f) + fixed32(-2.0f)));
  std::string bytes = field(1, entry("b", b_feature) + entry("label", label_feature) + entry("x", x_feature));

  Example ex = parse_example(bytes, "hand-made");
  CHECK(ex.bytes_features == std::map<std::string, std::vector<std::string>>{{"b", {"hi", ""}}});
  CHECK(ex.int64_features == std::map<std::string, std::vector<int64_t>>{{"label", {7, -1}}});
  CHECK(ex.float_features == std::map<std::string, std::vector<float>>{{"x", {1.5f, -2.0f}}});
  CHECK(serialize_example(ex) == bytes);

  // Unpacked int64s (older writers), an unknown field, and a Feature with no kind.
  std::string unpacked = field(3, varint(1 << 3 | 0) + varint(5) + varint(1 << 3 | 0) + varint(6));
  std::string other = field(1, entry("u", unpacked) + entry("empty", "")) + varint(7 << 3 | 0) + varint(99);
  Example ex2 = parse_example(other, "hand-made 2");
  CHECK(ex2.int64_features == std::map<std::string, std::vector<int64_t>>{{"u", {5, 6}}});
  CHECK(ex2.float_features.empty());
  CHECK(ex2.bytes_features.empty());
}

TEST_CASE("tf.train.Example: round trip through a TFRecord file, and bad input") {
  TempDir tmp("tnt-tfrecord");
  const std::string path = (tmp.path / "ex.tfrecord").string();
  std::vector<Example> examples(3);
  for (int i = 0; i < 3; ++i) {
    examples[i].int64_features["id"] = {i, -i * 1000000000000LL};
    examples[i].float_features["w"] = {0.25f * static_cast<float>(i), 3.0e38f, -0.0f};
    examples[i].bytes_features["text"] = {std::string("line\0 ", 6) + std::to_string(i)};
    examples[i].int64_features["empty"] = {};
  }
  {
    TFRecordWriter out(path);
    for (const auto& e : examples) out.write(serialize_example(e));
  }
  TFRecordReader in(path);
  std::string record;
  for (int i = 0; i < 3; ++i) {
    std::string where = fmt::format("{}:{}", in.path(), in.offset());
    REQUIRE(in.next(record));
    Example back = parse_example(record, where);
    CHECK(back.int64_features == examples[i].int64_features);
    CHECK(back.float_features == examples[i].float_features);
    CHECK(back.bytes_features == examples[i].bytes_features);
  }
  CHECK_FALSE(in.next(record));

  CHECK_THAT(error_of([] { parse_example("\xff\xff\xff garbage", "junk.tfrecord:120"); }),
             Catch::Contains("junk.tfrecord:120"));
  Example twice;
  twice.int64_features["k"] = {1};
  twice.float_features["k"] = {1.0f};
  CHECK_THROWS_WITH(serialize_example(twice), Catch::Contains("'k'"));
}
