// TFRecord files and tf.train.Example records (tarantella/tfrecord.hpp), and the ImageNet
// shards' two-feature view of an Example (tarantella/imagenet.hpp).
//
// Framing of one record:  uint64 length | uint32 masked CRC-32C of those 8 bytes |
//                         data[length]  | uint32 masked CRC-32C of the data
// all little-endian. The framing and its checks live here once: the sequential
// TFRecordReader, index_tfrecord (walks the headers only, checking the length CRCs, and
// seeks over the data, so a shard is scanned at a fraction of its reading cost) and
// read_tfrecord (one record at a known offset, both CRCs) share check_header.
//
// Example bytes are parsed and written by the protobuf library with our subset of
// TensorFlow's messages (runtime/proto/tf_subset.proto).
#include "tarantella/tfrecord.hpp"

#include "tarantella/check.hpp"
#include "tarantella/imagenet.hpp"
#include "tf_subset.pb.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <array>
#include <cerrno>
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

[[noreturn]] void corrupt(const std::string& path, uint64_t offset, const std::string& what) {
  TNT_INPUT_ERROR("TFRecord file '{}': corrupt record at byte offset {}: {}", path, offset, what);
}

// The header of the record at `offset`, with `remaining` bytes from there to the end of the
// file (>= 12): checks the length's CRC and that data and footer fit; returns the length.
uint64_t check_header(const uint8_t* header, const std::string& path, uint64_t offset, uint64_t remaining) {
  if (masked_crc32c(header, 8) != get_u32(header + 8)) corrupt(path, offset, "length CRC-32C mismatch");
  const uint64_t length = get_u64(header);
  if (length > remaining - kHeaderBytes || remaining - kHeaderBytes - length < kFooterBytes)
    corrupt(path, offset,
            fmt::format("length {} runs past the end of the file ({} bytes)", length, offset + remaining));
  return length;
}

std::ifstream open_shard(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) TNT_INPUT_ERROR("TFRecord file '{}': cannot open: {}", path, std::strerror(errno));
  return in;
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

// Protocol buffers: deterministic bytes (map entries in key order), so that the same
// Example always gives the same record.
std::string serialize_deterministic(const google::protobuf::MessageLite& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    TNT_CHECK(message.SerializeToCodedStream(&coded), "serializing a {} failed", message.GetTypeName());
  }
  return out;
}

tfpb::Example parse_example_proto(const uint8_t* data, size_t size, const std::string& where) {
  if (size > static_cast<size_t>(INT_MAX))
    TNT_INPUT_ERROR("tf.train.Example in {}: {} bytes, more than a protocol buffer may hold", where, size);
  tfpb::Example proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size)))
    TNT_INPUT_ERROR("tf.train.Example in {}: {} bytes that are not a valid tf.train.Example protocol buffer", where,
                    size);
  return proto;
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

struct TFRecordWriter::Impl {
  std::string path;
  std::FILE* file = nullptr;
};

TFRecordWriter::TFRecordWriter(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->file = std::fopen(path.c_str(), "wb");
  if (!impl_->file) TNT_INPUT_ERROR("TFRecord file '{}': cannot create: {}", path, std::strerror(errno));
}

TFRecordWriter::~TFRecordWriter() {
  if (impl_->file) std::fclose(impl_->file);
}

void TFRecordWriter::write(std::string_view data) {
  TNT_CHECK(impl_->file, "TFRecordWriter '{}': already closed", impl_->path);
  uint8_t header[kHeaderBytes], footer[kFooterBytes];
  put_u64(header, data.size());
  put_u32(header + 8, masked_crc32c(header, 8));
  put_u32(footer, masked_crc_of(data));
  bool ok = std::fwrite(header, 1, kHeaderBytes, impl_->file) == kHeaderBytes &&
            (data.empty() || std::fwrite(data.data(), 1, data.size(), impl_->file) == data.size()) &&
            std::fwrite(footer, 1, kFooterBytes, impl_->file) == kFooterBytes;
  if (!ok) TNT_INPUT_ERROR("TFRecord file '{}': write error: {}", impl_->path, std::strerror(errno));
}

void TFRecordWriter::flush() {
  TNT_CHECK(impl_->file, "TFRecordWriter '{}': already closed", impl_->path);
  if (std::fflush(impl_->file) != 0)
    TNT_INPUT_ERROR("TFRecord file '{}': write error: {}", impl_->path, std::strerror(errno));
}

void TFRecordWriter::close() {
  if (!impl_->file) return;
  int rc = std::fclose(impl_->file);
  impl_->file = nullptr;
  if (rc != 0) TNT_INPUT_ERROR("TFRecord file '{}': close failed: {}", impl_->path, std::strerror(errno));
}

// ---- sequential reader

struct TFRecordReader::Impl {
  std::string path;
  std::FILE* file = nullptr;
  uint64_t offset = 0;  // of the next record
};

TFRecordReader::TFRecordReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->file = std::fopen(path.c_str(), "rb");
  if (!impl_->file) TNT_INPUT_ERROR("TFRecord file '{}': cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fileno(impl_->file), &st) != 0 || !S_ISREG(st.st_mode)) {
    std::fclose(impl_->file);
    impl_->file = nullptr;
    TNT_INPUT_ERROR("TFRecord file '{}': not a regular file", path);
  }
}

TFRecordReader::~TFRecordReader() {
  if (impl_->file) std::fclose(impl_->file);
}

bool TFRecordReader::next(std::string& data) {
  Impl& r = *impl_;
  uint8_t header[kHeaderBytes];
  size_t got = std::fread(header, 1, kHeaderBytes, r.file);
  if (std::ferror(r.file)) corrupt(r.path, r.offset, fmt::format("read error: {}", std::strerror(errno)));
  if (got == 0) return false;
  if (got < kHeaderBytes)
    corrupt(r.path, r.offset, fmt::format("truncated: {} bytes where a 12-byte header starts", got));
  // The file's size now (a writer may still be appending) bounds the length before the
  // data is allocated.
  struct stat st {};
  if (fstat(fileno(r.file), &st) != 0)
    TNT_INPUT_ERROR("TFRecord file '{}': cannot determine its size: {}", r.path, std::strerror(errno));
  const uint64_t size = std::max(static_cast<uint64_t>(st.st_size), r.offset + kHeaderBytes);
  const uint64_t length = check_header(header, r.path, r.offset, size - r.offset);
  data.resize(length);
  uint8_t footer[kFooterBytes];
  if ((length > 0 && std::fread(data.data(), 1, length, r.file) != length) ||
      std::fread(footer, 1, kFooterBytes, r.file) != kFooterBytes)
    corrupt(r.path, r.offset, fmt::format("truncated: the file ends inside a record of {} bytes", length));
  if (masked_crc_of(data) != get_u32(footer)) corrupt(r.path, r.offset, "data CRC-32C mismatch");
  r.offset += kHeaderBytes + length + kFooterBytes;
  return true;
}

uint64_t TFRecordReader::offset() const { return impl_->offset; }
const std::string& TFRecordReader::path() const { return impl_->path; }

// ---- random access (ImageNet shards)

std::vector<uint64_t> index_tfrecord(const std::string& path) {
  std::ifstream in = open_shard(path);
  const uint64_t size = file_size_of(in, path);
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

// ---- tf.train.Example

std::string serialize_example(const Example& example) {
  tfpb::Example proto;
  auto& features = *proto.mutable_features()->mutable_feature();
  auto add = [&](const std::string& key) -> tfpb::Feature& {
    TNT_CHECK(!features.contains(key), "serialize_example: feature '{}' appears with two kinds", key);
    return features[key];
  };
  for (const auto& [key, values] : example.int64_features)
    add(key).mutable_int64_list()->mutable_value()->Add(values.begin(), values.end());
  for (const auto& [key, values] : example.float_features)
    add(key).mutable_float_list()->mutable_value()->Add(values.begin(), values.end());
  for (const auto& [key, values] : example.bytes_features) {
    auto* list = add(key).mutable_bytes_list()->mutable_value();
    for (const auto& v : values) list->Add(std::string(v));
  }
  return serialize_deterministic(proto);
}

Example parse_example(std::string_view data, const std::string& where) {
  tfpb::Example proto = parse_example_proto(reinterpret_cast<const uint8_t*>(data.data()), data.size(), where);
  Example ex;
  for (const auto& [key, feature] : proto.features().feature()) {
    switch (feature.kind_case()) {
      case tfpb::Feature::kInt64List:
        ex.int64_features[key].assign(feature.int64_list().value().begin(), feature.int64_list().value().end());
        break;
      case tfpb::Feature::kFloatList:
        ex.float_features[key].assign(feature.float_list().value().begin(), feature.float_list().value().end());
        break;
      case tfpb::Feature::kBytesList:
        ex.bytes_features[key].assign(feature.bytes_list().value().begin(), feature.bytes_list().value().end());
        break;
      case tfpb::Feature::KIND_NOT_SET:
        break;
    }
  }
  return ex;
}

// ---- the ImageNet view: image/encoded (bytes) and image/class/label (int64)

std::vector<uint8_t> encode_example(const ImageExample& example) {
  tfpb::Example proto;
  auto& features = *proto.mutable_features()->mutable_feature();
  features["image/encoded"].mutable_bytes_list()->add_value(example.encoded.data(), example.encoded.size());
  features["image/class/label"].mutable_int64_list()->add_value(example.label);
  std::string bytes = serialize_deterministic(proto);
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

ImageExample parse_example(const uint8_t* data, size_t size, const std::string& where) {
  tfpb::Example proto = parse_example_proto(data, size, where);
  const auto& features = proto.features().feature();
  ImageExample ex;
  // A repeated field's last value wins, as before the protobuf library did the parsing.
  auto image = features.find("image/encoded");
  if (image == features.end() || !image->second.has_bytes_list() || image->second.bytes_list().value().empty())
    TNT_INPUT_ERROR("tf.train.Example in {}: no image/encoded bytes_list feature", where);
  const std::string& encoded = *image->second.bytes_list().value().rbegin();
  ex.encoded.assign(encoded.begin(), encoded.end());
  auto label = features.find("image/class/label");
  if (label == features.end() || !label->second.has_int64_list() || label->second.int64_list().value().empty())
    TNT_INPUT_ERROR("tf.train.Example in {}: no image/class/label int64_list feature", where);
  ex.label = *label->second.int64_list().value().rbegin();
  return ex;
}

}  // namespace tnt
