#include "comm/allreduce_probe.hpp"

#include "core/clock.hpp"
#include "tarantella/tensor.hpp"

#include <algorithm>

namespace tnt::comm {

scaling::AllreduceFit measure_allreduce(Communicator& comm, Device device) {
  // Sizes around the buckets a fusion threshold makes (1 KB .. a few MB): the latency term
  // shows in the small ones, the bandwidth term in the large ones.
  const std::vector<int64_t> sizes{4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20};
  constexpr int kWarmup = 2;
  constexpr int kRepeats = 9;
  std::vector<double> medians;
  for (int64_t bytes : sizes) {
    Tensor t = Tensor::zeros({bytes / 4}, DType::f32, device);  // (n,)
    std::vector<double> times;
    for (int r = 0; r < kWarmup + kRepeats; ++r) {
      // Every rank starts together, so that a time is the allreduce's, not a late peer's.
      comm.barrier();
      const double t0 = detail::now_s();
      comm.allreduce(t);
      if (r >= kWarmup) times.push_back(detail::now_s() - t0);
    }
    std::nth_element(times.begin(), times.begin() + kRepeats / 2, times.end());
    medians.push_back(times[kRepeats / 2]);
  }
  // The sum is complete when the slowest rank has it.
  medians = comm.allreduce_max(medians);
  return scaling::fit_allreduce(sizes, medians, comm.size());
}

}  // namespace tnt::comm
