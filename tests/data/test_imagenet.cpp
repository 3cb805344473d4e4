// The ImageNet input pipeline on a dataset the test writes itself: 3 classes x 4 solid-
// colour JPEGs of 32x40 in class folders (created out of order), and the same samples as
// TFRecord shards written by our writer. A sample's colour encodes its class (red) and its
// number within the class (green), so labels and order can be checked from the pixels.
#include "capture_stderr.hpp"
#include "jpeg_writer.hpp"
#include "temp_dir.hpp"
#include <catch2/catch.hpp>

#include "tarantella/imagenet.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <unistd.h>

using namespace tnt;
namespace fs = std::filesystem;

namespace {

using tnt::test::Bytes;
using tnt::test::read_bytes;
using tnt::test::write_bytes;

constexpr int kClasses = 3;
constexpr int kPerClass = 4;
constexpr int64_t kH = 32, kW = 40;
// Class folders, written in this (unsorted) order; sorted they are n01..., n02..., n03...
const char* const kWnids[kClasses] = {"n01440764", "n01443537", "n01484850"};
const int kWriteOrder[kClasses] = {2, 0, 1};

// The colour of class c's k-th image.
int red_of(int c) { return 30 + 60 * c; }
int green_of(int k) { return 30 + 40 * k; }
constexpr int kBlue = 100;
// A solid colour survives JPEG at quality 95 to within a few levels (the DC coefficient's
// quantisation step is 2, plus YCbCr rounding); 12 is well inside the spacing of 40.
constexpr double kColourTol = 12.0;

using TempDir = tnt::test::TempDir;

Bytes solid_jpeg(int r, int g, int b, int64_t h = kH, int64_t w = kW) {
  Tensor rgb = Tensor::empty({h, w, 3}, DType::u8);  // (H, W, 3)
  uint8_t* p = rgb.data<uint8_t>();
  for (int64_t i = 0; i < h * w; ++i) {
    p[3 * i] = static_cast<uint8_t>(r);
    p[3 * i + 1] = static_cast<uint8_t>(g);
    p[3 * i + 2] = static_cast<uint8_t>(b);
  }
  return encode_jpeg(rgb, 95);
}

// A solid CMYK JPEG (encode_jpeg writes RGB only). libjpeg adds the Adobe marker for CMYK
// and stores the bytes as given: Adobe's inverted convention, 255 = no ink.
Bytes solid_cmyk_jpeg(const uint8_t cmyk[4], int h, int w) {
  std::vector<uint8_t> pixels(static_cast<size_t>(h) * w * 4);  // (H, W, 4)
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = cmyk[i % 4];
  return test::write_jpeg(pixels, h, w, {4, 1, 1, false, 95});
}

// Red rises left to right, green top to bottom: crops and flips change the pixels.
Bytes gradient_jpeg(int64_t h, int64_t w) {
  Tensor rgb = Tensor::empty({h, w, 3}, DType::u8);  // (H, W, 3)
  uint8_t* p = rgb.data<uint8_t>();
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      p[(y * w + x) * 3 + 0] = static_cast<uint8_t>(255 * x / (w - 1));
      p[(y * w + x) * 3 + 1] = static_cast<uint8_t>(255 * y / (h - 1));
      p[(y * w + x) * 3 + 2] = 128;
    }
  return encode_jpeg(rgb, 95);
}

// <root>/<split>/<wnid>/img_<k>.JPEG (extensions in mixed case, to check they all count).
void write_folders(const fs::path& root, const std::string& split) {
  for (int c : kWriteOrder) {
    fs::path dir = root / split / kWnids[c];
    fs::create_directories(dir);
    for (int k = kPerClass - 1; k >= 0; --k) {
      const char* ext = k % 2 ? ".jpg" : ".JPEG";
      write_bytes(dir / (std::string("img_") + std::to_string(k) + ext), solid_jpeg(red_of(c), green_of(k), kBlue));
    }
  }
  write_bytes(root / split / kWnids[0] / "README.txt", Bytes{'h', 'i'});  // not an image: ignored
}

// The same 12 samples, in listing order, as TFRecord shards <prefix>-0000s-of-0000n with
// 1-based labels, split as evenly as the shard count allows.
std::vector<fs::path> write_shards(const fs::path& root, const std::string& prefix, int shards) {
  std::vector<fs::path> paths;
  const int total = kClasses * kPerClass;
  for (int s = 0; s < shards; ++s) {
    paths.push_back(root / fmt::format("{}-{:05d}-of-{:05d}", prefix, s, shards));
    TFRecordWriter w(paths.back().string());
    for (int i = s * total / shards; i < (s + 1) * total / shards; ++i) {
      int c = i / kPerClass, k = i % kPerClass;
      w.write(encode_example({solid_jpeg(red_of(c), green_of(k), kBlue), c + 1}));
    }
    w.close();
  }
  return paths;
}

std::vector<Element> collect(const Dataset& d, int64_t epoch = 0) {
  std::vector<Element> out;
  auto it = d.iterate(epoch);
  while (auto e = it.next()) out.push_back(std::move(*e));
  return out;
}

int64_t scalar(const Tensor& t) { return t.data<int64_t>()[0]; }

// Pixel (c, y, x) of a preprocessed image back on the 0..255 scale.
double pixel255(const Tensor& image, int c, int64_t y, int64_t x) {
  const int64_t S = image.dim(1);
  float v = image.data<float>()[(c * S + y) * S + x];
  return (v * kImagenetStd[c] + kImagenetMean[c]) * 255.0;
}

// Checks that a preprocessed solid image is sample (class, k) everywhere; returns k.
int check_solid(const Tensor& image, int64_t label) {
  REQUIRE(image.shape() == Shape{3, image.dim(1), image.dim(1)});
  const int64_t S = image.dim(1);
  double g = pixel255(image, 1, S / 2, S / 2);
  int k = static_cast<int>(std::lround((g - 30.0) / 40.0));
  REQUIRE(k >= 0);
  REQUIRE(k < kPerClass);
  for (int64_t y = 0; y < S; ++y)
    for (int64_t x = 0; x < S; ++x) {
      REQUIRE(std::abs(pixel255(image, 0, y, x) - red_of(static_cast<int>(label))) < kColourTol);
      REQUIRE(std::abs(pixel255(image, 1, y, x) - green_of(k)) < kColourTol);
      REQUIRE(std::abs(pixel255(image, 2, y, x) - kBlue) < kColourTol);
    }
  return k;
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

}  // namespace

TEST_CASE("CRC-32C known answers and TFRecord masking") {
  const std::string digits = "123456789";
  CHECK(crc32c(reinterpret_cast<const uint8_t*>(digits.data()), digits.size()) == 0xE3069283u);
  Bytes zeros(32, 0), ones(32, 0xFF);  // RFC 3720 B.4 test vectors
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);
  CHECK(crc32c(ones.data(), ones.size()) == 0x62A8AB43u);
  // Incremental use: the CRC of a whole equals the CRC continued over its parts.
  const auto* d = reinterpret_cast<const uint8_t*>(digits.data());
  CHECK(crc32c(d + 4, 5, crc32c(d, 4)) == 0xE3069283u);
  uint32_t crc = 0xE3069283u;
  CHECK(masked_crc32c(d, digits.size()) == ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST_CASE("JPEG encode/decode round trip and a non-JPEG input") {
  Bytes jpeg = solid_jpeg(200, 50, 10);
  Tensor rgb = decode_jpeg(jpeg.data(), jpeg.size(), "solid");
  REQUIRE(rgb.shape() == Shape{kH, kW, 3});
  REQUIRE(rgb.dtype() == DType::u8);
  const uint8_t* p = rgb.data<uint8_t>();
  for (int64_t i = 0; i < kH * kW; ++i) {
    REQUIRE(std::abs(p[3 * i] - 200) < kColourTol);
    REQUIRE(std::abs(p[3 * i + 1] - 50) < kColourTol);
    REQUIRE(std::abs(p[3 * i + 2] - 10) < kColourTol);
  }
  // DCT-domain downscaling: ceil(H / d) x ceil(W / d), the colour unchanged.
  for (int d : {2, 4, 8}) {
    Tensor small = decode_jpeg(jpeg.data(), jpeg.size(), "solid", d);
    REQUIRE(small.shape() == Shape{(kH + d - 1) / d, (kW + d - 1) / d, 3});
    CHECK(std::abs(small.data<uint8_t>()[0] - 200) < kColourTol);
  }
  JpegSize js = jpeg_size(jpeg.data(), jpeg.size(), "solid");
  CHECK(js.height == kH);
  CHECK(js.width == kW);
  CHECK_THROWS(decode_jpeg(jpeg.data(), jpeg.size(), "solid", 3));
  // CMYK (some ImageNet training files are): stored (255, 128, 255, 200) is no cyan, half
  // magenta, no yellow, 1 - 200/255 black, so RGB = (200, 128 * 200 / 255, 200).
  const uint8_t cmyk[4] = {255, 128, 255, 200};
  Bytes cmyk_jpeg = solid_cmyk_jpeg(cmyk, 16, 24);
  Tensor from_cmyk = decode_jpeg(cmyk_jpeg.data(), cmyk_jpeg.size(), "cmyk");
  REQUIRE(from_cmyk.shape() == Shape{16, 24, 3});
  CHECK(std::abs(from_cmyk.data<uint8_t>()[0] - 200) < kColourTol);
  CHECK(std::abs(from_cmyk.data<uint8_t>()[1] - 100) < kColourTol);
  CHECK(std::abs(from_cmyk.data<uint8_t>()[2] - 200) < kColourTol);
  const Bytes png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13};
  std::string msg = error_of([&] { decode_jpeg(png.data(), png.size(), "pictures/cat.JPEG"); });
  CHECK_THAT(msg, Catch::Contains("pictures/cat.JPEG") && Catch::Contains("not a JPEG"));
  // Found by fuzzing: a header that declares 60000 x 60000 pixels (libjpeg's own limit is
  // 65500 a side) is refused before libjpeg allocates for it (our limit is 2^27 pixels).
  // The SOF0 marker (ff c0) holds the height and width 5 and 7 bytes after it.
  Bytes giant = jpeg;
  for (size_t k = 0; k + 8 < giant.size(); ++k) {
    if (giant[k] == 0xff && giant[k + 1] == 0xc0) {
      for (size_t j = k + 5; j < k + 9; j += 2) {
        giant[j] = 0xea;  // 0xea60 = 60000
        giant[j + 1] = 0x60;
      }
      break;
    }
  }
  CHECK(jpeg_size(giant.data(), giant.size(), "giant.jpg").height == 60000);  // the header alone is fine
  msg = error_of([&] { decode_jpeg(giant.data(), giant.size(), "giant.jpg"); });
  CHECK_THAT(msg, Catch::Contains("giant.jpg") && Catch::Contains("60000 x 60000") && Catch::Contains("limit"));
  // A JPEG cut after its first 200 bytes: libjpeg's own error, still an InputError.
  // Its tables take more than 200 bytes, so it ends before any image data.
  Bytes head(jpeg.begin(), jpeg.begin() + 200);
  msg = error_of([&] { decode_jpeg(head.data(), head.size(), "cut.jpg"); });
  CHECK_THAT(msg, Catch::Contains("cut.jpg"));
  // Cut inside its image data: libjpeg only warns ("Premature end of JPEG file") and pads
  // the rest with grey; PIL and TensorFlow refuse such a file, and so do we. A noisy image,
  // so that the entropy-coded data are long enough to cut inside.
  Tensor noise = Tensor::empty({64, 64, 3}, DType::u8);  // (H, W, 3)
  for (int64_t i = 0; i < noise.numel(); ++i) noise.data<uint8_t>()[i] = static_cast<uint8_t>((i * 7919) % 251);
  Bytes noisy = encode_jpeg(noise, 95);
  REQUIRE(noisy.size() > 2000);
  decode_jpeg(noisy.data(), noisy.size(), "noisy.jpg");  // whole: fine
  Bytes cut_data(noisy.begin(), noisy.end() - static_cast<std::ptrdiff_t>(noisy.size() / 10));
  msg = error_of([&] { decode_jpeg(cut_data.data(), cut_data.size(), "train/n01/cut_data.JPEG"); });
  CHECK_THAT(msg, Catch::Contains("image 'train/n01/cut_data.JPEG'") && Catch::Contains("Premature end of JPEG file"));
  CHECK_THROWS_AS(decode_jpeg(cut_data.data(), cut_data.size(), "cut_data.JPEG"), InputError);
  for (int d : {2, 8}) CHECK_THROWS_AS(decode_jpeg(cut_data.data(), cut_data.size(), "cut_data.JPEG", d), InputError);
  // Only the end marker missing (the last 2 bytes): libjpeg's decoder reads ahead past the
  // last code and warns too; PIL refuses it as well ("image file is truncated (0 bytes not
  // processed)").
  Bytes no_eoi(noisy.begin(), noisy.end() - 2);
  CHECK_THROWS_AS(decode_jpeg(no_eoi.data(), no_eoi.size(), "no_eoi.JPEG"), InputError);
  // Damaged in the middle: a run of 0xff 0xd0 bytes (restart markers where none belong).
  Bytes garbled = noisy;
  for (size_t k = noisy.size() / 2; k < noisy.size() / 2 + 64; k += 2) {
    garbled[k] = 0xff;
    garbled[k + 1] = 0xd3;
  }
  msg = error_of([&] { decode_jpeg(garbled.data(), garbled.size(), "garbled.JPEG"); });
  CHECK_THAT(msg, Catch::Contains("image 'garbled.JPEG'") && Catch::Contains("Corrupt JPEG data"));
}

TEST_CASE("image folders: what is left out is said, once") {
  // Before, images in a folder below a class folder (torchvision's ImageFolder reads them)
  // and a broken link named .JPEG were left out without a word: 16 samples of 18.
  TempDir tmp("tnt-imagenet");
  write_folders(tmp.path, "train");
  const fs::path cls = tmp.path / "train" / kWnids[1];
  fs::create_directories(cls / "more");
  write_bytes(cls / "more" / "img_9.JPEG", solid_jpeg(1, 2, 3));
  fs::create_symlink(tmp.path / "nowhere.JPEG", cls / "broken.JPEG");
  ImageFolderListing listing;
  const std::string said =
      test::captured_stderr([&] { listing = list_image_folder((tmp.path / "train").string()); });
  CHECK(listing.files.size() == static_cast<size_t>(kClasses * kPerClass));
  CHECK_THAT(said, Catch::Contains("1 folder(s) inside class folders not read (" + std::string(kWnids[1]) + "/more/)"));
  CHECK_THAT(said, Catch::Contains("1 image name(s) that are no readable file left out (" + std::string(kWnids[1]) +
                                   "/broken.JPEG: a broken link"));
}

TEST_CASE("image folders: hidden entries are no class and no image") {
  // Before: .ipynb_checkpoints was a class of no images (an error), and macOS's ._x.JPEG
  // beside each image was decoded (not a JPEG: an error).
  TempDir tmp("tnt-imagenet");
  write_folders(tmp.path, "train");
  fs::create_directories(tmp.path / "train" / ".ipynb_checkpoints");
  const fs::path cls = tmp.path / "train" / kWnids[0];
  write_bytes(cls / "._img_0.JPEG", Bytes{0, 5, 22, 7});
  const ImageFolderListing listing = list_image_folder((tmp.path / "train").string());
  CHECK(listing.classes.size() == static_cast<size_t>(kClasses));
  CHECK(listing.files.size() == static_cast<size_t>(kClasses * kPerClass));
  for (const std::string& f : listing.files) CHECK(fs::path(f).filename().string().rfind('.', 0) != 0);
}

TEST_CASE("image folders: listing, labels, shapes and pixels") {
  TempDir tmp("tnt-imagenet");
  write_folders(tmp.path, "train");
  write_folders(tmp.path, "val");
  ImageFolderListing listing = list_image_folder((tmp.path / "train").string());
  REQUIRE(listing.classes == std::vector<std::string>(kWnids, kWnids + kClasses));
  REQUIRE(listing.files.size() == static_cast<size_t>(kClasses * kPerClass));
  for (int i = 0; i < kClasses * kPerClass; ++i) {
    CHECK(listing.labels[i] == i / kPerClass);
    CHECK(fs::path(listing.files[i]).stem().string() == "img_" + std::to_string(i % kPerClass));
  }

  Dataset raw = imagenet_dataset(tmp.path.string(), "train");
  REQUIRE(raw.cardinality() == kClasses * kPerClass);
  auto elements = collect(raw, 3);
  REQUIRE(elements.size() == static_cast<size_t>(kClasses * kPerClass));
  for (int i = 0; i < kClasses * kPerClass; ++i) {
    const Element& e = elements[i];
    REQUIRE(e.size() == 5);
    CHECK(e[0].dtype() == DType::u8);
    CHECK(e[0].ndim() == 1);
    CHECK(e[0].to_vector().size() == read_bytes(listing.files[i]).size());
    CHECK(scalar(e[1]) == i / kPerClass);
    CHECK(scalar(e[2]) == i);
    CHECK(scalar(e[3]) == 3);
  }

  for (bool training : {false, true}) {
    for (const char* split : {"train", "val", "validation"}) {
      Dataset data = imagenet_dataset(tmp.path.string(), split).map(imagenet_preprocess(16, training, 7), 2);
      auto out = collect(data);
      REQUIRE(out.size() == static_cast<size_t>(kClasses * kPerClass));
      for (int i = 0; i < kClasses * kPerClass; ++i) {
        REQUIRE(out[i].size() == 2);
        REQUIRE(out[i][0].dtype() == DType::f32);
        REQUIRE(out[i][0].shape() == Shape{3, 16, 16});
        REQUIRE(scalar(out[i][1]) == i / kPerClass);
        CHECK(check_solid(out[i][0], scalar(out[i][1])) == i % kPerClass);
      }
    }
  }
}

TEST_CASE("image folders: clear errors") {
  TempDir tmp("tnt-imagenet");
  CHECK_THAT(error_of([&] { imagenet_dataset((tmp.path / "nope").string(), "train"); }),
             Catch::Contains("nope") && Catch::Contains("does not exist"));
  CHECK_THAT(error_of([&] { imagenet_dataset(tmp.path.string(), "train"); }),
             Catch::Contains(tmp.path.string()) && Catch::Contains("train-00000-of-NNNNN"));
  CHECK_THAT(error_of([&] { imagenet_dataset(tmp.path.string(), "test"); }), Catch::Contains("'test'"));
  fs::create_directories(tmp.path / "train");
  CHECK_THAT(error_of([&] { imagenet_dataset(tmp.path.string(), "train"); }),
             Catch::Contains("no class folders"));
  write_folders(tmp.path, "train");
  fs::create_directories(tmp.path / "train" / "n09999999");
  CHECK_THAT(error_of([&] { imagenet_dataset(tmp.path.string(), "train"); }),
             Catch::Contains("n09999999") && Catch::Contains("no .JPEG"));
  fs::remove(tmp.path / "train" / "n09999999");

  // A PNG under a .JPEG name: the error comes from the map function and names the file.
  const fs::path bad = tmp.path / "train" / kWnids[1] / "img_2.JPEG";
  write_bytes(bad, {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R'});
  Dataset data = imagenet_dataset(tmp.path.string(), "train").map(imagenet_preprocess(8, true, 0), 2);
  CHECK_THAT(error_of([&] { collect(data); }), Catch::Contains(bad.string()) && Catch::Contains("not a JPEG"));

  // An empty file with a .jpg name.
  write_bytes(bad, {});
  CHECK_THAT(error_of([&] { collect(data); }), Catch::Contains(bad.string()) && Catch::Contains("0 bytes"));

  CHECK_THAT(error_of([&] { imagenet_preprocess(0, true); }), Catch::Contains("image size 0"));
  CHECK_THAT(error_of([&] { imagenet_dataset(tmp.path.string(), "train", {.layout = "zip"}); }),
             Catch::Contains("'zip'"));
}

TEST_CASE("shuffle: a permutation per epoch, reproducible for a seed") {
  TempDir tmp("tnt-imagenet");
  write_folders(tmp.path, "train");
  auto order = [&](uint64_t seed, int64_t epoch) {
    std::vector<int64_t> ids;
    for (const Element& e : collect(imagenet_dataset(tmp.path.string(), "train", {.shuffle = true, .seed = seed}), epoch)) {
      // The label travels with the sample.
      REQUIRE(scalar(e[1]) == scalar(e[2]) / kPerClass);
      ids.push_back(scalar(e[2]));
    }
    return ids;
  };
  std::vector<int64_t> a = order(5, 0);
  CHECK(order(5, 0) == a);
  CHECK(std::set<int64_t>(a.begin(), a.end()).size() == static_cast<size_t>(kClasses * kPerClass));
  CHECK(*std::min_element(a.begin(), a.end()) == 0);
  CHECK(*std::max_element(a.begin(), a.end()) == kClasses * kPerClass - 1);
  // 12! orders: a repeat by chance is as good as impossible, and fixed seeds make it certain.
  CHECK(order(5, 1) != a);
  CHECK(order(6, 0) != a);
  std::vector<int64_t> sorted(a);
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted != a);
}

TEST_CASE("augmentation: reproducible per (seed, index, epoch), crops and flips vary") {
  TempDir tmp("tnt-imagenet");
  const int64_t h = 48, w = 64;
  fs::create_directories(tmp.path / "train" / "n00000001");
  write_bytes(tmp.path / "train" / "n00000001" / "a.JPEG", gradient_jpeg(h, w));
  Dataset raw = imagenet_dataset(tmp.path.string(), "train");
  const int64_t S = 12;
  auto run = [&](uint64_t seed, int64_t epoch) {
    return collect(raw.map(imagenet_preprocess(S, true, seed)), epoch).at(0)[0].to_vector();
  };
  CHECK(run(1, 0) == run(1, 0));
  CHECK(run(1, 0) != run(1, 1));
  CHECK(run(1, 0) != run(2, 0));

  // Red rises with x in the file: a flipped output has it falling. Over 64 epochs about half
  // are flipped (binomial(64, 1/2) lies in [16, 48] except with probability < 1e-4, and the
  // seed is fixed, so this is a fixed outcome, not a flaky one).
  int flipped = 0;
  for (int64_t epoch = 0; epoch < 64; ++epoch) {
    std::vector<float> img = run(3, epoch);  // (3, S, S)
    float left = img[(0 * S + S / 2) * S + 0], right = img[(0 * S + S / 2) * S + S - 1];
    REQUIRE(left != right);
    flipped += left > right;
  }
  CHECK(flipped >= 16);
  CHECK(flipped <= 48);

  // Evaluation has no randomness: the central crop of the resized image. With S = 12 the
  // image is resized to 14 x 18 (R = round(12 * 256 / 224) = 14), so the crop starts at
  // column 3 of 18 and red at the left edge is about 255 * (3.5 * 64 / 18 - 0.5) / 63.
  std::vector<float> e0 = collect(raw.map(imagenet_preprocess(S, false, 1)), 0).at(0)[0].to_vector();
  std::vector<float> e1 = collect(raw.map(imagenet_preprocess(S, false, 2)), 5).at(0)[0].to_vector();
  CHECK(e0 == e1);
  double left_red = (e0[(0 * S + S / 2) * S + 0] * kImagenetStd[0] + kImagenetMean[0]) * 255.0;
  // Tolerance: JPEG blurs a steep gradient by a few levels; 8 covers it with room.
  CHECK(std::abs(left_red - 255.0 * (3.5 * 64.0 / 18.0 - 0.5) / 63.0) < 8.0);
}

TEST_CASE("distribute: disjoint rank shares covering the epoch; other ranks' files unread") {
  TempDir tmp("tnt-imagenet");
  write_folders(tmp.path, "train");
  const int64_t n = kClasses * kPerClass;
  Dataset raw = imagenet_dataset(tmp.path.string(), "train", {.shuffle = true, .seed = 11});
  MapFn keep_index = [](Element e) { return Element{e[2], e[1]}; };
  for (int size : {2, 3}) {
    for (int64_t global : {int64_t{4}, int64_t{6}}) {
      std::vector<int> seen(n, 0);
      for (int r = 0; r < size; ++r) {
        auto it = raw.distribute(global, r, size).map(keep_index).iterate(2);
        while (auto b = it.next())
          for (double id : b->columns[0].to_double_vector()) ++seen[static_cast<size_t>(id)];
      }
      for (int64_t i = 0; i < n; ++i) CHECK(seen[i] == 1);  // 12 is a multiple of 4 and 6
    }
  }

  // Rank 1's files are deleted (after listing): rank 0 must still run its whole epoch.
  std::vector<int64_t> rank1;
  {
    auto it = raw.distribute(4, 1, 2).map(keep_index).iterate(0);
    while (auto b = it.next())
      for (double id : b->columns[0].to_double_vector()) rank1.push_back(static_cast<int64_t>(id));
  }
  ImageFolderListing listing = list_image_folder((tmp.path / "train").string());
  for (int64_t id : rank1) fs::remove(listing.files[id]);
  int64_t samples = 0;
  auto it = raw.distribute(4, 0, 2).map(imagenet_preprocess(8, true, 0), 2).prefetch(2).iterate(0);
  while (auto b = it.next()) samples += b->real_samples;
  CHECK(samples == n / 2);
  // ... and rank 1 now names a missing file.
  CHECK_THAT(error_of([&] {
               auto it1 = raw.distribute(4, 1, 2).iterate(0);
               while (it1.next()) {}
             }),
             Catch::Contains("': no such file"));
}

TEST_CASE("TFRecord: writer, index, Example round trip, shard detection, labels") {
  TempDir tmp("tnt-imagenet");
  std::vector<fs::path> shards = write_shards(tmp.path, "train", 2);
  write_shards(tmp.path, "validation", 1);

  Bytes img = solid_jpeg(1, 2, 3, 8, 8);
  Bytes rec = encode_example({img, 417});
  ImageExample back = parse_example(rec.data(), rec.size(), "memory");
  CHECK(back.encoded == img);
  CHECK(back.label == 417);
  CHECK_THAT(error_of([&] { parse_example(img.data(), img.size(), "junk record"); }),
             Catch::Contains("junk record"));
  Bytes empty;
  CHECK_THAT(error_of([&] { parse_example(empty.data(), 0, "empty record"); }),
             Catch::Contains("no image/encoded"));

  std::vector<uint64_t> offsets = index_tfrecord(shards[0].string());
  REQUIRE(offsets.size() == 6);
  CHECK(offsets[0] == 0);
  for (size_t i = 1; i < offsets.size(); ++i) {
    Bytes r = read_tfrecord(shards[0].string(), offsets[i - 1]);
    CHECK(offsets[i] == offsets[i - 1] + 12 + r.size() + 4);
  }

  for (const char* split : {"train", "val"}) {
    auto out = collect(imagenet_dataset(tmp.path.string(), split).map(imagenet_preprocess(8, false), 2));
    REQUIRE(out.size() == static_cast<size_t>(kClasses * kPerClass));
    for (int i = 0; i < kClasses * kPerClass; ++i) {
      REQUIRE(scalar(out[i][1]) == i / kPerClass);  // stored 1-based, mapped to 0-based
      CHECK(check_solid(out[i][0], scalar(out[i][1])) == i % kPerClass);
    }
  }
  auto kept = collect(imagenet_dataset(tmp.path.string(), "train", {.one_based_labels = false}));
  for (int i = 0; i < kClasses * kPerClass; ++i) CHECK(scalar(kept[i][1]) == i / kPerClass + 1);
  // Folders win over shards with layout auto; layout picks either explicitly.
  write_folders(tmp.path, "train");
  REQUIRE(fs::remove(tmp.path / "train" / kWnids[2] / "img_2.JPEG"));
  CHECK(imagenet_dataset(tmp.path.string(), "train").cardinality() == kClasses * kPerClass - 1);
  CHECK(imagenet_dataset(tmp.path.string(), "train", {.layout = "tfrecord"}).cardinality() == 12);
}

TEST_CASE("labels beyond the model's classes name the folder, or the record's file and offset") {
  TempDir tmp("tnt-imagenet");
  write_folders(tmp.path, "train");
  const std::string split_dir = (tmp.path / "train").string();
  // 3 class folders: labels 0..2. With 2 classes, the third folder (sorted) has no label.
  CHECK(error_of([&] { image_folder_dataset(split_dir, {.num_classes = 2}); }) ==
        fmt::format("image folder '{}': 3 class folders, more than the model's 2 classes (folder '{}' would be label "
                    "2, outside [0, 2))",
                    split_dir, kWnids[2]));
  CHECK(imagenet_dataset(tmp.path.string(), "train", {.num_classes = 3}).cardinality() == kClasses * kPerClass);
  CHECK_THAT(error_of([&] { imagenet_dataset(tmp.path.string(), "train", {.num_classes = 1}); }),
             Catch::Contains("3 class folders, more than the model's 1 classes"));

  // TFRecord: 1-based labels 1..3 in one shard of 12 records, the last class's from record 8.
  std::vector<fs::path> shards = write_shards(tmp.path, "validation", 1);
  const std::string path = shards[0].string();
  const std::vector<uint64_t> offsets = index_tfrecord(path);
  Dataset d = imagenet_dataset(tmp.path.string(), "val", {.layout = "tfrecord", .num_classes = 2});
  auto it = d.iterate(0);
  for (int i = 0; i < 2 * kPerClass; ++i) REQUIRE(it.next());
  CHECK(error_of([&] { it.next(); }) ==
        fmt::format("TFRecord '{}' at byte offset {} (record 8 of the shard): label 3 is outside the model's 2 classes "
                    "(1 to 2, 1-based)",
                    path, offsets[8]));
  CHECK(collect(imagenet_dataset(tmp.path.string(), "val", {.layout = "tfrecord", .num_classes = 3})).size() == 12);
}

TEST_CASE("TFRecord: corrupt records name the file and the byte offset") {
  TempDir tmp("tnt-imagenet");
  std::vector<fs::path> shards = write_shards(tmp.path, "train", 1);
  const std::string path = shards[0].string();
  std::vector<uint64_t> offsets = index_tfrecord(path);
  const Bytes good = read_bytes(path);

  // A flipped byte in record 2's data: the index is fine, reading the record is not.
  Bytes bad = good;
  bad[offsets[2] + 12 + 40] ^= 0x01;
  write_bytes(path, bad);
  Dataset raw = imagenet_dataset(tmp.path.string(), "train");
  std::string msg = error_of([&] { collect(raw); });
  CHECK_THAT(msg, Catch::Contains(path) && Catch::Contains(fmt::format("byte offset {}", offsets[2])) &&
                      Catch::Contains("data CRC"));
  // Samples 0 and 1 still read (the error is where the damage is).
  CHECK(read_tfrecord(path, offsets[1]).size() > 0);

  // A flipped byte in record 4's length: the index scan reports it.
  bad = good;
  bad[offsets[4] + 1] ^= 0x10;
  write_bytes(path, bad);
  msg = error_of([&] { imagenet_dataset(tmp.path.string(), "train"); });
  CHECK_THAT(msg, Catch::Contains(path) && Catch::Contains(fmt::format("byte offset {}", offsets[4])) &&
                      Catch::Contains("length CRC"));

  // A file cut in the middle of its last record.
  bad.assign(good.begin(), good.end() - 7);
  write_bytes(path, bad);
  msg = error_of([&] { index_tfrecord(path); });
  CHECK_THAT(msg, Catch::Contains(fmt::format("byte offset {}", offsets.back())));
}

namespace {

// The 12 samples as tensorflow_datasets writes them into `version_dir`:
// imagenet2012-<split>.tfrecord-0000s-of-0000n, features image and label (0-based, plus
// `label_shift` so that two versions can be told apart), and the folder's JSON files.
void write_tfds(const fs::path& version_dir, const std::string& split, int shards, int label_shift = 0) {
  fs::create_directories(version_dir);
  write_bytes(version_dir / "dataset_info.json", Bytes{'{', '}'});
  write_bytes(version_dir / "features.json", Bytes{'{', '}'});
  const int total = kClasses * kPerClass;
  for (int s = 0; s < shards; ++s) {
    TFRecordWriter w((version_dir / fmt::format("imagenet2012-{}.tfrecord-{:05d}-of-{:05d}", split, s, shards)).string());
    for (int i = s * total / shards; i < (s + 1) * total / shards; ++i) {
      int c = i / kPerClass, k = i % kPerClass;
      Bytes jpeg = solid_jpeg(red_of(c), green_of(k), kBlue);
      Example ex;
      ex.bytes_features["image"] = {std::string(jpeg.begin(), jpeg.end())};
      ex.bytes_features["file_name"] = {fmt::format("{}_{}.JPEG", kWnids[c], k)};
      ex.int64_features["label"] = {c + label_shift};
      w.write(serialize_example(ex));
    }
    w.close();
  }
}

}  // namespace

TEST_CASE("tensorflow_datasets layout: data_dir, dataset folder or version folder; the highest version") {
  TempDir tmp("tnt-imagenet");
  const fs::path dataset = tmp.path / "imagenet2012";
  // 5.9.0 and 5.10.0: numerically 5.10.0 is newer, as text it is not. 5.9.0's labels are
  // shifted by 100 so that reading it shows.
  write_tfds(dataset / "5.9.0", "train", 2, 100);
  write_tfds(dataset / "5.10.0", "train", 3);
  write_tfds(dataset / "5.10.0", "validation", 1);
  fs::create_directories(dataset / "5.10.0.incomplete7XYZ");  // a download in progress: not a version
  fs::create_directories(tmp.path / "downloads");

  for (const fs::path& dir : {tmp.path, dataset}) {
    INFO("data_dir " << dir);
    ImagenetLayout l = find_imagenet_layout(dir.string(), "train");
    CHECK(l.kind == "tfds");
    CHECK(l.version == "5.10.0");
    CHECK(l.dir == (dataset / "5.10.0").string());
    REQUIRE(l.shards.size() == 3);
    CHECK(l.shards[2] == (dataset / "5.10.0" / "imagenet2012-train.tfrecord-00002-of-00003").string());
    CHECK(l.describe() == fmt::format("train data: tensorflow_datasets version 5.10.0 in '{}' (3 shards; features "
                                      "image, label 0-based)",
                                      l.dir));
    for (const char* split : {"train", "val"}) {
      // Labels as stored (0-based), even with one_based_labels left at its default.
      auto out = collect(imagenet_dataset(dir.string(), split).map(imagenet_preprocess(8, false), 2));
      REQUIRE(out.size() == static_cast<size_t>(kClasses * kPerClass));
      for (int i = 0; i < kClasses * kPerClass; ++i) {
        REQUIRE(scalar(out[i][1]) == i / kPerClass);
        CHECK(check_solid(out[i][0], scalar(out[i][1])) == i % kPerClass);
      }
    }
  }
  // A version folder itself is read as given, even an older one.
  ImagenetLayout old = find_imagenet_layout((dataset / "5.9.0").string(), "train");
  CHECK(old.version == "5.9.0");
  CHECK(scalar(collect(imagenet_dataset((dataset / "5.9.0").string(), "train"))[0][1]) == 100);
  // layout = "tfds" skips the others; folders still win with auto.
  write_folders(tmp.path, "train");
  CHECK(find_imagenet_layout(tmp.path.string(), "train").kind == "folders");
  CHECK(find_imagenet_layout(tmp.path.string(), "train", "tfds").kind == "tfds");
  CHECK(imagenet_dataset(tmp.path.string(), "train", {.layout = "tfds"}).cardinality() == 12);
  // The Model Garden layout is named as such.
  TempDir garden("tnt-imagenet");
  write_shards(garden.path, "train", 2);
  ImagenetLayout g = find_imagenet_layout(garden.path.string(), "train");
  CHECK(g.kind == "tfrecord");
  CHECK_THAT(g.describe(), Catch::Contains("TF Model Garden") && Catch::Contains("2 shards"));
}

TEST_CASE("tensorflow_datasets and Model Garden layouts: errors name the folder and what was expected") {
  TempDir tmp("tnt-imagenet");
  const fs::path dataset = tmp.path / "imagenet2012";
  // The newest version has no train files (only its JSON files and validation).
  write_tfds(dataset / "5.0.0", "train", 1);
  write_tfds(dataset / "5.1.0", "validation", 1);
  const std::string v510 = (dataset / "5.1.0").string();
  CHECK(error_of([&] { find_imagenet_layout(tmp.path.string(), "train"); }) ==
        fmt::format("tensorflow_datasets version folder '{}' holds no train files (expected "
                    "imagenet2012-train.tfrecord-00000-of-NNNNN ...)",
                    v510));
  // A missing shard, and shards that disagree on their count.
  write_tfds(dataset / "5.1.0", "train", 3);
  fs::remove(dataset / "5.1.0" / "imagenet2012-train.tfrecord-00001-of-00003");
  CHECK(error_of([&] { find_imagenet_layout(tmp.path.string(), "train"); }) ==
        fmt::format("'{}': <dataset>-train.tfrecord shard 00001 of 00003 is missing (2 of 3 present)", v510));
  write_bytes(dataset / "5.1.0" / "imagenet2012-train.tfrecord-00001-of-00004", Bytes{});
  CHECK_THAT(error_of([&] { find_imagenet_layout(tmp.path.string(), "train"); }),
             Catch::Contains(v510) && Catch::Contains("disagree on their count") && Catch::Contains("says 4"));
  // A dataset folder without any version folder.
  TempDir empty("tnt-imagenet");
  fs::create_directories(empty.path / "imagenet2012");
  CHECK_THAT(error_of([&] { find_imagenet_layout(empty.path.string(), "train"); }),
             Catch::Contains((empty.path / "imagenet2012").string()) && Catch::Contains("no version folder"));
  // Model Garden: a missing shard is an error too (it used to be a warning).
  TempDir garden("tnt-imagenet");
  write_shards(garden.path, "train", 3);
  fs::remove(garden.path / "train-00002-of-00003");
  CHECK(error_of([&] { imagenet_dataset(garden.path.string(), "train"); }) ==
        fmt::format("'{}': train-NNNNN-of-MMMMM shard 00002 of 00003 is missing (2 of 3 present)", garden.path.string()));
  // Nothing at all: all three layouts are named.
  TempDir nothing("tnt-imagenet");
  CHECK_THAT(error_of([&] { imagenet_dataset(nothing.path.string(), "train"); }),
             Catch::Contains("train/<wnid>/*.JPEG") && Catch::Contains("train-00000-of-NNNNN") &&
                 Catch::Contains("imagenet2012/<version>/imagenet2012-train.tfrecord-00000-of-NNNNN"));
  CHECK_THAT(error_of([&] { find_imagenet_layout(nothing.path.string(), "train", "jpeg"); }),
             Catch::Contains("'jpeg'"));
}

// A validation split whose class folders are not the training split's: without the training
// split's names, its sorted folders are labels 0, 1, ... of its own, so a missing class
// shifts every later label by one (what resnet50 did before). With class_names (the
// training split's) the labels go by name, and a folder of a class the training split lacks
// is refused, naming it.
TEST_CASE("image folders: another split labelled by the training split's class names") {
  TempDir tmp("tnt-imagenet");
  write_folders(tmp.path, "train");
  write_folders(tmp.path, "val");
  fs::remove_all(tmp.path / "val" / kWnids[0]);
  const std::vector<std::string> train_classes = image_folder_classes((tmp.path / "train").string());
  REQUIRE(train_classes == std::vector<std::string>(kWnids, kWnids + kClasses));

  ImagenetOptions by_name;
  by_name.class_names = train_classes;
  const auto labels = [](const Dataset& d) {
    std::vector<int64_t> out;
    for (const Element& e : collect(d)) out.push_back(scalar(e[1]));
    return out;
  };
  std::vector<int64_t> expected;
  for (int c = 1; c < kClasses; ++c) expected.insert(expected.end(), kPerClass, c);
  CHECK(labels(image_folder_dataset((tmp.path / "val").string(), by_name)) == expected);
  // Its own folders alone: the shift that class_names prevents.
  CHECK(labels(image_folder_dataset((tmp.path / "val").string())).front() == 0);

  fs::create_directories(tmp.path / "val" / "n99999999");
  fs::copy_file(tmp.path / "val" / kWnids[1] / "img_0.JPEG", tmp.path / "val" / "n99999999" / "img_0.JPEG");
  CHECK_THROWS_AS(image_folder_dataset((tmp.path / "val").string(), by_name), InputError);
  CHECK_THROWS_WITH(image_folder_dataset((tmp.path / "val").string(), by_name),
                    Catch::Contains((tmp.path / "val").string()) &&
                        Catch::Contains("1 class folder is not among the training split's 3 classes: 'n99999999'"));
}
