// The Reducer: the agreement check, the plan (comm/bucket_plan), and the step protocol of
// reducer.hpp over one transport (comm/transport.hpp) that moves the buckets.
//
// mark_ready() and finalize() run on the training thread and share the step state under
// mu: which gradients are ready, which bucket launches next. A bucket is launched when it
// is complete and every bucket before it has been launched, so all ranks launch in the same
// order whatever order their gradients arrive in. With one rank nothing is launched:
// finalize() scales the gradients in place.
#include "tarantella/reducer.hpp"

#include "comm/agreement.hpp"
#include "comm/auto_threshold.hpp"
#include "comm/bucket_plan.hpp"
#include "comm/transport.hpp"
#include "core/timeline_events.hpp"
#include "tarantella/check.hpp"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"

#include <algorithm>
#include <mutex>
#include <unordered_map>

namespace tnt {

using comm::Clock;

double StepTiming::comm_s() const {
  double total = 0;
  for (const BucketTiming& b : buckets) total += b.end_s - b.start_s;
  return total;
}

double StepTiming::hidden_s() const {
  double total = 0;
  for (const BucketTiming& b : buckets) {
    total += std::max(0.0, std::min(b.end_s, backward_end_s) - b.start_s);
  }
  return total;
}

double StepTiming::exposed_s() const { return finalize_end_s - backward_end_s; }

double StepTiming::launch_delay_s() const {
  if (buckets.empty()) return 0;
  // Buckets go through one channel in order: the earliest a bucket can start is when it
  // is ready and its predecessor is done.
  double total = 0, free = 0;
  for (const BucketTiming& b : buckets) {
    total += std::max(0.0, b.start_s - std::max(b.ready_s, free));
    free = b.end_s;
  }
  return total / static_cast<double>(buckets.size());
}

double StepTiming::finish_s() const {
  double last = backward_end_s;
  for (const BucketTiming& b : buckets) last = std::max(last, b.end_s);
  return std::max(0.0, finalize_end_s - last);
}

namespace {

std::string describe(size_t index, const std::string& name, const Tensor& grad) {
  if (!grad.defined()) return fmt::format("gradient #{} '{}': undefined tensor", index, name);
  return fmt::format("gradient #{} '{}': {} {} on {}", index, name, dtype_name(grad.dtype()), shape_str(grad.shape()),
                     grad.device().is_cpu() ? "cpu" : "cuda");
}

// Entry 0 holds the settings (with the gradient count, so that lists of different lengths
// already differ there); entry i+1 describes gradient i. Throws CommError on every rank.
void check_agreement(Communicator& comm, int64_t threshold, bool automatic,
                     const std::vector<std::pair<std::string, Tensor>>& gradients) {
  std::vector<std::string> entries;
  entries.push_back(fmt::format("fusion threshold {} B{}, {} gradients", threshold, automatic ? " (auto)" : "",
                                gradients.size()));
  for (size_t i = 0; i < gradients.size(); ++i) entries.push_back(describe(i, gradients[i].first, gradients[i].second));
  std::optional<detail::Disagreement> d = detail::find_disagreement(comm, entries);
  if (!d) return;
  throw CommError(fmt::format(
      "Reducer: the ranks disagree on the gradients to reduce (their fusion plans would differ and the allreduces "
      "would hang); first difference at {}: {}",
      d->entry == 0 ? "the settings" : fmt::format("gradient #{}", d->entry - 1), d->describe()));
}

}  // namespace

struct Reducer::Impl {
  int size = 1;
  int64_t threshold = 0;
  std::vector<std::string> names;  // (gradients,)
  std::vector<Tensor> grads;       // (gradients,)
  std::unordered_map<std::string, size_t> by_name;
  comm::BucketPlan plan;
  std::vector<Bucket> buckets;  // the plan as reducer.hpp shows it
  std::unique_ptr<comm::Transport> transport;
  std::vector<comm::GradientInfo> infos;  // (gradients,) what the plan is made from
  Communicator* comm = nullptr;           // the user's, for a plan made again (auto)
  ReducerOptions options;
  std::unique_ptr<comm::AutoThreshold> tuner;  // --fusion-threshold auto, until it has chosen
  std::string auto_choice;
  double local_factor = 1.0;
  bool broken = false;

  // Step state.
  std::mutex mu;
  std::vector<char> ready;   // (gradients,)
  std::vector<int> missing;  // (buckets,) gradients not yet ready
  size_t next_launch = 0;
  bool in_step = false;
  Clock::time_point t0;
  StepTiming current, last;

  double since_t0() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }

  void begin_step_locked() {
    if (in_step) return;
    in_step = true;
    t0 = Clock::now();
    transport->begin_step(t0);
  }

  void mark_locked(size_t i) {
    ready[i] = 1;
    current.gradient_ready_s[i] = since_t0();
    size_t b = plan.bucket_of[i];
    if (--missing[b] == 0) current.buckets[b].ready_s = since_t0();
  }

  void launch_ready_locked() {
    try {
      while (next_launch < buckets.size() && missing[next_launch] == 0) {
        size_t b = next_launch++;
        timeline::Span span(timeline::Lane::compute, "launch", [&] { return fmt::format(R"("bucket":{})", b); });
      if (size > 1) transport->launch(b, local_factor);
      }
    } catch (...) {
      // A bucket counted as launched whose collective never started: finalize() would
      // unpack an unsummed buffer, and the peers would pair later collectives with the
      // wrong bucket.
      broken = true;
      throw;
    }
  }

  // The plan for `t` bytes, its buckets and a transport over them (collective: the
  // transport duplicates the communicator).
  void build_plan(int64_t t) {
    threshold = t;
    plan = comm::plan_buckets(infos, threshold);
    buckets.clear();
    for (const comm::PlannedBucket& pb : plan.buckets) {
      const comm::PlannedBucket& first = plan.buckets[0];
      // One kind of memory per Reducer: one transport moves all its buckets.
      TNT_CHECK(pb.device.is_cuda() == first.device.is_cuda(),
                "Reducer: gradients on the host and on a device in one Reducer ('{}' on {}, '{}' on {}); use one "
                "Reducer per kind",
                names[first.gradients[0]], first.device.str(), names[pb.gradients[0]], pb.device.str());
      buckets.push_back({.gradients = pb.gradients, .bytes = pb.bytes, .dtype = pb.dtype, .device = pb.device});
    }
    transport.reset();
    const comm::TransportSetup setup{*comm, plan, names, grads, options};
    transport = on_device() ? comm::make_nccl_transport(setup) : comm::make_host_transport(setup);
    ready.assign(grads.size(), 0);
    missing.resize(buckets.size());
    for (size_t b = 0; b < buckets.size(); ++b) missing[b] = static_cast<int>(buckets[b].gradients.size());
    current.buckets.assign(buckets.size(), {});
    current.gradient_ready_s.assign(grads.size(), 0);
  }

  bool on_device() const { return !plan.buckets.empty() && plan.buckets[0].device.is_cuda(); }

  void reset_step_locked() {
    // A device transport of several ranks timed the step on the GPU's clock (read_timing),
    // which runs behind the host's: the host's clock here would mix the two.
    if (!(on_device() && size > 1)) current.finalize_end_s = since_t0();
    last = current;
    current = StepTiming{};
    current.buckets.assign(buckets.size(), {});
    current.gradient_ready_s.assign(grads.size(), 0);
    std::fill(ready.begin(), ready.end(), 0);
    for (size_t b = 0; b < buckets.size(); ++b) missing[b] = static_cast<int>(buckets[b].gradients.size());
    next_launch = 0;
    in_step = false;
  }
};

Reducer::Reducer(Communicator& comm, std::vector<std::pair<std::string, Tensor>> gradients, ReducerOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.size = comm.size();
  m.comm = &comm;
  m.options = options;
  const bool automatic = options.threshold_bytes == ReducerOptions::kAuto ||
                         (options.threshold_bytes < 0 && config().fusion_threshold_kb.automatic);
  const int64_t threshold = options.threshold_bytes >= 0 ? options.threshold_bytes : config().fusion_threshold_kb * 1024;
  check_agreement(comm, threshold, automatic, gradients);

  // Every rank holds the same list now, so these checks fail on all ranks alike.
  for (size_t i = 0; i < gradients.size(); ++i) {
    auto& [name, grad] = gradients[i];
    TNT_CHECK(grad.defined(), "Reducer: gradient #{} '{}' is an undefined tensor", i, name);
    TNT_CHECK(m.by_name.emplace(name, i).second, "Reducer: the name '{}' is given twice (#{} and #{})", name,
              m.by_name[name], i);
    m.names.push_back(name);
    m.grads.push_back(grad);
    m.infos.push_back({name, grad.numel(), static_cast<int64_t>(grad.nbytes()), grad.dtype(), grad.device()});
  }
  m.build_plan(threshold);
  // With one rank nothing is communicated: there is nothing to choose.
  if (automatic && m.size > 1) {
    m.tuner = std::make_unique<comm::AutoThreshold>(options.auto_warmup_steps, options.auto_steps);
  }
}

Reducer::~Reducer() {
  Impl& m = *impl_;
  {
    // A bucket still in flight (this rank left the step early, e.g. on an exception) must
    // not keep the destructor waiting for peers.
    std::lock_guard<std::mutex> lk(m.mu);
    if (m.in_step) m.transport->cancel();
  }
  m.transport.reset();
}

void Reducer::mark_ready(size_t index) {
  Impl& m = *impl_;
  TNT_CHECK(!m.broken, "Reducer: unusable after an earlier communication error");
  TNT_CHECK(index < m.grads.size(), "Reducer::mark_ready: index {} out of range ({} gradients)", index,
            m.grads.size());
  std::lock_guard<std::mutex> lk(m.mu);
  m.begin_step_locked();
  TNT_CHECK(!m.ready[index], "Reducer::mark_ready: gradient #{} '{}' marked ready twice in one step", index,
            m.names[index]);
  m.mark_locked(index);
  m.launch_ready_locked();
}

void Reducer::mark_ready(const std::string& name) {
  auto it = impl_->by_name.find(name);
  TNT_CHECK(it != impl_->by_name.end(), "Reducer::mark_ready: no gradient named '{}'", name);
  mark_ready(it->second);
}

void Reducer::set_local_factor(double factor) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.mu);
  TNT_CHECK(!m.in_step, "Reducer::set_local_factor: call it before the step's first mark_ready");
  m.local_factor = factor;
}

double Reducer::local_factor() const { return impl_->local_factor; }

void Reducer::finalize(std::optional<double> scale) {
  Impl& m = *impl_;
  TNT_CHECK(!m.broken, "Reducer: unusable after an earlier communication error");
  const double s = scale.value_or(1.0 / static_cast<double>(m.size));
  const bool on_device = m.on_device();
  std::lock_guard<std::mutex> lk(m.mu);
  m.begin_step_locked();
  m.current.backward_end_s = m.since_t0();
  try {
    m.transport->end_backward();
    for (size_t i = 0; i < m.grads.size(); ++i) {
      if (!m.ready[i]) m.mark_locked(i);
    }
    m.launch_ready_locked();
    if (m.size == 1) {
      // Sum over one rank: the gradient itself, times both factors.
      for (size_t b = 0; b < m.buckets.size(); ++b) {
        m.transport->scale(b, m.local_factor * s);
        BucketTiming& t = m.current.buckets[b];
        t.start_s = t.end_s = t.ready_s;
      }
    } else {
      m.transport->wait_all();
      for (size_t b = 0; b < m.buckets.size(); ++b) m.transport->unpack(b, s);
      m.transport->read_timing(m.current);
      if (on_device) {
        for (size_t i = 0; i < m.grads.size(); ++i) m.current.gradient_ready_s[i] = m.current.buckets[m.plan.bucket_of[i]].ready_s;
      }
    }
  } catch (...) {
    m.broken = true;
    throw;
  }
  m.reset_step_locked();
  if (m.tuner) {
    try {
      std::vector<int64_t> bytes;
      for (const comm::GradientInfo& g : m.infos) bytes.push_back(g.bytes);
      // Collective at the same step on every rank; the master's choice is everyone's.
      if (std::optional<int64_t> t = m.tuner->step_done(m.last, bytes, m.threshold, *m.comm, m.infos.empty() ? Device::cpu() : m.infos[0].device)) {
        m.auto_choice = m.tuner->note();
        if (*t != m.threshold) m.build_plan(*t);
        m.tuner.reset();
        if (m.comm->is_master()) print("{}", m.auto_choice);
      }
    } catch (...) {
      m.broken = true;
      throw;
    }
  }
}

void Reducer::set_threshold(int64_t bytes) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.mu);
  TNT_CHECK(!m.broken, "Reducer: unusable after an earlier communication error");
  TNT_CHECK(!m.in_step, "Reducer::set_threshold: call it between steps");
  TNT_CHECK(!m.tuner, "Reducer::set_threshold: --fusion-threshold auto has not chosen yet");
  TNT_CHECK(bytes >= 0, "Reducer::set_threshold: {} bytes", bytes);
  if (bytes != m.threshold) m.build_plan(bytes);
}

bool Reducer::choosing_threshold() const { return impl_->tuner != nullptr; }

size_t Reducer::num_gradients() const { return impl_->grads.size(); }
const std::vector<std::string>& Reducer::gradient_names() const { return impl_->names; }
std::vector<int64_t> Reducer::gradient_bytes() const {
  std::vector<int64_t> out;
  for (const Tensor& g : impl_->grads) out.push_back(static_cast<int64_t>(g.nbytes()));
  return out;
}
const std::vector<Reducer::Bucket>& Reducer::buckets() const { return impl_->buckets; }
int64_t Reducer::threshold_bytes() const { return impl_->threshold; }
const std::string& Reducer::auto_choice() const { return impl_->auto_choice; }
const StepTiming& Reducer::last_step() const { return impl_->last; }

std::string Reducer::plan() const {
  const Impl& m = *impl_;
  std::string out;
  for (size_t b = 0; b < m.buckets.size(); ++b) {
    const Bucket& bk = m.buckets[b];
    out += fmt::format("bucket {}: {} B {} on {}, {} gradient(s):", b, bk.bytes, dtype_name(bk.dtype), bk.device.str(),
                       bk.gradients.size());
    for (size_t g : bk.gradients) out += " " + m.names[g];
    out += "\n";
  }
  return out;
}

}  // namespace tnt
