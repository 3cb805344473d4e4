// A step's small device results, read back to the host ONCE at the step's end.
//
// On CUDA each host read of a device number waits for the device: a training step used to
// wait several times (the loss's label check, the loss value, each metric's counts, the loss
// scaler's overflow flag). Instead, every producer reserves a few 64-bit words of one device
// buffer, its kernels write them there, and it registers a consumer: host code that is given
// the words after the step's single copy (flush) and does what the producer did before (adds
// counts to a metric, checks a label and throws the same InputError). Consumers run in the
// order they were registered, so sums are added in the same order as when each producer read
// its own words at once.
//
// Where the words live: device memory on CUDA (one block from the caching allocator, filled
// by the producer's reserve() on the compute stream, so the kernels that write them come
// after), host memory on the CPU (the words are then read where they are written: nothing is
// copied, and the same bookkeeping runs). The block grows between steps: a step that needs
// more words than the block holds gets another block, and the next step's block is as large
// as the whole last step's need, so after the first step a step has one block and one copy.
//
// Who uses it: Model opens a StepScalars::Scope around a step; the engines of the losses and
// metrics call StepScalars::For, which gives them the step's buffer inside such a scope and
// a buffer of their own outside (a direct call of Loss::forward or Metric::update), flushed
// when they finish: the public calls keep reading back at once, as documented.
#pragma once

#include "tarantella/device.hpp"
#include "tarantella/tensor.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tnt::detail {

class StepScalars {
 public:
  using Consumer = std::function<void(const uint64_t* words)>;
  static constexpr uint64_t kNone = ~uint64_t{0};  // "no bad index" (all bytes 0xff)

  explicit StepScalars(Device device, size_t initial_words = 64);
  ~StepScalars();
  StepScalars(const StepScalars&) = delete;
  StepScalars& operator=(const StepScalars&) = delete;

  Device device() const { return device_; }
  // zeros + nones words on the device (host on the CPU): the first `zeros` set to 0, the
  // next `nones` to kNone (stream-ordered on CUDA), valid until flush(); consume gets the same
  // words on the host at flush.
  uint64_t* reserve(size_t zeros, size_t nones, Consumer consume);
  // The value of a 1-element f32 tensor on this device, given to consume as a double at flush
  // (what ops::item gives: the float widened). On CUDA a 4-byte device copy, no host wait.
  void read_f32(const Tensor& t, std::function<void(double)> consume);
  // Queues the copy of every word reserved so far to page-locked host memory, on the
  // compute stream after the work queued so far (which wrote them), and records an event.
  // flush() then waits for that copy alone, not for the work queued since: a training step
  // calls this after its loss and metrics, so that its readback does not wait for the
  // backward, and the host queues the optimizer and the next step while the device still
  // runs it. The rule for a producer: the kernels that write its words are queued before
  // this call (reserve, then the kernels: every engine does). Words reserved after it make
  // flush copy everything again, after all the work queued (as without it). On the CPU,
  // nothing (the words are where they were written).
  void start_copy();
  // The step's one copy to the host, then every consumer in order. An InputError a consumer
  // throws is kept (the first; later consumers still run, so the other results are not lost)
  // and returned; any other exception propagates. The buffer is then empty for the next step.
  std::string flush();

  // Bookkeeping, for tests and the step's readback counter.
  size_t blocks() const { return blocks_.size(); }  // blocks in use this step
  size_t words_reserved() const { return used_total_; }
  size_t capacity() const { return next_capacity_; }  // the first block's size next step
  int64_t copies() const { return copies_; }        // device-to-host copies so far
  int64_t early_reads() const { return early_reads_; }  // flushes served by start_copy's copy

  // The step's buffer of the current thread, or null outside a Scope.
  static StepScalars* current();
  class Scope {
   public:
    explicit Scope(StepScalars& scalars);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepScalars* previous_;
  };

  // What an engine uses: the current step's buffer when there is one on this device, else
  // a buffer of its own; finish() flushes an own buffer (rethrowing its InputError), and
  // does nothing to the step's.
  class For {
   public:
    explicit For(Device device);
    StepScalars& operator*() { return *use_; }
    StepScalars* operator->() { return use_; }
    void finish();

   private:
    std::unique_ptr<StepScalars> own_;
    StepScalars* use_ = nullptr;
  };

 private:
  struct Block {
    uint64_t* words = nullptr;  // device (host on the CPU)
    size_t capacity = 0;
    size_t used = 0;
  };
  struct Pending {
    size_t block, offset, n;
    Consumer consume;
  };
  void release_blocks();
  void wait_early_copy() noexcept;  // for the destructor: the copy may still be queued

  Device device_;
  size_t next_capacity_;
  std::vector<Block> blocks_;
  std::vector<Pending> pending_;
  std::vector<uint64_t> host_;  // the copies' target
  size_t used_total_ = 0;
  int64_t copies_ = 0;
  // start_copy's target (page-locked, CUDA only), its event, and how many words it copied
  // (0: none queued this step).
  uint64_t* pinned_ = nullptr;
  size_t pinned_capacity_ = 0;
  void* copied_ = nullptr;
  size_t early_words_ = 0;
  int64_t early_reads_ = 0;
};

// The device word pair of a check (the first bad index, the value there) as a consumer
// reads it: the index, or -1 when every element was good.
int64_t bad_index(const uint64_t* words);
double bad_value(const uint64_t* words);  // the value at bad_index (its double's bits in word 1)

// A CPU engine's InputError (a bad label or target): inside a step on the CPU it is raised
// with the step's other results at the flush, as the CUDA engines' are, so that Model raises
// it on every rank; outside a step it is thrown at once. The engine must be able to go on
// computing with the bad element (skipping it) when this returns.
void raise_input_error(const std::string& message);

// ops::has_non_finite(xs) for the step's flush: consume(any NaN or infinity) then; all xs on
// scalars.device(). On CUDA one flag word written by one kernel per tensor.
void defer_has_non_finite(StepScalars& scalars, const std::vector<Tensor>& xs, std::function<void(bool)> consume);

}  // namespace tnt::detail

namespace tnt::cuda {
// The kernels of defer_has_non_finite (step/step_scalars_cuda.cu): *flag = 1 (device word)
// if any element of xs (floating, all on one CUDA device) is a NaN or an infinity.
void flag_non_finite(const std::vector<Tensor>& xs, uint64_t* flag);
}  // namespace tnt::cuda

namespace tnt::detail {

}  // namespace tnt::detail
