// The NCCL path with one rank (label gpu; CUDA builds only): allreduce sum and average in
// f32, f16 and bf16, broadcast, allgather, the algorithm choice for device buffers, and a
// Reducer over device gradients. Data are small integers, exact in all three dtypes, so
// results are compared exactly. (With one rank the Reducer scales in place; its NCCL
// hand-off needs two ranks, hence two GPUs, and is compile-checked only.)
#include "tarantella/comm.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/reducer.hpp"
#include "tarantella/runtime.hpp"

#include <catch2/catch.hpp>

#include <vector>

using namespace tnt;

namespace {

Device gpu() { return default_device().is_cuda() ? default_device() : Device::cuda(0); }

std::vector<float> pattern(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i % 31 - 15);
  return v;
}

// f32 data on the device (copied from the host).
Tensor on_gpu(const std::vector<float>& v) {
  Tensor host = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  Tensor t = Tensor::empty(host.shape(), DType::f32, gpu());
  t.copy_from(host);
  return t;
}

}  // namespace

TEST_CASE("NCCL allreduce on one rank, f32/f16/bf16", "[comm][nccl][gpu]") {
  REQUIRE(cuda_available());
  Communicator& comm = communicator();
  CHECK(comm.resolve(AllreduceAlgo::automatic, gpu()) == AllreduceAlgo::nccl);
  for (int64_t n : {int64_t{1}, int64_t{997}, int64_t{1} << 20}) {
    std::vector<float> v = pattern(n);
    Tensor t = on_gpu(v);
    comm.allreduce(t);
    CHECK(t.to_vector() == v);  // one rank: the sum is the buffer itself
    comm.allreduce(t, ReduceOp::average);
    CHECK(t.to_vector() == v);
    for (DType dt : {DType::f16, DType::bf16}) {
      Tensor h = Tensor::full({n}, 3.0, dt, gpu());
      comm.allreduce(h);
      for (float x : h.to_vector()) CHECK(x == 3.0f);
    }
  }
  Tensor empty = Tensor::empty({0}, DType::f32, gpu());
  comm.allreduce(empty);
}

// NcclComm::synchronize polls cudaEventQuery; a "not ready" answer left as the thread's last
// error would make the next launch check (cudaGetLastError) throw for a kernel that was
// fine. Here the NCCL stream waits behind ~20 passes over 1 GiB on the compute stream, so
// the host polls "not ready" many times before each allreduce completes.
TEST_CASE("a polled NCCL wait leaves no stale error for the next kernel launch", "[comm][nccl][gpu]") {
  REQUIRE(cuda_available());
  Communicator& comm = communicator();
  Tensor big = Tensor::full({int64_t{1} << 28}, 1.0, DType::f32, gpu());  // 1 GiB
  const std::vector<float> v = pattern(1000);
  Tensor t = on_gpu(v);
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 20; ++i) ops::scale(big, 1.0);
    comm.allreduce(t);
    CHECK_NOTHROW(ops::scale(t, 1.0));
    CHECK_NOTHROW(Tensor::full({4}, 2.0, DType::f32, gpu()));
  }
  CHECK(t.to_vector() == v);
}

TEST_CASE("NCCL broadcast and allgather on one rank", "[comm][nccl][gpu]") {
  REQUIRE(cuda_available());
  Communicator& comm = communicator();
  std::vector<float> v = pattern(4099);
  Tensor t = on_gpu(v);
  comm.broadcast(t, 0);
  CHECK(t.to_vector() == v);
  Tensor all = comm.allgather(t);
  CHECK(all.shape() == Shape{1, 4099});
  CHECK(all.device() == gpu());
  CHECK(all.to_vector() == v);
}

TEST_CASE("Reducer over device gradients on one rank", "[comm][nccl][gpu][reducer]") {
  REQUIRE(cuda_available());
  Communicator& comm = communicator();
  std::vector<std::pair<std::string, Tensor>> grads;
  for (int i = 0; i < 6; ++i) grads.emplace_back(fmt::format("g{}", i), on_gpu(pattern(1000 * (i + 1))));
  Reducer reducer(comm, grads, {.threshold_bytes = 8192});
  CHECK(reducer.buckets().size() > 1);
  reducer.set_local_factor(3.0);
  for (size_t i = grads.size(); i-- > 0;) reducer.mark_ready(i);
  reducer.finalize(2.0);
  for (int i = 0; i < 6; ++i) {
    std::vector<float> expect = pattern(1000 * (i + 1));
    for (float& x : expect) x *= 6.0f;  // local factor 3 times scale 2: exact for these integers
    CHECK(grads[static_cast<size_t>(i)].second.to_vector() == expect);
  }
}
