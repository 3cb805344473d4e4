// ImageNet preprocessing (imagenet_preprocess, tarantella/imagenet.hpp): decoding the box a
// sample keeps, resampling it to S x S and normalising.
//
// Preprocessing follows torchvision's ImageNet recipe, with one difference: resizing is
// bilinear interpolation at the sample point (as tf.image.resize without antialias and
// OpenCV's INTER_LINEAR), not PIL's antialiased filter. A shrink by 2x or more happens
// first in libjpeg's DCT domain (decode at 1/2, 1/4, 1/8: fast, and an average rather
// than a sample), so only the last factor below 2 is plain bilinear.
//   training    RandomResizedCrop(S, scale = (0.08, 1), ratio = (3/4, 4/3)): 10 attempts
//               at an area fraction U(0.08, 1) and a log-uniform aspect ratio, accepted
//               when the box fits; else the whole image clipped to the ratio range, centred.
//               Then a horizontal flip with probability 1/2.
//   evaluation  shorter side resized to R = round(S * 256 / 224) (the longer one to
//               floor(R * long / short)), then the central S x S (offsets rounded).
//   both        pixels / 255, minus kImagenetMean, divided by kImagenetStd; f32 (3, S, S).
// Randomness: CounterRng(seed, key(index, epoch)), counters 4a..4a+3 for attempt a's
// (scale, ratio, top, left) and 40 for the flip.
// Only the pixels the resampling reads are reconstructed (detail::decode_jpeg_region), and a
// file once read to its end is later read only down to the rows it needs.
#include "tarantella/imagenet.hpp"

#include "data/dataset_node.hpp"  // detail::mix64
#include "data/jpeg_region.hpp"
#include "tarantella/log.hpp"
#include "tarantella/random.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tnt {
namespace {

Tensor scalar_i64(int64_t v) { return Tensor::from_data(&v, {}); }

// Bilinear resampling of the box (y0, x0, h, w) (source pixels, fractional allowed) to
// S x S, sampling at pixel centres; source coordinates are clamped to the integer box
// [lo, hi] (the crop for training: as if cropped first). A Tap is one output row's (or
// column's) two source rows and the weight of the second.
struct Tap {
  int64_t i0, i1;
  float f;
};
std::vector<Tap> resample_taps(int64_t S, double start, double len, int64_t lo, int64_t hi) {
  std::vector<Tap> t(static_cast<size_t>(S));
  for (int64_t o = 0; o < S; ++o) {
    double s = start + (static_cast<double>(o) + 0.5) * len / static_cast<double>(S) - 0.5;
    s = std::clamp(s, static_cast<double>(lo), static_cast<double>(hi));
    int64_t i0 = static_cast<int64_t>(std::floor(s));
    t[static_cast<size_t>(o)] = {i0, std::min(i0 + 1, hi), static_cast<float>(s - static_cast<double>(i0))};
  }
  return t;
}

// The source rows (or columns) the taps read, [first, last].
std::pair<int64_t, int64_t> tap_span(const std::vector<Tap>& t) {
  int64_t first = t.front().i0, last = t.front().i1;
  for (const Tap& a : t) first = std::min(first, a.i0), last = std::max(last, a.i1);
  return {first, last};
}

// img: u8 (rows, W, 3) holding source rows row0.. and columns col0.. (a decoded region);
// out: f32 (3, S, S), normalised.
void resample(const uint8_t* img, int64_t W, int64_t row0, int64_t col0, const std::vector<Tap>& ty,
              std::vector<Tap> tx, int64_t S, bool flip, float* out) {
  for (Tap& b : tx) b.i0 -= col0, b.i1 -= col0;  // columns of the region
  float scale[3], shift[3];  // v * scale + shift == (v / 255 - mean) / std
  for (int c = 0; c < 3; ++c) {
    scale[c] = 1.0f / (255.0f * kImagenetStd[c]);
    shift[c] = -kImagenetMean[c] / kImagenetStd[c];
  }
  const int64_t plane = S * S;
  for (int64_t oy = 0; oy < S; ++oy) {
    const Tap& a = ty[static_cast<size_t>(oy)];
    const uint8_t* r0 = img + (a.i0 - row0) * W * 3;
    const uint8_t* r1 = img + (a.i1 - row0) * W * 3;
    for (int64_t ox = 0; ox < S; ++ox) {
      const Tap& b = tx[static_cast<size_t>(flip ? S - 1 - ox : ox)];
      for (int c = 0; c < 3; ++c) {
        float top = r0[b.i0 * 3 + c] + b.f * (static_cast<float>(r0[b.i1 * 3 + c]) - r0[b.i0 * 3 + c]);
        float bot = r1[b.i0 * 3 + c] + b.f * (static_cast<float>(r1[b.i1 * 3 + c]) - r1[b.i0 * 3 + c]);
        float v = top + a.f * (bot - top);
        out[c * plane + oy * S + ox] = v * scale[c] + shift[c];
      }
    }
  }
}

struct Box {
  int64_t top, left, height, width;
};

Box random_resized_crop(int64_t H, int64_t W, const CounterRng& rng) {
  const double area = static_cast<double>(H) * static_cast<double>(W);
  const double log_lo = std::log(3.0 / 4.0), log_hi = std::log(4.0 / 3.0);
  for (int a = 0; a < 10; ++a) {
    double target = area * (0.08 + (1.0 - 0.08) * rng.uniform(4 * a + 0));
    double ratio = std::exp(log_lo + (log_hi - log_lo) * rng.uniform(4 * a + 1));
    int64_t w = std::llround(std::sqrt(target * ratio));
    int64_t h = std::llround(std::sqrt(target / ratio));
    if (w > 0 && h > 0 && w <= W && h <= H) {
      int64_t top = static_cast<int64_t>(rng.uniform(4 * a + 2) * static_cast<double>(H - h + 1));
      int64_t left = static_cast<int64_t>(rng.uniform(4 * a + 3) * static_cast<double>(W - w + 1));
      return {std::min(top, H - h), std::min(left, W - w), h, w};
    }
  }
  const double in_ratio = static_cast<double>(W) / static_cast<double>(H);
  int64_t w = W, h = H;
  if (in_ratio < 3.0 / 4.0) {
    h = std::min<int64_t>(H, std::llround(static_cast<double>(W) / (3.0 / 4.0)));
  } else if (in_ratio > 4.0 / 3.0) {
    w = std::min<int64_t>(W, std::llround(static_cast<double>(H) * (4.0 / 3.0)));
  }
  return {(H - h) / 2, (W - w) / 2, h, w};
}

const Tensor& column(const Element& e, size_t i, DType dtype, int ndim, const char* what) {
  TNT_CHECK(e.size() > i && e[i].defined() && e[i].dtype() == dtype && e[i].ndim() == ndim,
            "imagenet_preprocess: element column {} ({}) is not a {} tensor of {} dimensions; the input "
            "must be an undecoded ImageNet element (see tarantella/imagenet.hpp)",
            i, what, dtype_name(dtype), ndim);
  return e[i];
}

// The samples whose file has been read to its end once (decode_jpeg_region's to_end): by
// sample index, with a hash of the file's name, so that a map function shared by two
// datasets never takes one's file for the other's. A sample's later reads stop below the
// rows they need; a damaged file is still refused, at its first read. 8 bytes a sample
// (10 MB for ImageNet's training set), shared by the map function's workers.
class FilesReadWhole {
 public:
  bool contains(int64_t index, uint64_t name_hash) const {
    std::lock_guard<std::mutex> lock(mu_);
    return index >= 0 && static_cast<size_t>(index) < hashes_.size() &&
           hashes_[static_cast<size_t>(index)] == (name_hash | 1);
  }
  void add(int64_t index, uint64_t name_hash) {
    if (index < 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    const size_t i = static_cast<size_t>(index);
    if (i >= hashes_.size()) hashes_.resize(std::max(i + 1, 2 * hashes_.size()), 0);
    hashes_[i] = name_hash | 1;  // never 0, which marks a sample not yet read whole
  }

 private:
  mutable std::mutex mu_;
  std::vector<uint64_t> hashes_;
};

}  // namespace

MapFn imagenet_preprocess(int64_t image_size, bool training, uint64_t seed) {
  if (image_size < 1) TNT_INPUT_ERROR("imagenet_preprocess: image size {} must be positive", image_size);
  const int64_t S = image_size;
  // Evaluation's resize target: 256 for 224, scaled with the image size.
  const int64_t R = std::max<int64_t>(S, std::llround(static_cast<double>(S) * 256.0 / 224.0));
  auto read_whole = std::make_shared<FilesReadWhole>();
  return [S, R, training, seed, read_whole](Element e) -> Element {
    const Tensor& bytes = column(e, 0, DType::u8, 1, "bytes");
    const int64_t label = column(e, 1, DType::i64, 0, "label").data<int64_t>()[0];
    const int64_t index = column(e, 2, DType::i64, 0, "index").data<int64_t>()[0];
    const int64_t epoch = column(e, 3, DType::i64, 0, "epoch").data<int64_t>()[0];
    const Tensor& src = column(e, 4, DType::u8, 1, "source");
    std::string source(reinterpret_cast<const char*>(src.data<uint8_t>()), static_cast<size_t>(src.numel()));

    const uint8_t* data = bytes.data<uint8_t>();
    const size_t size = static_cast<size_t>(bytes.numel());
    const JpegSize js = jpeg_size(data, size, source);
    const int64_t H = js.height, W = js.width;
    // The box to resample in original pixels, and the (h, w) it must keep when shrunk in
    // the DCT domain: the largest 1/d that still leaves at least the pixels the plain
    // resize would have used, so the result only gets smoother, never coarser.
    double y0 = 0, x0 = 0, bh = 0, bw = 0;
    int64_t need_h = 0, need_w = 0;
    int64_t clamp[4] = {0, H - 1, 0, W - 1};  // y_lo, y_hi, x_lo, x_hi in original pixels
    bool flip = false;
    if (training) {
      uint64_t key = detail::mix64(detail::mix64(static_cast<uint64_t>(epoch)) + static_cast<uint64_t>(index));
      CounterRng rng(seed, key);
      Box b = random_resized_crop(H, W, rng);
      flip = rng.uniform(40) < 0.5f;
      y0 = static_cast<double>(b.top), x0 = static_cast<double>(b.left);
      bh = static_cast<double>(b.height), bw = static_cast<double>(b.width);
      clamp[0] = b.top, clamp[1] = b.top + b.height - 1, clamp[2] = b.left, clamp[3] = b.left + b.width - 1;
      need_h = S * H / b.height, need_w = S * W / b.width;  // whole-image size at the crop's scale
    } else {
      int64_t rh = R, rw = R;  // the resized image (rh, rw)
      if (W <= H) rh = R * H / W; else rw = R * W / H;
      const int64_t top = std::llround(static_cast<double>(rh - S) / 2.0);
      const int64_t left = std::llround(static_cast<double>(rw - S) / 2.0);
      const double sy = static_cast<double>(H) / static_cast<double>(rh);
      const double sx = static_cast<double>(W) / static_cast<double>(rw);
      y0 = static_cast<double>(top) * sy, x0 = static_cast<double>(left) * sx;
      bh = static_cast<double>(S) * sy, bw = static_cast<double>(S) * sx;
      need_h = rh, need_w = rw;
    }
    int d = 1;
    for (int cand : {8, 4, 2})
      if (H / cand >= need_h && W / cand >= need_w) { d = cand; break; }
    // Only the source pixels the taps read are decoded (detail::decode_jpeg_region): a
    // training crop is on average about half the image, so reconstructing the rest (its
    // inverse DCT, upsampling and colour conversion) would be wasted.
    const int64_t Hs = detail::jpeg_scaled_side(H, d), Ws = detail::jpeg_scaled_side(W, d);
    const double fy = static_cast<double>(Hs) / static_cast<double>(H);
    const double fx = static_cast<double>(Ws) / static_cast<double>(W);
    auto lo = [](int64_t v, double f) { return static_cast<int64_t>(std::floor(static_cast<double>(v) * f)); };
    auto hi = [](int64_t v, double f, int64_t n) {
      return std::min<int64_t>(n - 1, static_cast<int64_t>(std::ceil(static_cast<double>(v + 1) * f)) - 1);
    };
    const std::vector<Tap> ty = resample_taps(S, y0 * fy, bh * fy, lo(clamp[0], fy), hi(clamp[1], fy, Hs));
    const std::vector<Tap> tx = resample_taps(S, x0 * fx, bw * fx, lo(clamp[2], fx), hi(clamp[3], fx, Ws));
    const auto [row0, row1] = tap_span(ty);
    const auto [col0, col1] = tap_span(tx);
    const uint64_t name_hash = std::hash<std::string>{}(source);
    const bool to_end = !read_whole->contains(index, name_hash);
    detail::JpegRegion region =
        detail::decode_jpeg_region(data, size, source, d, row0, row1 - row0 + 1, col0, col1 - col0 + 1, to_end);
    if (to_end) read_whole->add(index, name_hash);
    Tensor image = Tensor::empty({3, S, S});  // (3, S, S)
    resample(region.rgb.data<uint8_t>(), region.rgb.dim(1), row0, region.col0, ty, tx, S, flip,
             image.data<float>());
    return Element{std::move(image), scalar_i64(label)};
  };
}

}  // namespace tnt
