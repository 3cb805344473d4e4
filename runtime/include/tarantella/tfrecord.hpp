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
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tnt {

// Writes TFRecord framing: uint64 length | masked CRC-32C(length) | data | masked CRC-32C(data).
class TFRecordWriter {
 public:
  explicit TFRecordWriter(const std::string& path);  // creates/truncates; InputError naming the path if it cannot
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

// Reads records in order; both CRCs checked; errors are InputError naming the file and byte offset.
class TFRecordReader {
 public:
  explicit TFRecordReader(const std::string& path);
  ~TFRecordReader();
  TFRecordReader(const TFRecordReader&) = delete;
  TFRecordReader& operator=(const TFRecordReader&) = delete;
  bool next(std::string& data);  // false at a clean end of file; a truncated record is an error
  uint64_t offset() const;       // byte offset of the next record
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
