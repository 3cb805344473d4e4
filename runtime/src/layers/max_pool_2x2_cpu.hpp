// Max pooling 2x2 with stride 2 and no padding on NCHW planes, the CPU's common case (the
// Fashion-MNIST CNN pools twice per step this way), eight windows at a time with AVX2; a
// row's last run of fewer than eight is masked (a scalar loop without AVX2).
//
// The rules are max_pool_plain's (layers/pooling.cpp), compare for compare: in a window
// (a b / c d) b beats a when larger, or when b is a NaN and a is not; d beats c likewise;
// the bottom pair's winner beats the top's when larger or a NaN, unless the top's is a NaN.
// So values, ties (the first maximum in row-major order) and NaNs (the first NaN) are the
// plain loop's, and so is each argmax. The backward writes every element of a window once
// (the windows do not overlap): 0 + dy at the argmax, 0 elsewhere, the bits of the plain
// loop's zero fill and addition (0 + -0 is +0 there too).
#pragma once

#include <algorithm>
#include <cstdint>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace tnt::detail {

// max_pool_2x2_row's windows from ow on, one at a time: its tail without AVX2 (and what the
// tests compare its vectors with).
template <bool kReLU = false>
inline void max_pool_2x2_row_scalar(const float* r0, const float* r1, float* y, int32_t* arg, int64_t ow,
                                    int64_t wo, int32_t base, int32_t w) {
  for (; ow < wo; ++ow) {
    float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
    if constexpr (kReLU) {
      a = a > 0.0f ? a : 0.0f;
      b = b > 0.0f ? b : 0.0f;
      c = c > 0.0f ? c : 0.0f;
      d = d > 0.0f ? d : 0.0f;
    }
    const bool pick_b = b > a || (b != b && a == a);
    const float top = pick_b ? b : a;
    const int32_t top_i = pick_b ? 1 : 0;
    const bool pick_d = d > c || (d != d && c == c);
    const float bottom = pick_d ? d : c;
    const int32_t bottom_i = pick_d ? w + 1 : w;
    const bool pick_bottom = (bottom > top || bottom != bottom) && top == top;
    y[ow] = pick_bottom ? bottom : top;
    arg[ow] = base + static_cast<int32_t>(2 * ow) + (pick_bottom ? bottom_i : top_i);
  }
}

// One output row: r0 and r1 are input rows 2*oh and 2*oh + 1 of a plane w wide, base their
// first element's index in the plane (2 * oh * w); y and arg take wo outputs. With kReLU the
// window's elements are ReLU's outputs first (x > 0 ? x : 0, so a NaN becomes 0): the
// values, ties and argmax of a ReLU followed by this pooling (layers/relu_max_pool_fusion.cpp).
template <bool kReLU = false>
inline void max_pool_2x2_row(const float* r0, const float* r1, float* y, int32_t* arg, int64_t wo, int32_t base,
                             int32_t w) {
  int64_t ow = 0;
#if defined(__AVX2__)
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  // Lanes below n (n may be negative or above 8).
  auto lanes_below = [&](int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(n < 0 ? 0 : n > 8 ? 8 : n)), lane);
  };
  // Even and odd elements of 16 consecutive floats, in order (the first `n` of them read).
  auto split = [&](const float* p, int64_t n, __m256& even, __m256& odd) {
    const __m256 lo = n >= 16 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes_below(n));
    const __m256 hi = n >= 16 ? _mm256_loadu_ps(p + 8) : _mm256_maskload_ps(p + 8, lanes_below(n - 8));
    // Within each 128-bit lane: (lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6); then pairs 0 2 1 3.
    even = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0))), _MM_SHUFFLE(3, 1, 2, 0)));
    odd = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1))), _MM_SHUFFLE(3, 1, 2, 0)));
  };
  // second beats first: larger, or a NaN where first is not one.
  auto beats = [](__m256 second, __m256 first) {
    return _mm256_or_ps(_mm256_cmp_ps(second, first, _CMP_GT_OQ),
                        _mm256_and_ps(_mm256_cmp_ps(second, second, _CMP_UNORD_Q),
                                      _mm256_cmp_ps(first, first, _CMP_ORD_Q)));
  };
  const __m256i lane2 = _mm256_add_epi32(lane, lane);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i width = _mm256_set1_epi32(w);
  // Windows ow .. ow + 7; the last run of a row holds fewer (masked loads and stores).
  for (; ow < wo; ow += 8) {
    const int64_t n = wo - ow;
    __m256 a, b, c, d;
    split(r0 + 2 * ow, 2 * n, a, b);
    split(r1 + 2 * ow, 2 * n, c, d);
    if constexpr (kReLU) {
      const __m256 z = _mm256_setzero_ps();
      a = _mm256_and_ps(a, _mm256_cmp_ps(a, z, _CMP_GT_OQ));
      b = _mm256_and_ps(b, _mm256_cmp_ps(b, z, _CMP_GT_OQ));
      c = _mm256_and_ps(c, _mm256_cmp_ps(c, z, _CMP_GT_OQ));
      d = _mm256_and_ps(d, _mm256_cmp_ps(d, z, _CMP_GT_OQ));
    }
    const __m256 pick_b = beats(b, a), pick_d = beats(d, c);
    const __m256 top = _mm256_blendv_ps(a, b, pick_b), bottom = _mm256_blendv_ps(c, d, pick_d);
    const __m256 pick_bottom = beats(bottom, top);
    const __m256 best = _mm256_blendv_ps(top, bottom, pick_bottom);
    const __m256i top_i = _mm256_and_si256(_mm256_castps_si256(pick_b), one);
    const __m256i bottom_i = _mm256_add_epi32(width, _mm256_and_si256(_mm256_castps_si256(pick_d), one));
    const __m256i off = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(top_i), _mm256_castsi256_ps(bottom_i), pick_bottom));
    const __m256i start = _mm256_add_epi32(_mm256_set1_epi32(base + static_cast<int32_t>(2 * ow)), lane2);
    const __m256i where = _mm256_add_epi32(start, off);
    if (n >= 8) {
      _mm256_storeu_ps(y + ow, best);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(arg + ow), where);
    } else {
      const __m256i m = lanes_below(n);
      _mm256_maskstore_ps(y + ow, m, best);
      _mm256_maskstore_epi32(arg + ow, m, where);
    }
  }
#endif
  max_pool_2x2_row_scalar<kReLU>(r0, r1, y, arg, ow, wo, base, w);
}

// max_pool_2x2_row_backward's windows from ow on, one at a time.
inline void max_pool_2x2_row_backward_scalar(const float* dy, const int32_t* arg, float* r0, float* r1, int64_t ow,
                                             int64_t wo, int32_t base, int32_t w, const float* relu_y) {
  for (; ow < wo; ++ow) {
    const int32_t rel = arg[ow] - base - static_cast<int32_t>(2 * ow);
    const float g = relu_y == nullptr || relu_y[ow] > 0.0f ? 0.0f + dy[ow] : 0.0f;
    r0[2 * ow] = rel == 0 ? g : 0.0f;
    r0[2 * ow + 1] = rel == 1 ? g : 0.0f;
    r1[2 * ow] = rel == w ? g : 0.0f;
    r1[2 * ow + 1] = rel == w + 1 ? g : 0.0f;
  }
}

// The backward of one output row: dx rows r0 and r1 (2 * wo elements each) get 0 + dy at
// each window's argmax (an index within the plane, base being r0's first) and 0 elsewhere.
// With relu_y (the row of the fused chain's output), ReLU's backward too: 0 + dy only where
// that output is above 0 (the argmax's ReLU output), as ReLU's backward after the pooling's.
inline void max_pool_2x2_row_backward(const float* dy, const int32_t* arg, float* r0, float* r1, int64_t wo,
                                      int32_t base, int32_t w, const float* relu_y = nullptr) {
  int64_t ow = 0;
#if defined(__AVX2__)
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  auto lanes_below = [&](int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(n < 0 ? 0 : n > 8 ? 8 : n)), lane);
  };
  const __m256i lane2 = _mm256_add_epi32(lane, lane);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i width = _mm256_set1_epi32(w), width1 = _mm256_set1_epi32(w + 1);
  const __m256 zero = _mm256_setzero_ps();
  // The even (e) and odd (o) elements of 16 floats, interleaved; the first n written.
  auto store_pairs = [&](float* p, __m256 e, __m256 o, int64_t n) {
    const __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);
    const __m256 first = _mm256_permute2f128_ps(lo, hi, 0x20), second = _mm256_permute2f128_ps(lo, hi, 0x31);
    if (n >= 16) {
      _mm256_storeu_ps(p, first);
      _mm256_storeu_ps(p + 8, second);
    } else {
      _mm256_maskstore_ps(p, lanes_below(n), first);
      _mm256_maskstore_ps(p + 8, lanes_below(n - 8), second);
    }
  };
  for (; ow < wo; ow += 8) {
    const int64_t n = wo - ow;
    const __m256i m = lanes_below(n);
    __m256 g = _mm256_add_ps(zero, n >= 8 ? _mm256_loadu_ps(dy + ow) : _mm256_maskload_ps(dy + ow, m));
    if (relu_y != nullptr) {
      const __m256 yv = n >= 8 ? _mm256_loadu_ps(relu_y + ow) : _mm256_maskload_ps(relu_y + ow, m);
      g = _mm256_and_ps(g, _mm256_cmp_ps(yv, zero, _CMP_GT_OQ));
    }
    const __m256i start = _mm256_add_epi32(_mm256_set1_epi32(base + static_cast<int32_t>(2 * ow)), lane2);
    const __m256i at_arg = n >= 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(arg + ow))
                                  : _mm256_maskload_epi32(arg + ow, m);
    const __m256i rel = _mm256_sub_epi32(at_arg, start);
    auto at = [&](__m256i where) { return _mm256_and_ps(g, _mm256_castsi256_ps(_mm256_cmpeq_epi32(rel, where))); };
    store_pairs(r0 + 2 * ow, at(_mm256_setzero_si256()), at(one), 2 * n);
    store_pairs(r1 + 2 * ow, at(width), at(width1), 2 * n);
  }
#endif
  max_pool_2x2_row_backward_scalar(dy, arg, r0, r1, ow, wo, base, w, relu_y);
}

// Whole planes: x (P, H, W) -> y and arg (P, H / 2, W / 2); an odd height's last row and an
// odd width's last column are in no window.
template <bool kReLU = false>
inline void max_pool_2x2_planes(const float* x, float* y, int32_t* arg, int64_t planes, int64_t h, int64_t w) {
  const int64_t ho = h / 2, wo = w / 2;
#pragma omp parallel for schedule(static) if (planes * ho * wo * 4 > 32768)
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* xp = x + pl * h * w;
    for (int64_t oh = 0; oh < ho; ++oh) {
      const float* r0 = xp + 2 * oh * w;
      max_pool_2x2_row<kReLU>(r0, r0 + w, y + (pl * ho + oh) * wo, arg + (pl * ho + oh) * wo, wo,
                              static_cast<int32_t>(2 * oh * w), static_cast<int32_t>(w));
    }
  }
}

// dx (P, H, W) from dy and arg (P, H / 2, W / 2): every element written once (those in no
// window 0). relu_y: as for max_pool_2x2_row_backward, the chain's output (P, H / 2, W / 2).
inline void max_pool_2x2_planes_backward(const float* dy, const int32_t* arg, float* dx, int64_t planes, int64_t h,
                                         int64_t w, const float* relu_y = nullptr) {
  const int64_t ho = h / 2, wo = w / 2;
#pragma omp parallel for schedule(static) if (planes * h * w > 32768)
  for (int64_t pl = 0; pl < planes; ++pl) {
    float* dp = dx + pl * h * w;
    for (int64_t oh = 0; oh < ho; ++oh) {
      float* r0 = dp + 2 * oh * w;
      const int64_t o = (pl * ho + oh) * wo;
      max_pool_2x2_row_backward(dy + o, arg + o, r0, r0 + w, wo, static_cast<int32_t>(2 * oh * w),
                                static_cast<int32_t>(w), relu_y == nullptr ? nullptr : relu_y + o);
      std::fill(r0 + 2 * wo, r0 + w, 0.0f);  // an odd width's last column
      std::fill(r0 + w + 2 * wo, r0 + 2 * w, 0.0f);
    }
    std::fill(dp + 2 * ho * w, dp + h * w, 0.0f);  // an odd height's last row
  }
}

}  // namespace tnt::detail
