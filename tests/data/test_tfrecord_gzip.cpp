// GZIP-compressed TFRecord files (tf.data's compression_type='GZIP'): the same records as
// uncompressed ones, chosen explicitly or detected; truncated and corrupt streams are
// errors naming the file and the record, and a record's claimed length allocates nothing.
#include "temp_dir.hpp"
#include <catch2/catch.hpp>
#include <zlib.h>

#include "tarantella/dataset.hpp"
#include "tarantella/imagenet.hpp"
#include "tarantella/tfrecord.hpp"

#include <filesystem>
#include <sys/resource.h>

using namespace tnt;
namespace fs = std::filesystem;
using tnt::test::Bytes;
using tnt::test::read_bytes;
using tnt::test::TempDir;
using tnt::test::write_bytes;

namespace {

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

std::vector<std::string> read_all(const std::string& path, TFRecordCompression c = TFRecordCompression::detect) {
  TFRecordReader in(path, c);
  std::vector<std::string> out;
  std::string r;
  while (in.next(r)) out.push_back(r);
  return out;
}

// Records around the edges: empty, one byte, a piece boundary of the reader (64 KiB), and
// larger than its 1 MiB growth step, with bytes that do not compress to nothing.
std::vector<std::string> sample_records() {
  std::vector<std::string> v = {"first", "", "x", std::string(65536, 'a'), std::string("\x1f\x8b\x08\0", 4)};
  std::string big(3 * 1024 * 1024 + 17, '\0');
  uint32_t s = 12345;
  for (char& c : big) c = static_cast<char>((s = s * 1103515245u + 12345u) >> 24);
  v.push_back(big);
  for (int i = 0; i < 50; ++i) v.push_back("record " + std::to_string(i));
  return v;
}

void write_file(const std::string& path, const std::vector<std::string>& records, TFRecordCompression c) {
  TFRecordWriter w(path, c);
  for (const auto& r : records) w.write(r);
  w.close();
}

// gzip of `data` by zlib's own gz* functions, independent of our writer.
void gzip_with_zlib(const std::string& path, const Bytes& data) {
  gzFile f = gzopen(path.c_str(), "wb9");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, data.data(), static_cast<unsigned>(data.size())) == static_cast<int>(data.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

Bytes header_with_length(uint64_t length) {
  Bytes h(12);
  for (int i = 0; i < 8; ++i) h[i] = static_cast<uint8_t>(length >> (8 * i));
  uint32_t m = masked_crc32c(h.data(), 8);
  for (int i = 0; i < 4; ++i) h[8 + i] = static_cast<uint8_t>(m >> (8 * i));
  return h;
}

long max_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

}  // namespace

TEST_CASE("GZIP TFRecord: the same records as uncompressed, explicit or detected") {
  TempDir tmp("tnt-gzip");
  const auto records = sample_records();
  const std::string plain = tmp.file("plain.tfrecord"), gz = tmp.file("records.tfrecord.gz");
  write_file(plain, records, TFRecordCompression::none);
  write_file(gz, records, TFRecordCompression::gzip);
  CHECK(fs::file_size(gz) < fs::file_size(plain));
  const Bytes gz_bytes = read_bytes(gz);
  REQUIRE(gz_bytes.size() > 3);
  CHECK((gz_bytes[0] == 0x1f && gz_bytes[1] == 0x8b && gz_bytes[2] == 0x08));

  CHECK(read_all(plain) == records);
  CHECK(read_all(plain, TFRecordCompression::none) == records);
  CHECK(read_all(gz) == records);
  CHECK(read_all(gz, TFRecordCompression::gzip) == records);
  CHECK(TFRecordReader(gz).compression() == TFRecordCompression::gzip);
  CHECK(TFRecordReader(plain).compression() == TFRecordCompression::none);

  // What gzip itself makes of the uncompressed file reads the same (zlib's gz* writer),
  // and so do two gzip members one after the other (cat a.gz b.gz).
  const std::string other = tmp.file("zlib.gz");
  gzip_with_zlib(other, read_bytes(plain));
  CHECK(read_all(other) == records);
  Bytes twice = gz_bytes;
  twice.insert(twice.end(), gz_bytes.begin(), gz_bytes.end());
  write_bytes(tmp.file("twice.gz"), twice);
  std::vector<std::string> doubled = records;
  doubled.insert(doubled.end(), records.begin(), records.end());
  CHECK(read_all(tmp.file("twice.gz")) == doubled);

  // Offsets and indices are those of the uncompressed stream; skip() agrees with next().
  TFRecordReader a(plain), b(gz);
  std::string r;
  for (size_t i = 0; i < records.size(); ++i) {
    CHECK(a.offset() == b.offset());
    CHECK(b.index() == static_cast<int64_t>(i));
    if (i % 2) {
      REQUIRE(a.skip());
      REQUIRE(b.skip());
    } else {
      REQUIRE(a.next(r));
      REQUIRE(b.next(r));
      CHECK(r == records[i]);
    }
  }
  CHECK_FALSE(b.next(r));
  CHECK_FALSE(b.skip());
  CHECK(a.offset() == b.offset());

  // The dataset source, both ways, and an empty gzip file: no records.
  auto records_of = [](const Dataset& d) {
    std::vector<std::string> out;
    auto it = d.iterate(0);
    while (auto e = it.next()) out.push_back(element_string((*e)[0]));
    return out;
  };
  CHECK(records_of(Dataset::from_tfrecord({gz, plain})) == doubled);
  CHECK(records_of(Dataset::from_tfrecord({gz}, TFRecordCompression::gzip)) == records);
  CHECK(records_of(Dataset::from_tfrecord({plain, gz}).skip(records.size() + 3)) ==
        std::vector<std::string>(records.begin() + 3, records.end()));
  write_file(tmp.file("empty.gz"), {}, TFRecordCompression::gzip);
  CHECK(read_all(tmp.file("empty.gz")).empty());

  CHECK(parse_tfrecord_compression("GZIP") == TFRecordCompression::gzip);
  CHECK(parse_tfrecord_compression("gzip") == TFRecordCompression::gzip);
  CHECK(parse_tfrecord_compression("") == TFRecordCompression::none);
  CHECK(parse_tfrecord_compression("NONE") == TFRecordCompression::none);
  CHECK_THAT(error_of([] { parse_tfrecord_compression("ZLIB"); }), Catch::Contains("'ZLIB'"));
}

TEST_CASE("GZIP TFRecord: detection is not fooled by an uncompressed record that starts like gzip") {
  TempDir tmp("tnt-gzip");
  // Length 0x088b1f: the first three bytes are 1f 8b 08, gzip's magic, but the length CRC
  // holds, so detection reads the file as uncompressed.
  const std::string path = tmp.file("looks_gzipped.tfrecord");
  std::vector<std::string> records = {std::string(0x088b1f, 'z'), "after"};
  write_file(path, records, TFRecordCompression::none);
  Bytes head = read_bytes(path);
  REQUIRE((head[0] == 0x1f && head[1] == 0x8b && head[2] == 0x08));
  CHECK(TFRecordReader(path).compression() == TFRecordCompression::none);
  CHECK(read_all(path) == records);
  // Said explicitly, the wrong compression is an error naming the file, not a crash.
  const std::string gz = tmp.file("g.gz"), plain = tmp.file("p.tfrecord");
  write_file(gz, {"a", "b"}, TFRecordCompression::gzip);
  write_file(plain, {"a", "b"}, TFRecordCompression::none);
  CHECK_THAT(error_of([&] { read_all(plain, TFRecordCompression::gzip); }),
             Catch::Contains(plain) && Catch::Contains("magic"));
  CHECK_THAT(error_of([&] { read_all(gz, TFRecordCompression::none); }),
             Catch::Contains(gz) && Catch::Contains("length CRC"));
  // Reading records by offset (ImageNet shards) needs uncompressed files and says so.
  CHECK_THAT(error_of([&] { index_tfrecord(gz); }), Catch::Contains(gz) && Catch::Contains("GZIP-compressed"));
}

TEST_CASE("GZIP TFRecord: truncated and corrupt streams name the file and the record") {
  TempDir tmp("tnt-gzip");
  std::vector<std::string> records;
  for (int i = 0; i < 200; ++i) records.push_back("record number " + std::to_string(i) + std::string(i, 'q'));
  const std::string gz = tmp.file("r.gz"), cut = tmp.file("cut.gz");
  write_file(gz, records, TFRecordCompression::gzip);
  const Bytes good = read_bytes(gz);

  // Every cut is an error (the stream's end and its CRC-32 trailer are gone), found where
  // the stream stops, never a crash or a silent short read.
  for (size_t at = 1; at < good.size(); at += (at < 40 || at + 40 > good.size()) ? 1 : 53) {
    write_bytes(cut, Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(at)));
    INFO("cut at " << at << " of " << good.size());
    std::string msg = error_of([&] { read_all(cut); });
    CHECK_THAT(msg, Catch::Contains(cut) && Catch::Contains("record ") && Catch::Contains("byte offset"));
  }
  write_bytes(cut, Bytes(good.begin(), good.end() - 3));
  CHECK_THAT(error_of([&] { read_all(cut); }), Catch::Contains("record 200 at byte offset") &&
                                                   Catch::Contains("gzip stream is truncated"));

  // A changed byte in the compressed data (after gzip's 10-byte header, whose time and OS
  // bytes nothing checks): inflate's errors, its CRC-32, or our CRC-32C catch it.
  for (size_t at = 10; at < good.size(); at += 37) {
    Bytes bad = good;
    bad[at] ^= 0x5a;
    write_bytes(cut, bad);
    INFO("byte " << at << " changed");
    CHECK_THAT(error_of([&] { read_all(cut); }), Catch::Contains(cut) && Catch::Contains("corrupt record"));
  }

  // The TFRecord CRCs still apply inside the stream: a changed data byte of record 7.
  const std::string plain = tmp.file("p.tfrecord");
  write_file(plain, records, TFRecordCompression::none);
  Bytes raw = read_bytes(plain);
  uint64_t offset7 = 0;
  for (int i = 0; i < 7; ++i) offset7 += 12 + records[i].size() + 4;
  raw[offset7 + 12 + 2] ^= 0x01;
  gzip_with_zlib(cut, raw);
  CHECK_THAT(error_of([&] { read_all(cut); }),
             Catch::Contains(fmt::format("record 7 at byte offset {}", offset7)) && Catch::Contains("data CRC"));
  TFRecordReader skipping(cut);
  for (int i = 0; i < 7; ++i) REQUIRE(skipping.skip());
  CHECK_THAT(error_of([&] { skipping.skip(); }), Catch::Contains("data CRC"));
}

TEST_CASE("GZIP TFRecord: a record's length is bounded before anything is allocated") {
  TempDir tmp("tnt-gzip");
  const std::string path = tmp.file("bomb.gz");
  // A valid header claiming 2^40 bytes: refused at once.
  Bytes claim = header_with_length(uint64_t{1} << 40);
  gzip_with_zlib(path, claim);
  CHECK_THAT(error_of([&] { read_all(path); }),
             Catch::Contains(path) && Catch::Contains("record 0") && Catch::Contains("more than"));
  // 1000 MiB claimed (under the cap) but 8 MiB of zeros present, which gzip squeezes to a few
  // KiB: the record grows only as it inflates, so the error comes with about 8 MiB used,
  // not 1000. Tolerance: 200 MiB of growth in peak memory covers the reader's pieces and
  // the allocator's slack, and is far below the claimed length.
  Bytes bomb = header_with_length(uint64_t{1000} << 20);
  bomb.resize(bomb.size() + (size_t{8} << 20), 0);
  gzip_with_zlib(path, bomb);
  CHECK(fs::file_size(path) < (size_t{1} << 20));
  const long before = max_rss_kib();
  CHECK_THAT(error_of([&] { read_all(path); }), Catch::Contains("truncated"));
  CHECK(max_rss_kib() - before < 200 * 1024);
}
