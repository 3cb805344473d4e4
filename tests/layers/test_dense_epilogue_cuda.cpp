// Dense with ReLU and dropout on CUDA (label gpu): in f32, f16 and bf16 the fused pass
// (dense_epilogue_kernel and the backward's first pass) equals the CUDA engines' Dense ->
// ReLU -> Dropout bit for bit, forward and every gradient (but the bias gradient where the
// first pass sums it: below), on sizes that take the 8-element
// vector path, its scalar tail, and rows that wrap the bias column inside a vector; in f32
// it agrees with the CPU engine within the products' rounding (the mask is the same, so a
// wrong draw is a whole element off); dropout without an activation draws its mask again in
// the backward.
// Not here: racecheck (no shared memory) and speed (scripts/bench/transformer_gpu).
#include "gpu_test_util.hpp"

#include "tarantella/layers.hpp"
#include "tarantella/ops.hpp"

#include <cstdint>
#include <string>
#include <vector>

using namespace tnt;
using tnt::test::dot_atol;
using tnt::test::gpu;
using tnt::test::kUnitFp32;
using tnt::test::require_close;
using tnt::test::require_equal;

namespace {

struct Out {
  Tensor y, dx, dw, db;
};

void set_compute(Dense& d, DType dtype) {
  if (dtype != DType::f32) d.weight().compute = ops::cast(d.weight().value, dtype);
}

void zero_grads(Dense& d) {
  d.weight().grad.fill_(0.0);
  if (d.bias()) d.bias()->grad.fill_(0.0);
}

Out grads_of(Dense& d, Tensor y, Tensor dx) {
  Out o{std::move(y), std::move(dx), d.weight().grad.to(Device::cpu()), Tensor()};
  if (d.bias()) o.db = d.bias()->grad.to(Device::cpu());
  return o;
}

Out fused_run(Dense& d, const Tensor& x, const Tensor& dy, const RunContext& rc) {
  zero_grads(d);
  SavedState s;
  Tensor y = d.forward({x}, rc, s)[0];
  Tensor dx = d.backward({dy}, rc, s)[0];
  return grads_of(d, y.to(Device::cpu()), dx.to(Device::cpu()));
}

Out chain_run(Dense& d, bool relu, double rate, const Tensor& x, const Tensor& dy, const RunContext& rc) {
  zero_grads(d);
  ReLU act("act");
  Dropout drop(rate, d.name());
  act.to(x.device());
  drop.to(x.device());
  SavedState sd, sa, sp;
  Tensor h = d.forward({x}, rc, sd)[0];
  if (relu) h = act.forward({h}, rc, sa)[0];
  if (rate > 0) h = drop.forward({h}, rc, sp)[0];
  Tensor dh = dy;
  if (rate > 0) dh = drop.backward({dh}, rc, sp)[0];
  if (relu) dh = act.backward({dh}, rc, sa)[0];
  Tensor dx = d.backward({dh}, rc, sd)[0];
  return grads_of(d, h.to(Device::cpu()), dx.to(Device::cpu()));
}

std::shared_ptr<Dense> make(int64_t units, bool relu, double rate, const Shape& in, Device device) {
  DenseOptions o;
  o.bias_initializer = Initializer::uniform(-0.5, 0.5);
  o.activation = relu ? DenseActivation::relu : DenseActivation::linear;
  o.dropout = rate;
  auto d = std::make_shared<Dense>(units, o, "ffn");
  if (device.is_cuda()) d->to(device);
  d->ensure_built({in});
  d->initialize(13);
  return d;
}

}  // namespace

TEST_CASE("Dense with ReLU and dropout on CUDA is the CUDA Dense -> ReLU -> Dropout, bit for bit",
          "[gpu][layers][dense]") {
  struct Case {
    Shape x;
    int64_t units;
  };
  // 315 outputs (a scalar tail, bias columns wrapping inside 8-element vectors: 9 units),
  // 6000 (10 units), 256 x 128 (whole vectors only), 600 x 16 (the bias summed in the first
  // pass over stripes of 64 rows, the last one short).
  for (const Case& c : {Case{{5, 7, 16}, 9}, Case{{600, 33}, 10}, Case{{256, 64}, 128}, Case{{600, 24}, 16}}) {
    for (bool relu : {true, false}) {
      for (double rate : {0.0, 0.3}) {
        if (!relu && rate == 0.0) continue;
        for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
          INFO("input " << shape_str(c.x) << ", units " << c.units << ", relu " << relu << ", rate " << rate << ", "
                        << dtype_name(dt));
          auto fused = make(c.units, relu, rate, c.x, gpu());
          auto plain = make(c.units, false, 0.0, c.x, gpu());
          set_compute(*fused, dt);
          set_compute(*plain, dt);
          Shape out = c.x;
          out.back() = c.units;
          Tensor x = test::random_tensor(c.x, "dense_epi_x"), dy = test::random_tensor(out, "dense_epi_dy");
          if (dt != DType::f32) {
            x = ops::cast(x, dt);
            dy = ops::cast(dy, dt);
          }
          x = x.to(gpu());
          dy = dy.to(gpu());
          const RunContext rc = test::layer_context(true, gpu(), 3);
          const Out a = fused_run(*fused, x, dy, rc), b = chain_run(*plain, relu, rate, x, dy, rc);
          require_equal(a.y, b.y, "y");
          require_equal(a.dx, b.dx, "dx");
          require_equal(a.dw, b.dw, "dW");
          // The bias gradient of a half dtype with ReLU and whole 8-column groups is summed in
          // the backward's first pass (epilogue_relu_grad_bias_kernel), rows in another order
          // than column_sum's: the same f32 terms, so within the float rounding of a sum of
          // `rows` terms of |dz| <= |dy| / 0.7 (dot_atol with unit 0); a missing row, a wrong
          // mask or scale is off by a whole term, O(0.1-1).
          const int64_t rows = shape_numel(c.x) / c.x.back();
          const bool own_order = relu && dt != DType::f32 && c.units % 8 == 0;
          if (own_order) {
            require_close(a.db, b.db, dot_atol(rows, test::max_abs(dy.to(Device::cpu())) / 0.7, 1.0, 0.0), 0.0, "db");
          } else {
            require_equal(a.db, b.db, "db");
          }
          // Inference: the activation alone.
          const RunContext infer = test::layer_context(false, gpu(), 3);
          SavedState s1, s2, s3;
          Tensor yi = fused->forward({x}, infer, s1)[0];
          Tensor yp = plain->forward({x}, infer, s2)[0];
          if (relu) {
            ReLU act("act");
            act.to(gpu());
            yp = act.forward({yp}, infer, s3)[0];
          }
          require_equal(yi.to(Device::cpu()), yp.to(Device::cpu()), "inference y");
        }
      }
    }
  }
}

TEST_CASE("Dense with ReLU and dropout on CUDA agrees with the CPU engine (f32)", "[gpu][layers][dense]") {
  // The output only: the gradients follow from the chain's (above) and the single engines'
  // own GPU tests, and a product within rounding of 0 may pass ReLU on one side only, which
  // moves a gradient by a whole element.
  const Shape in{600, 33};
  const int64_t units = 10;
  auto cpu = make(units, true, 0.3, in, Device::cpu());
  auto cuda = make(units, true, 0.3, in, gpu());
  const Tensor x = test::random_tensor(in, "dense_epi_cpu_x");
  SavedState sa, sb;
  const Tensor a = cpu->forward({x}, test::layer_context(true, Device::cpu(), 3), sa)[0];
  const Tensor b = cuda->forward({x.to(gpu())}, test::layer_context(true, gpu(), 3), sb)[0];
  const double xmax = test::max_abs(x), wmax = test::max_abs(cpu->weight().value);
  // FP32 products summed in other orders (cuBLAS without TF32, oneDNN) plus the bias, times
  // the dropout's scale 1/0.7; a mask decision drawn differently is a whole element off.
  require_close(b.to(Device::cpu()), a, (1.0 / 0.7) * dot_atol(33, xmax, wmax, kUnitFp32) + 1e-6, 1e-6, "y");
}
