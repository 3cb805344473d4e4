// TFRecord files and tf.train.Example records, as TensorFlow writes and reads them.
//
// A TFRecord file is a sequence of records, each framed as
//   uint64 length | uint32 masked CRC-32C of those 8 bytes | data[length] | uint32 masked
//   CRC-32C of the data
// all little-endian; masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8. TensorBoard
// event files are TFRecord files of Event protocol buffers (tnt::TensorBoard writes them),
// and dataset shards are TFRecord files of tf.train.Example protocol buffers.
//
//   tnt::TFRecordWriter out("shard-00000");
//   out.write(tnt::serialize_example({.int64_features = {{"label", {3}}}}));
//   out.close();
//   tnt::TFRecordReader in("shard-00000");
//   std::string record;
//   for (uint64_t at = in.offset(); in.next(record); at = in.offset())
//     tnt::Example ex = tnt::parse_example(record, in.path() + ":" + std::to_string(at));
//
// Compression (tf.data's TFRecordDataset(files, compression_type='GZIP')): a GZIP file is
// one gzip stream around the same framing, and the reader inflates it incrementally, so a
// record is never allocated beyond what its bytes actually inflate to (and at most
// TFRecordReader::kMaxRecordBytes). Compression::gzip and ::none are what the caller says;
// ::detect (the reader's default) looks at the file's first bytes: gzip's magic 1f 8b 08,
// unless those 12 bytes are also a valid uncompressed record header (its length CRC holds,
// a 1 in 2^32 accident for a gzip header), so an uncompressed record of length 0x..088b1f
// is still read as such. Offsets in errors are in the uncompressed stream, with the record's
// index. The random-access functions of tarantella/imagenet.hpp need uncompressed files.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tnt {

enum class TFRecordCompression {
  none,    // TensorFlow's compression_type '' / 'NONE'
  gzip,    // 'GZIP'
  detect,  // by the file's first bytes (reading only; see above)
};
// "NONE" (or ""), "GZIP" or "DETECT", any case; InputError naming the text otherwise.
TFRecordCompression parse_tfrecord_compression(const std::string& text);

// Writes TFRecord framing: uint64 length | masked CRC-32C(length) | data | masked CRC-32C(data).
class TFRecordWriter {
 public:
  // creates/truncates; InputError naming the path if it cannot. gzip: one gzip stream
  // (deflate level 6), completed by close().
  explicit TFRecordWriter(const std::string& path, TFRecordCompression compression = TFRecordCompression::none);
  ~TFRecordWriter();                                  // closes (errors are not thrown here: call close())
  TFRecordWriter(const TFRecordWriter&) = delete;
  TFRecordWriter& operator=(const TFRecordWriter&) = delete;
  void write(std::string_view data);
  void write(const std::vector<uint8_t>& data) {
    write(std::string_view(reinterpret_cast<const char*>(data.data()), data.size()));
  }
  void flush();  // to the OS (a crash after flush leaves whole records)
  void close();  // flushes and closes; throws on a write error; a second call does nothing

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Reads records in order; both CRCs checked; errors are InputError naming the file, the
// record's index and its byte offset (in the uncompressed stream).
class TFRecordReader {
 public:
  // Bounds a record's length before anything is allocated for it: an uncompressed file's
  // length must fit in what remains of the file; a compressed record grows only as its
  // bytes inflate, up to this (protocol buffers stop at 2 GiB anyway).
  static constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 30;

  explicit TFRecordReader(const std::string& path, TFRecordCompression compression = TFRecordCompression::detect);
  ~TFRecordReader();
  TFRecordReader(const TFRecordReader&) = delete;
  TFRecordReader& operator=(const TFRecordReader&) = delete;
  // false at a clean end of file; a truncated record or gzip stream is an error
  bool next(std::string& data);
  // Steps over one record without keeping it: an uncompressed file seeks past the data
  // (checking the length's CRC, not the data's); a compressed one inflates it in pieces.
  bool skip();
  uint64_t offset() const;  // byte offset of the next record (uncompressed stream)
  int64_t index() const;    // number of the next record, from 0
  TFRecordCompression compression() const;  // none or gzip: what was given or detected
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// tf.train.Example, the subset of feature kinds TensorFlow has.
struct Example {
  std::map<std::string, std::vector<int64_t>> int64_features;
  std::map<std::string, std::vector<float>> float_features;
  std::map<std::string, std::vector<std::string>> bytes_features;
};
// Deterministic bytes (features in key order). A key used in two of the maps is an error.
std::string serialize_example(const Example& example);
// where: e.g. "file:offset", for messages. A feature without a kind (TensorFlow's empty
// Feature) is left out; bytes that are not an Example are an InputError naming `where`.
Example parse_example(std::string_view data, const std::string& where);

}  // namespace tnt
