// Dropout on CUDA: the mask is drawn from the same Philox stream as on the CPU
// (core/philox.hpp, compiled for the device), keep iff uniform(key, base + i) >= rate,
// and kept values are multiplied by the same float scale, so y equals the CPU's bit for
// bit. The mask is not stored: backward draws it again from (key, base), which the
// forward leaves in SavedState::extra.
#include "layers/dropout_cuda.hpp"

#include "backend/cuda/device_common.cuh"
#include "core/philox.hpp"

#include <memory>

namespace tnt::cuda {

namespace {

struct DropoutSaved {
  uint64_t key = 0;
  uint64_t base = 0;  // counter of element 0
  float rate = 0.0f;
  float keep_scale = 1.0f;
  Shape shape;
};

template <typename T>
__global__ void dropout_kernel(const T* __restrict__ in,  // (n): x forward, dy backward
                               T* __restrict__ out,       // (n)
                               int64_t n, uint64_t key, uint64_t base, float rate, float keep_scale) {
  TNT_KERNEL_LOOP(i, n) {
    const bool keep = philox::uniform(key, base + static_cast<uint64_t>(i)) >= rate;
    out[i] = keep ? from_float<T>(to_float(in[i]) * keep_scale) : from_float<T>(0.0f);
  }
}

void launch(const DropoutSaved& s, const Tensor& in, const Tensor& out, int device) {
  const int64_t n = in.numel();
  if (n == 0) return;
  TNT_CUDA_DISPATCH_FLOAT(in.dtype(), "Dropout", {
    dropout_kernel<scalar_t><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
        static_cast<const scalar_t*>(in.raw()), static_cast<scalar_t*>(out.raw()), n, s.key, s.base, s.rate,
        s.keep_scale);
  });
  TNT_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::vector<Tensor> dropout_forward(Dropout& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                    SavedState& saved) {
  const Tensor& x = inputs.at(0);
  int device = common_device({&x}, "Dropout");
  auto s = std::make_shared<DropoutSaved>();
  s->key = layer.mask_key(rc);
  s->base = Dropout::mask_counter(rc, x.shape());
  s->rate = static_cast<float>(layer.rate());
  s->keep_scale = static_cast<float>(1.0 / (1.0 - layer.rate()));
  s->shape = x.shape();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  launch(*s, x, y, device);
  saved.tensors.clear();
  saved.extra = s;
  return {y};
}

std::vector<Tensor> dropout_backward(Dropout& layer, const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                     SavedState& saved) {
  (void)rc;  // the mask is the forward's, whatever rc says now
  TNT_CHECK(saved.extra, "Dropout '{}': backward without a forward", layer.name());
  const auto& s = *static_cast<const DropoutSaved*>(saved.extra.get());
  const Tensor& dy = grad_outputs.at(0);
  int device = common_device({&dy}, "Dropout backward");
  TNT_CHECK(shape_numel(s.shape) == dy.numel(), "Dropout '{}': gradient {} for output {}", layer.name(), dy.str(),
            shape_str(s.shape));
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  launch(s, dy, dx, device);
  return {dx};
}

}  // namespace tnt::cuda
