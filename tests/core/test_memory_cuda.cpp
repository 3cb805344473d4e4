// The CUDA caching allocator and copies: block rounding, reuse across sizes, reuse (no cudaMalloc in a steady
// state loop, layers included), statistics, empty_cache, a clear OOM error, thread safety,
// and exact host <-> device round trips.
#include "gpu_test_util.hpp"

#include "backend/cuda/allocator.hpp"
#include "tarantella/graph.hpp"
#include "tarantella/layers.hpp"

#include "core/device_api.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

using namespace tnt;
using tnt::test::gpu;

TEST_CASE("allocator blocks: requests rounded up to 512 bytes", "[gpu][memory]") {
  CHECK(cuda::allocator_block_size(0) == 512);
  CHECK(cuda::allocator_block_size(1) == 512);
  CHECK(cuda::allocator_block_size(512) == 512);
  CHECK(cuda::allocator_block_size(513) == 1024);
  CHECK(cuda::allocator_block_size(2049) == 2560);
  CHECK(cuda::allocator_block_size((1u << 20) + 1) == (1u << 20) + 512);
}

TEST_CASE("a freed large block serves smaller requests of other sizes without cudaMalloc", "[gpu][memory]") {
  const int dev = 0;
  {
    Tensor workspace = Tensor::empty({int64_t{256} << 20}, DType::u8, gpu());  // 256 MiB
    // The small blocks below (a segment of their own kind) exist from here on too.
    CHECK(ops::sum(Tensor::full({8}, 1.0, DType::f32, gpu())) == 8.0);
  }
  const cuda::AllocatorCounters before = cuda::allocator_counters(dev);
  {
    std::vector<Tensor> acts;
    for (int i = 0; i < 40; ++i) acts.push_back(Tensor::empty({(int64_t{3} << 20) + 1000 * i}, DType::u8, gpu()));
    CHECK(ops::sum(Tensor::full({8}, 1.0, DType::f32, gpu())) == 8.0);
  }
  const cuda::AllocatorCounters after = cuda::allocator_counters(dev);
  CHECK(after.driver_mallocs == before.driver_mallocs);
  CHECK(after.reserved_bytes == before.reserved_bytes);
}

TEST_CASE("a freed block is reused: no cudaMalloc in a steady-state loop", "[gpu][memory]") {
  const int dev = 0;
  // One "training step": tensors of assorted sizes, layer forward and backward passes
  // (cuBLAS, cuDNN workspaces, our kernels), everything freed at the end of the step.
  Dense dense(32, DenseOptions{}, "steady_dense");
  Conv2D conv(8, 3, Conv2DOptions{.stride = 1, .padding = 1}, "steady_conv");
  BatchNorm bn("steady_bn");
  for (Layer* l : std::initializer_list<Layer*>{&dense, &conv, &bn}) l->to(gpu());
  RunContext rc;
  rc.training = true;
  rc.device = gpu();
  auto step = [&] {
    std::vector<Tensor> scratch;
    for (int64_t n : {1, 100, 4096, 100000, 3 << 20}) scratch.push_back(Tensor::zeros({n}, DType::f32, gpu()));
    Tensor x = test::random_tensor({4, 16}, "steady_x").to(gpu());
    SavedState sd;
    Tensor y = dense.forward({x}, rc, sd)[0];
    dense.backward({y}, rc, sd);
    Tensor img = test::random_tensor({2, 3, 9, 9}, "steady_img").to(gpu());
    SavedState sc, sb;
    Tensor z = conv.forward({img}, rc, sc)[0];
    Tensor zb = bn.forward({z}, rc, sb)[0];
    Tensor dz = bn.backward({zb}, rc, sb)[0];
    conv.backward({dz}, rc, sc);
    return ops::sum(zb);  // waits for the step's work
  };
  step();  // fills the cache (and creates handles, plans)
  step();
  const cuda::AllocatorCounters before = cuda::allocator_counters(dev);
  for (int i = 0; i < 5; ++i) step();
  const cuda::AllocatorCounters after = cuda::allocator_counters(dev);
  INFO("requests " << after.requests - before.requests << ", cache hits " << after.cache_hits - before.cache_hits);
  CHECK(after.driver_mallocs == before.driver_mallocs);
  CHECK(after.requests > before.requests);
  CHECK(after.cache_hits - before.cache_hits == after.requests - before.requests);
}

TEST_CASE("memory statistics count tensor bytes; empty_cache returns cached blocks", "[gpu][memory]") {
  const int dev = 0;
  const MemoryStats base = memory_stats(gpu());
  reset_peak_memory(gpu());
  {
    Tensor a = Tensor::empty({1000}, DType::f32, gpu());   // 4000 bytes
    Tensor b = Tensor::empty({250}, DType::f64, gpu());    // 2000 bytes
    MemoryStats s = memory_stats(gpu());
    CHECK(s.current_bytes == base.current_bytes + 6000);
    CHECK(s.peak_bytes >= s.current_bytes);
    CHECK(s.reserved_bytes >= s.current_bytes);
  }
  MemoryStats after = memory_stats(gpu());
  CHECK(after.current_bytes == base.current_bytes);
  CHECK(after.peak_bytes >= base.current_bytes + 6000);
  reset_peak_memory(gpu());
  CHECK(memory_stats(gpu()).peak_bytes == base.current_bytes);

  {
    // A segment of its own (64 MiB is a large request), wholly free after the scope.
    Tensor big = Tensor::empty({int64_t{64} << 20}, DType::u8, gpu());
  }
  const cuda::AllocatorCounters held = cuda::allocator_counters(dev);
  CHECK(held.cached_bytes >= (size_t{64} << 20));
  cuda::empty_cache(dev);
  const cuda::AllocatorCounters emptied = cuda::allocator_counters(dev);
  CHECK(emptied.driver_frees > held.driver_frees);
  CHECK(emptied.cached_bytes + (size_t{64} << 20) <= held.cached_bytes);
  CHECK(emptied.reserved_bytes + (size_t{64} << 20) <= held.reserved_bytes);
  CHECK(memory_stats(gpu()).reserved_bytes >= memory_stats(gpu()).current_bytes);
  // Still usable after emptying.
  Tensor c = Tensor::full({10}, 3.0, DType::f32, gpu());
  CHECK(c.to_vector() == std::vector<float>(10, 3.0f));
}

TEST_CASE("an impossible allocation fails with a message naming the sizes", "[gpu][memory]") {
  const int64_t huge = int64_t{1} << 50;  // 1 PiB
  try {
    Tensor t = Tensor::empty({huge}, DType::u8, gpu());
    FAIL("allocating 1 PiB on the GPU succeeded");
  } catch (const Error& e) {
    std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("out of GPU memory") != std::string::npos);
    CHECK(msg.find("cuda:0") != std::string::npos);
    CHECK(msg.find(std::to_string(huge)) != std::string::npos);
  }
  // The allocator keeps working after the failure.
  Tensor ok = Tensor::full({4}, 1.5, DType::f32, gpu());
  CHECK(ok.to_vector() == std::vector<float>(4, 1.5f));
}

TEST_CASE("the allocator is thread-safe", "[gpu][memory]") {
  const MemoryStats base = memory_stats(gpu());
  std::atomic<int> failures{0};
  auto worker = [&failures](int id) {
    try {
      for (int i = 0; i < 500; ++i) {
        Tensor t = Tensor::empty({static_cast<int64_t>(64 + (i * 37 + id * 101) % 5000)}, DType::f32, gpu());
        (void)t;
      }
    } catch (const std::exception&) {
      ++failures;  // Catch2's macros are not thread-safe: count here, check below
    }
  };
  std::thread a(worker, 1), b(worker, 2), c(worker, 3);
  a.join();
  b.join();
  c.join();
  CHECK(failures == 0);
  CHECK(memory_stats(gpu()).current_bytes == base.current_bytes);
}

TEST_CASE("host <-> device copies are exact, for every dtype", "[gpu][memory]") {
  Tensor host = test::random_tensor({3, 257}, "copy_roundtrip", -1e6f, 1e6f);
  Tensor d1 = host.to(gpu());
  Tensor d2 = d1.clone();  // device to device
  Tensor back = d2.to(Device::cpu());
  CHECK(back.to_vector() == host.to_vector());
  CHECK(d2.device() == gpu());

  Tensor ints = Tensor::empty({5}, DType::i64);
  for (int64_t i = 0; i < 5; ++i) ints.data<int64_t>()[i] = (int64_t{1} << 40) + i;
  CHECK(ints.to(gpu()).to(Device::cpu()).to_double_vector() == ints.to_double_vector());

  Tensor z = Tensor::full({100}, 7.0, DType::f32, gpu());
  z.zero_();
  CHECK(z.to_vector() == std::vector<float>(100, 0.0f));

  // Row slices share storage and copy at their offset.
  Tensor rows = d1.slice_rows(1, 3);
  CHECK(rows.to_vector() == host.slice_rows(1, 3).to_vector());
}

TEST_CASE("cuda_zero_spans zeroes every span in one launch, and no byte beside them", "[gpu][memory]") {
  const int dev = 0;
  // 0xff everywhere, then spans at aligned and odd offsets, of sizes around the 16-byte
  // stores and the 64 KiB chunks (an empty one too); every other byte must stay 0xff.
  const int64_t total = (int64_t{1} << 20) + 4099;
  Tensor buffer = Tensor::full({total}, 255.0, DType::u8, gpu());
  auto* base = static_cast<unsigned char*>(buffer.raw());
  const std::vector<std::pair<int64_t, int64_t>> at_size = {
      {0, 16},        {16, 1},          {33, 15},          {64, 17},    {4096, 65536},
      {70000, 65537}, {140001, 200001}, {400000, 0},       {400016, 3}, {500000, 262144 + 16},
      {800003, 5}};
  std::vector<std::pair<void*, size_t>> spans;
  for (const auto& [at, size] : at_size) spans.push_back({base + at, static_cast<size_t>(size)});
  auto check = [&](const std::vector<std::pair<int64_t, int64_t>>& zeroed, const char* what) {
    const std::vector<uint8_t> host = [&] {
      std::vector<uint8_t> v(static_cast<size_t>(total));
      backend::cuda_copy(v.data(), Device::cpu(), buffer.raw(), buffer.device(), v.size());
      return v;
    }();
    std::vector<uint8_t> want(static_cast<size_t>(total), 0xff);
    for (const auto& [at, size] : zeroed)
      for (int64_t i = 0; i < size; ++i) want[static_cast<size_t>(at + i)] = 0;
    int64_t wrong = 0, first = -1;
    for (size_t i = 0; i < want.size(); ++i) {
      if (host[i] != want[i]) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++wrong;
      }
    }
    INFO(what << ": " << wrong << " wrong bytes, the first at " << first);
    CHECK(wrong == 0);
  };
  std::shared_ptr<void> cache;  // the caller's tables (a Network keeps its own)
  backend::cuda_zero_spans(spans, dev, cache);
  check(at_size, "first call");
  // Other spans (a new table), then the first ones again (another new table): each call
  // zeroes exactly its own spans.
  buffer.fill_(255.0);
  const std::vector<std::pair<int64_t, int64_t>> others = {{1, 100}, {900000, 70000}};
  std::vector<std::pair<void*, size_t>> other_spans;
  for (const auto& [at, size] : others) other_spans.push_back({base + at, static_cast<size_t>(size)});
  backend::cuda_zero_spans(other_spans, dev, cache);
  check(others, "other spans");
  buffer.fill_(255.0);
  backend::cuda_zero_spans(spans, dev, cache);
  check(at_size, "the first spans again");
  // The same spans again reuse the table: no allocation.
  buffer.fill_(255.0);
  const cuda::AllocatorCounters before = cuda::allocator_counters(dev);
  backend::cuda_zero_spans(spans, dev, cache);
  CHECK(cuda::allocator_counters(dev).requests == before.requests);
  check(at_size, "the same spans, the table reused");
  // Another cache keeps its own table: the first one's is still reused after it.
  std::shared_ptr<void> other_cache;
  buffer.fill_(255.0);
  backend::cuda_zero_spans(other_spans, dev, other_cache);
  check(others, "other spans, another cache");
  buffer.fill_(255.0);
  const cuda::AllocatorCounters again = cuda::allocator_counters(dev);
  backend::cuda_zero_spans(spans, dev, cache);
  CHECK(cuda::allocator_counters(dev).requests == again.requests);
  check(at_size, "the first cache's spans, its table kept");
  backend::cuda_zero_spans({}, dev, cache);  // nothing to do
}

TEST_CASE("zero_grad on a GPU network: every gradient zero, a layer called twice counted once", "[gpu][memory]") {
  auto first = std::make_shared<Dense>(6, DenseOptions{}, "zg_first");
  auto twice = std::make_shared<Dense>(6, DenseOptions{}, "zg_twice");
  SymTensor x = Input({6});
  Network net({x}, {call(twice, call(twice, call(first, x)))}, "zg_net");
  net.to(gpu());
  RunContext rc;
  rc.training = true;
  rc.device = gpu();
  net.forward({test::random_tensor({3, 6}, "zg_x").to(gpu())}, rc, false);
  std::vector<Parameter*> params;
  for (auto& [name, p] : net.named_parameters()) params.push_back(p);
  REQUIRE(params.size() == 4);
  for (Parameter* p : params) {
    REQUIRE(p->grad.defined());
    REQUIRE(p->grad.device() == gpu());
    p->grad.fill_(3.0);
  }
  net.zero_grad();
  for (Parameter* p : params) {
    INFO(p->grad.str());
    const std::vector<float> g = p->grad.to_vector();
    CHECK(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; }));
  }
}

TEST_CASE("cuda_cast_spans rounds f32 to bf16 and f16 as ops::cast does, in one launch", "[gpu][memory]") {
  const int dev = 0;
  // Values across the range: ties at the 8th and 11th significant bit, subnormals of both
  // formats, overflow to infinity in f16, infinities and NaN; sizes around the 4-element
  // stores and the 16,384-element chunks; an odd element offset (no 16-byte alignment).
  std::vector<float> values;
  for (int i = 0; i < 40000; ++i) {
    const float base = std::ldexp(1.0f + static_cast<float>(i % 257) / 256.0f, (i % 61) - 30);
    values.push_back(i % 2 ? -base : base);
  }
  for (float v : {1.0f + 1.0f / 256, 1.0f + 3.0f / 512, 1.0f + 1.0f / 2048, 1e-40f, 6e-8f, 70000.0f, 65519.0f})
    values.push_back(v);
  values.push_back(std::numeric_limits<float>::infinity());
  values.push_back(-std::numeric_limits<float>::infinity());
  values.push_back(std::numeric_limits<float>::quiet_NaN());
  const Tensor src = Tensor::from_vector(values, {static_cast<int64_t>(values.size())}).to(gpu());
  const int64_t total = src.numel();
  const std::vector<std::pair<int64_t, int64_t>> at_size = {{0, 4}, {4, 3}, {9, 16384}, {16400, 16385}, {32800, 1},
                                                             {32801, total - 32801}};
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    const Tensor want = ops::cast(src, dt);
    Tensor dst = Tensor::zeros({total}, dt, gpu());
    std::vector<backend::CastSpan> spans;
    for (const auto& [at, size] : at_size) {
      spans.push_back({static_cast<const float*>(src.raw()) + at,
                       static_cast<unsigned char*>(dst.raw()) + at * static_cast<int64_t>(dtype_size(dt)), size, dt});
    }
    std::shared_ptr<void> cache;
    backend::cuda_cast_spans(spans, dev, cache);
    // Bit for bit: the same rounding (NaN's payload included, as the same conversion makes it).
    std::vector<uint16_t> got(static_cast<size_t>(total)), ref(static_cast<size_t>(total));
    backend::cuda_copy(got.data(), Device::cpu(), dst.raw(), dst.device(), got.size() * 2);
    backend::cuda_copy(ref.data(), Device::cpu(), want.raw(), want.device(), ref.size() * 2);
    int64_t wrong = 0, first = -1;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != ref[i]) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++wrong;
      }
    }
    INFO(wrong << " elements differ from ops::cast, the first at " << first);
    CHECK(wrong == 0);
    // Again with the table reused (same spans): no allocation, the same result.
    dst.zero_();
    const cuda::AllocatorCounters before = cuda::allocator_counters(dev);
    backend::cuda_cast_spans(spans, dev, cache);
    CHECK(cuda::allocator_counters(dev).requests == before.requests);
    backend::cuda_copy(got.data(), Device::cpu(), dst.raw(), dst.device(), got.size() * 2);
    CHECK(got == ref);
  }
}
