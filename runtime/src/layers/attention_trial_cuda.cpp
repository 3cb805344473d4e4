// The trial of TNT_CUDNN_ATTENTION=auto (attention_trial_cuda.hpp; rules in
// attention_choice.hpp).
#include "layers/attention_trial_cuda.hpp"

#include "backend/cuda/compare.hpp"
#include "layers/attention_choice.hpp"
#include "tarantella/log.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

namespace tnt::cuda {

namespace {

std::mutex trials_mu;
std::map<std::pair<int, std::string>, bool> verdicts;  // (device, key) -> runs cuDNN
std::vector<AttentionTrialRecord> records;
std::atomic<bool> prefer_cudnn_hook{false};
std::atomic<bool> corrupt_scale_hook{false};
std::atomic<bool> corrupt_dropout_hook{false};

// Seeds of the test operands: fixed, so a trial's numbers repeat from run to run.
constexpr uint64_t kSeedQ = 0x71a1, kSeedK = 0x71a2, kSeedV = 0x71a3, kSeedDo = 0x71a4;

Tensor uniform_like(const Tensor& t, uint64_t seed, float lo, float hi, int device) {
  Tensor x = Tensor::empty(t.shape(), t.dtype(), t.device());
  fill_uniform(x.raw(), x.numel(), x.dtype(), seed, lo, hi, device);
  return x;
}

// The padding ids with each row's first key made visible (see the header), on their device.
Tensor trial_ids(const Tensor& key_ids) {
  if (!key_ids.defined()) return Tensor();
  TNT_CHECK(key_ids.ndim() == 2, "attention trial: key ids {} are not (B, Tk)", key_ids.str());
  Tensor h = key_ids.to(Device::cpu());
  const int64_t rows = h.dim(0), tk = h.dim(1);
  if (tk > 0) {
    if (h.dtype() == DType::i64) {
      auto* p = h.data<int64_t>();
      for (int64_t b = 0; b < rows; ++b)
        if (p[b * tk] == 0) p[b * tk] = 1;
    } else {
      TNT_CHECK(h.dtype() == DType::i32, "attention trial: key ids {} are not i32 or i64", key_ids.str());
      auto* p = h.data<int32_t>();
      for (int64_t b = 0; b < rows; ++b)
        if (p[b * tk] == 0) p[b * tk] = 1;
    }
  }
  return h.to(key_ids.device());
}

struct Results {
  Tensor o, dq, dk, dv;
};

// One forward and backward of `engine`; dO is `d_o`, or the output itself where undefined.
Results run(AttentionEngine engine, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& ids,
            const AttentionCoreArgs& a, const Tensor& d_o) {
  Results r;
  std::shared_ptr<void> state;
  r.o = attention_core_forward(q, k, v, ids, a, state, engine);
  const Tensor g = d_o.defined() ? d_o : r.o.clone();
  attention_core_backward(g, state, r.dq, r.dk, r.dv);
  return r;
}

AttentionTrialRecord::Agreement agreement(const Tensor& got, const Tensor& ref, int device) {
  TNT_CHECK(got.numel() == ref.numel() && got.dtype() == ref.dtype(), "attention trial: {} against {}", got.str(),
            ref.str());
  const auto [diff, largest] = max_difference(got.raw(), ref.raw(), got.numel(), got.dtype(), device);
  return {diff, largest};
}

double dot_of(const Tensor& a, const Tensor& b, int device) {
  TNT_CHECK(a.numel() == b.numel() && a.dtype() == b.dtype(), "attention trial: {} against {}", a.str(), b.str());
  return dot(a.raw(), b.raw(), a.numel(), a.dtype(), device);
}

void trial(const Tensor& q_shape, const Tensor& k_shape, const Tensor& key_ids, const AttentionCoreArgs& a,
           const CudnnAttentionKey& key, AttentionEngine other, int device, AttentionTrialRecord& rec) {
  namespace rules = attention_choice;
  // The undropped graphs first: the check below runs them.
  CudnnAttentionKey key0 = key;
  key0.rate = 0.0f;
  if (!cudnn_attention_prepare(key0, device, true)) {
    rec.verdict = "no room for its undropped graphs (the shape cap)";
    return;
  }
  const Tensor q = uniform_like(q_shape, kSeedQ, -2.0f, 2.0f, device);
  const Tensor k = uniform_like(k_shape, kSeedK, -2.0f, 2.0f, device);
  const Tensor v = uniform_like(k_shape, kSeedV, -1.0f, 1.0f, device);
  const Tensor d_o = uniform_like(q_shape, kSeedDo, -1.0f, 1.0f, device);
  const Tensor ids = trial_ids(key_ids);

  AttentionCoreArgs a0 = a;
  a0.rate = 0.0f;
  const Results ref = run(other, q, k, v, ids, a0, d_o);
  AttentionCoreArgs ac = a0;
  if (corrupt_scale_hook) ac.scale *= 2.0f;
  {
    const Results got = run(AttentionEngine::cudnn, q, k, v, ids, ac, d_o);
    rec.o = agreement(got.o, ref.o, device);
    rec.dq = agreement(got.dq, ref.dq, device);
    rec.dk = agreement(got.dk, ref.dk, device);
    rec.dv = agreement(got.dv, ref.dv, device);
  }
  const std::pair<const char*, const AttentionTrialRecord::Agreement*> outputs[] = {
      {"o", &rec.o}, {"dq", &rec.dq}, {"dk", &rec.dk}, {"dv", &rec.dv}};
  for (const auto& [name, g] : outputs) {
    if (!rules::agrees(g->diff, g->largest)) {
      rec.suspect = true;
      rec.verdict = fmt::format("its {} differs from the {} engine's by {} (largest value {}; allowed {} of it)", name,
                                rec.other, g->diff, g->largest, rules::kTolerance);
      return;
    }
  }
  if (a.rate > 0.0f) {
    const Results dropped = run(AttentionEngine::cudnn, q, k, v, ids, corrupt_dropout_hook ? a0 : a, Tensor());
    rec.o_dot_o = dot_of(dropped.o, dropped.o, device);
    rec.v_dot_dv = dot_of(v, dropped.dv, device);
    if (!rules::dropout_backward_consistent(rec.o_dot_o, rec.v_dot_dv)) {
      rec.suspect = true;
      rec.verdict = fmt::format("with dropout its backward does not match its forward: <V, dV> {} against <o, o> {}",
                                rec.v_dot_dv, rec.o_dot_o);
      return;
    }
    if (rules::dropout_mean_checkable(a.batch * a.heads * a.tq, a.rate)) {
      const double cross = dot_of(dropped.o, ref.o, device), own = dot_of(ref.o, ref.o, device);
      rec.mean_ratio = cross / own;
      if (!rules::dropout_mean_agrees(cross, own)) {
        rec.suspect = true;
        rec.verdict = fmt::format("with dropout {} its output's mean is {} of the undropped one (allowed 1 +- {})",
                                  a.rate, rec.mean_ratio, rules::kMeanTolerance);
        return;
      }
      rec.noise = rules::dropout_noise(rec.o_dot_o, cross, own);
      if (!rules::dropout_noise_agrees(rec.noise, a.rate)) {
        rec.suspect = true;
        rec.verdict = fmt::format("with dropout {} its output moves by {} of the undropped one's square norm, where "
                                  "{} is expected (allowed a factor 2)",
                                  a.rate, rec.noise, a.rate / (1.0 - a.rate));
        return;
      }
    }
  }
  // Timed with the layer's own dropout, after one untimed run each (first launches); the
  // engines alternate over the rounds and each keeps its best.
  auto step = [&](AttentionEngine e) { (void)run(e, q, k, v, ids, a, d_o); };
  std::tie(rec.other_ms, rec.cudnn_ms) = time_alternating([&] { step(other); }, [&] { step(AttentionEngine::cudnn); },
                                                          rules::kTimedRounds, rules::kTimedRuns, device);
  const bool faster = rules::prefer_cudnn(rec.cudnn_ms, rec.other_ms);
  rec.use_cudnn = faster || prefer_cudnn_hook;
  rec.verdict = faster ? "faster" : prefer_cudnn_hook ? "not faster, taken (test hook)" : "not faster";
}

}  // namespace

std::string AttentionTrialRecord::str() const {
  std::string s = fmt::format("TNT_CUDNN_ATTENTION=auto: {} on cuda:{} runs the {} engine", key, device,
                              use_cudnn ? "cuDNN" : other);
  if (cudnn_ms > 0 && other_ms > 0) {
    s += fmt::format(" (forward + backward: cuDNN {:.3f} ms, {} {:.3f} ms; {})", cudnn_ms, other, other_ms, verdict);
  } else {
    s += fmt::format(" (cuDNN ruled out: {})", verdict);
  }
  if (!std::isnan(o.diff)) {
    s += fmt::format("; without dropout, cuDNN - {}: o {:.3g} of {:.3g}, dq {:.3g} of {:.3g}, dk {:.3g} of {:.3g}, "
                     "dv {:.3g} of {:.3g}",
                     other, o.diff, o.largest, dq.diff, dq.largest, dk.diff, dk.largest, dv.diff, dv.largest);
  }
  if (!std::isnan(o_dot_o)) s += fmt::format("; dropout: <V, dV> / <o, o> = {:.5f}", v_dot_dv / o_dot_o);
  if (!std::isnan(mean_ratio)) s += fmt::format(", mean ratio {:.4f}", mean_ratio);
  if (!std::isnan(noise)) s += fmt::format(", noise {:.4f}", noise);
  return s;
}

bool attention_auto_uses_cudnn(const Tensor& q, const Tensor& k, const Tensor& key_ids, const AttentionCoreArgs& a,
                               const CudnnAttentionKey& key, bool other_fused, int device) {
  const std::string key_str = key.str();
  std::lock_guard<std::mutex> lock(trials_mu);
  auto it = verdicts.find({device, key_str});
  if (it != verdicts.end()) return it->second;
  AttentionTrialRecord rec;
  rec.key = key_str;
  rec.device = device;
  rec.other = other_fused ? "fused" : "unfused";
  try {
    trial(q, k, key_ids, a, key, other_fused ? AttentionEngine::fused : AttentionEngine::unfused, device, rec);
  } catch (const std::exception& e) {
    rec.use_cudnn = false;
    rec.suspect = true;
    rec.verdict = fmt::format("the trial failed: {}", e.what());
  }
  verdicts[{device, key_str}] = rec.use_cudnn;
  records.push_back(rec);
  // A cuDNN that disagrees, or a trial that fails, is news for whoever runs this cuDNN.
  if (rec.suspect) {
    log_warning("MultiHeadAttention: {}", rec.str());
  } else {
    log_info("MultiHeadAttention: {}", rec.str());
  }
  return rec.use_cudnn;
}

std::vector<AttentionTrialRecord> attention_trials() {
  std::lock_guard<std::mutex> lock(trials_mu);
  return records;
}

void attention_trials_reset() {
  std::lock_guard<std::mutex> lock(trials_mu);
  verdicts.clear();
  records.clear();
}

void attention_trial_prefer_cudnn(bool on) { prefer_cudnn_hook = on; }
void attention_trial_corrupt_scale(bool on) { corrupt_scale_hook = on; }
void attention_trial_corrupt_dropout(bool on) { corrupt_dropout_hook = on; }

}  // namespace tnt::cuda
