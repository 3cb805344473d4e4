// IDX reader and writer (format in tarantella/idx.hpp). The whole file is read, gunzipped
// in memory when it starts with the gzip magic, and validated before any value is used.
#include "tarantella/idx.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

namespace tnt {
namespace {

using Bytes = std::vector<uint8_t>;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  TNT_INPUT_ERROR("IDX file '{}': {}", path, what);
}

Bytes read_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(path, "no such file");
  if (std::filesystem::is_directory(path, ec)) fail(path, "is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, fmt::format("cannot open: {}", std::strerror(errno)));
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  Bytes bytes(static_cast<size_t>(std::max<std::streamoff>(size, 0)));
  if (!bytes.empty() && !in.read(reinterpret_cast<char*>(bytes.data()), size)) fail(path, "read error");
  return bytes;
}

bool is_gzip(const Bytes& b) { return b.size() >= 2 && b[0] == 0x1f && b[1] == 0x8b; }

// The gzip trailer's ISIZE (uncompressed size mod 2^32) is written by whoever made the file
// and checked by zlib only at the very end, so it is a hint for sizing the buffer, never a
// size to allocate up front: deflate expands at most about 1032:1, so a trailer that claims
// more than that is ignored, and the buffer starts at a few times the compressed size and
// grows as data arrives. A trailer that disagrees with the data fails zlib's length check.
constexpr size_t kDeflateMaxRatio = 1032;

size_t gzip_size_hint(const Bytes& in) {
  if (in.size() < 18) return 0;  // smaller than an empty gzip member: no trailer to read
  const size_t isize = size_t{in[in.size() - 4]} | size_t{in[in.size() - 3]} << 8 |
                       size_t{in[in.size() - 2]} << 16 | size_t{in[in.size() - 1]} << 24;
  return isize <= in.size() * kDeflateMaxRatio ? isize : 0;
}

Bytes gunzip(const Bytes& in, const std::string& path) {
  z_stream zs{};
  // 16 + MAX_WBITS: gzip wrapper only, so the CRC and length in the trailer are checked.
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) fail(path, "zlib inflateInit2 failed");
  const size_t hint = gzip_size_hint(in);
  // +1: with room left over after the last byte, inflate reaches Z_STREAM_END without a
  // further resize.
  auto grown = [&](size_t now) {
    const size_t doubled = now * 2;
    return hint >= now && hint < doubled ? hint + 1 : doubled;
  };
  Bytes out(std::max<size_t>(std::min(hint + 1, in.size() * 4), size_t{1} << 16));
  size_t consumed = 0;
  size_t produced = 0;
  std::string error;
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
    if (rc == Z_STREAM_END) {
      if (consumed == in.size()) break;
      // Another gzip member may follow (what `cat a.gz b.gz` makes).
      Bytes rest(in.begin() + static_cast<std::ptrdiff_t>(consumed), in.begin() + static_cast<std::ptrdiff_t>(std::min(consumed + 2, in.size())));
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
      out.resize(grown(out.size()));
      continue;
    }
    if (consumed == in.size()) {  // input used up before the end of the stream
      error = "truncated gzip data (the compressed stream ends early)";
      break;
    }
  }
  inflateEnd(&zs);
  if (!error.empty()) fail(path, error);
  out.resize(produced);
  return out;
}

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
  if (bytes.size() < 4) fail(path, fmt::format("truncated: {} bytes, shorter than the 4-byte magic number", bytes.size()));
  if (bytes[0] != 0 || bytes[1] != 0) {
    fail(path, fmt::format("wrong magic number {:02x} {:02x} {:02x} {:02x}: an IDX file starts with 00 00 <type> <ndim>",
                           bytes[0], bytes[1], bytes[2], bytes[3]));
  }
  const IdxType* type = nullptr;
  for (const IdxType& t : kTypes) {
    if (t.code == bytes[2]) type = &t;
  }
  if (!type) fail(path, fmt::format("wrong magic number: unknown type code 0x{:02x}", bytes[2]));
  size_t ndim = bytes[3];
  size_t header = 4 + 4 * ndim;
  if (bytes.size() < header) {
    fail(path, fmt::format("truncated: the header of {} dimensions needs {} bytes, the file has {}", ndim, header,
                           bytes.size()));
  }
  Shape shape;
  // The product of up to 255 dimensions of 2^32 would wrap even 128 bits around to a small
  // number, so it saturates once it passes 2^64 values (more than any file holds: the file
  // is then "truncated"); below that it is exact and the message gives the real numbers. A
  // zero dimension makes it 0 whatever came before.
  constexpr unsigned __int128 kHuge = static_cast<unsigned __int128>(UINT64_MAX) + 1;
  unsigned __int128 count = 1;
  bool zero = false;
  for (size_t i = 0; i < ndim; ++i) {
    uint32_t d = be32(bytes.data() + 4 + 4 * i);
    shape.push_back(d);
    zero = zero || d == 0;
    count = std::min(count * d, kHuge);  // count <= 2^64 and d < 2^32: no wrap
  }
  if (zero) count = 0;
  const unsigned __int128 need = count * type->size;
  const size_t have = bytes.size() - header;
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
  Tensor t = Tensor::empty(shape, type->dtype);
  const uint8_t* src = bytes.data() + header;
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
  for (int64_t i = 0; i < t.numel(); ++i) {
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
  auto find = [&](const std::string& base) {
    std::filesystem::path plain = std::filesystem::path(dir) / base;
    std::filesystem::path gz = std::filesystem::path(dir) / (base + ".gz");
    std::error_code ec;
    if (std::filesystem::is_regular_file(plain, ec)) return plain.string();
    if (std::filesystem::is_regular_file(gz, ec)) return gz.string();
    TNT_INPUT_ERROR("MNIST directory '{}': neither {} nor {} exists (split '{}')", dir, base,
                    base + ".gz", split_name);
  };
  std::string images_path = find(split + "-images-idx3-ubyte");
  std::string labels_path = find(split + "-labels-idx1-ubyte");
  Tensor images = read_idx(images_path);  // u8 (N, H, W)
  Tensor labels = read_idx(labels_path);  // u8 (N,)
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
  int64_t n = images.dim(0), h = images.dim(1), w = images.dim(2);
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
  for (int64_t i = 0; i < images.numel(); ++i) dst[i] = static_cast<float>(px[i]) / 255.0f;
  for (int64_t i = 0; i < n; ++i) out.labels.data<int64_t>()[i] = lb[i];
  return out;
}

}  // namespace tnt
