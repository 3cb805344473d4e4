#include "step/step_scalars.hpp"

#include "core/device_api.hpp"
#include "tarantella/check.hpp"
#include "tarantella/ops.hpp"

#include <algorithm>
#include <cstring>

namespace tnt::detail {

namespace {

thread_local StepScalars* t_current = nullptr;

}  // namespace

StepScalars::StepScalars(Device device, size_t initial_words)
    : device_(device), next_capacity_(std::max<size_t>(initial_words, 1)) {}

StepScalars::~StepScalars() {
  // A step that threw before its flush leaves words behind: dropped, nothing was consumed.
  // Its early copy may still be queued: it must run before the buffers go.
  wait_early_copy();
  release_blocks();
  if (pinned_ != nullptr) backend::cuda_host_free(pinned_);
  if (copied_ != nullptr) backend::cuda_event_destroy(copied_, device_.index);
}

void StepScalars::wait_early_copy() noexcept {
  if (early_words_ == 0) return;
  try {
    backend::cuda_event_synchronize(copied_, device_.index);
  } catch (...) {
    // A failed device: its context goes with the process; nothing more to order.
  }
  early_words_ = 0;
}

void StepScalars::start_copy() {
  if (!device_.is_cuda() || used_total_ == 0) return;
  if (pinned_capacity_ < used_total_) {
    wait_early_copy();  // not expected (one early copy a step, read by flush), but safe
    if (pinned_ != nullptr) backend::cuda_host_free(pinned_);
    pinned_ = nullptr;
    pinned_capacity_ = 0;
    // Room for more words than today's: a step's need grows only in its first steps.
    const size_t capacity = std::max<size_t>(2 * used_total_, 64);
    pinned_ = static_cast<uint64_t*>(backend::cuda_host_alloc(capacity * sizeof(uint64_t)));
    pinned_capacity_ = capacity;
  }
  if (copied_ == nullptr) copied_ = backend::cuda_event_create(device_.index);
  size_t at = 0;
  for (const Block& b : blocks_) {
    backend::cuda_copy_async(pinned_ + at, b.words, b.used * sizeof(uint64_t), backend::CudaStream::compute,
                             device_.index);
    at += b.used;
  }
  backend::cuda_event_record(copied_, backend::CudaStream::compute, device_.index);
  early_words_ = used_total_;
}

void StepScalars::release_blocks() {
  for (Block& b : blocks_) {
    if (device_.is_cuda()) {
      backend::cuda_free(b.words, b.capacity * sizeof(uint64_t), device_.index);
    } else {
      delete[] b.words;
    }
  }
  blocks_.clear();
}

uint64_t* StepScalars::reserve(size_t zeros, size_t nones, Consumer consume) {
  const size_t n = zeros + nones;
  TNT_CHECK(n > 0, "StepScalars::reserve of 0 words");
  if (blocks_.empty() || blocks_.back().capacity - blocks_.back().used < n) {
    // The first block holds a whole step once the step's size is known (next_capacity_);
    // a block added during a step holds at least this request.
    Block b;
    b.capacity = blocks_.empty() ? std::max(next_capacity_, n) : std::max(n, blocks_.back().capacity);
    if (device_.is_cuda()) {
      b.words = static_cast<uint64_t*>(backend::cuda_malloc(b.capacity * sizeof(uint64_t), device_.index));
    } else {
      b.words = new uint64_t[b.capacity];
    }
    blocks_.push_back(b);
  }
  Block& b = blocks_.back();
  uint64_t* words = b.words + b.used;
  if (device_.is_cuda()) {
    backend::cuda_fill_bytes(words, 0, zeros * sizeof(uint64_t), device_.index);
    backend::cuda_fill_bytes(words + zeros, 0xff, nones * sizeof(uint64_t), device_.index);
  } else {
    std::fill(words, words + zeros, uint64_t{0});
    std::fill(words + zeros, words + n, kNone);
  }
  pending_.push_back(Pending{blocks_.size() - 1, b.used, n, std::move(consume)});
  b.used += n;
  used_total_ += n;
  return words;
}

void StepScalars::read_f32(const Tensor& t, std::function<void(double)> consume) {
  TNT_CHECK(t.defined() && t.numel() == 1 && t.dtype() == DType::f32,
            "StepScalars::read_f32: needs a 1-element f32 tensor, got {}", t.defined() ? t.str() : "undefined");
  TNT_CHECK(t.device() == device_, "StepScalars::read_f32: tensor on {}, buffer on {}", t.device().str(),
            device_.str());
  // The float's 4 bytes go into the low bytes of one word; the word's rest is never read.
  auto read = [consume = std::move(consume)](const uint64_t* w) {
    float v = 0;
    std::memcpy(&v, w, sizeof(float));
    consume(static_cast<double>(v));
  };
  uint64_t* word = reserve(1, 0, std::move(read));
  if (device_.is_cuda()) {
    backend::cuda_copy_async(word, t.raw(), sizeof(float), backend::CudaStream::compute, device_.index);
  } else {
    std::memcpy(word, t.raw(), sizeof(float));
  }
}

std::string StepScalars::flush() {
  std::vector<const uint64_t*> host_blocks;
  if (device_.is_cuda() && early_words_ > 0 && early_words_ == used_total_) {
    // Every word was in start_copy's copy: wait for it alone.
    backend::cuda_wait_readback(copied_, device_.index);
    early_words_ = 0;
    ++copies_;
    ++early_reads_;
    size_t at = 0;
    for (const Block& b : blocks_) {
      host_blocks.push_back(pinned_ + at);
      at += b.used;
    }
  } else if (device_.is_cuda()) {
    // Words reserved after start_copy (if any was queued): the host buffer of that copy is
    // not read, and this copy comes after it on the stream.
    early_words_ = 0;
    size_t total = 0;
    for (const Block& b : blocks_) total += b.used;
    host_.resize(total);
    size_t at = 0;
    for (const Block& b : blocks_) {
      host_blocks.push_back(host_.data() + at);
      if (b.used == 0) continue;
      // Synchronous: ordered after every kernel of the step on the compute stream.
      backend::cuda_copy(host_.data() + at, Device::cpu(), b.words, device_, b.used * sizeof(uint64_t));
      ++copies_;
      at += b.used;
    }
  } else {
    for (const Block& b : blocks_) host_blocks.push_back(b.words);
  }
  // The next step's first block holds all of this step's words.
  next_capacity_ = std::max(next_capacity_, used_total_);
  std::vector<Pending> pending = std::move(pending_);
  pending_.clear();
  used_total_ = 0;
  // Emptied after the consumers (on the CPU they read the blocks themselves), also when one
  // of them throws something other than an InputError.
  auto empty_blocks = [&] {
    if (blocks_.size() > 1) {
      release_blocks();
    } else if (!blocks_.empty()) {
      blocks_[0].used = 0;
    }
  };
  std::string error;
  try {
    for (Pending& p : pending) {
      try {
        p.consume(host_blocks.at(p.block) + p.offset);
      } catch (const InputError& e) {
        if (error.empty()) error = e.what();
      }
    }
  } catch (...) {
    empty_blocks();
    throw;
  }
  empty_blocks();
  return error;
}

int64_t bad_index(const uint64_t* words) {
  return words[0] == StepScalars::kNone ? -1 : static_cast<int64_t>(words[0]);
}

double bad_value(const uint64_t* words) {
  double v = 0;
  std::memcpy(&v, &words[1], sizeof(double));
  return v;
}

void raise_input_error(const std::string& message) {
  StepScalars* step = StepScalars::current();
  if (!step || !step->device().is_cpu()) throw InputError(message);
  step->reserve(1, 0, [message](const uint64_t*) { throw InputError(message); });
}

void defer_has_non_finite(StepScalars& scalars, const std::vector<Tensor>& xs, std::function<void(bool)> consume) {
  for (const Tensor& x : xs) {
    TNT_CHECK(x.defined() && x.device() == scalars.device(), "defer_has_non_finite: a tensor on {}, the step on {}",
              x.defined() ? x.device().str() : std::string("undefined"), scalars.device().str());
  }
  uint64_t* flag = scalars.reserve(1, 0, [consume = std::move(consume)](const uint64_t* w) { consume(w[0] != 0); });
  if (scalars.device().is_cuda()) {
#ifdef TNT_WITH_CUDA
    cuda::flag_non_finite(xs, flag);
#endif
  } else {
    *flag = ops::has_non_finite(xs) ? 1 : 0;
  }
}

StepScalars* StepScalars::current() { return t_current; }

StepScalars::Scope::Scope(StepScalars& scalars) : previous_(t_current) { t_current = &scalars; }

StepScalars::Scope::~Scope() { t_current = previous_; }

StepScalars::For::For(Device device) {
  StepScalars* step = current();
  if (step && step->device() == device) {
    use_ = step;
  } else {
    own_ = std::make_unique<StepScalars>(device, 16);
    use_ = own_.get();
  }
}

void StepScalars::For::finish() {
  if (!own_) return;
  const std::string error = own_->flush();
  if (!error.empty()) throw InputError(error);
}

}  // namespace tnt::detail
