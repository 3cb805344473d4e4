// TFRecord files (tarantella/tfrecord.hpp): the framing, written and read.
//
// Framing of one record:  uint64 length | uint32 masked CRC-32C of those 8 bytes |
//                         data[length]  | uint32 masked CRC-32C of the data
// all little-endian. The framing and its checks live here once: the sequential
// TFRecordReader, index_tfrecord (walks the headers only, checking the length CRCs, and
// seeks over the data, so a shard is scanned at a fraction of its reading cost) and
// read_tfrecord (one record at a known offset, both CRCs) share check_header.
//
// GZIP files (TFRecordCompression): the sequential reader and writer put a zlib gzip
// stream (inflateInit2/deflateInit2 with 16 + MAX_WBITS) between the framing and the file,
// so the same framing code runs on uncompressed bytes either way; see tfrecord.hpp for
// detection and for how lengths are bounded.
//
// tf.train.Example records: data/tf_example.cpp.
#include "tarantella/tfrecord.hpp"
#include "tarantella/files.hpp"

#include "tarantella/check.hpp"
#include "tarantella/imagenet.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sys/stat.h>

namespace tnt {
namespace {

// Reflected CRC-32C (polynomial 0x1EDC6F41, reversed 0x82F63B78), one table lookup a byte.
constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

constexpr uint64_t kHeaderBytes = 12;  // length + its CRC
constexpr uint64_t kFooterBytes = 4;   // the data's CRC

void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
uint32_t masked_crc_of(std::string_view data) {
  return masked_crc32c(reinterpret_cast<const uint8_t*>(data.data()), data.size());
}

constexpr size_t kChunkBytes = size_t{1} << 16;  // file reads and inflate pieces

bool has_gzip_magic(const uint8_t* p, size_t n) { return n >= 3 && p[0] == 0x1f && p[1] == 0x8b && p[2] == 0x08; }

[[noreturn]] void corrupt(const std::string& path, uint64_t offset, const std::string& what) {
  TNT_INPUT_ERROR("TFRecord file '{}': corrupt record at byte offset {}: {}", path, offset, what);
}

// The header of the record at `offset`, with `remaining` bytes from there to the end of the
// file (>= 12): checks the length's CRC and that data and footer fit. Returns what is wrong,
// or "" with *length set.
std::string header_problem(const uint8_t* header, uint64_t offset, uint64_t remaining, uint64_t* length) {
  if (masked_crc32c(header, 8) != get_u32(header + 8)) return "length CRC-32C mismatch";
  *length = get_u64(header);
  if (*length > remaining - kHeaderBytes)
    return fmt::format("length {} runs past the end of the file ({} bytes)", *length, offset + remaining);
  // The data fit, its 4-byte CRC does not: a file cut at its very end.
  if (remaining - kHeaderBytes - *length < kFooterBytes)
    return fmt::format("the data's {} bytes end {} byte(s) before the file does, short of their {}-byte CRC-32C: "
                       "the file is cut short",
                       *length, remaining - kHeaderBytes - *length, kFooterBytes);
  return "";
}

uint64_t check_header(const uint8_t* header, const std::string& path, uint64_t offset, uint64_t remaining) {
  uint64_t length = 0;
  std::string problem = header_problem(header, offset, remaining, &length);
  if (!problem.empty()) corrupt(path, offset, problem);
  return length;
}

std::ifstream open_shard(const std::string& path) {
  return open_regular_file(path, "TFRecord file");
}

uint64_t file_size_of(std::ifstream& in, const std::string& path) {
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  if (size < 0) TNT_INPUT_ERROR("TFRecord file '{}': cannot determine its size", path);
  return static_cast<uint64_t>(size);
}

// Reads the header at offset from a seekable stream; false at a clean end of file.
bool read_header(std::ifstream& in, const std::string& path, uint64_t offset, uint64_t file_size,
                 uint64_t* length) {
  if (offset == file_size) return false;
  if (file_size - offset < kHeaderBytes)
    corrupt(path, offset, fmt::format("{} trailing bytes, a header needs 12", file_size - offset));
  uint8_t header[kHeaderBytes];
  in.seekg(static_cast<std::streamoff>(offset));
  if (!in.read(reinterpret_cast<char*>(header), kHeaderBytes)) corrupt(path, offset, "read error in the header");
  *length = check_header(header, path, offset, file_size - offset);
  return true;
}

}  // namespace

// ---- CRC-32C

uint32_t crc32c(const uint8_t* data, size_t size, uint32_t crc) {
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = kCrcTable[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const uint8_t* data, size_t size) {
  uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// ---- writer

TFRecordCompression parse_tfrecord_compression(const std::string& text) {
  std::string t;
  for (char c : text) t += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (t.empty() || t == "NONE") return TFRecordCompression::none;
  if (t == "GZIP") return TFRecordCompression::gzip;
  if (t == "DETECT") return TFRecordCompression::detect;
  TNT_INPUT_ERROR("TFRecord compression '{}': expected NONE, GZIP or DETECT", text);
}

struct TFRecordWriter::Impl {
  std::string path;
  std::FILE* file = nullptr;
  bool gzip = false;
  z_stream zs{};
  std::vector<uint8_t> out;  // deflate's output buffer
  // Uncompressed: whole records, written to the (unbuffered) file only as whole records, so
  // that a process killed at any moment leaves whole records behind (stdio's buffer would
  // go to the file whenever it filled, mid-record). At kPendingBytes, kPendingSeconds after
  // the last write to the file (a live TensorBoard sees batch scalars within seconds), or
  // flush().
  std::vector<uint8_t> pending;
  static constexpr size_t kPendingBytes = size_t{1} << 16;
  static constexpr double kPendingSeconds = 2.0;
  std::chrono::steady_clock::time_point drained = std::chrono::steady_clock::now();
  int failed = 0;  // errno of a failed write: the file's end is unknown, nothing more goes

  // A failed write is the machine's (a full disk, a quota), not the input's: Error (exit 1),
  // not InputError's usage status 2, which a launcher's restart would not retry.
  void fail() { throw Error(fmt::format("TFRecord file '{}': write error: {}", path, std::strerror(errno))); }
  void drain() {
    if (failed != 0) {
      errno = failed;
      fail();
    }
    drained = std::chrono::steady_clock::now();
    if (pending.empty()) return;
    if (std::fwrite(pending.data(), 1, pending.size(), file) != pending.size()) {
      // A part may be in the file: writing the records again after it would duplicate them.
      failed = errno != 0 ? errno : EIO;
      pending.clear();
      fail();
    }
    pending.clear();
  }
  bool drain_due() const {
    return pending.size() >= kPendingBytes ||
           std::chrono::duration<double>(std::chrono::steady_clock::now() - drained).count() >= kPendingSeconds;
  }
  void put(const void* data, size_t n) {
    if (failed != 0) {
      errno = failed;
      fail();
    }
    if (n == 0) return;
    if (!gzip) {
      const auto* p = static_cast<const uint8_t*>(data);
      pending.insert(pending.end(), p, p + n);
      return;
    }
    zs.next_in = static_cast<Bytef*>(const_cast<void*>(data));
    zs.avail_in = static_cast<uInt>(n);  // records above 4 GiB are not written (protobufs stop at 2)
    TNT_CHECK(n <= UINT32_MAX, "TFRecordWriter '{}': a record of {} bytes is too long to compress", path, n);
    deflate_all(Z_NO_FLUSH);
  }
  // Runs deflate until it has taken all input (and, for a flush, emitted everything).
  void deflate_all(int flush) {
    for (;;) {
      zs.next_out = out.data();
      zs.avail_out = static_cast<uInt>(out.size());
      int rc = deflate(&zs, flush);
      TNT_CHECK(rc == Z_OK || rc == Z_STREAM_END || rc == Z_BUF_ERROR, "TFRecordWriter '{}': deflate failed ({})",
                path, rc);
      size_t have = out.size() - zs.avail_out;
      if (have > 0 && std::fwrite(out.data(), 1, have, file) != have) fail();
      if (flush == Z_FINISH ? rc == Z_STREAM_END : (zs.avail_in == 0 && zs.avail_out != 0)) return;
    }
  }
};

TFRecordWriter::TFRecordWriter(const std::string& path, TFRecordCompression compression)
    : impl_(std::make_unique<Impl>()) {
  TNT_CHECK(compression != TFRecordCompression::detect, "TFRecordWriter '{}': compression must be none or gzip", path);
  impl_->path = path;
  impl_->file = std::fopen(path.c_str(), "wb");
  if (!impl_->file) TNT_INPUT_ERROR("TFRecord file '{}': cannot create: {}", path, std::strerror(errno));
  if (compression != TFRecordCompression::gzip) std::setvbuf(impl_->file, nullptr, _IONBF, 0);  // Impl::pending
  if (compression == TFRecordCompression::gzip) {
    impl_->gzip = true;
    impl_->out.resize(kChunkBytes);
    // 16 + MAX_WBITS: a gzip header and trailer around the deflate data, as TensorFlow writes.
    if (deflateInit2(&impl_->zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
      std::fclose(impl_->file);
      impl_->file = nullptr;
      TNT_CHECK(false, "TFRecordWriter '{}': deflateInit2 failed", path);
    }
  }
}

TFRecordWriter::~TFRecordWriter() {
  try {
    close();
  } catch (...) {  // a destructor does not throw; close() reports errors
  }
  if (impl_->gzip) deflateEnd(&impl_->zs);
  if (impl_->file) std::fclose(impl_->file);
}

void TFRecordWriter::write(std::string_view data) {
  TNT_CHECK(impl_->file, "TFRecordWriter '{}': already closed", impl_->path);
  uint8_t header[kHeaderBytes], footer[kFooterBytes];
  put_u64(header, data.size());
  put_u32(header + 8, masked_crc32c(header, 8));
  put_u32(footer, masked_crc_of(data));
  impl_->put(header, kHeaderBytes);
  impl_->put(data.data(), data.size());
  impl_->put(footer, kFooterBytes);
  if (!impl_->gzip && impl_->drain_due()) impl_->drain();
}

void TFRecordWriter::flush() {
  TNT_CHECK(impl_->file, "TFRecordWriter '{}': already closed", impl_->path);
  // Z_SYNC_FLUSH: everything written so far inflates; the stream is finished by close().
  if (impl_->gzip) impl_->deflate_all(Z_SYNC_FLUSH);
  impl_->drain();
  if (std::fflush(impl_->file) != 0)
    throw Error(fmt::format("TFRecord file '{}': write error: {}", impl_->path, std::strerror(errno)));
}

void TFRecordWriter::close() {
  if (!impl_->file) return;
  std::FILE* file = impl_->file;
  try {
    if (impl_->gzip) impl_->deflate_all(Z_FINISH);
    impl_->drain();
  } catch (...) {
    impl_->file = nullptr;
    std::fclose(file);
    throw;
  }
  impl_->file = nullptr;
  if (std::fclose(file) != 0)
    throw Error(fmt::format("TFRecord file '{}': close failed: {}", impl_->path, std::strerror(errno)));
}

// ---- sequential reader

struct TFRecordReader::Impl {
  std::string path;
  std::FILE* file = nullptr;
  bool gzip = false;
  uint64_t offset = 0;  // of the next record, in the uncompressed stream
  int64_t index = 0;    // of the next record
  // gzip only
  z_stream zs{};
  bool z_ready = false;
  bool z_done = false;       // the stream's end marker (and trailer) has been read
  bool file_ended = false;
  std::vector<uint8_t> in;   // compressed bytes read from the file, not yet inflated
  std::vector<char> scratch;  // skip()'s destination

  [[noreturn]] void fail(const std::string& what) const {
    TNT_INPUT_ERROR("TFRecord file '{}': corrupt record {} at byte offset {}{}: {}", path, index, offset,
                    gzip ? " of the uncompressed stream" : "", what);
  }

  // Up to n bytes of the uncompressed stream; fewer only where it ends.
  size_t read(void* dst, size_t n) {
    if (!gzip) {
      size_t got = std::fread(dst, 1, n, file);
      if (std::ferror(file)) fail(fmt::format("read error: {}", std::strerror(errno)));
      return got;
    }
    size_t got = 0;
    while (got < n && !z_done) {
      if (zs.avail_in == 0 && !file_ended) {
        size_t r = std::fread(in.data(), 1, in.size(), file);
        if (std::ferror(file)) fail(fmt::format("read error: {}", std::strerror(errno)));
        if (r < in.size()) file_ended = true;
        zs.next_in = in.data();
        zs.avail_in = static_cast<uInt>(r);
      }
      zs.next_out = static_cast<Bytef*>(dst) + got;
      zs.avail_out = static_cast<uInt>(std::min<size_t>(n - got, UINT32_MAX));
      const uInt before = zs.avail_out;
      int rc = inflate(&zs, Z_NO_FLUSH);
      got += before - zs.avail_out;
      if (rc == Z_STREAM_END) {
        // A file of several gzip members (cat a.gz b.gz) is one stream, as for gunzip.
        const int c = zs.avail_in > 0 ? 0 : std::fgetc(file);
        if (zs.avail_in == 0 && c == EOF) {
          z_done = true;
        } else {
          if (zs.avail_in == 0) std::ungetc(c, file);  // only a byte fgetc took goes back
          inflateReset(&zs);
        }
      } else if (rc == Z_BUF_ERROR && zs.avail_in == 0 && file_ended) {
        fail("the gzip stream is truncated (the file ends before the stream's end)");
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        fail(fmt::format("the gzip stream is corrupt ({})", zs.msg ? zs.msg : zError(rc)));
      }
    }
    return got;
  }

  // The next record's length, its header checked; false at a clean end.
  bool header(uint64_t* length) {
    uint8_t h[kHeaderBytes];
    size_t got = read(h, kHeaderBytes);
    if (got == 0) return false;
    if (got < kHeaderBytes) fail(fmt::format("truncated: {} bytes where a 12-byte header starts", got));
    if (gzip) {
      if (masked_crc32c(h, 8) != get_u32(h + 8)) fail("length CRC-32C mismatch");
      *length = get_u64(h);
      // Nothing to compare with but sanity: the record grows only as it inflates anyway.
      if (*length > kMaxRecordBytes)
        fail(fmt::format("length {} is more than the {} bytes a record may have", *length, kMaxRecordBytes));
      return true;
    }
    // The file's size now (a writer may still be appending) bounds the length before the
    // data is allocated.
    struct stat st {};
    if (fstat(fileno(file), &st) != 0)
      TNT_INPUT_ERROR("TFRecord file '{}': cannot determine its size: {}", path, std::strerror(errno));
    const uint64_t size = std::max(static_cast<uint64_t>(st.st_size), offset + kHeaderBytes);
    std::string problem = header_problem(h, offset, size - offset, length);
    if (!problem.empty()) fail(problem);
    return true;
  }

  void finish(uint64_t length, uint32_t crc, const uint8_t* footer) {
    if (((crc >> 15) | (crc << 17)) + 0xa282ead8u != get_u32(footer)) fail("data CRC-32C mismatch");
    offset += kHeaderBytes + length + kFooterBytes;
    ++index;
  }
  [[noreturn]] void truncated(uint64_t length) const {
    fail(fmt::format("truncated: the {} ends inside a record of {} bytes", gzip ? "stream" : "file", length));
  }
};

TFRecordReader::TFRecordReader(const std::string& path, TFRecordCompression compression)
    : impl_(std::make_unique<Impl>()) {
  Impl& r = *impl_;
  r.path = path;
  check_regular_file(path, "TFRecord file");  // before fopen: a FIFO's open would wait for a writer
  r.file = std::fopen(path.c_str(), "rb");
  if (!r.file) TNT_INPUT_ERROR("TFRecord file '{}': cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fileno(r.file), &st) != 0 || !S_ISREG(st.st_mode)) {
    std::fclose(r.file);
    r.file = nullptr;
    TNT_INPUT_ERROR("TFRecord file '{}': not a regular file", path);
  }
  if (compression != TFRecordCompression::none) {
    uint8_t head[kHeaderBytes];
    const size_t got = std::fread(head, 1, kHeaderBytes, r.file);
    std::rewind(r.file);
    const bool magic = has_gzip_magic(head, got);
    if (compression == TFRecordCompression::gzip && got > 0 && !magic) {
      std::fclose(r.file);
      r.file = nullptr;
      TNT_INPUT_ERROR("TFRecord file '{}': compression GZIP was given, but the file does not start with gzip's "
                      "magic bytes 1f 8b 08",
                      path);
    }
    // A gzip header whose bytes 8..11 are the masked CRC of bytes 0..7 is a 1 in 2^32
    // accident; an uncompressed first record whose length starts 1f 8b 08 is not.
    const bool valid_record = got == kHeaderBytes && masked_crc32c(head, 8) == get_u32(head + 8);
    r.gzip = compression == TFRecordCompression::gzip || (magic && !valid_record);
  }
  if (r.gzip) {
    r.in.resize(kChunkBytes);
    if (inflateInit2(&r.zs, 16 + MAX_WBITS) != Z_OK) {
      std::fclose(r.file);
      r.file = nullptr;
      TNT_CHECK(false, "TFRecordReader '{}': inflateInit2 failed", path);
    }
    r.z_ready = true;
  }
}

TFRecordReader::~TFRecordReader() {
  if (impl_->z_ready) inflateEnd(&impl_->zs);
  if (impl_->file) std::fclose(impl_->file);
}

bool TFRecordReader::next(std::string& data) {
  Impl& r = *impl_;
  uint64_t length = 0;
  if (!r.header(&length)) return false;
  uint8_t footer[kFooterBytes];
  if (!r.gzip) {
    data.resize(length);
    if ((length > 0 && r.read(data.data(), length) != length) || r.read(footer, kFooterBytes) != kFooterBytes)
      r.truncated(length);
  } else {
    // In pieces: memory follows what the stream really holds, not what the header claims.
    data.clear();
    while (data.size() < length) {
      const size_t at = data.size();
      const size_t piece = static_cast<size_t>(std::min<uint64_t>(length - at, kChunkBytes * 16));
      data.resize(at + piece);
      if (r.read(data.data() + at, piece) != piece) r.truncated(length);
    }
    if (r.read(footer, kFooterBytes) != kFooterBytes) r.truncated(length);
  }
  r.finish(length, crc32c(reinterpret_cast<const uint8_t*>(data.data()), data.size()), footer);
  return true;
}

bool TFRecordReader::skip() {
  Impl& r = *impl_;
  uint64_t length = 0;
  if (!r.header(&length)) return false;
  uint8_t footer[kFooterBytes];
  if (!r.gzip) {
    // check_header has made sure the data and footer are in the file.
    if (std::fseek(r.file, static_cast<long>(length + kFooterBytes), SEEK_CUR) != 0) r.truncated(length);
    r.offset += kHeaderBytes + length + kFooterBytes;
    ++r.index;
    return true;
  }
  r.scratch.resize(kChunkBytes);
  uint32_t crc = 0;
  for (uint64_t left = length; left > 0;) {
    const size_t piece = static_cast<size_t>(std::min<uint64_t>(left, kChunkBytes));
    if (r.read(r.scratch.data(), piece) != piece) r.truncated(length);
    crc = crc32c(reinterpret_cast<const uint8_t*>(r.scratch.data()), piece, crc);
    left -= piece;
  }
  if (r.read(footer, kFooterBytes) != kFooterBytes) r.truncated(length);
  r.finish(length, crc, footer);
  return true;
}

uint64_t TFRecordReader::offset() const { return impl_->offset; }
int64_t TFRecordReader::index() const { return impl_->index; }
TFRecordCompression TFRecordReader::compression() const {
  return impl_->gzip ? TFRecordCompression::gzip : TFRecordCompression::none;
}
const std::string& TFRecordReader::path() const { return impl_->path; }

// ---- random access (ImageNet shards)

std::vector<uint64_t> index_tfrecord(const std::string& path) {
  std::ifstream in = open_shard(path);
  const uint64_t size = file_size_of(in, path);
  if (size >= kHeaderBytes) {
    uint8_t head[kHeaderBytes];
    in.seekg(0);
    const bool read = static_cast<bool>(in.read(reinterpret_cast<char*>(head), kHeaderBytes));
    in.clear();
    if (read && has_gzip_magic(head, kHeaderBytes) &&
        masked_crc32c(head, 8) != get_u32(head + 8))
      TNT_INPUT_ERROR("TFRecord file '{}': GZIP-compressed; reading records by offset (the ImageNet shards) needs "
                      "uncompressed files (gunzip it, or read it in order: Dataset::from_tfrecord)",
                      path);
  }
  std::vector<uint64_t> offsets;
  uint64_t offset = 0, length = 0;
  while (read_header(in, path, offset, size, &length)) {
    offsets.push_back(offset);
    offset += kHeaderBytes + length + kFooterBytes;
  }
  return offsets;
}

std::vector<uint8_t> read_tfrecord(const std::string& path, uint64_t offset) {
  std::ifstream in = open_shard(path);
  const uint64_t size = file_size_of(in, path);
  uint64_t length = 0;
  if (offset >= size || !read_header(in, path, offset, size, &length))
    corrupt(path, offset, fmt::format("offset is at or past the end of the file ({} bytes)", size));
  std::vector<uint8_t> data(length);
  uint8_t footer[kFooterBytes];
  if (!in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(length)) ||
      !in.read(reinterpret_cast<char*>(footer), kFooterBytes))
    corrupt(path, offset, "read error in the data");
  if (masked_crc32c(data.data(), data.size()) != get_u32(footer)) corrupt(path, offset, "data CRC-32C mismatch");
  return data;
}

}  // namespace tnt
