// Decoding part of a JPEG (runtime/src/data/jpeg_region.hpp), which ImageNet preprocessing
// uses for the box it resamples: the part's pixels must be the whole decode's, bit for bit,
// for every chroma subsampling, grayscale, CMYK, progressive files and every DCT scale; and
// a damaged file must be refused whatever part is asked for.
#include "data/jpeg_region.hpp"
#include "jpeg_writer.hpp"
#include "tarantella/imagenet.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <cstdlib>
#include <vector>


using namespace tnt;
using Bytes = std::vector<uint8_t>;

namespace {

struct Kind {
  const char* name;
  int components;  // 1 grayscale, 3 RGB, 4 CMYK
  int h_samp, v_samp;  // the luma's sampling factors (chroma at 1): 2x2 is 4:2:0
  bool progressive;
};

// A noisy diagonal ramp of the kind's layout.
Bytes write_jpeg(const Kind& k, int h, int w, uint64_t seed) {
  std::vector<uint8_t> pixels(static_cast<size_t>(h) * w * k.components);  // (H, W, components)
  uint64_t s = seed;
  for (size_t i = 0; i < pixels.size(); ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    const size_t x = i / k.components % w, y = i / k.components / w;
    pixels[i] = static_cast<uint8_t>(x * 3 + y * (1 + i % k.components) + (s & 63));
  }
  return test::write_jpeg(pixels, h, w, {k.components, k.h_samp, k.v_samp, k.progressive, 90});
}

const Kind kKinds[] = {
    {"4:2:0", 3, 2, 2, false}, {"4:4:4", 3, 1, 1, false}, {"4:2:2", 3, 2, 1, false},
    {"4:4:0", 3, 1, 2, false}, {"4:1:1", 3, 4, 1, false}, {"grayscale", 1, 1, 1, false},
    {"CMYK", 4, 1, 1, false},  {"4:2:0 progressive", 3, 2, 2, true},
    // Decoded whole (libjpeg-turbo 2.1 narrows and skips these inexactly): still exact.
    {"luma 2x4", 3, 2, 4, false}, {"luma 4x2", 3, 4, 2, false},
};

// How many of the region's asked pixels differ from the whole decode's (-1: the region does
// not cover what was asked).
int64_t differing(const Tensor& whole, const detail::JpegRegion& r, int64_t top, int64_t rows, int64_t left,
                  int64_t cols) {
  const int64_t W = whole.dim(1), RW = r.rgb.dim(1);
  if (r.rgb.ndim() != 3 || r.rgb.dim(0) != rows || r.rgb.dim(2) != 3 || r.col0 > left || r.col0 + RW < left + cols)
    return -1;
  const uint8_t* a = whole.data<uint8_t>();
  const uint8_t* b = r.rgb.data<uint8_t>();
  int64_t n = 0;
  for (int64_t y = 0; y < rows; ++y)
    for (int64_t x = left; x < left + cols; ++x)
      for (int64_t c = 0; c < 3; ++c)
        n += a[((top + y) * W + x) * 3 + c] != b[(y * RW + x - r.col0) * 3 + c];
  return n;
}

// An undecoded ImageNet element (bytes, label, index, epoch, source), as the sources give.
Element element(const Bytes& jpeg, int64_t index, const std::string& source) {
  auto u8 = [](const void* p, size_t n) {
    Tensor t = Tensor::empty({static_cast<int64_t>(n)}, DType::u8);
    std::memcpy(t.raw(), p, n);
    return t;
  };
  auto i64 = [](int64_t v) { return Tensor::from_data(&v, {}); };
  return {u8(jpeg.data(), jpeg.size()), i64(3), i64(index), i64(0), u8(source.data(), source.size())};
}

}  // namespace

TEST_CASE("a part of a JPEG decodes to the whole decode's pixels", "[data][jpeg]") {
  uint64_t s = 0x51ed27a3;
  auto next = [&](int64_t n) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return static_cast<int64_t>(s % static_cast<uint64_t>(n));
  };
  int k_index = 0;
  for (const Kind& k : kKinds) {
    // Sizes off the 16-pixel blocks, different for each kind.
    const int h = 131 + 7 * k_index, w = 197 - 5 * k_index;
    const Bytes jpeg = write_jpeg(k, h, w, 1 + k_index++);
    for (int d : {1, 2, 4, 8}) {
      DYNAMIC_SECTION(k.name << " at 1/" << d) {
        const Tensor whole = decode_jpeg(jpeg.data(), jpeg.size(), "whole.jpg", d);  // (H, W, 3)
        const int64_t H = whole.dim(0), W = whole.dim(1);
        REQUIRE(H == detail::jpeg_scaled_side(h, d));
        REQUIRE(W == detail::jpeg_scaled_side(w, d));
        // The corners, whole rows, whole columns, the whole image, then random boxes. Before
        // the margin in decode_jpeg_region, about 1 in 3 random boxes of the 4:2:0, 4:2:2 and
        // progressive files differed in their outermost columns.
        std::vector<std::array<int64_t, 4>> boxes = {{0, 1, 0, 1},         {H - 1, 1, W - 1, 1}, {0, H, 0, W},
                                                     {H / 2, 1, 0, W},     {0, H, W / 2, 1},     {0, H, 0, 1},
                                                     {0, H, W - 1, 1},     {H / 3, H / 3, W / 3, W / 3}};
        for (int t = 0; t < 60; ++t) {
          const int64_t top = next(H), left = next(W);
          boxes.push_back({top, 1 + next(H - top), left, 1 + next(W - left)});
        }
        for (const auto& [top, rows, left, cols] : boxes) {
          const detail::JpegRegion r =
              detail::decode_jpeg_region(jpeg.data(), jpeg.size(), "part.jpg", d, top, rows, left, cols);
          INFO("rows [" << top << ", " << top + rows << "), columns [" << left << ", " << left + cols
                        << "); decoded from column " << r.col0 << ", " << r.rgb.str());
          CHECK(differing(whole, r, top, rows, left, cols) == 0);
        }
      }
    }
  }
}

TEST_CASE("a part of a damaged JPEG is refused as the whole is", "[data][jpeg]") {
  const Bytes jpeg = write_jpeg(kKinds[0], 160, 200, 9);
  REQUIRE(jpeg.size() > 4000);
  auto error_of = [](auto f) -> std::string {
    try {
      f();
    } catch (const InputError& e) {
      return e.what();
    }
    return "(no InputError)";
  };
  // Cut inside the image data, only the end marker gone, or garbled in the middle: the first
  // rows alone are intact, and still the file is refused (its codes are read to the end).
  const Bytes cut(jpeg.begin(), jpeg.end() - static_cast<std::ptrdiff_t>(jpeg.size() / 10));
  const Bytes no_eoi(jpeg.begin(), jpeg.end() - 2);
  auto garbled_at = [&](size_t at) {
    Bytes g = jpeg;
    for (size_t k = at; k < at + 64; k += 2) {
      g[k] = 0xff;
      g[k + 1] = 0xd3;
    }
    return g;
  };
  const Bytes early = garbled_at(jpeg.size() / 4), late = garbled_at(jpeg.size() * 3 / 4);
  for (int d : {1, 4}) {
    const int64_t H = detail::jpeg_scaled_side(160, d);
    for (const auto& [what, bytes] :
         {std::pair{"cut", &cut}, {"no_eoi", &no_eoi}, {"garbled early", &early}, {"garbled late", &late}}) {
      const std::string whole = error_of([&] { decode_jpeg(bytes->data(), bytes->size(), "train/n01/x.JPEG", d); });
      for (int64_t top : {int64_t{0}, H - 4}) {
        INFO(what << " at 1/" << d << ", rows from " << top);
        const std::string part = error_of(
            [&] { detail::decode_jpeg_region(bytes->data(), bytes->size(), "train/n01/x.JPEG", d, top, 4, 0, 8); });
        CHECK_THAT(part, Catch::Contains("image 'train/n01/x.JPEG'"));
        CHECK(part == whole);
      }
    }
  }
  // Stopping after the rows (to_end false, for a file once read whole) does not see damage
  // below them, and gives the same pixels.
  const detail::JpegRegion good = detail::decode_jpeg_region(jpeg.data(), jpeg.size(), "x.jpg", 1, 0, 4, 0, 8);
  for (const Bytes* bytes : {&cut, &no_eoi, &late}) {
    const detail::JpegRegion r = detail::decode_jpeg_region(bytes->data(), bytes->size(), "x.jpg", 1, 0, 4, 0, 8, false);
    CHECK(r.rgb.to_vector() == good.rgb.to_vector());
  }
  // A box outside the image is a caller's bug, named as such.
  CHECK_THROWS_WITH(detail::decode_jpeg_region(jpeg.data(), jpeg.size(), "x.jpg", 1, 150, 20, 0, 8),
                    Catch::Contains("not inside image 'x.jpg' (160 x 200 at 1/1)"));
  CHECK_THROWS(detail::decode_jpeg_region(jpeg.data(), jpeg.size(), "x.jpg", 2, 0, 1, 99, 2));
  CHECK_THROWS(detail::decode_jpeg_region(jpeg.data(), jpeg.size(), "x.jpg", 1, 0, 0, 0, 8));
}

TEST_CASE("preprocessing reads the decoded part at the right place", "[data][jpeg]") {
  // Evaluation of a 480 x 640 ramp (red rises with x, green with y) at 224: the image is
  // resized to 256 x 341 and its central 224 x 224 taken, so the part decoded starts near
  // row 30 and column 100 of the file (no DCT scaling: 640 / 2 < 341). Each output pixel
  // must show the ramp's value where it samples; reading the part as if it started at the
  // image's corner would be 15 levels off in green and 38 in red.
  const int64_t h = 480, w = 640, S = 224;
  Tensor rgb = Tensor::empty({h, w, 3}, DType::u8);  // (H, W, 3)
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      uint8_t* p = rgb.data<uint8_t>() + (y * w + x) * 3;
      p[0] = static_cast<uint8_t>(255 * x / (w - 1));
      p[1] = static_cast<uint8_t>(255 * y / (h - 1));
      p[2] = 128;
    }
  const Bytes jpeg = encode_jpeg(rgb, 95);
  const Tensor out = imagenet_preprocess(S, false, 1)(element(jpeg, 0, "val/n01/ramp.JPEG"))[0];  // (3, S, S)
  REQUIRE(out.shape() == Shape{3, S, S});
  const float* v = out.data<float>();
  const double rh = 256, rw = std::floor(256.0 * 640.0 / 480.0);  // the resized image
  const double top = std::llround((rh - S) / 2.0), left = std::llround((rw - S) / 2.0);
  double worst = 0;
  for (int64_t oy = 0; oy < S; ++oy)
    for (int64_t ox = 0; ox < S; ++ox) {
      const double sy = (top + oy + 0.5) * h / rh - 0.5, sx = (left + ox + 0.5) * w / rw - 0.5;
      const double want[2] = {255.0 * sx / (w - 1), 255.0 * sy / (h - 1)};
      for (int c = 0; c < 2; ++c) {
        const double got = (v[(c * S + oy) * S + ox] * kImagenetStd[c] + kImagenetMean[c]) * 255.0;
        worst = std::max(worst, std::abs(got - want[c]));
      }
    }
  // Tolerance: the ramp's integer steps (1 level) and JPEG's error on a smooth ramp at
  // quality 95 (a few levels); an offset of the part is 15 levels or more.
  CHECK(worst < 6.0);
}

TEST_CASE("preprocessing reads a file to its end once, then only the rows it needs", "[data][jpeg]") {
  // A file whose end marker is missing: libjpeg reads its pixels, and refuses it only on
  // reaching the end, which the central crop of an evaluation does not need.
  Tensor rgb = Tensor::empty({96, 64, 3}, DType::u8);  // (H, W, 3)
  for (int64_t i = 0; i < rgb.numel(); ++i) rgb.data<uint8_t>()[i] = static_cast<uint8_t>((i * 7919) % 251);
  const Bytes good = encode_jpeg(rgb, 90);
  const Bytes no_eoi(good.begin(), good.end() - 2);
  for (bool training : {false, true}) {
    INFO((training ? "training" : "evaluation"));
    MapFn f = imagenet_preprocess(16, training, 1);
    // First read of sample 5: to the end, so the damaged file is refused.
    CHECK_THROWS_AS(f(element(no_eoi, 5, "train/n01/a.JPEG")), InputError);
    const std::vector<float> first = f(element(good, 5, "train/n01/a.JPEG"))[0].to_vector();
    // Sample 5 has been read whole: a later read stops below its rows (the damaged bytes
    // stand in for a file that would need the end to be refused). Where the crop reaches
    // the last rows, the end is read all the same, so only the evaluation is sure to pass.
    if (!training) {
      CHECK(f(element(no_eoi, 5, "train/n01/a.JPEG"))[0].to_vector() == first);
    }
    CHECK(f(element(good, 5, "train/n01/a.JPEG"))[0].to_vector() == first);
    // The same index with another file's name, or another index: read to the end.
    CHECK_THROWS_AS(f(element(no_eoi, 5, "val/n02/b.JPEG")), InputError);
    CHECK_THROWS_AS(f(element(no_eoi, 6, "train/n01/a.JPEG")), InputError);
    // A new map function knows no file.
    CHECK_THROWS_AS(imagenet_preprocess(16, training, 1)(element(no_eoi, 5, "train/n01/a.JPEG")), InputError);
  }
}
