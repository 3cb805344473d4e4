// The fused chain Dropout -> Add (nn/fusion.hpp): a Transformer's "x + dropout(sublayer(x))",
// 30 of them in Transformer-big. On CUDA one pass each way (dropout_cuda.hpp:
// dropout_add_forward): the forward reads the sublayer's output and the residual and writes
// the sum, where the layers one by one wrote and read the dropped-out tensor and a byte mask
// in between; the backward writes only the sublayer's gradient, and hands the sum's gradient
// on as the residual's (an Add passes it through unchanged, and nobody writes into a
// gradient another tensor holds), where Add::backward made a copy. At 32k tokens of 1,024
// features in bf16 that is about 440 MB less traffic per chain and step, and the mask is
// kept as bits (4 MB instead of 32). Bits are those of the layers one by one: the same
// Philox draws (Dropout's key and counters), the dropped value rounded to the dtype before
// the float sum that is rounded once, as Dropout's and Add's kernels do.
//
// On the CPU (f32) the same pass each way with Dropout's byte mask (layers/dropout_cpu.hpp's
// draws): the dropped value is rounded before the sum (this file builds without FMA
// contraction, runtime/CMakeLists.txt), so the bits are the layers' too.
//
// Everywhere else (inference, rate 0, a memory format other than contiguous, an Add of more
// than two inputs, another dtype on the CPU) the executor runs the two layers one by one.
#include "backend/dispatch.hpp"
#include "layers/dropout_cpu.hpp"
#include "layers/dropout_cuda.hpp"
#include "nn/fusion.hpp"
#include "tarantella/layers/add.hpp"
#include "tarantella/layers/dropout.hpp"

namespace tnt {

namespace {

Dropout& dropout_of(const std::vector<Layer*>& layers) {
  auto* d = dynamic_cast<Dropout*>(layers.at(0));
  TNT_CHECK(d != nullptr, "fused chain: layer '{}' says it is a Dropout but is not one", layers.at(0)->name());
  return *d;
}

// The CPU engine: y = x + (keep ? h * scale : 0), Dropout's mask (1 = kept) saved.
struct CpuSaved {
  Tensor mask;  // u8, h's shape
};

void cpu_forward(Dropout& dropout, const Tensor& h, const Tensor& x, const RunContext& rc, SavedState& saved,
                 std::vector<Tensor>& outputs) {
  const uint64_t key = dropout.mask_key(rc), base = Dropout::mask_counter(rc, h.shape());
  const float rate = static_cast<float>(dropout.rate());
  const float keep_scale = static_cast<float>(1.0 / (1.0 - dropout.rate()));
  Tensor y = Tensor::empty(h.shape(), DType::f32);
  auto s = std::make_shared<CpuSaved>();
  s->mask = Tensor::empty(h.shape(), DType::u8);
  const float* hs = h.data<float>();
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  uint8_t* ms = s->mask.data<uint8_t>();
  detail::for_each_dropout_keep(key, base, h.numel(), rate, [&](int64_t i, bool keep) {
    ms[i] = keep;
    const float dropped = keep ? hs[i] * keep_scale : 0.0f;  // Dropout's value, rounded (no FMA)
    ys[i] = dropped + xs[i];
  });
  saved.tensors.clear();
  saved.extra = s;
  outputs = {y};
}

// dy -> {dh, dx}: Dropout's backward for h; the sum's gradient itself for x.
std::vector<Tensor> cpu_backward(Dropout& dropout, const Tensor& dy_any, SavedState& saved) {
  auto s = std::static_pointer_cast<CpuSaved>(saved.extra);
  TNT_CHECK(s != nullptr, "fused chain of Dropout '{}': backward without a forward", dropout.name());
  const Tensor dy = dy_any.contiguous();
  TNT_CHECK(dy.numel() == s->mask.numel() && dy.dtype() == DType::f32,
            "fused chain of Dropout '{}': gradient {} for output {}", dropout.name(), dy.str(), s->mask.str());
  const float keep_scale = static_cast<float>(1.0 / (1.0 - dropout.rate()));
  Tensor dh = Tensor::empty(dy.shape(), DType::f32);
  const uint8_t* ms = s->mask.data<uint8_t>();
  const float* g = dy.data<float>();
  float* d = dh.data<float>();
  const int64_t n = dy.numel();
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) d[i] = ms[i] ? g[i] * keep_scale : 0.0f;
  return {dh, dy};
}

// inputs: {h, x}: the Dropout's input, then the Add's other input (a sum does not care which
// side it is on).
bool chain_forward(const std::vector<Layer*>& layers, const std::vector<Tensor>& inputs, const RunContext& rc,
                   SavedState& saved, std::vector<Tensor>& outputs) {
  Dropout& dropout = dropout_of(layers);
  if (!rc.training || dropout.rate() == 0 || inputs.size() != 2) return false;
  const Tensor& h = inputs[0];
  const Tensor& x = inputs[1];
  if (!h.defined() || !x.defined() || h.device() != x.device()) return false;
  if (h.shape() != x.shape() || h.dtype() != x.dtype() || (h.dtype() != DType::f32 && !is_half(h.dtype()))) return false;
  if (h.memory_format() != MemoryFormat::contiguous || x.memory_format() != MemoryFormat::contiguous) return false;
  if (h.device().is_cpu() && h.dtype() != DType::f32) return false;
  dropout.ensure_built({h.shape()});
  layers.at(1)->ensure_built({x.shape(), h.shape()});
  if (h.device().is_cpu()) {
    cpu_forward(dropout, h, x, rc, saved, outputs);
    return true;
  }
  auto run = [&]() -> bool {
    TNT_CUDA_DISPATCH(h.device(), cuda::dropout_add_forward(dropout, h, x, rc, saved, outputs));
    return false;
  };
  return run();
}

std::vector<Tensor> chain_backward(const std::vector<Layer*>& layers, const std::vector<Tensor>& grad_outputs,
                                   const RunContext&, SavedState& saved) {
  Dropout& dropout = dropout_of(layers);
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined(),
            "fused chain of Dropout '{}': one gradient expected", dropout.name());
  const Tensor& dy = grad_outputs[0];
  auto run = [&]() -> std::vector<Tensor> {
    TNT_CUDA_DISPATCH(dy.device(), cuda::dropout_add_backward(dropout, dy, saved));
    return cpu_backward(dropout, dy, saved);
  };
  return run();
}

bool accepts(const std::vector<Layer*>& layers) {
  return detail::is_exactly<Dropout>(layers.at(0)) && detail::is_exactly<Add>(layers.at(1));
}

const detail::FusionRegistration kDropoutAdd([] {
  detail::FusionPattern p{"dropout_add", {"Dropout", "Add"}, accepts, chain_forward, chain_backward};
  p.cpu_engine = true;
  p.cuda_engine = true;
  return p;
}());

}  // namespace

}  // namespace tnt
