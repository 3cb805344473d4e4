// --data_workers: the threads that decode and augment ImageNet images on each rank, and the
// hint after training when they held it back.
#pragma once

#include "tarantella/check.hpp"
#include "tarantella/model.hpp"

#include <fmt/format.h>

#include <string>

namespace tnt_models {

inline constexpr int kMaxDataWorkers = 256;
inline constexpr int kCpuRankDataWorkers = 4;
// The hint is printed when the last epoch waited this share of its time for batches.
inline constexpr double kInputBoundHint = 0.10;

struct DataWorkers {
  int count = kCpuRankDataWorkers;
  bool automatic = true;
  bool gpu_rank = false;
  std::string why;  // how auto chose, for the run's header
};

// flag: "auto" or 1 to kMaxDataWorkers. auto on a GPU rank: its cores but one (the thread
// that drives the GPU), at least 1. A GPU takes images far faster than one core decodes
// them: an H200 trains ResNet-50 at about 6,600 images/s, and a core decodes and crops about
// 750 a second at 224 (docs/performance.md), so 4 threads would hold it to about half its
// speed. auto on a CPU rank: 4, since its cores also train.
inline DataWorkers resolve_data_workers(const std::string& flag, bool gpu_rank, int rank_cores) {
  DataWorkers w;
  w.gpu_rank = gpu_rank;
  if (flag == "auto") {
    if (gpu_rank) {
      w.count = rank_cores > 1 ? std::min(rank_cores - 1, kMaxDataWorkers) : 1;
      w.why = fmt::format("auto: this GPU rank's {} core{} but one", rank_cores, rank_cores == 1 ? "" : "s");
    } else {
      w.why = "auto: on CPU ranks, whose cores also train";
    }
    return w;
  }
  w.automatic = false;
  size_t used = 0;
  long value = 0;
  try {
    value = std::stol(flag, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TNT_INPUT_CHECK(used == flag.size() && !flag.empty(), "--data_workers={}: expected auto or a number from 1 to {}",
                  flag, kMaxDataWorkers);
  TNT_INPUT_CHECK(value >= 1 && value <= kMaxDataWorkers, "--data_workers={}: must be from 1 to {}", flag,
                  kMaxDataWorkers);
  w.count = static_cast<int>(value);
  return w;
}

// After training: what to do when the last epoch waited for its batches kInputBoundHint of
// its time or more (steps of the loop's own clock); "" otherwise, or with fewer than 10 steps
// (the pipeline's start would weigh too much). On a GPU rank more threads, up to its cores
// but one; on a CPU rank the cores are shared with training.
inline std::string input_bound_hint(const tnt::EpochTiming& t, const DataWorkers& w, int rank_cores) {
  if (t.steps < 10 || t.input_fraction() < kInputBoundHint) return "";
  std::string line = fmt::format(
      "input: in the last epoch each step waited {:.1f} ms for its images, {:.0f}% of the {:.1f} ms it took: "
      "decoding holds training back. This rank decodes on {} thread{} (--data_workers={}) and has {} core{}",
      t.input_seconds * 1e3, t.input_fraction() * 100.0, (t.input_seconds + t.step_seconds) * 1e3, w.count,
      w.count == 1 ? "" : "s", w.automatic ? "auto" : std::to_string(w.count), rank_cores, rank_cores == 1 ? "" : "s");
  if (!w.gpu_rank) {
    return line + ", which also train (TNT_NUM_THREADS): give decoding more of them with --data_workers and "
                  "fewer to training, or each rank more cores (fewer ranks a node)";
  }
  if (w.count < rank_cores - 1) return line + fmt::format(": try --data_workers={}", rank_cores - 1);
  return line + ": give each rank more cores (fewer ranks a node), or read the images from a faster disk";
}

}  // namespace tnt_models
