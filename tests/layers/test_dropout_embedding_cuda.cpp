// Dropout and Embedding on CUDA after the vectorised kernels and the device-side id checks
// (label gpu): Dropout's mask on the vector and scalar paths and in channels_last equals the
// CPU's bit for bit; Embedding reports out-of-range ids where embedding_cuda.hpp says (its
// backward, or a later call), with the CPU engine's message, and its weight gradient sums
// repeated ids deterministically.
#include "gpu_test_util.hpp"

#include "backend/cuda/elementwise_plan.hpp"
#include "tarantella/layers.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

using namespace tnt;
using tnt::test::dot_atol;
using tnt::test::gpu;
using tnt::test::kUlp;
using tnt::test::kUnitFp32;
using tnt::test::require_close;

namespace {


RunContext context(bool training, Device device) { return tnt::test::layer_context(training, device, 3); }

// The values of `host` in a GPU buffer at `offset` bytes past a 16-byte aligned address
// (offset 0: the vector path; 2, 4, 8: the scalar path).
Tensor place(const Tensor& host, size_t offset) {
  Tensor buffer = Tensor::empty({static_cast<int64_t>(host.nbytes() + 32)}, DType::u8, gpu());
  const auto base = reinterpret_cast<std::uintptr_t>(buffer.raw());
  Tensor view = buffer.view(host.shape(), host.dtype(), (16 - base % 16) % 16 + offset);
  if (host.numel() > 0) view.copy_from(host);
  REQUIRE(cuda::aligned_for_vectors(view.raw()) == (offset == 0));
  return view;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  Tensor h = t.to(Device::cpu());
  const auto* b = static_cast<const uint8_t*>(h.raw());
  return std::vector<uint8_t>(b, b + h.nbytes());
}

Tensor ids64(std::vector<int64_t> v, Shape shape) { return Tensor::from_data(v.data(), shape); }

// An Embedding built and initialised on `device` (the same name and seed give the same weights).
std::shared_ptr<Embedding> embedding(int64_t vocab, int64_t hidden, Device device, const Shape& ids_shape) {
  auto e = std::make_shared<Embedding>(vocab, hidden, "emb");
  if (device.is_cuda()) e->to(device);
  e->ensure_built({ids_shape});
  e->initialize(11);
  return e;
}

}  // namespace

TEST_CASE("Dropout on CUDA: vector and scalar paths draw the CPU's mask", "[gpu][layers][vector]") {
  for (int64_t n : {0, 1, 7, 8, 9, 1023, 4096 + 3}) {
    const Tensor x = test::random_tensor({1, n}, "dropout_vec_x");
    const Tensor dy = test::random_tensor({1, n}, "dropout_vec_dy");
    Dropout cpu(0.4, "dropout");
    SavedState sc;
    const Tensor y_cpu = cpu.forward({x}, context(true, Device::cpu()), sc)[0];
    const Tensor dx_cpu = cpu.backward({dy}, context(true, Device::cpu()), sc)[0];
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
      const Tensor xt = dt == DType::f32 ? x : ops::cast(x, dt), dyt = dt == DType::f32 ? dy : ops::cast(dy, dt);
      std::vector<uint8_t> y_aligned, dx_aligned;
      for (size_t offset : {size_t{0}, size_t{2}, size_t{4}, size_t{8}}) {
        if (offset % dtype_size(dt) != 0) continue;
        INFO(dtype_name(dt) << " n " << n << " offset " << offset);
        Dropout layer(0.4, "dropout");
        layer.to(gpu());
        SavedState sg;
        const Tensor y = layer.forward({place(xt, offset)}, context(true, gpu()), sg)[0];
        const Tensor dx = layer.backward({place(dyt, offset)}, context(true, gpu()), sg)[0];
        if (dt == DType::f32) {
          // Same Philox bits and the same float scale as the CPU engine: equal bits.
          CHECK(bytes_of(y) == bytes_of(y_cpu));
          CHECK(bytes_of(dx) == bytes_of(dx_cpu));
        }
        if (offset == 0) {
          y_aligned = bytes_of(y);
          dx_aligned = bytes_of(dx);
        } else {
          CHECK(bytes_of(y) == y_aligned);
          CHECK(bytes_of(dx) == dx_aligned);
        }
      }
    }
  }
}

TEST_CASE("Dropout on CUDA: a channels_last tensor gets the contiguous tensor's mask", "[gpu][layers][format]") {
  const Tensor x = test::random_tensor({2, 3, 4, 5}, "dropout_cl_x");
  const Tensor dy = test::random_tensor({2, 3, 4, 5}, "dropout_cl_dy");
  Dropout cpu(0.5, "dropout"), cuda(0.5, "dropout");
  cuda.to(gpu());
  SavedState sc, sg;
  const Tensor y_cpu = cpu.forward({x}, context(true, Device::cpu()), sc)[0];
  const Tensor y = cuda.forward({x.to(gpu()).to_memory_format(MemoryFormat::channels_last)}, context(true, gpu()), sg)[0];
  CHECK(y.is_channels_last());
  CHECK(bytes_of(y.contiguous()) == bytes_of(y_cpu));  // the mask follows the logical index
  const Tensor dx_cpu = cpu.backward({dy}, context(true, Device::cpu()), sc)[0];
  const Tensor dx =
      cuda.backward({dy.to(gpu()).to_memory_format(MemoryFormat::channels_last)}, context(true, gpu()), sg)[0];
  CHECK(dx.is_channels_last());
  CHECK(bytes_of(dx.contiguous()) == bytes_of(dx_cpu));
  // The mask is a function of the logical index, so a contiguous dy works as well.
  const Tensor dx_plain = cuda.backward({dy.to(gpu())}, context(true, gpu()), sg)[0];
  CHECK_FALSE(dx_plain.is_channels_last());
  CHECK(bytes_of(dx_plain) == bytes_of(dx_cpu));
}

TEST_CASE("Embedding on CUDA: a bad id is reported by the call's backward", "[gpu][transformer][ids]") {
  const Tensor bad = ids64({3, 1, 0, 4, 2, 12, 5, 13}, {2, 4});  // first bad: 12 at position 5
  // The CPU engine's message, which the CUDA one starts with.
  std::string cpu_message;
  {
    auto c = embedding(9, 16, Device::cpu(), {2, 4});
    SavedState s;
    try {
      c->forward({bad}, context(true, Device::cpu()), s);
    } catch (const InputError& e) {
      cpu_message = e.what();
    }
    REQUIRE(cpu_message == "Embedding 'emb': token id 12 at position 5 is outside the vocabulary [0, 9)");
  }
  auto g = embedding(9, 16, gpu(), {2, 4});
  SavedState s;
  // The forward only queues the check of its own ids: it cannot throw for them.
  REQUIRE_NOTHROW(g->forward({bad.to(gpu())}, context(true, gpu()), s));
  const Tensor dy = Tensor::zeros({2, 4, 16}, DType::f32, gpu());
  try {
    g->backward({dy}, context(true, gpu()), s);
    FAIL("backward accepted an id outside the vocabulary");
  } catch (const InputError& e) {
    const std::string m = e.what();
    CHECK_THAT(m, Catch::StartsWith(cpu_message));
    CHECK_THAT(m, Catch::Contains("lookup call 1 of this layer"));
    CHECK_THAT(m, Catch::Contains("reported by its backward"));
  }
  // Reported once: the next call (good ids) goes through.
  SavedState s2;
  CHECK_NOTHROW(g->forward({ids64({1, 2}, {1, 2}).to(gpu())}, context(true, gpu()), s2));
}

TEST_CASE("Embedding on CUDA: in inference a bad id is reported by the next call", "[gpu][transformer][ids]") {
  auto g = embedding(9, 16, gpu(), {1, 3});
  SavedState s1;
  // i32 ids, a negative one at position 1.
  const int32_t raw[3] = {2, -1, 7};
  const Tensor bad = Tensor::from_data(raw, {1, 3});
  Tensor y;
  REQUIRE_NOTHROW(y = g->forward({bad.to(gpu())}, context(false, gpu()), s1)[0]);
  // Reading y waits for the lookup, queued after the check: the check has finished now.
  const std::vector<float> yv = y.to_vector();
  for (int64_t j = 16; j < 32; ++j) CHECK(yv[static_cast<size_t>(j)] == 0.0f);  // the bad row: 0, W never read
  SavedState s2;
  try {
    g->forward({ids64({1}, {1, 1}).to(gpu())}, context(false, gpu()), s2);
    FAIL("the call after a bad id did not report it");
  } catch (const InputError& e) {
    const std::string m = e.what();
    CHECK_THAT(m, Catch::StartsWith("Embedding 'emb': token id -1 at position 1 is outside the vocabulary [0, 9)"));
    CHECK_THAT(m, Catch::Contains("lookup call 1 of this layer"));
    CHECK_THAT(m, Catch::Contains("reported by a later call of the layer"));
  }
  // Once reported, later calls run; a projection call checks too and finds nothing.
  SavedState s3, s4;
  CHECK_NOTHROW(g->forward({ids64({1}, {1, 1}).to(gpu())}, context(false, gpu()), s3));
  CHECK_NOTHROW(g->forward({Tensor::zeros({1, 16}, DType::f32, gpu())}, context(false, gpu()), s4));
}

TEST_CASE("Embedding on CUDA: repeated ids summed in row order, bitwise repeatable, close to the CPU",
          "[gpu][transformer][ids]") {
  SECTION("closed form") {
    // dy row r = r + 1 everywhere: each id's sum of integers is exact in float, then one
    // product with the float scale, as the kernel does: equal bits.
    const int64_t v = 7, d = 40;
    const std::vector<int64_t> id = {3, 5, 3, 0, 3, 6, 5, 0, 1, 3};
    const auto rows = static_cast<int64_t>(id.size());
    auto g = embedding(v, d, gpu(), {rows});
    g->weight().grad.zero_();
    SavedState s;
    g->forward({ids64(id, {rows}).to(gpu())}, context(true, gpu()), s);
    Tensor dy = Tensor::empty({rows, d});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < d; ++j) dy.data<float>()[r * d + j] = static_cast<float>(r + 1);
    g->backward({dy.to(gpu())}, context(true, gpu()), s);
    Tensor expected = Tensor::zeros({v, d});
    std::map<int64_t, float> sums;
    for (int64_t r = 0; r < rows; ++r)
      if (id[static_cast<size_t>(r)] != 0) sums[id[static_cast<size_t>(r)]] += static_cast<float>(r + 1);
    const float scale = static_cast<float>(g->scale());
    for (auto [k, sum] : sums)
      for (int64_t j = 0; j < d; ++j) expected.data<float>()[k * d + j] = sum * scale;
    CHECK(bytes_of(g->weight().grad) == bytes_of(expected));  // row 0 (padding) and unused ids stay 0
  }
  SECTION("many ids over a large vocabulary") {
    // 8000 ids in [0, 300) (about 27 per id, zeros included) over a 32000-token vocabulary:
    // the radix sort over 15 key bits, many groups, long runs.
    const int64_t v = 32000, d = 64, rows = 8000;
    Tensor id = test::random_labels(rows, 300, "emb_many_ids");
    auto c = embedding(v, d, Device::cpu(), {rows});
    auto g = embedding(v, d, gpu(), {rows});
    const Tensor dy = test::random_tensor({rows, d}, "emb_many_dy");
    auto run_gpu = [&] {
      g->weight().grad.zero_();
      SavedState s;
      g->forward({id.to(gpu())}, context(true, gpu()), s);
      g->backward({dy.to(gpu())}, context(true, gpu()), s);
      return g->weight().grad.to(Device::cpu());
    };
    const Tensor first = run_gpu(), second = run_gpu();
    CHECK(bytes_of(first) == bytes_of(second));  // a fixed order per id: the same bits every run
    c->weight().grad.zero_();
    SavedState s;
    c->forward({id}, context(true, Device::cpu()), s);
    c->backward({dy}, context(true, Device::cpu()), s);
    int64_t most = 0;
    std::map<int64_t, int64_t> count;
    for (int64_t r = 0; r < rows; ++r) most = std::max(most, ++count[id.data<int64_t>()[r]]);
    // The CPU adds scale * dy row by row into dW, the GPU scales each id's row-order sum
    // once: per id, a sum of at most `most` terms of |dy| <= 1 times scale, in other
    // roundings (the bound of the existing lookup test, test_transformer_layers_cuda.cpp).
    require_close(first, c->weight().grad, dot_atol(most, 1, g->scale(), kUnitFp32), kUlp, "dW");
  }
}
