// TFRecord files and the tf.train.Example records in ImageNet shards.
//
// Framing of one record:  uint64 length | uint32 masked CRC-32C of those 8 bytes |
//                         data[length]  | uint32 masked CRC-32C of the data
// all little-endian. index_tfrecord walks the headers only (checking the length CRCs) and
// seeks over the data, so a shard is scanned once at a fraction of its reading cost; the
// data CRC is checked when read_tfrecord reads a record.
//
// tf.train.Example is protobuf:  Example { Features features = 1; }
//   Features { map<string, Feature> feature = 1; }   (map entry: key = 1, value = 2)
//   Feature  { oneof { BytesList bytes_list = 1; FloatList float_list = 2;
//                      Int64List int64_list = 3; } }  (each list: repeated value = 1)
// The parser below reads just that much of the wire format and skips every other field.
#include "tarantella/imagenet.hpp"

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

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

[[noreturn]] void corrupt(const std::string& path, uint64_t offset, const std::string& what) {
  TNT_INPUT_ERROR("TFRecord file '{}': corrupt record at byte offset {}: {}", path, offset, what);
}

std::ifstream open_shard(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) TNT_INPUT_ERROR("TFRecord file '{}': cannot open: {}", path, std::strerror(errno));
  return in;
}

// Reads the 12-byte header at offset; returns the data length. false at a clean end of file.
bool read_header(std::ifstream& in, const std::string& path, uint64_t offset, uint64_t file_size,
                 uint64_t* length) {
  if (offset == file_size) return false;
  if (file_size - offset < 12) corrupt(path, offset, fmt::format("{} trailing bytes, a header needs 12", file_size - offset));
  uint8_t header[12];
  in.seekg(static_cast<std::streamoff>(offset));
  if (!in.read(reinterpret_cast<char*>(header), 12)) corrupt(path, offset, "read error in the header");
  if (masked_crc32c(header, 8) != get_u32(header + 8)) corrupt(path, offset, "length CRC-32C mismatch");
  *length = get_u64(header);
  // Data and its CRC must fit in the rest of the file.
  if (*length > file_size - offset - 12 || file_size - offset - 12 - *length < 4)
    corrupt(path, offset, fmt::format("length {} runs past the end of the file ({} bytes)", *length, file_size));
  return true;
}

uint64_t file_size_of(std::ifstream& in, const std::string& path) {
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  if (size < 0) TNT_INPUT_ERROR("TFRecord file '{}': cannot determine its size", path);
  return static_cast<uint64_t>(size);
}

// ---- protobuf wire format
struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  const std::string* where;

  [[noreturn]] void bad(const char* what) const {
    TNT_INPUT_ERROR("tf.train.Example in {}: {}", *where, what);
  }
  bool done() const { return p >= end; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) bad("truncated varint");
      uint8_t b = *p++;
      v |= uint64_t{b & 0x7Fu} << shift;
      if (!(b & 0x80)) return v;
    }
    bad("varint longer than 10 bytes");
  }
  // A length-delimited field's payload.
  Reader sub() {
    uint64_t n = varint();
    if (n > static_cast<uint64_t>(end - p)) bad("length-delimited field runs past its message");
    Reader r{p, p + n, where};
    p += n;
    return r;
  }
  void skip(uint32_t wire_type) {
    switch (wire_type) {
      case 0: varint(); break;
      case 1: if (end - p < 8) bad("truncated fixed64"); p += 8; break;
      case 2: sub(); break;
      case 5: if (end - p < 4) bad("truncated fixed32"); p += 4; break;
      default: bad("unsupported wire type (groups or garbage)");
    }
  }
};

void put_varint(std::vector<uint8_t>& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
}
void put_tag(std::vector<uint8_t>& out, uint32_t field, uint32_t wire_type) { put_varint(out, field << 3 | wire_type); }
void put_bytes(std::vector<uint8_t>& out, uint32_t field, const uint8_t* data, size_t size) {
  put_tag(out, field, 2);
  put_varint(out, size);
  out.insert(out.end(), data, data + size);
}
void put_message(std::vector<uint8_t>& out, uint32_t field, const std::vector<uint8_t>& msg) {
  put_bytes(out, field, msg.data(), msg.size());
}

// One map entry of Features: key -> Feature.
std::vector<uint8_t> feature_entry(const std::string& key, const std::vector<uint8_t>& feature) {
  std::vector<uint8_t> entry;
  put_bytes(entry, 1, reinterpret_cast<const uint8_t*>(key.data()), key.size());
  put_message(entry, 2, feature);
  return entry;
}

}  // namespace

uint32_t crc32c(const uint8_t* data, size_t size, uint32_t crc) {
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = kCrcTable[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const uint8_t* data, size_t size) {
  uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::vector<uint8_t> encode_example(const ImageExample& example) {
  std::vector<uint8_t> bytes_list, image_feature, int64_list, label_feature, packed, features, out;
  put_bytes(bytes_list, 1, example.encoded.data(), example.encoded.size());  // BytesList.value
  put_message(image_feature, 1, bytes_list);                                 // Feature.bytes_list
  put_varint(packed, static_cast<uint64_t>(example.label));                  // int64: two's complement
  put_bytes(int64_list, 1, packed.data(), packed.size());                    // Int64List.value, packed
  put_message(label_feature, 3, int64_list);                                 // Feature.int64_list
  put_message(features, 1, feature_entry("image/encoded", image_feature));
  put_message(features, 1, feature_entry("image/class/label", label_feature));
  put_message(out, 1, features);  // Example.features
  return out;
}

ImageExample parse_example(const uint8_t* data, size_t size, const std::string& where) {
  ImageExample ex;
  bool have_image = false, have_label = false;
  Reader example{data, data + size, &where};
  while (!example.done()) {
    uint64_t tag = example.varint();
    if (tag != (1 << 3 | 2)) { example.skip(static_cast<uint32_t>(tag & 7)); continue; }
    Reader features = example.sub();
    while (!features.done()) {
      uint64_t ftag = features.varint();
      if (ftag != (1 << 3 | 2)) { features.skip(static_cast<uint32_t>(ftag & 7)); continue; }
      Reader entry = features.sub();
      std::string key;
      Reader value{nullptr, nullptr, &where};
      bool have_value = false;
      while (!entry.done()) {
        uint64_t etag = entry.varint();
        if (etag == (1 << 3 | 2)) {
          Reader k = entry.sub();
          key.assign(reinterpret_cast<const char*>(k.p), static_cast<size_t>(k.end - k.p));
        } else if (etag == (2 << 3 | 2)) {
          value = entry.sub();
          have_value = true;
        } else {
          entry.skip(static_cast<uint32_t>(etag & 7));
        }
      }
      if (!have_value || (key != "image/encoded" && key != "image/class/label")) continue;
      bool is_image = key == "image/encoded";
      while (!value.done()) {
        uint64_t vtag = value.varint();
        uint32_t field = static_cast<uint32_t>(vtag >> 3);
        if ((vtag & 7) != 2 || field != (is_image ? 1u : 3u)) { value.skip(static_cast<uint32_t>(vtag & 7)); continue; }
        Reader list = value.sub();
        while (!list.done()) {
          uint64_t ltag = list.varint();
          if (is_image && ltag == (1 << 3 | 2)) {
            Reader b = list.sub();
            ex.encoded.assign(b.p, b.end);  // a repeated field: the last value wins
            have_image = true;
          } else if (!is_image && ltag == (1 << 3 | 2)) {  // packed int64s
            Reader packed = list.sub();
            while (!packed.done()) {
              ex.label = static_cast<int64_t>(packed.varint());
              have_label = true;
            }
          } else if (!is_image && ltag == (1 << 3 | 0)) {  // unpacked int64
            ex.label = static_cast<int64_t>(list.varint());
            have_label = true;
          } else {
            list.skip(static_cast<uint32_t>(ltag & 7));
          }
        }
      }
    }
  }
  if (!have_image) example.bad("no image/encoded bytes_list feature");
  if (!have_label) example.bad("no image/class/label int64_list feature");
  return ex;
}

struct TFRecordWriter::Impl {
  std::FILE* file = nullptr;
};

TFRecordWriter::TFRecordWriter(const std::string& path) : path_(path), impl_(new Impl) {
  impl_->file = std::fopen(path.c_str(), "wb");
  if (!impl_->file) {
    delete impl_;
    impl_ = nullptr;
    TNT_INPUT_ERROR("TFRecord file '{}': cannot create: {}", path, std::strerror(errno));
  }
}

TFRecordWriter::~TFRecordWriter() {
  if (impl_ && impl_->file) std::fclose(impl_->file);
  delete impl_;
}

void TFRecordWriter::write(const uint8_t* data, size_t size) {
  TNT_CHECK(impl_ && impl_->file, "TFRecordWriter '{}': already closed", path_);
  uint8_t header[12], footer[4];
  put_u64(header, size);
  put_u32(header + 8, masked_crc32c(header, 8));
  put_u32(footer, masked_crc32c(data, size));
  bool ok = std::fwrite(header, 1, 12, impl_->file) == 12 &&
            (size == 0 || std::fwrite(data, 1, size, impl_->file) == size) &&
            std::fwrite(footer, 1, 4, impl_->file) == 4;
  if (!ok) TNT_INPUT_ERROR("TFRecord file '{}': write error: {}", path_, std::strerror(errno));
}

void TFRecordWriter::close() {
  if (!impl_ || !impl_->file) return;
  int rc = std::fclose(impl_->file);
  impl_->file = nullptr;
  if (rc != 0) TNT_INPUT_ERROR("TFRecord file '{}': close failed: {}", path_, std::strerror(errno));
}

std::vector<uint64_t> index_tfrecord(const std::string& path) {
  std::ifstream in = open_shard(path);
  const uint64_t size = file_size_of(in, path);
  std::vector<uint64_t> offsets;
  uint64_t offset = 0, length = 0;
  while (read_header(in, path, offset, size, &length)) {
    offsets.push_back(offset);
    offset += 12 + length + 4;
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
  uint8_t footer[4];
  if (!in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(length)) ||
      !in.read(reinterpret_cast<char*>(footer), 4))
    corrupt(path, offset, "read error in the data");
  if (masked_crc32c(data.data(), data.size()) != get_u32(footer)) corrupt(path, offset, "data CRC-32C mismatch");
  return data;
}

}  // namespace tnt
