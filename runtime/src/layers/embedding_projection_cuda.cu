// Embedding's output projection on CUDA, direct or on a padded vocabulary
// (embedding_projection_cuda.hpp; the rules: projection_pad.hpp).
#include "layers/embedding_projection_cuda.hpp"

#include "backend/cuda/compare.hpp"
#include "backend/cuda/device_common.cuh"
#include "layers/gemm_cuda.hpp"
#include "layers/projection_pad.hpp"
#include "tarantella/config.hpp"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

namespace tnt::cuda {

namespace {

namespace rules = tnt::projection_pad;

std::mutex trials_mu;
// (device, dtype, v, d, rows class) -> path
std::map<std::tuple<int, int, int64_t, int64_t, int>, ProjectionPath> verdicts;
std::vector<ProjectionPadRecord> records;
std::atomic<int64_t> chunk_rows_hook{0};
std::atomic<int> corrupt_hook{0};  // 1: the check's padded forward, 2: its backward
std::atomic<int64_t> padded_calls{0};
std::atomic<bool> prefer_padded_hook{false};

char* bytes(void* p, int64_t offset) { return static_cast<char*>(p) + offset; }
const char* bytes(const void* p, int64_t offset) { return static_cast<const char*>(p) + offset; }

int64_t chunk_for(int64_t rows, int64_t vp, size_t es) {
  const int64_t hook = chunk_rows_hook;
  return hook > 0 ? hook : rules::chunk_rows(rows, vp, es);
}

// Rows of `width` 16-bit elements from src (rows `sp` elements apart) to dst (`dp` apart),
// in units of E (2 bytes, or 8 when every row start allows): a block a slice of a row. The
// strided copies of the padded path, as kernels rather than cudaMemcpy2DAsync, so that they
// run at the bandwidth of the SMs whatever engine the driver would pick for a 2-D copy.
template <typename E>
__global__ void copy_rows_kernel(const E* __restrict__ src, int64_t sp, E* __restrict__ dst, int64_t dp, int64_t width,
                                 int64_t rows) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const E* s = src + r * sp;
    E* d = dst + r * dp;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < width;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      d[c] = s[c];
    }
  }
}

// 16-bit elements only: the padded path applies to f16 and bf16 (projection_pad::applies).
void copy_rows(const void* src, int64_t sp, void* dst, int64_t dp, int64_t width, int64_t rows, int device) {
  if (width <= 0 || rows <= 0) return;
  cudaStream_t stream = compute_stream(device);
  const auto aligned8 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; };
  const bool wide = width % 4 == 0 && sp % 4 == 0 && dp % 4 == 0 && aligned8(src) && aligned8(dst);
  const int64_t unit = wide ? 4 : 1;
  const int64_t w = width / unit;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((w + kBlock - 1) / kBlock, 1024)),
                  static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  if (wide) {
    copy_rows_kernel<uint2><<<grid, kBlock, 0, stream>>>(static_cast<const uint2*>(src), sp / 4,
                                                         static_cast<uint2*>(dst), dp / 4, w, rows);
  } else {
    copy_rows_kernel<uint16_t><<<grid, kBlock, 0, stream>>>(static_cast<const uint16_t*>(src), sp,
                                                            static_cast<uint16_t*>(dst), dp, w, rows);
  }
  TNT_CUDA_CHECK_LAUNCH();
}

// (vp, d) copy of w (v, d) with zero rows after v.
Workspace padded_weight(const void* w, int64_t v, int64_t vp, int64_t d, size_t es, int device) {
  cudaStream_t stream = compute_stream(device);
  Workspace wp(static_cast<size_t>(vp * d) * es, device);
  TNT_CUDA_CHECK(cudaMemcpyAsync(wp.data(), w, static_cast<size_t>(v * d) * es, cudaMemcpyDeviceToDevice, stream));
  TNT_CUDA_CHECK(cudaMemsetAsync(bytes(wp.data(), v * d * static_cast<int64_t>(es)), 0,
                                 static_cast<size_t>((vp - v) * d) * es, stream));
  return wp;
}

// `shift` (the test fault): the copy out reads each row one column late.
void padded_forward(int device, DType t, int64_t rows, int64_t v, int64_t d, const void* x, const void* w,
                    void* logits, int64_t chunk, bool shift) {
  const int64_t vp = rules::padded_width(v);
  const auto es = static_cast<int64_t>(dtype_size(t));
  Workspace wp = padded_weight(w, v, vp, d, static_cast<size_t>(es), device);
  Workspace cp(static_cast<size_t>(std::min(chunk, rows) * vp * es), device);  // (chunk, vp)
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t rc = std::min(chunk, rows - r0);
    gemm_rm(device, t, t, false, true, rc, vp, d, 1.0f, bytes(x, r0 * d * es), 0, wp.data(), 0, 0.0f, cp.data(), 0);
    copy_rows(bytes(cp.data(), shift ? es : 0), vp, bytes(logits, r0 * v * es), v, v, rc, device);
  }
}

// `shift` (the test fault): each dy row lands one column late (column 0 keeps what the
// scratch held, column v gets dy's last value).
void padded_backward(int device, DType t, int64_t rows, int64_t v, int64_t d, const void* dy, const void* x,
                     const void* w, void* dx, float* dw, int64_t chunk, bool shift) {
  const int64_t vp = rules::padded_width(v);
  const auto es = static_cast<int64_t>(dtype_size(t));
  cudaStream_t stream = compute_stream(device);
  Workspace wp;
  if (dx != nullptr) wp = padded_weight(w, v, vp, d, static_cast<size_t>(es), device);
  // (vp, d) f32: the gradient, then zero rows; the products add into it; its first v rows
  // go back.
  Workspace gp(static_cast<size_t>(vp * d) * sizeof(float), device);
  TNT_CUDA_CHECK(cudaMemcpyAsync(gp.data(), dw, static_cast<size_t>(v * d) * sizeof(float), cudaMemcpyDeviceToDevice,
                                 stream));
  TNT_CUDA_CHECK(cudaMemsetAsync(gp.as<float>() + v * d, 0, static_cast<size_t>((vp - v) * d) * sizeof(float), stream));
  // (chunk, vp) rows of dy; the columns after v are zeroed once and never written again.
  const int64_t cr = std::min(chunk, rows);
  Workspace yp(static_cast<size_t>(cr * vp * es), device);
  TNT_CUDA_CHECK(cudaMemset2DAsync(bytes(yp.data(), v * es), static_cast<size_t>(vp * es), 0,
                                   static_cast<size_t>((vp - v) * es), static_cast<size_t>(cr), stream));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t rc = std::min(chunk, rows - r0);
    copy_rows(bytes(dy, r0 * v * es), v, bytes(yp.data(), shift ? es : 0), vp, v, rc, device);
    if (dx != nullptr) {
      gemm_rm(device, t, t, false, false, rc, d, vp, 1.0f, yp.data(), 0, wp.data(), 0, 0.0f, bytes(dx, r0 * d * es),
              0);
    }
    gemm_rm(device, t, DType::f32, true, false, vp, d, rc, 1.0f, yp.data(), 0, bytes(x, r0 * d * es), 0, 1.0f,
            gp.data(), 0);
  }
  TNT_CUDA_CHECK(cudaMemcpyAsync(dw, gp.data(), static_cast<size_t>(v * d) * sizeof(float), cudaMemcpyDeviceToDevice,
                                 stream));
}

ProjectionPadRecord::Agreement compare(const void* padded, const void* direct, int64_t n, DType t, int device) {
  const auto [diff, largest] = max_difference(padded, direct, n, t, device);
  return {diff, largest};
}

// Both paths on the first rows of x, several chunks of them, compared; then both timed at
// the call's size, each direction apart.
void trial(DType t, int64_t rows, int64_t v, int64_t d, const void* x, const void* w, void* logits, int device,
           ProjectionPadRecord& rec) {
  const auto es = static_cast<int64_t>(dtype_size(t));
  cudaStream_t stream = compute_stream(device);
  {
    const int64_t r = std::min(rows, rules::kCheckRows);
    Workspace la(static_cast<size_t>(r * v * es), device), lb(static_cast<size_t>(r * v * es), device);
    Workspace xa(static_cast<size_t>(r * d * es), device), xb(static_cast<size_t>(r * d * es), device);
    Workspace ga(static_cast<size_t>(v * d) * sizeof(float), device), gb(static_cast<size_t>(v * d) * sizeof(float),
                                                                          device);
    projection_forward(false, device, t, r, v, d, x, w, la.data());
    padded_forward(device, t, r, v, d, x, w, lb.data(), rules::kCheckChunkRows, corrupt_hook == 1);
    rec.logits = compare(lb.data(), la.data(), r * v, t, device);
    TNT_CUDA_CHECK(cudaMemsetAsync(ga.data(), 0, ga.bytes(), stream));
    TNT_CUDA_CHECK(cudaMemsetAsync(gb.data(), 0, gb.bytes(), stream));
    // The direct logits stand in for dy.
    projection_backward(false, device, t, r, v, d, la.data(), x, w, xa.data(), ga.as<float>());
    padded_backward(device, t, r, v, d, la.data(), x, w, xb.data(), gb.as<float>(), rules::kCheckChunkRows,
                    corrupt_hook == 2);
    rec.dx = compare(xb.data(), xa.data(), r * d, t, device);
    rec.dw = compare(gb.data(), ga.data(), v * d, DType::f32, device);
    for (const auto& [what, a] : {std::pair{"logits", rec.logits}, std::pair{"dx", rec.dx}, std::pair{"dW", rec.dw}}) {
      if (!rules::agrees(a.diff, a.largest)) {
        rec.suspect = true;
        rec.verdict = fmt::format("the padded {} differ from the direct ones by {:.3g} where the largest is {:.3g}",
                                  what, a.diff, a.largest);
        return;
      }
    }
  }
  // Timed at the call's size, the paths alternating (time_alternating). The backward reads
  // the call's logits as its dy.
  constexpr int kRounds = 2, kRuns = 3;
  const int64_t chunk = chunk_for(rows, rules::padded_width(v), static_cast<size_t>(es));
  auto fwd = [&](bool padded) {
    if (padded) {
      padded_forward(device, t, rows, v, d, x, w, logits, chunk, false);
    } else {
      projection_forward(false, device, t, rows, v, d, x, w, logits);
    }
  };
  std::tie(rec.forward_direct_ms, rec.forward_padded_ms) =
      time_alternating([&] { fwd(false); }, [&] { fwd(true); }, kRounds, kRuns, device);
  // With dx always: a verdict serves every later call of the shape, and training needs dx.
  Workspace dx(static_cast<size_t>(rows * d * es), device);
  Workspace dw(static_cast<size_t>(v * d) * sizeof(float), device);
  TNT_CUDA_CHECK(cudaMemsetAsync(dw.data(), 0, dw.bytes(), stream));
  auto bwd = [&](bool padded) {
    if (padded) {
      padded_backward(device, t, rows, v, d, logits, x, w, dx.data(), dw.as<float>(), chunk, false);
    } else {
      projection_backward(false, device, t, rows, v, d, logits, x, w, dx.data(), dw.as<float>());
    }
  };
  std::tie(rec.backward_direct_ms, rec.backward_padded_ms) =
      time_alternating([&] { bwd(false); }, [&] { bwd(true); }, kRounds, kRuns, device);
  const bool hook = prefer_padded_hook;
  rec.path.forward_padded = hook || rules::prefer_padded(rec.forward_padded_ms, rec.forward_direct_ms);
  rec.path.backward_padded = hook || rules::prefer_padded(rec.backward_padded_ms, rec.backward_direct_ms);
  if (hook) rec.verdict = "padded taken (test hook)";
}

}  // namespace

void projection_forward(bool padded, int device, DType t, int64_t rows, int64_t v, int64_t d, const void* x,
                        const void* w, void* logits) {
  if (rows <= 0 || v <= 0) return;
  if (padded && rules::applies(t, v)) {
    padded_forward(device, t, rows, v, d, x, w, logits, chunk_for(rows, rules::padded_width(v), dtype_size(t)),
                   false);
    ++padded_calls;
    return;
  }
  gemm_rm(device, t, t, false, true, rows, v, d, 1.0f, x, 0, w, 0, 0.0f, logits, 0);
}

void projection_backward(bool padded, int device, DType t, int64_t rows, int64_t v, int64_t d, const void* dy,
                         const void* x, const void* w, void* dx, float* dw) {
  if (rows <= 0 || v <= 0) return;
  if (padded && rules::applies(t, v)) {
    padded_backward(device, t, rows, v, d, dy, x, w, dx, dw, chunk_for(rows, rules::padded_width(v), dtype_size(t)),
                    false);
    ++padded_calls;
    return;
  }
  if (dx != nullptr) gemm_rm(device, t, t, false, false, rows, d, v, 1.0f, dy, 0, w, 0, 0.0f, dx, 0);
  gemm_rm(device, t, DType::f32, true, false, v, d, rows, 1.0f, dy, 0, x, 0, 1.0f, dw, 0);
}

namespace {

// The path where no trial is needed: {decided, path}.
std::pair<bool, ProjectionPath> mode_path(DType dtype, int64_t rows, int64_t v) {
  const AutoSwitch mode = tnt::config().gemm_pad;
  if (mode.off() || !rules::applies(dtype, v) || rows <= 0) return {true, {}};
  if (mode.on()) return {true, {true, true}};
  if (tnt::config().deterministic) return {true, {}};
  return {false, {}};
}

std::tuple<int, int, int64_t, int64_t, int> key_of(DType dtype, int64_t rows, int64_t v, int64_t d, int device) {
  return std::make_tuple(device, static_cast<int>(dtype), v, d, rules::rows_class(rows));
}

}  // namespace

ProjectionPath projection_path_known(DType dtype, int64_t rows, int64_t v, int64_t d, int device) {
  const auto [decided, path] = mode_path(dtype, rows, v);
  if (decided) return path;
  std::lock_guard<std::mutex> lock(trials_mu);
  auto it = verdicts.find(key_of(dtype, rows, v, d, device));
  return it != verdicts.end() ? it->second : ProjectionPath{};
}

ProjectionPath projection_path(const std::string& layer, DType dtype, int64_t rows, int64_t v, int64_t d,
                               const void* x, const void* w, void* logits, int device) {
  const auto [decided, path] = mode_path(dtype, rows, v);
  if (decided) return path;
  const auto key = key_of(dtype, rows, v, d, device);
  std::lock_guard<std::mutex> lock(trials_mu);
  auto it = verdicts.find(key);
  if (it != verdicts.end()) return it->second;
  ProjectionPadRecord rec;
  rec.layer = layer;
  rec.device = device;
  rec.dtype = dtype;
  rec.rows = rows;
  rec.v = v;
  rec.d = d;
  try {
    trial(dtype, rows, v, d, x, w, logits, device, rec);
  } catch (const std::exception& e) {
    rec.suspect = true;
    rec.verdict = fmt::format("the trial failed: {}", e.what());
  }
  if (rec.suspect) rec.path = {};  // a trial that threw after choosing keeps nothing of it
  verdicts[key] = rec.path;
  records.push_back(rec);
  if (rec.suspect) {
    log_warning("{}", rec.str());
  } else {
    log_info("{}", rec.str());
  }
  return rec.path;
}

std::string ProjectionPadRecord::str() const {
  std::string s = fmt::format("TNT_GEMM_PAD=auto: {} {} ({} x {}) x ({} x {})^T on cuda:{}", layer,
                              dtype_name(dtype), rows, d, v, d, device);
  if (forward_direct_ms > 0) {
    s += fmt::format(": forward {} (direct {:.3f} ms, padded to {} {:.3f} ms), backward {} (direct {:.3f} ms, padded "
                     "{:.3f} ms)",
                     path.forward_padded ? "padded" : "direct", forward_direct_ms, projection_pad::padded_width(v),
                     forward_padded_ms, path.backward_padded ? "padded" : "direct", backward_direct_ms,
                     backward_padded_ms);
  } else {
    s += ": direct";
  }
  if (!verdict.empty()) s += fmt::format(" ({})", verdict);
  if (!std::isnan(logits.diff)) {
    s += fmt::format("; padded - direct: logits {:.3g} of {:.3g}", logits.diff, logits.largest);
  }
  if (!std::isnan(dx.diff)) s += fmt::format(", dx {:.3g} of {:.3g}", dx.diff, dx.largest);
  if (!std::isnan(dw.diff)) s += fmt::format(", dW {:.3g} of {:.3g}", dw.diff, dw.largest);
  return s;
}

std::vector<ProjectionPadRecord> projection_pad_trials() {
  std::lock_guard<std::mutex> lock(trials_mu);
  return records;
}

void projection_pad_trials_reset() {
  std::lock_guard<std::mutex> lock(trials_mu);
  verdicts.clear();
  records.clear();
}

void projection_pad_chunk_rows_for_tests(int64_t rows) { chunk_rows_hook = rows; }
void projection_pad_corrupt_for_tests(int which) { corrupt_hook = which; }
void projection_pad_prefer_padded_for_tests(bool on) { prefer_padded_hook = on; }
int64_t projection_pad_padded_calls() { return padded_calls; }

}  // namespace tnt::cuda
