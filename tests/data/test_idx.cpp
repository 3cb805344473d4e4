// IDX files: hand-made bytes (plain and gzip, from zlib directly), our writer, every kind
// of broken file, the MNIST directory loader, and the real Fashion-MNIST package.
#include "temp_dir.hpp"
#include <catch2/catch.hpp>
#include <zlib.h>

#include "tarantella/idx.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <chrono>
#include <csignal>
#include <fstream>
#include <numeric>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace tnt;
namespace fs = std::filesystem;

namespace {

using tnt::test::Bytes;
using tnt::test::read_bytes;
using tnt::test::write_bytes;

using TempDir = tnt::test::TempDir;

Bytes gzip(const Bytes& raw) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  Bytes out(deflateBound(&zs, raw.size()) + 64);
  zs.next_in = const_cast<Bytef*>(raw.data());
  zs.avail_in = static_cast<uInt>(raw.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// u8 (2, 3) = 1..6, exactly as the format lays it out.
Bytes small_u8() { return {0, 0, 0x08, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6}; }

// Runs `body` in a child process whose address space may grow by at most `headroom` bytes
// beyond what it has at the fork, and returns the child's exit code (-1 when it had to be
// killed). An allocation that a file cannot justify then fails inside the child (as
// std::bad_alloc) instead of taking the machine's memory. The wait is bounded.
int exit_code_with_memory_cap(size_t headroom, const std::function<int()>& body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;  // first field: the address space in pages
    const rlim_t cap = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + headroom;
    rlimit limit{cap, cap};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(90);
    int code = 91;
    try {
      code = body();
    } catch (...) {
      code = 92;
    }
    ::_exit(code);
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("read_idx reads hand-made files, plain and gzip, whatever their names", "[idx]") {
  TempDir dir("tnt-idx");
  write_bytes(dir.file("a.idx"), small_u8());
  write_bytes(dir.file("b.idx"), gzip(small_u8()));        // gzip without .gz in the name
  write_bytes(dir.file("c.idx.gz"), small_u8());           // plain despite the name
  for (const char* name : {"a.idx", "b.idx", "c.idx.gz"}) {
    Tensor t = read_idx(dir.file(name));
    CHECK(t.dtype() == DType::u8);
    CHECK(t.shape() == Shape{2, 3});
    CHECK(t.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});
  }
  // Big-endian values of the wider types: i16 -2 (ff fe), i32 258 (00 00 01 02),
  // f32 1.5 (3f c0 00 00), f64 -2.0 (c0 00 ...), i8 -1 (ff).
  write_bytes(dir.file("i16"), {0, 0, 0x0B, 1, 0, 0, 0, 1, 0xff, 0xfe});
  write_bytes(dir.file("i32"), {0, 0, 0x0C, 1, 0, 0, 0, 1, 0, 0, 1, 2});
  write_bytes(dir.file("f32"), {0, 0, 0x0D, 1, 0, 0, 0, 1, 0x3f, 0xc0, 0, 0});
  write_bytes(dir.file("f64"), {0, 0, 0x0E, 1, 0, 0, 0, 1, 0xc0, 0, 0, 0, 0, 0, 0, 0});
  write_bytes(dir.file("i8"), {0, 0, 0x09, 1, 0, 0, 0, 1, 0xff});
  CHECK(read_idx(dir.file("i16")).to_double_vector() == std::vector<double>{-2});
  CHECK(read_idx(dir.file("i16")).dtype() == DType::i32);
  CHECK(read_idx(dir.file("i32")).to_double_vector() == std::vector<double>{258});
  CHECK(read_idx(dir.file("f32")).to_double_vector() == std::vector<double>{1.5});
  CHECK(read_idx(dir.file("f64")).to_double_vector() == std::vector<double>{-2.0});
  CHECK(read_idx(dir.file("i8")).to_double_vector() == std::vector<double>{-1});
  // Zero samples is a valid file.
  write_bytes(dir.file("empty"), {0, 0, 0x08, 3, 0, 0, 0, 0, 0, 0, 0, 28, 0, 0, 0, 28});
  CHECK(read_idx(dir.file("empty")).shape() == Shape{0, 28, 28});
}

TEST_CASE("write_idx round-trips through read_idx", "[idx]") {
  TempDir dir("tnt-idx");
  std::vector<float> v(2 * 3 * 4);
  std::iota(v.begin(), v.end(), -5.25f);
  Tensor f = Tensor::from_vector(v, {2, 3, 4});
  std::vector<int32_t> iv = {-70000, 0, 1, 70000};
  Tensor i = Tensor::from_data(iv.data(), {4});
  std::vector<uint8_t> uv = {0, 7, 255};
  Tensor u = Tensor::from_data(uv.data(), {3});
  for (bool gz : {false, true}) {
    write_idx(dir.file("f"), f, gz);
    write_idx(dir.file("i"), i, gz);
    write_idx(dir.file("u"), u, gz);
    CHECK((read_bytes(dir.file("f"))[0] == 0x1f) == gz);
    Tensor f2 = read_idx(dir.file("f"));
    CHECK(f2.shape() == f.shape());
    CHECK(f2.to_vector() == v);
    CHECK(read_idx(dir.file("i")).to_double_vector() == std::vector<double>{-70000, 0, 1, 70000});
    CHECK(read_idx(dir.file("u")).to_vector() == std::vector<float>{0, 7, 255});
  }
  write_idx(dir.file("plain"), u);
  CHECK(read_bytes(dir.file("plain")) == Bytes{0, 0, 0x08, 1, 0, 0, 0, 3, 0, 7, 255});
  CHECK_THROWS_AS(write_idx(dir.file("x"), Tensor::zeros({2}, DType::i64)), InputError);
}

TEST_CASE("read_idx names the file in every error", "[idx]") {
  TempDir dir("tnt-idx");
  auto expect_error = [&](const std::string& name, const Bytes& bytes, const std::string& what) {
    std::string path = dir.file(name);
    write_bytes(path, bytes);
    CAPTURE(name);
    CHECK_THROWS_AS(read_idx(path), InputError);
    CHECK_THROWS_WITH(read_idx(path), Catch::Contains(path) && Catch::Contains(what));
  };
  Bytes good = small_u8();
  Bytes truncated(good.begin(), good.end() - 2);
  Bytes longer = good;
  longer.push_back(9);
  expect_error("truncated", truncated, "truncated");
  expect_error("longer", longer, "length mismatch");
  expect_error("magic", Bytes{1, 0, 0x08, 1, 0, 0, 0, 1, 5}, "wrong magic number");
  expect_error("type", Bytes{0, 0, 0x07, 1, 0, 0, 0, 1, 5}, "unknown type code 0x07");
  expect_error("short", Bytes{0, 0}, "truncated");
  expect_error("header", Bytes{0, 0, 0x08, 3, 0, 0, 0, 1}, "truncated");
  expect_error("empty", Bytes{}, "truncated");
  expect_error("gz-truncated", gzip(truncated), "truncated");
  expect_error("gz-longer", gzip(longer), "length mismatch");
  // The numbers are the header's, not clamped to the file's size: 10000 labels declared,
  // 5000 bytes there (the first 5008 bytes of a t10k labels file); 3 f64 values in 2 bytes.
  Bytes cut_labels(8 + 5000, 7);
  const Bytes label_header = {0, 0, 0x08, 1, 0, 0, 0x27, 0x10};
  std::copy(label_header.begin(), label_header.end(), cut_labels.begin());
  expect_error("cut-labels", cut_labels,
               "truncated: 10000 values of u8 with dimensions (10000,) need 10000 data bytes, the file has 5000");
  expect_error("cut-f64", Bytes{0, 0, 0x0E, 1, 0, 0, 0, 3, 1, 2},
               "truncated: 3 values of f64 with dimensions (3,) need 24 data bytes, the file has 2");

  // Broken gzip: the compressed stream cut short, and a flipped byte (caught by the
  // deflate decoder or, failing that, by the CRC in the trailer).
  std::vector<uint8_t> big(5000);
  for (size_t k = 0; k < big.size(); ++k) big[k] = static_cast<uint8_t>((k * 7919) % 251);
  const Bytes raw_header = {0, 0, 0x08, 1, 0, 0, 0x13, 0x88};
  Bytes raw(raw_header.size() + big.size());
  std::copy(raw_header.begin(), raw_header.end(), raw.begin());
  std::copy(big.begin(), big.end(), raw.begin() + static_cast<std::ptrdiff_t>(raw_header.size()));
  Bytes gz = gzip(raw);
  write_bytes(dir.file("ok.gz"), gz);
  CHECK(read_idx(dir.file("ok.gz")).numel() == 5000);
  expect_error("cut.gz", Bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2)), "truncated gzip");
  Bytes flipped = gz;
  flipped[gz.size() / 2] ^= 0x5a;
  expect_error("flip.gz", flipped, "gzip data");
  Bytes garbage = gz;
  garbage.push_back(0x00);
  garbage.push_back(0x42);
  expect_error("garbage.gz", garbage, "corrupt gzip");

  // A gzip trailer (ISIZE, the uncompressed size mod 2^32) that claims 4 GiB for 18 bytes
  // of data: the reader must not believe it, and must say which file lies.
  Bytes liar = gzip(small_u8());
  for (size_t k = liar.size() - 4; k < liar.size(); ++k) liar[k] = 0xff;
  expect_error("liar.gz", liar, "gzip");

  // Found by fuzzing: 255 dimensions of 2^32 - 1 whose product wraps 128 bits around; the
  // count saturates instead, so the file is "truncated", not a tensor of wrapped size.
  Bytes wrap = {0, 0, 0x08, 255};
  for (int k = 0; k < 255; ++k) wrap.insert(wrap.end(), {0xff, 0xff, 0xff, 0xff});
  expect_error("wrap", wrap, "truncated: dimensions (4294967295, 4294967295, ");
  expect_error("wrap-end", wrap, ") of u8 need more than 2^64 data bytes, the file has 0");
  Bytes zero_dim = {0, 0, 0x08, 3, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
  write_bytes(dir.file("zero-dim"), zero_dim);
  CHECK(read_idx(dir.file("zero-dim")).numel() == 0);  // an empty tensor is a valid file

  std::string missing = dir.file("does-not-exist");
  CHECK_THROWS_WITH(read_idx(missing), Catch::Contains(missing) && Catch::Contains("no such file"));
}

TEST_CASE("read_idx allocates what a gzip file holds, not what its trailer claims", "[idx]") {
  TempDir dir("tnt-idx");
  Bytes liar = gzip(small_u8());
  for (size_t k = liar.size() - 4; k < liar.size(); ++k) liar[k] = 0xff;  // ISIZE = 4 GiB - 1
  const std::string path = dir.file("liar-images-idx3-ubyte.gz");
  write_bytes(path, liar);
  // 256 MiB of headroom: far more than 18 bytes need, far less than the trailer's 4 GiB.
  const int code = exit_code_with_memory_cap(size_t{256} << 20, [&] {
    try {
      read_idx(path);
      return 1;  // accepted a file whose trailer lies
    } catch (const InputError& e) {
      return std::string(e.what()).find(path) != std::string::npos ? 0 : 2;
    } catch (const std::bad_alloc&) {
      return 3;  // believed the trailer
    }
  });
  INFO("child exit code " << code << " (0: InputError naming the file, 1: no error, 2: error without the "
                          "file's name, 3: std::bad_alloc, 9x: the child's own set-up)");
  CHECK(code == 0);

  // The same data with an honest trailer, and a larger file whose honest size is many times
  // the compressed size (so the buffer has to grow as data arrives), both read back exactly.
  write_bytes(dir.file("honest.gz"), gzip(small_u8()));
  CHECK(read_idx(dir.file("honest.gz")).to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});
  Bytes zeros = {0, 0, 0x08, 1, 0, 0x10, 0, 0};  // u8 (1048576,), all zero: compresses ~1000:1
  zeros.resize(zeros.size() + (size_t{1} << 20), 0);
  zeros.back() = 7;
  write_bytes(dir.file("zeros.gz"), gzip(zeros));
  Tensor z = read_idx(dir.file("zeros.gz"));
  REQUIRE(z.numel() == (int64_t{1} << 20));
  CHECK(z.data<uint8_t>()[0] == 0);
  CHECK(z.data<uint8_t>()[(1 << 20) - 1] == 7);
}

TEST_CASE("load_mnist_dir loads plain and gzip files and checks the counts", "[idx]") {
  TempDir dir("tnt-idx");
  // 3 images of 2x2: pixel values 0, 51, 102, 255 ...; labels 4, 0, 9.
  std::vector<uint8_t> px = {0, 51, 102, 255, 1, 2, 3, 4, 255, 255, 0, 0};
  write_idx(dir.file("train-images-idx3-ubyte"), Tensor::from_data(px.data(), {3, 2, 2}));
  std::vector<uint8_t> lb = {4, 0, 9};
  write_idx(dir.file("train-labels-idx1-ubyte.gz"), Tensor::from_data(lb.data(), {3}), true);
  MnistSplit s = load_mnist_dir(dir.path.string(), "train");
  CHECK(s.images.shape() == Shape{3, 1, 2, 2});
  CHECK(s.images.dtype() == DType::f32);
  CHECK(s.labels.shape() == Shape{3});
  CHECK(s.labels.dtype() == DType::i64);
  std::vector<float> want;
  for (uint8_t p : px) want.push_back(static_cast<float>(p) / 255.0f);
  CHECK(s.images.to_vector() == want);
  CHECK(s.labels.to_double_vector() == std::vector<double>{4, 0, 9});
  CHECK(s.file_samples == 3);
  // max_samples keeps the first samples only (and says how many the files hold); more than
  // there are keeps all of them.
  MnistSplit first = load_mnist_dir(dir.path.string(), "train", MnistExpect{.max_samples = 2});
  CHECK(first.images.shape() == Shape{2, 1, 2, 2});
  CHECK(first.images.to_vector() == std::vector<float>(want.begin(), want.begin() + 8));
  CHECK(first.labels.to_double_vector() == std::vector<double>{4, 0});
  CHECK(first.file_samples == 3);
  CHECK(load_mnist_dir(dir.path.string(), "train", MnistExpect{.max_samples = 5}).images.dim(0) == 3);
  CHECK_THROWS_WITH(load_mnist_dir(dir.path.string(), "train", MnistExpect{.max_samples = -1}),
                    Catch::Contains("max_samples -1 must be at least 0"));

  // Counts that disagree, and a missing split.
  std::vector<uint8_t> lb2 = {1, 2};
  write_idx(dir.file("t10k-images-idx3-ubyte.gz"), Tensor::from_data(px.data(), {3, 2, 2}), true);
  write_idx(dir.file("t10k-labels-idx1-ubyte"), Tensor::from_data(lb2.data(), {2}));
  CHECK_THROWS_WITH(load_mnist_dir(dir.path.string(), "test"),
                    Catch::Contains("3 images") && Catch::Contains("2 labels"));
  CHECK_THROWS_WITH(load_mnist_dir(dir.path.string(), "val"), Catch::Contains("val-images-idx3-ubyte"));
  // Labels stored as a 2-D file are rejected with the file's name.
  write_idx(dir.file("odd-images-idx3-ubyte"), Tensor::from_data(px.data(), {3, 2, 2}));
  write_idx(dir.file("odd-labels-idx1-ubyte"), Tensor::from_data(px.data(), {3, 4}));
  CHECK_THROWS_WITH(load_mnist_dir(dir.path.string(), "odd"), Catch::Contains("odd-labels-idx1-ubyte"));
  // Both a plain file and a gzipped one: the same data (gunzip -k) load; other data (a stale
  // file of another dataset beside the download) are refused, naming both. Before, the plain
  // file was read without a word.
  write_idx(dir.file("train-images-idx3-ubyte.gz"), Tensor::from_data(px.data(), {3, 2, 2}), true);
  CHECK(load_mnist_dir(dir.path.string(), "train").images.to_vector() == want);
  std::vector<uint8_t> other = px;
  other[5] = 7;
  write_idx(dir.file("train-images-idx3-ubyte"), Tensor::from_data(other.data(), {3, 2, 2}));
  CHECK_THROWS_WITH(load_mnist_dir(dir.path.string(), "train"),
                    Catch::Contains("train-images-idx3-ubyte and train-images-idx3-ubyte.gz both exist and hold "
                                    "different data") &&
                        Catch::Contains("remove the one that is not this dataset"));
  // A directory where the file should be is named as such (it said "neither ... exists").
  std::filesystem::create_directory(dir.file("dirs-images-idx3-ubyte.gz"));
  CHECK_THROWS_WITH(load_mnist_dir(dir.path.string(), "dirs"),
                    Catch::Contains("dirs-images-idx3-ubyte.gz is not a regular file"));
}

TEST_CASE("load_mnist_dir names the file and the sample of a label outside the classes, and images of another size",
          "[idx]") {
  TempDir dir("tnt-idx");
  std::vector<uint8_t> px(4 * 3 * 2, 7);  // 4 images of 3x2
  write_idx(dir.file("train-images-idx3-ubyte"), Tensor::from_data(px.data(), {4, 3, 2}));
  std::vector<uint8_t> lb = {9, 0, 12, 3};
  const std::string labels = dir.file("train-labels-idx1-ubyte.gz");
  write_idx(labels, Tensor::from_data(lb.data(), {4}), true);
  CHECK_THROWS_WITH(load_mnist_dir(dir.path.string(), "train"),
                    Catch::Equals("IDX file '" + labels + "': label 12 of sample 2 (0-based) is outside the 10 classes [0, 10)"));
  // More classes allowed (EMNIST), or none checked.
  MnistSplit s = load_mnist_dir(dir.path.string(), "train", {.num_classes = 13});
  CHECK(s.labels.to_double_vector() == std::vector<double>{9, 0, 12, 3});
  CHECK_THROWS_WITH(load_mnist_dir(dir.path.string(), "train", {.num_classes = 12}),
                    Catch::Contains("label 12 of sample 2 (0-based) is outside the 12 classes [0, 12)"));
  CHECK_NOTHROW(load_mnist_dir(dir.path.string(), "train", {.num_classes = 0}));
  // Only the samples kept are checked.
  CHECK(load_mnist_dir(dir.path.string(), "train", {.max_samples = 2}).labels.to_double_vector() ==
        std::vector<double>{9, 0});
  // Image size.
  const std::string images = dir.file("train-images-idx3-ubyte");
  CHECK_NOTHROW(load_mnist_dir(dir.path.string(), "train", {.num_classes = 13, .height = 3, .width = 2}));
  CHECK_THROWS_WITH(load_mnist_dir(dir.path.string(), "train", {.num_classes = 13, .height = 28, .width = 28}),
                    Catch::Equals("IDX file '" + images + "': its images are 3x2, expected 28x28"));
  CHECK_THROWS_WITH(load_mnist_dir(dir.path.string(), "train", {.num_classes = 13, .height = 3, .width = 5}),
                    Catch::Contains("its images are 3x2, expected 3x5"));
}

TEST_CASE("the Fashion-MNIST package loads", "[idx][fashion-mnist]") {
  // Installed by scripts/setup (Debian package dataset-fashion-mnist).
  const char* env = std::getenv("TNT_TEST_FASHION_MNIST_DIR");
  std::string dir = env ? env : "/usr/share/datasets/fashion-mnist";
  MnistSplit test = load_mnist_dir(dir, "t10k");
  CHECK(test.images.shape() == Shape{10000, 1, 28, 28});
  CHECK(test.labels.shape() == Shape{10000});
  std::vector<double> labels = test.labels.to_double_vector();
  std::vector<int> per_class(10, 0);
  for (double l : labels) {
    REQUIRE(l >= 0);
    REQUIRE(l <= 9);
    ++per_class[static_cast<int>(l)];
  }
  CHECK(per_class == std::vector<int>(10, 1000));  // the test split is balanced
  CHECK(std::vector<double>(labels.begin(), labels.begin() + 4) == std::vector<double>{9, 2, 1, 1});

  MnistSplit train = load_mnist_dir(dir, "train");
  CHECK(train.images.shape() == Shape{60000, 1, 28, 28});
  std::vector<double> tl = train.labels.to_double_vector();
  CHECK(std::vector<double>(tl.begin(), tl.begin() + 10) == std::vector<double>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5});
  // The first training image's bytes sum to 76247; scaled by 1/255 in f32 the sum agrees to
  // within 784 roundings of about 3e-8 relative each.
  std::vector<float> first = train.images.slice_rows(0, 1).to_vector();
  double sum = 0;
  float lo = 1, hi = 0;
  for (float x : first) {
    sum += x;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  CHECK(sum * 255.0 == Approx(76247.0).epsilon(1e-5));
  CHECK(lo >= 0.0f);
  CHECK(hi <= 1.0f);
}

// A gzip bomb: a header that says 10 images of 28x28 (7,856 bytes in all) in a file that
// inflates to 64 MiB of zeros (about 64 KB compressed). The reader stops once the data pass
// what the header gives, with a message naming the file, instead of inflating all of it
// (the case: 6.4 GB and a bare std::bad_alloc). Run with 32 MiB of headroom: today's
// whole-file inflation needs twice that. And a header whose counts no gzip file of its size
// can hold (10^9 images) is refused before anything is inflated past the header.
TEST_CASE("read_idx stops inflating where the header's size ends, and bounds its counts", "[idx]") {
  TempDir dir("tnt-idx");
  Bytes bomb = {0, 0, 0x08, 3, 0, 0, 0, 10, 0, 0, 0, 28, 0, 0, 0, 28};
  bomb.resize(size_t{64} << 20, 0);
  const std::string path = dir.file("bomb-images-idx3-ubyte.gz");
  write_bytes(path, gzip(bomb));
  const int code = exit_code_with_memory_cap(size_t{32} << 20, [&] {
    try {
      read_idx(path);
      return 1;
    } catch (const InputError& e) {
      const std::string what = e.what();
      return what.find(path) != std::string::npos && what.find("more than the 7856 bytes its header gives") !=
                 std::string::npos ? 0 : 2;
    } catch (const std::bad_alloc&) {
      return 3;  // inflated past the header's size
    }
  });
  INFO("child exit code " << code << " (0: InputError naming the file and the header's size, 1: no error, 2: another "
                          "message, 3: std::bad_alloc, 9x: the child's own set-up)");
  CHECK(code == 0);

  // 10^9 images of 28x28 claimed by a file of a few dozen bytes.
  Bytes claim = {0, 0, 0x08, 3, 0x3b, 0x9a, 0xca, 0x00, 0, 0, 0, 28, 0, 0, 0, 28, 1, 2, 3};
  const std::string claim_path = dir.file("claim.gz");
  write_bytes(claim_path, gzip(claim));
  CHECK_THROWS_WITH(read_idx(claim_path),
                    Catch::Contains(claim_path) && Catch::Contains("(1000000000, 28, 28) of u8") &&
                        Catch::Contains("inflates to at most"));
}

// Special files given as data: /dev/zero would be read without end, a FIFO's open waits for
// a writer that never comes (CTest's timeout ends that test), a directory is no data.
TEST_CASE("read_idx refuses what is not a regular file, naming it", "[idx]") {
  TempDir dir("tnt-idx");
  const std::string fifo = dir.file("fifo-images-idx3-ubyte");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string& path : {std::string("/dev/zero"), fifo, dir.path.string()}) {
    CAPTURE(path);
    CHECK_THROWS_AS(read_idx(path), InputError);
    CHECK_THROWS_WITH(read_idx(path), Catch::Contains(path) && Catch::Contains("not a regular file"));
  }
}
