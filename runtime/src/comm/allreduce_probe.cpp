#include "comm/allreduce_probe.hpp"

#include "core/clock.hpp"
#include "tarantella/tensor.hpp"

#include <algorithm>

namespace tnt::comm {

scaling::AllreduceFit measure_allreduce(Communicator& comm, Device device, int64_t largest) {
  // The latency term shows in the small sizes, the bandwidth term in the large ones. The
  // sizes step down from the largest by 8 (to 4 KB at least), so the larger half that sets
  // the slope (fit_allreduce) spans a factor of 8 or more: sizes stepped up from 4 KB gave
  // 256 KB and 400 KB for a 400 KB model, whose medians a loaded machine swapped.
  largest = std::clamp<int64_t>(largest, 64 << 10, 16 << 20) / 4 * 4;
  std::vector<int64_t> sizes;
  for (int64_t s = largest; s >= (4 << 10); s = s / 8 / 4 * 4) sizes.insert(sizes.begin(), s);
  constexpr int kWarmup = 1;
  // Few: the probe runs inside training (auto: at step 8), and every repeat of the largest
  // size moves all the gradients once more; the median of 5 is steady enough for a line.
  constexpr int kRepeats = 5;
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
    std::nth_element(times.begin(), times.begin() + kRepeats / 2, times.end());  // the median
    medians.push_back(times[kRepeats / 2]);
  }
  // The sum is complete when the slowest rank has it.
  medians = comm.allreduce_max(medians);
  return scaling::fit_allreduce(sizes, medians, comm.size());
}

}  // namespace tnt::comm
