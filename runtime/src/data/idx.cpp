// IDX reader and writer (format in tarantella/idx.hpp). The whole file is read, gunzipped
// in memory when it starts with the gzip magic (no further than its header says), and
// validated before any value is used.
#include "tarantella/idx.hpp"

#include "tarantella/device.hpp"
#include "tarantella/files.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

namespace tnt {
namespace {

using Bytes = std::vector<uint8_t>;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  TNT_INPUT_ERROR("IDX file '{}': {}", path, what);
}

Bytes read_file(const std::string& path) {
  const uint64_t size = check_regular_file(path, "IDX file");
  std::ifstream in = open_regular_file(path, "IDX file");
  Bytes bytes(static_cast<size_t>(size));
  if (!bytes.empty() && !in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size))) {
    fail(path, "read error");
  }
  return bytes;
}

bool is_gzip(const Bytes& b) { return b.size() >= 2 && b[0] == 0x1f && b[1] == 0x8b; }

struct IdxType {
  uint8_t code;
  size_t size;
  DType dtype;
  const char* name;
};

const IdxType kTypes[] = {
    {0x08, 1, DType::u8, "u8"},   {0x09, 1, DType::i32, "i8"},  {0x0B, 2, DType::i32, "i16"},
    {0x0C, 4, DType::i32, "i32"}, {0x0D, 4, DType::f32, "f32"}, {0x0E, 8, DType::f64, "f64"},
};

uint32_t be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

// The product of up to 255 dimensions of 2^32 would wrap even 128 bits around to a small
// number, so counts saturate once they pass 2^64 values (more than any file holds: the file
// is then "truncated"); below that they are exact and messages give the real numbers.
constexpr unsigned __int128 kHuge = static_cast<unsigned __int128>(UINT64_MAX) + 1;

struct IdxHeader {
  const IdxType* type = nullptr;
  Shape shape;
  size_t bytes = 0;               // the header's own: 4 + 4 * ndim
  unsigned __int128 values = 0;   // the product of the dimensions (saturated at kHuge)
  unsigned __int128 data_bytes() const { return std::min(values * type->size, kHuge); }
  unsigned __int128 file_bytes() const { return std::min(data_bytes() + bytes, kHuge); }
};

// The header from the first n bytes of the (inflated) file; nullopt while n is too short
// to hold it. A wrong magic number or type code fails as soon as its 4 bytes are there.
std::optional<IdxHeader> parse_header(const uint8_t* b, size_t n, const std::string& path) {
  if (n < 4) return std::nullopt;
  if (b[0] != 0 || b[1] != 0) {
    fail(path, fmt::format("wrong magic number {:02x} {:02x} {:02x} {:02x}: an IDX file starts with 00 00 <type> <ndim>",
                           b[0], b[1], b[2], b[3]));
  }
  IdxHeader h;
  for (const IdxType& t : kTypes) {
    if (t.code == b[2]) h.type = &t;
  }
  if (!h.type) fail(path, fmt::format("wrong magic number: unknown type code 0x{:02x}", b[2]));
  const size_t ndim = b[3];
  h.bytes = 4 + 4 * ndim;
  if (n < h.bytes) return std::nullopt;
  h.values = 1;
  bool zero = false;
  for (size_t i = 0; i < ndim; ++i) {
    const uint32_t d = be32(b + 4 + 4 * i);
    h.shape.push_back(d);
    zero = zero || d == 0;
    h.values = std::min(h.values * d, kHuge);  // values <= 2^64 and d < 2^32: no wrap
  }
  if (zero) h.values = 0;  // a zero dimension makes it 0 whatever came before
  return h;
}

// deflate expands at most about 1032:1, so a gzip file of n bytes inflates to at most
// n * 1032: a header that promises more is a truncated file, known before inflating on. The
// gzip trailer's ISIZE is never trusted for sizing (it is checked by zlib only at the end).
constexpr size_t kDeflateMaxRatio = 1032;

// Inflates a gzip file (one or several members, as `cat a.gz b.gz` makes), checking the IDX
// header as soon as it has come out: the output never grows past the size the header gives
// (one byte more tells that the file holds more than its header says: it is refused there,
// without inflating the rest), so a small file that inflates to gigabytes costs no more
// memory than its header announced, and that was bounded against the host's memory first.
Bytes gunzip(const Bytes& in, const std::string& path) {
  z_stream zs{};
  // 16 + MAX_WBITS: gzip wrapper only, so the CRC and length in the trailer are checked.
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) fail(path, "zlib inflateInit2 failed");
  Bytes out(size_t{1} << 16);  // grows by doubling, up to what the header allows
  size_t limit = SIZE_MAX;     // the header's file size + 1, once known
  bool header_seen = false;
  size_t consumed = 0;
  size_t produced = 0;
  std::string error;
  try {
    for (;;) {
      size_t in_chunk = std::min<size_t>(in.size() - consumed, 1u << 30);
      size_t out_room = std::min<size_t>(out.size() - produced, 1u << 30);
      zs.next_in = const_cast<Bytef*>(in.data() + consumed);
      zs.avail_in = static_cast<uInt>(in_chunk);
      zs.next_out = out.data() + produced;
      zs.avail_out = static_cast<uInt>(out_room);
      int rc = inflate(&zs, Z_NO_FLUSH);
      consumed += in_chunk - zs.avail_in;
      produced += out_room - zs.avail_out;
      if (!header_seen) {
        if (std::optional<IdxHeader> h = parse_header(out.data(), produced, path)) {
          header_seen = true;
          const unsigned __int128 want = h->file_bytes();
          const unsigned __int128 most = static_cast<unsigned __int128>(in.size()) * kDeflateMaxRatio;
          if (want > most) {
            fail(path, fmt::format("truncated: its header gives dimensions {} of {}, {} bytes, and a gzip file of {} "
                                   "bytes inflates to at most {}",
                                   shape_str(h->shape), h->type->name,
                                   want >= kHuge ? std::string("more than 2^64") : std::to_string(static_cast<uint64_t>(want)),
                                   in.size(), static_cast<uint64_t>(most)));
          }
          limit = static_cast<size_t>(want) + 1;
        }
      }
      if (produced >= limit) {
        error = fmt::format("length mismatch: it inflates to more than the {} bytes its header gives; not read further",
                            limit - 1);
        break;
      }
      if (rc == Z_STREAM_END) {
        if (consumed == in.size()) break;
        // Another gzip member may follow.
        Bytes rest(in.begin() + static_cast<std::ptrdiff_t>(consumed),
                   in.begin() + static_cast<std::ptrdiff_t>(std::min(consumed + 2, in.size())));
        if (!is_gzip(rest)) {
          error = fmt::format("corrupt gzip data: {} bytes of garbage after the compressed stream", in.size() - consumed);
          break;
        }
        inflateReset(&zs);
        continue;
      }
      if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT || rc == Z_STREAM_ERROR) {
        const std::string msg = zs.msg ? zs.msg : "invalid stream";
        error = fmt::format("corrupt gzip data ({})", msg);
        if (msg == "incorrect length check") {
          error += fmt::format(": the trailer does not match the {} bytes the data holds", produced);
        }
        break;
      }
      if (rc == Z_MEM_ERROR) {
        error = "out of memory while decompressing";
        break;
      }
      if (produced == out.size()) {
        out.resize(std::min(out.size() * 2, limit));
        continue;
      }
      if (consumed == in.size()) {  // input used up before the end of the stream
        error = "truncated gzip data (the compressed stream ends early)";
        break;
      }
    }
  } catch (...) {
    inflateEnd(&zs);
    throw;
  }
  inflateEnd(&zs);
  if (!error.empty()) fail(path, error);
  out.resize(produced);
  return out;
}

uint64_t be_bits(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v = v << 8 | p[i];
  return v;
}

void put_be(Bytes& out, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * (n - 1 - i))));
}

}  // namespace

Tensor read_idx(const std::string& path) {
  Bytes bytes = read_file(path);
  if (is_gzip(bytes)) bytes = gunzip(bytes, path);
  std::optional<IdxHeader> header = parse_header(bytes.data(), bytes.size(), path);
  if (!header) {
    if (bytes.size() < 4) {
      fail(path, fmt::format("truncated: {} bytes, shorter than the 4-byte magic number", bytes.size()));
    }
    fail(path, fmt::format("truncated: the header of {} dimensions needs {} bytes, the file has {}", bytes[3],
                           4 + 4 * size_t{bytes[3]}, bytes.size()));
  }
  const IdxType* type = header->type;
  const Shape& shape = header->shape;
  const size_t head = header->bytes;
  const unsigned __int128 count = header->values;
  const unsigned __int128 need = header->data_bytes();
  const size_t have = bytes.size() - head;
  if (need > have) {
    if (need >= kHuge) {
      fail(path, fmt::format("truncated: dimensions {} of {} need more than 2^64 data bytes, the file has {}",
                             shape_str(shape), type->name, have));
    }
    fail(path, fmt::format("truncated: {} values of {} with dimensions {} need {} data bytes, the file has {}",
                           static_cast<uint64_t>(count), type->name, shape_str(shape), static_cast<uint64_t>(need),
                           have));
  }
  if (need < have) {
    fail(path, fmt::format("length mismatch: dimensions {} of {} need {} data bytes, the file has {} ({} extra)",
                           shape_str(shape), type->name, static_cast<uint64_t>(need), have,
                           have - static_cast<uint64_t>(need)));
  }
  // The tensor beside the bytes already read (i8 and i16 widen to 4 bytes a value).
  const uint64_t tensor_bytes = static_cast<uint64_t>(count) * dtype_size(type->dtype);
  const MemoryStats memory = memory_stats(Device::cpu());
  if (memory.total_bytes > 0 && tensor_bytes + bytes.size() > memory.total_bytes) {
    fail(path, fmt::format("dimensions {} need {:.1f} GiB as a tensor of {} beside the {:.1f} GiB read, more than this "
                           "host's {:.1f} GiB of memory",
                           shape_str(shape), static_cast<double>(tensor_bytes) / (1 << 30), dtype_name(type->dtype),
                           static_cast<double>(bytes.size()) / (1 << 30),
                           static_cast<double>(memory.total_bytes) / (1 << 30)));
  }
  Tensor t = Tensor::empty(shape, type->dtype);
  const uint8_t* src = bytes.data() + head;
  int64_t n = t.numel();
  switch (type->code) {
    case 0x08: std::memcpy(t.raw(), src, static_cast<size_t>(n)); break;
    case 0x09:
      for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int8_t>(src[i]);
      break;
    case 0x0B:
      for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int16_t>(be_bits(src + 2 * i, 2));
      break;
    case 0x0C:
      for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(be_bits(src + 4 * i, 4));
      break;
    case 0x0D:
      for (int64_t i = 0; i < n; ++i) {
        uint32_t bits = static_cast<uint32_t>(be_bits(src + 4 * i, 4));
        std::memcpy(t.data<float>() + i, &bits, 4);
      }
      break;
    case 0x0E:
      for (int64_t i = 0; i < n; ++i) {
        uint64_t bits = be_bits(src + 8 * i, 8);
        std::memcpy(t.data<double>() + i, &bits, 8);
      }
      break;
  }
  return t;
}

void write_idx(const std::string& path, const Tensor& tensor, bool gzip) {
  Tensor t = tensor.device().is_cpu() ? tensor : tensor.to(Device::cpu());
  uint8_t code = 0;
  switch (t.dtype()) {
    case DType::u8: code = 0x08; break;
    case DType::i32: code = 0x0C; break;
    case DType::f32: code = 0x0D; break;
    case DType::f64: code = 0x0E; break;
    default: TNT_INPUT_ERROR("write_idx '{}': IDX cannot hold {}", path, dtype_name(t.dtype()));
  }
  TNT_CHECK(t.ndim() <= 255, "write_idx '{}': {} dimensions, IDX allows 255", path, t.ndim());
  Bytes raw = {0, 0, code, static_cast<uint8_t>(t.ndim())};
  for (int64_t d : t.shape()) {
    TNT_CHECK(d <= 0xffffffffll, "write_idx '{}': dimension {} does not fit in 32 bits", path, d);
    put_be(raw, static_cast<uint64_t>(d), 4);
  }
  size_t elem = dtype_size(t.dtype());
  raw.reserve(raw.size() + t.nbytes());
  const auto* src = static_cast<const uint8_t*>(t.raw());
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    uint64_t v = 0;
    std::memcpy(&v, src + i * elem, elem);  // little-endian host
    put_be(raw, v, elem);
  }
  Bytes out;
  if (gzip) {
    TNT_CHECK(raw.size() < (size_t{1} << 32), "write_idx '{}': {} bytes is too large to compress in one call", path,
              raw.size());
    z_stream zs{};
    TNT_CHECK(deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK,
              "write_idx '{}': zlib deflateInit2 failed", path);
    out.resize(deflateBound(&zs, raw.size()) + 64);
    zs.next_in = raw.data();
    zs.avail_in = static_cast<uInt>(raw.size());
    zs.next_out = out.data();
    zs.avail_out = static_cast<uInt>(out.size());
    int rc = deflate(&zs, Z_FINISH);
    out.resize(zs.total_out);
    deflateEnd(&zs);
    TNT_CHECK(rc == Z_STREAM_END, "write_idx '{}': zlib deflate failed ({})", path, rc);
  } else {
    out = std::move(raw);
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) TNT_INPUT_ERROR("write_idx '{}': cannot open for writing: {}", path, std::strerror(errno));
  f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  f.close();
  if (!f) TNT_INPUT_ERROR("write_idx '{}': write failed", path);
}

MnistSplit load_mnist_dir(const std::string& dir, const std::string& split_name, const MnistExpect& expect) {
  std::string split = split_name == "test" ? "t10k" : split_name;
  // The plain file or the gzipped one. Both there (gunzip -k) must hold the same data: a
  // stale plain file of another dataset (MNIST's digits have the same sizes) would
  // otherwise be read in place of the download beside it, without a word.
  std::string images_path, labels_path;
  auto read = [&](const std::string& base, std::string& path) {
    std::filesystem::path plain = std::filesystem::path(dir) / base;
    std::filesystem::path gz = std::filesystem::path(dir) / (base + ".gz");
    std::error_code ec;
    const bool has_plain = std::filesystem::is_regular_file(plain, ec), has_gz = std::filesystem::is_regular_file(gz, ec);
    if (has_plain && has_gz) {
      path = plain.string();
      Tensor a = read_idx(path);
      Tensor b = read_idx(gz.string());
      const bool same = a.dtype() == b.dtype() && a.shape() == b.shape() &&
                        std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
      if (!same) {
        TNT_INPUT_ERROR("MNIST directory '{}': {} and {} both exist and hold different data ({} and {}); remove the "
                        "one that is not this dataset",
                        dir, base, base + ".gz", a.str(), b.str());
      }
      return a;
    }
    if (has_plain || has_gz) {
      path = (has_plain ? plain : gz).string();
      return read_idx(path);
    }
    // One that exists but is no file (a directory, a FIFO) is named as such.
    for (const auto& p : {plain, gz}) {
      if (std::filesystem::exists(p, ec)) {
        TNT_INPUT_ERROR("MNIST directory '{}': {} is not a regular file (split '{}')", dir, p.string(), split_name);
      }
    }
    TNT_INPUT_ERROR("MNIST directory '{}': neither {} nor {} exists (split '{}')", dir, base,
                    base + ".gz", split_name);
  };
  Tensor images = read(split + "-images-idx3-ubyte", images_path);  // u8 (N, H, W)
  Tensor labels = read(split + "-labels-idx1-ubyte", labels_path);  // u8 (N,)
  if (images.dtype() != DType::u8 || images.ndim() != 3) {
    fail(images_path, fmt::format("expected u8 images (N, H, W), found {}", images.str()));
  }
  if (labels.dtype() != DType::u8 || labels.ndim() != 1) {
    fail(labels_path, fmt::format("expected u8 labels (N,), found {}", labels.str()));
  }
  if (images.dim(0) != labels.dim(0)) {
    TNT_INPUT_ERROR("MNIST directory '{}': {} has {} images but {} has {} labels", dir, images_path,
                    images.dim(0), labels_path, labels.dim(0));
  }
  TNT_INPUT_CHECK(expect.max_samples >= 0, "MNIST directory '{}': max_samples {} must be at least 0", dir,
                  expect.max_samples);
  const int64_t file_samples = images.dim(0), h = images.dim(1), w = images.dim(2);
  const int64_t n = expect.max_samples > 0 ? std::min(file_samples, expect.max_samples) : file_samples;
  if ((expect.height > 0 && h != expect.height) || (expect.width > 0 && w != expect.width)) {
    fail(images_path, fmt::format("its images are {}x{}, expected {}x{}", h, w,
                                  expect.height > 0 ? std::to_string(expect.height) : std::string("any"),
                                  expect.width > 0 ? std::to_string(expect.width) : std::string("any")));
  }
  const uint8_t* lb = labels.data<uint8_t>();
  if (expect.num_classes > 0) {
    for (int64_t i = 0; i < n; ++i) {
      if (lb[i] >= expect.num_classes) {
        fail(labels_path, fmt::format("label {} of sample {} (0-based) is outside the {} classes [0, {})", lb[i], i,
                                      expect.num_classes, expect.num_classes));
      }
    }
  }
  MnistSplit out;
  out.images = Tensor::empty({n, 1, h, w}, DType::f32);  // (N, 1, H, W)
  out.labels = Tensor::empty({n}, DType::i64);           // (N,)
  const uint8_t* px = images.data<uint8_t>();
  float* dst = out.images.data<float>();
  out.file_samples = file_samples;
  const int64_t pixels = n * h * w;
  for (int64_t i = 0; i < pixels; ++i) dst[i] = static_cast<float>(px[i]) / 255.0f;
  for (int64_t i = 0; i < n; ++i) out.labels.data<int64_t>()[i] = lb[i];
  return out;
}

}  // namespace tnt
