// safetensors reader and atomic writer (format and guarantees in tarantella/checkpoint.hpp).
//
// Atomicity rests on POSIX rename(2) replacing the target in one step within a directory.
// Before the rename the data must be on disk (fsync of the temporary file), and after it
// the directory entry too (fsync of the directory); otherwise a power cut could leave
// the new name pointing at an empty file.
#include "tarantella/checkpoint.hpp"
#include "io/temp_files.hpp"
#include "tarantella/files.hpp"

#include <nlohmann/json.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

namespace tnt {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data are little-endian");

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

// A header larger than this is not a checkpoint header (the reference reader's limit).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  TNT_INPUT_ERROR("safetensors file '{}': {}", path, what);
}

const DType kDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8};

bool parse_dtype(const std::string& name, DType* out) {
  for (DType d : kDTypes) {
    if (name == dtype_safetensors(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// A write that fails (a full disk, a file-size limit) names the file being written, not its
// temporary, and says that nothing was replaced: an error for the user, without the source
// location an internal error carries.
[[noreturn]] void write_failed(const std::string& path, const std::string& what) {
  throw Error(fmt::format("writing '{}' failed: {} (a file already there is kept as it was)", path, what));
}

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, std::min<size_t>(bytes, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) write_failed(path, n < 0 ? std::strerror(errno) : "no progress");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void read_all(int fd, void* data, size_t bytes, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = ::pread(fd, p, std::min<size_t>(bytes, size_t{1} << 30), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) bad_file(path, fmt::format("read error: {}", std::strerror(errno)));
    if (n == 0) bad_file(path, "the file ended early while reading");
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

std::string build_header(const NamedTensors& tensors, const Metadata& metadata, const std::string& path) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__") {
      TNT_INPUT_ERROR("write_safetensors '{}': invalid tensor name '{}'", path, name);
    }
    if (!names.insert(name).second) {
      TNT_INPUT_ERROR("write_safetensors '{}': tensor name '{}' appears twice", path, name);
    }
    if (!t.defined()) TNT_INPUT_ERROR("write_safetensors '{}': tensor '{}' is undefined", path, name);
    Json entry = Json::object();
    entry["dtype"] = dtype_safetensors(t.dtype());
    entry["shape"] = t.shape();
    entry["data_offsets"] = {offset, offset + t.nbytes()};
    header[name] = entry;
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the buffer then starts 8-byte aligned
  return text;
}

}  // namespace

void write_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  std::string header = build_header(tensors, metadata, path);
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string base = target.filename().string();
  if (base.empty()) TNT_INPUT_ERROR("write_safetensors '{}': not a file name", path);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    TNT_INPUT_ERROR("write_safetensors '{}': directory '{}' does not exist", path, dir.string());
  }

  // A dead writer's temporary file goes first: on a nearly full disk, the space it holds is
  // what this write needs (after a SIGKILL mid-save, every later save failed for it).
  io::remove_stale_temps(dir, base);
  std::string tmp = io::temp_template(dir, base);
  Fd fd(::mkstemp(tmp.data()));
  if (fd.get() < 0) {
    TNT_INPUT_ERROR("write_safetensors '{}': cannot create a temporary file in '{}': {}", path,
                    dir.string(), std::strerror(errno));
  }
  try {
    // mkstemp makes 0600; a checkpoint is an ordinary file (0666 less the umask).
    ::fchmod(fd.get(), 0666 & ~io::current_umask());

    unsigned char len[8];
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    write_all(fd.get(), len, 8, path);
    write_all(fd.get(), header.data(), header.size(), path);
    for (const auto& [name, t] : tensors) {
      // Files hold the logical (row-major) order, whatever the tensor's memory format.
      const Tensor host = (t.device().is_cpu() ? t : t.to(Device::cpu())).contiguous();
      write_all(fd.get(), host.raw(), host.nbytes(), path);
    }
    if (::fsync(fd.get()) != 0) write_failed(path, fmt::format("fsync: {}", std::strerror(errno)));
    if (::close(fd.release()) != 0) write_failed(path, fmt::format("close: {}", std::strerror(errno)));
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      write_failed(path, fmt::format("renaming '{}' to it: {}", tmp, std::strerror(errno)));
    }
  } catch (...) {
    fd.reset();
    ::unlink(tmp.c_str());
    throw;
  }
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY));
  if (dfd.get() < 0 || ::fsync(dfd.get()) != 0) {
    TNT_THROW("write_safetensors '{}': fsync of directory '{}' failed: {}", path, dir.string(), std::strerror(errno));
  }
  io::remove_stale_temps(dir, base);
}

SafetensorsFile read_safetensors(const std::string& path) {
  check_regular_file(path, "safetensors file");  // before open: a FIFO's would wait for a writer
  Fd fd(::open(path.c_str(), O_RDONLY));
  if (fd.get() < 0) bad_file(path, fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) bad_file(path, fmt::format("cannot stat: {}", std::strerror(errno)));
  if (S_ISDIR(st.st_mode)) bad_file(path, "is a directory");
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) bad_file(path, fmt::format("{} bytes is too short for the 8-byte header length", size));
  unsigned char len[8];
  read_all(fd.get(), len, 8, 0, path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | len[i];
  if (n > size - 8) bad_file(path, fmt::format("header length {} exceeds the {} bytes after the length field", n, size - 8));
  if (n > kMaxHeaderBytes) bad_file(path, fmt::format("header length {} is over the limit of {}", n, kMaxHeaderBytes));
  std::string text(n, '\0');
  read_all(fd.get(), text.data(), n, 8, path);
  uint64_t buffer_start = 8 + n;
  uint64_t buffer_size = size - buffer_start;

  Json header;
  try {
    header = Json::parse(text);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number too large
    bad_file(path, fmt::format("the header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) bad_file(path, "the header is not a JSON object");

  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  SafetensorsFile out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const Json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad_file(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) bad_file(path, fmt::format("metadata value of '{}' is not a string", m.key()));
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { bad_file(path, fmt::format("tensor '{}': {}", name, what)); };
    if (!v.is_object()) bad("entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) bad("no dtype string");
    if (!v.contains("shape") || !v["shape"].is_array()) bad("no shape array");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2) {
      bad("data_offsets is not an array of two numbers");
    }
    Entry e;
    e.name = name;
    std::string dtype = v["dtype"].get<std::string>();
    if (!parse_dtype(dtype, &e.dtype)) bad(fmt::format("unsupported dtype '{}'", dtype));
    unsigned __int128 count = 1;
    for (const Json& d : v["shape"]) {
      if (!d.is_number_unsigned()) bad(fmt::format("shape {} has an entry that is not a non-negative integer", v["shape"].dump()));
      // A zero dimension makes every count fine, so each dimension is bounded on its own.
      if (d.get<uint64_t>() > 0x7fffffffffffffffu) {
        bad(fmt::format("shape {} has a dimension over 2^63", v["shape"].dump()));
      }
      e.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
      count *= d.get<uint64_t>();
      if (count > buffer_size) {
        bad(fmt::format("shape {} has more elements than the {} bytes of data after the header (a file cut short?)",
                        v["shape"].dump(), buffer_size));
      }
    }
    for (const Json& o : v["data_offsets"]) {
      if (!o.is_number_unsigned()) bad(fmt::format("data_offsets {} are not non-negative integers", v["data_offsets"].dump()));
    }
    e.begin = v["data_offsets"][0].get<uint64_t>();
    e.end = v["data_offsets"][1].get<uint64_t>();
    if (e.begin > e.end) bad(fmt::format("data_offsets [{}, {}] end before they begin", e.begin, e.end));
    if (e.end > buffer_size) {
      // The header is whole and the data are not: the usual sign of a copy or a write that
      // did not finish.
      bad(fmt::format("data_offsets [{}, {}] end past the {} bytes of data after the header: the file is cut short "
                      "by at least {} bytes (a copy or a write that did not finish?)",
                      e.begin, e.end, buffer_size, e.end - buffer_size));
    }
    uint64_t need = static_cast<uint64_t>(count) * dtype_size(e.dtype);
    if (e.end - e.begin != need) {
      bad(fmt::format("data_offsets [{}, {}] hold {} bytes but {} {} needs {}", e.begin, e.end, e.end - e.begin,
                      dtype, shape_str(e.shape), need));
    }
    entries.push_back(std::move(e));
  }
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].begin < entries[i - 1].end) {
      bad_file(path, fmt::format("tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", entries[i - 1].name,
                                 entries[i - 1].begin, entries[i - 1].end, entries[i].name, entries[i].begin,
                                 entries[i].end));
    }
  }
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin) read_all(fd.get(), t.raw(), e.end - e.begin, buffer_start + e.begin, path);
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace tnt
