// What a parameter-server job's servers and workers share: the message tags of the
// strategy's communicator, the variables' host mirrors with the shard plan over them
// (Shards), and a worker's bounded wait for the servers.
#pragma once

#include "ps/shard_plan.hpp"
#include "tarantella/model.hpp"

#include <mpi.h>

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tnt::ps {

// Tags on the strategy's own communicator.
inline constexpr int kPull = 11;        // worker -> server: int64 {clock, with_state, epoch, own steps (-1: unknown)}
inline constexpr int kValues = 12;      // server -> worker: f32 shard values, the puller's lead, the step count
inline constexpr int kState = 13;       // server -> worker: f32 shard optimizer slots
inline constexpr int kStateSteps = 14;  // server -> worker: int64 per-piece update counts, then the step count
inline constexpr int kPush = 15;        // worker -> server: f32 shard gradients, then the worker's epoch
inline constexpr int kDone = 16;        // worker -> server: int64 0, no more pushes
inline constexpr int kAbort = 17;       // worker -> server: the error that ended it (first byte 'I': input error)
inline constexpr int kSchedule = 19;    // worker -> server: f64 {replaced, rate, factor, floor} (see Worker::push)
inline constexpr int kPause = 18;       // worker -> server: int64 epoch, no more pushes in it (PsWorker::pause)
// The sample ledger (ps/server.cpp): a worker whose batches of an epoch are done asks the
// first server for more; the answer is a part of a lost worker's batches, or the epoch's end.
inline constexpr int kLedger = 20;      // worker -> first server: int64 {epoch, stopping, own steps}
inline constexpr int kPart = 21;        // first server -> worker: int64 {1, owner, first, end} or {0, lost ranks...}
inline constexpr int kLost = 22;        // first server -> server: int64 world rank of a dropped worker
inline constexpr int kFinal = 23;       // first server -> every rank: int64 {lost ranks...}, the fit is over
// Liveness outside the epoch's steps (ps/server.cpp): a worker's watch thread beats while
// the worker does the epoch's end (metrics, validation, callbacks), where it sends nothing
// else; a worker dropped then is named to the others, whose collectives it would block.
inline constexpr int kBeat = 24;        // worker -> first server: int64 0, alive
inline constexpr int kGone = 25;        // first server -> worker: int64 {lost ranks...}, all lost so far
inline constexpr int kRedo = 26;        // worker -> worker: int64 epoch, here to redo its end without the lost

// The variables as host mirrors, the plan over them, and the optimizer state by variable:
// what servers and workers share.
class Shards {
 public:
  Shards(Network& network, Optimizer& optimizer, int servers) : optimizer_(optimizer) {
    vars_ = network.trainable_parameters();
    optimizer_.init_state(vars_);
    slot_names_ = optimizer_.slot_names();
    std::map<std::string, Tensor> state;
    for (auto& s : optimizer_.named_state()) state[s.name] = s.tensor;
    std::vector<VariableShape> shapes;
    for (auto& v : vars_) {
      const Tensor& t = v.param->value;
      TNT_INPUT_CHECK(t.dtype() == DType::f32,
                      "fit: strategy=parameter_server supports f32 variables only; {} is {}", v.name,
                      dtype_name(t.dtype()));
      VariableShape s;
      s.rows = t.ndim() == 0 ? 1 : t.dim(0);
      s.row_elements = s.rows > 0 ? t.numel() / s.rows : 0;
      shapes.push_back(s);
      values_.push_back(Tensor::zeros(t.shape()));
      grads_.push_back(Tensor::zeros(t.shape()));
      std::vector<Tensor> slots, host_slots;
      for (const auto& name : slot_names_) {
        auto it = state.find(v.name + "." + name);
        TNT_CHECK(it != state.end(), "optimizer state {}.{} missing", v.name, name);
        slots.push_back(it->second);
        host_slots.push_back(Tensor::zeros(t.shape()));
      }
      auto step = state.find(v.name + ".step");
      TNT_CHECK(step != state.end(), "optimizer state {}.step missing", v.name);
      state_.push_back(std::move(slots));
      host_state_.push_back(std::move(host_slots));
      steps_.push_back(step->second);
    }
    plan_ = plan_shards(shapes, servers);
    // One MPI message carries a server's shard (times the slots for the state).
    for (int64_t n : plan_.shard_elements) {
      const auto slots = static_cast<int64_t>(std::max<size_t>(1, slot_names_.size()));
      TNT_INPUT_CHECK(n * slots < std::numeric_limits<int>::max(),
                      "fit: strategy=parameter_server: a server's shard of {} variables is too large for one MPI "
                      "message; use more servers (TNT_PS_SERVERS)",
                      n);
    }
  }

  const ShardPlan& plan() const { return plan_; }
  std::vector<NamedParameter>& vars() { return vars_; }
  int64_t shard_elements(int s) const { return plan_.shard_elements[static_cast<size_t>(s)]; }
  size_t slots() const { return slot_names_.size(); }

  // Model -> host mirrors, and back.
  void read_values() {
    for (size_t i = 0; i < vars_.size(); ++i) values_[i].copy_from(vars_[i].param->value);
  }
  void write_values() {
    if (direct_ > 0) refresh_own_values();  // the server's own rows are its variables'
    for (size_t i = 0; i < vars_.size(); ++i) vars_[i].param->value.copy_from(values_[i]);
  }
  void read_grads() {
    for (size_t i = 0; i < vars_.size(); ++i) grads_[i].copy_from(vars_[i].param->grad);
  }
  void read_state() {
    for (size_t i = 0; i < vars_.size(); ++i) {
      for (size_t j = 0; j < slots(); ++j) host_state_[i][j].copy_from(state_[i][j]);
    }
  }
  void write_state(int64_t step_count) {
    for (size_t i = 0; i < vars_.size(); ++i) {
      for (size_t j = 0; j < slots(); ++j) state_[i][j].copy_from(host_state_[i][j]);
    }
    optimizer_.set_step_count(step_count);
  }

  // Server s's shard of the host values (or gradients) in shard order, and back. `out`: a
  // buffer to reuse (resized; its elements are all overwritten). A server that updates its
  // variables in place (apply) serves their values straight from them.
  std::vector<float> gather(int s, bool grads, std::vector<float> out = {}) const {
    out.resize(static_cast<size_t>(shard_elements(s)));
    const bool direct = !grads && direct_ > 0 && s == direct_server_;
    for (int i : plan_.pieces_of(s)) {
      const ShardPiece& p = plan_.pieces[static_cast<size_t>(i)];
      const Tensor& t = direct ? vars_[static_cast<size_t>(p.variable)].param->value
                               : (grads ? grads_ : values_)[static_cast<size_t>(p.variable)];
      const float* src = t.data<float>() + p.offset;
      std::copy(src, src + p.count, out.data() + p.shard_offset);
    }
    return out;
  }
  void scatter(int s, const float* in, bool grads) {
    for (int i : plan_.pieces_of(s)) {
      const ShardPiece& p = plan_.pieces[static_cast<size_t>(i)];
      float* dst = (grads ? grads_ : values_)[static_cast<size_t>(p.variable)].data<float>() + p.offset;
      std::copy(in + p.shard_offset, in + p.shard_offset + p.count, dst);
    }
  }
  // Server s's shard of the optimizer state: the slots (shard x slots floats), the pieces'
  // update counts and the step count.
  std::pair<std::vector<float>, std::vector<int64_t>> gather_state(int s) const {
    const int64_t n = shard_elements(s);
    std::vector<float> floats(static_cast<size_t>(n) * slots());
    std::vector<int64_t> ints;
    for (int i : plan_.pieces_of(s)) {
      const ShardPiece& p = plan_.pieces[static_cast<size_t>(i)];
      for (size_t j = 0; j < slots(); ++j) {
        const float* src = host_state_[static_cast<size_t>(p.variable)][j].data<float>() + p.offset;
        std::copy(src, src + p.count, floats.data() + static_cast<int64_t>(j) * n + p.shard_offset);
      }
      ints.push_back(steps_[static_cast<size_t>(p.variable)].data<int64_t>()[0]);
    }
    ints.push_back(optimizer_.step_count());
    return {std::move(floats), std::move(ints)};
  }
  void scatter_state(int s, const float* floats, const int64_t* ints) {
    const int64_t n = shard_elements(s);
    size_t k = 0;
    for (int i : plan_.pieces_of(s)) {
      const ShardPiece& p = plan_.pieces[static_cast<size_t>(i)];
      for (size_t j = 0; j < slots(); ++j) {
        float* dst = host_state_[static_cast<size_t>(p.variable)][j].data<float>() + p.offset;
        const float* src = floats + static_cast<int64_t>(j) * n + p.shard_offset;
        std::copy(src, src + p.count, dst);
      }
      steps_[static_cast<size_t>(p.variable)].data<int64_t>()[0] = ints[k++];
    }
  }
  size_t pieces_of_count(int s) const { return plan_.pieces_of(s).size(); }
  int64_t step_count() const { return optimizer_.step_count(); }
  Optimizer& optimizer() { return optimizer_; }

  // The server's update: the shard's gradient (shard order) into the variables it touches,
  // one optimizer step over them, the new values back into the host mirrors. Rows of a
  // split variable that another server holds get a zero gradient here and are never served.
  // Where every variable the server owns is a plain (row-major) f32 host tensor (a server computes
  // on the CPU), the gradient goes straight into the variables' gradients (whose rows of
  // other servers stay at the 0 they get once) and the values stay in the variables, which
  // pulls read (gather): two copies of the shard fewer per update than through the mirrors.
  void apply(int s, const float* grad, const std::vector<NamedParameter>& owned, const std::vector<int>& owned_index) {
    if (direct_ < 0) {
      direct_ = 1;
      for (const auto& v : owned) {
        const Parameter& p = *v.param;
        const bool host = p.value.device().is_cpu() && p.grad.device().is_cpu() && p.value.dtype() == DType::f32 &&
                          p.grad.dtype() == DType::f32 && !p.value.is_channels_last() && !p.grad.is_channels_last();
        if (!host) direct_ = 0;
      }
      if (direct_ > 0) {
        for (const auto& v : owned) v.param->grad.zero_();
        direct_server_ = s;
      }
    }
    if (direct_ > 0) {
      for (int i : plan_.pieces_of(s)) {
        const ShardPiece& p = plan_.pieces[static_cast<size_t>(i)];
        float* dst = vars_[static_cast<size_t>(p.variable)].param->grad.data<float>() + p.offset;
        std::copy(grad + p.shard_offset, grad + p.shard_offset + p.count, dst);
      }
      optimizer_.step(owned);
      return;
    }
    scatter(s, grad, true);
    for (size_t k = 0; k < owned.size(); ++k) {
      owned[k].param->grad.copy_from(grads_[static_cast<size_t>(owned_index[k])]);
    }
    optimizer_.step(owned);
    for (size_t k = 0; k < owned.size(); ++k) {
      values_[static_cast<size_t>(owned_index[k])].copy_from(owned[k].param->value);
    }
  }

 private:
  // The in-place server's pieces from its variables into the value mirrors.
  void refresh_own_values() {
    for (int i : plan_.pieces_of(direct_server_)) {
      const ShardPiece& p = plan_.pieces[static_cast<size_t>(i)];
      const float* src = vars_[static_cast<size_t>(p.variable)].param->value.data<float>() + p.offset;
      std::copy(src, src + p.count, values_[static_cast<size_t>(p.variable)].data<float>() + p.offset);
    }
  }

  Optimizer& optimizer_;
  int direct_ = -1;  // apply updates the variables in place: -1 not decided yet, 0 no, 1 yes
  int direct_server_ = -1;
  std::vector<NamedParameter> vars_;
  std::vector<std::string> slot_names_;
  std::vector<Tensor> values_, grads_;            // host f32 mirrors, same shapes
  std::vector<std::vector<Tensor>> state_;        // [variable][slot]: the optimizer's own
  std::vector<std::vector<Tensor>> host_state_;   // their host mirrors
  std::vector<Tensor> steps_;                     // [variable]: its update count (i64 host)
  ShardPlan plan_;
};

// Float buffers to reuse for a server's messages (a shard is megabytes: a fresh buffer per
// message costs its allocation and zeroing).
class FloatPool {
 public:
  std::vector<float> take() {
    if (spare_.empty()) return {};
    std::vector<float> v = std::move(spare_.back());
    spare_.pop_back();
    return v;
  }
  void give(std::vector<float>&& v) {
    if (spare_.size() < 16 && v.capacity() > 0) spare_.push_back(std::move(v));
  }

 private:
  std::vector<std::vector<float>> spare_;
};

// Waits for a worker's requests to the servers; `peer[i]` is the server rank request i
// talks to. Polls, so that a server that is lost or stopped ends this worker after
// TNT_COLLECTIVE_TIMEOUT (0: never) with the server named, rather than never. A timed-out
// request is left to MPI: the job is ending.
void wait_servers(std::vector<MPI_Request>& reqs, const std::vector<int>& peer, const std::string& what);

}  // namespace tnt::ps
