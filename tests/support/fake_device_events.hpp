// A GPU's timed events without a GPU (timeline::DeviceEvents): an event runs at the GPU
// time its record was given, and the GPU has run everything up to `done`, which the test
// moves (behind the host, as a GPU is) or a synchronize moves. Asking for the elapsed time
// of an event that has not run fails the test, as CUDA refuses it.
#pragma once

#include <catch2/catch.hpp>

#include "io/timeline_gpu.hpp"

#include <algorithm>
#include <map>
#include <memory>

namespace tnt::test {

struct FakeGpu {
  std::map<void*, double> at;  // GPU seconds
  double next = 0;             // the time the next record gets
  double done = -1;
  int created = 0, destroyed = 0, waits = 0;
  int stalls = 0;  // synchronize calls that had to wait (the event had not run yet)
};

class FakeEvents final : public timeline::DeviceEvents {
 public:
  explicit FakeEvents(std::shared_ptr<FakeGpu> gpu) : gpu_(std::move(gpu)) {}
  void* create() override { return new int(++gpu_->created); }
  void destroy(void* e) override {
    ++gpu_->destroyed;
    delete static_cast<int*>(e);
  }
  void record(void* e) override { gpu_->at[e] = gpu_->next; }
  bool complete(void* e) override { return gpu_->at.count(e) && gpu_->at[e] <= gpu_->done; }
  void synchronize(void* e) override {
    ++gpu_->waits;
    if (gpu_->at.at(e) > gpu_->done) ++gpu_->stalls;
    gpu_->done = std::max(gpu_->done, gpu_->at.at(e));
  }
  double elapsed_ms(void* from, void* to) override {
    REQUIRE(complete(from));
    REQUIRE(complete(to));
    return (gpu_->at.at(to) - gpu_->at.at(from)) * 1e3;
  }

 private:
  std::shared_ptr<FakeGpu> gpu_;
};

}  // namespace tnt::test
