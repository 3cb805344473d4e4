// resnet50's images-per-second lines (ThroughputLogger), apart from main.cpp.
#pragma once

#include "common/wording.hpp"

#include <tarantella/tarantella.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace tnt_models {

// Images per second from step timing (as the TF Model Garden's TimeHistory): the time
// between the ends of consecutive steps of one epoch, so the first step of each epoch (warm
// up, validation before it) is not counted. Prints every log_steps timed steps, a window
// that never spans two epochs ("step 11: ... over the last 10 steps (2 to 11)": steps are
// counted from 1 over the whole run, as the epoch line's), and a summary at the end. With
// --enable_time_history the TimeHistory callback prints the rates instead (summary = false:
// only the peak memory line is left here).
class ThroughputLogger : public tnt::Callback {
 public:
  ThroughputLogger(int64_t global_batch, int64_t log_steps, bool summary = true)
      : tnt::Callback(Ranks::master), global_batch_(global_batch), log_steps_(log_steps), summary_(summary) {}
  void on_epoch_begin(int, const tnt::Logs&) override {
    have_last_ = false;
    window_seconds_ = 0;
    window_steps_ = 0;
  }
  void on_train_batch_end(int64_t, const tnt::Logs& logs) override {
    double t = now();
    if (have_last_) {
      total_seconds_ += t - last_;
      ++total_steps_;
      window_seconds_ += t - last_;
      ++window_steps_;
    }
    last_ = t;
    have_last_ = true;
    if (log_steps_ > 0 && window_steps_ >= log_steps_) {
      auto loss = logs.find("loss");
      // global_step() counts this step already: the window is its last window_steps_ steps.
      const int64_t last = model_->global_step();
      tnt::print("step {}: {:.1f} images/s over the last {}{}, loss {:.4f}", last,
                 images_per_second(window_seconds_, window_steps_), tnt_models::count_of(window_steps_, "step"),
                 window_steps_ > 1 ? fmt::format(" ({} to {})", last - window_steps_ + 1, last) : std::string(),
                 loss == logs.end() ? 0.0 : loss->second);
      window_seconds_ = 0;
      window_steps_ = 0;
    }
  }
  void on_train_end(const tnt::Logs&) override {
    if (summary_ && total_steps_ == 0) {
      tnt::print("images/s: not measured (fewer than 2 steps in an epoch)");
      return;
    }
    if (summary_) {
      tnt::print("images/s: {:.1f} (global batch {}, {}, {}, {:.1f} ms/step)",
                 images_per_second(total_seconds_, total_steps_), global_batch_,
                 tnt_models::count_of(tnt::size(), "rank"), tnt_models::count_of(total_steps_, "timed step"),
                 1e3 * total_seconds_ / static_cast<double>(total_steps_));
    }
    if (tnt::default_device().is_cuda()) {
      // What the caching allocator handed out at most (scripts/bench/resnet50_gpu reads it).
      {
        // In use at the peak, and what the caching allocator held from the driver at the end (the
        // difference, the pool's spare blocks, is part of what nvidia-smi shows beyond the peak).
        const tnt::MemoryStats m = tnt::memory_stats(tnt::default_device());
        tnt::print("peak GPU memory: {} MiB in use, {} MiB held by the allocator", m.peak_bytes >> 20,
                   m.reserved_bytes >> 20);
      }
      // Which BatchNorm chains ran as one cuDNN call (TNT_LAYER_FUSION, docs/gpu.md).
      tnt::Network& net = model_->network();
      tnt::print("layer fusion: {} chains, {} fused by cuDNN in the last training step", net.fused_chains(),
                 net.fused_engine_runs());
    }
  }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  double images_per_second(double seconds, int64_t steps) const {
    return seconds > 0 ? static_cast<double>(global_batch_ * steps) / seconds : 0.0;
  }
  int64_t global_batch_, log_steps_;
  bool summary_;
  bool have_last_ = false;
  double last_ = 0;
  double total_seconds_ = 0, window_seconds_ = 0;
  int64_t total_steps_ = 0, window_steps_ = 0;
};

}  // namespace tnt_models
