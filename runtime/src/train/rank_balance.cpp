// Which rank the others wait for (train/rank_balance.hpp says what is measured and why).
#include "train/rank_balance.hpp"

#include "tarantella/log.hpp"
#include "tarantella/model.hpp"
#include "tarantella/runtime.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

namespace tnt::detail {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Milliseconds to one decimal, three below 1 ms.
std::string ms(double seconds) {
  const double v = seconds * 1e3;
  return v < 1.0 ? fmt::format("{:.3f}", v) : fmt::format("{:.1f}", v);
}

constexpr int kFields = 9;       // own, input, other, compute, queue, period, steps, gpu, exposed
constexpr int kHostWords = 8;    // a host name's first 64 bytes, as i64 words

}  // namespace

namespace {

// The faster half of the ranks by own work (at least one; the lower rank first among
// equals): where judge() starts, so that two or more slow ranks do not pull "typical" up.
std::vector<size_t> faster_half(const std::vector<RankWork>& ranks) {
  std::vector<size_t> order(ranks.size());
  for (size_t q = 0; q < order.size(); ++q) order[q] = q;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranks[a].own_s < ranks[b].own_s; });
  order.resize(std::max<size_t>(1, ranks.size() / 2));
  return order;
}

// "1", "1 and 2", "1, 2 and 5".
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    out += fmt::format("{}{}", i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ", ranks[i]);
  }
  return out;
}

}  // namespace

namespace {

// Whether w stands out against typical own work t (the thresholds, kStragglerRatio...).
bool stands_out(const RankWork& w, double t, double period) {
  const double lag = w.own_s - t;
  return lag >= kStragglerMinGapS && lag >= kStragglerShare * period && w.own_s >= kStragglerRatio * t;
}

// The ranks that stand out, and "typical": the medians, part by part, of the ranks that do
// not, the slowest left out in any case (they are the ranks that waited). Found from the
// faster half's median first (so that two slow ranks of three are not measured against
// each other), then refined until the named ranks are those that stand out against the
// others' medians. The named ranks are always those above a line that rises with typical,
// and typical does not fall as that line rises: typical moves one way only and settles
// within as many rounds as there are ranks.
struct Verdict {
  int slowest = -1;
  std::vector<int> named;  // ascending; empty: none stands out
  RankWork typical;
};

Verdict judge(const std::vector<RankWork>& ranks) {
  Verdict v;
  for (size_t q = 0; q < ranks.size(); ++q) {
    if (v.slowest < 0 || ranks[q].own_s > ranks[static_cast<size_t>(v.slowest)].own_s) v.slowest = static_cast<int>(q);
  }
  if (ranks.size() < 2) return v;
  std::vector<double> period;
  for (const RankWork& w : ranks) period.push_back(w.period_s);
  const double p = median(period);
  auto named_against = [&](double t) {
    std::vector<int> out;
    for (size_t q = 0; q < ranks.size(); ++q) {
      if (stands_out(ranks[q], t, p)) out.push_back(static_cast<int>(q));
    }
    return out;
  };
  auto typical_without = [&](const std::vector<int>& named) {
    std::vector<bool> out(ranks.size(), false);
    for (int r : named) out[static_cast<size_t>(r)] = true;
    out[static_cast<size_t>(v.slowest)] = true;
    std::vector<double> own, input, other, compute, queue;
    for (size_t q = 0; q < ranks.size(); ++q) {
      if (out[q]) continue;
      own.push_back(ranks[q].own_s);
      input.push_back(ranks[q].input_s);
      other.push_back(ranks[q].other_s);
      compute.push_back(ranks[q].compute_s);
      queue.push_back(ranks[q].queue_s);
    }
    return RankWork{.own_s = median(own), .input_s = median(input), .other_s = median(other),
                    .compute_s = median(compute), .queue_s = median(queue), .period_s = p,
                    .steps = ranks[static_cast<size_t>(v.slowest)].steps, .gpu = ranks[static_cast<size_t>(v.slowest)].gpu};
  };
  std::vector<double> own;
  for (size_t q : faster_half(ranks)) own.push_back(ranks[q].own_s);
  v.named = named_against(median(own));
  for (size_t round = 0; round < ranks.size(); ++round) {
    v.typical = typical_without(v.named);
    std::vector<int> again = named_against(v.typical.own_s);
    if (again == v.named) break;
    v.named = std::move(again);
  }
  v.typical = typical_without(v.named);
  if (!v.named.empty() && !stands_out(ranks[static_cast<size_t>(v.slowest)], v.typical.own_s, p)) v.named.clear();
  return v;
}

}  // namespace

double slowest_ratio(const std::vector<RankWork>& ranks, int* slowest, double* typical) {
  const Verdict v = judge(ranks);
  if (slowest) *slowest = v.slowest;
  if (ranks.size() < 2 || v.slowest < 0) return 1.0;
  if (typical) *typical = v.typical.own_s;
  return v.typical.own_s > 0 ? ranks[static_cast<size_t>(v.slowest)].own_s / v.typical.own_s : 1.0;
}

std::optional<Straggler> find_straggler(const std::vector<RankWork>& ranks) {
  if (ranks.size() < 2) return std::nullopt;
  for (const RankWork& w : ranks) {
    if (w.steps < kStragglerMinSteps) return std::nullopt;
  }
  const Verdict v = judge(ranks);
  if (v.named.empty() || v.typical.period_s <= 0) return std::nullopt;
  Straggler s;
  s.rank = v.slowest;
  s.ranks = v.named;
  s.slow = ranks[static_cast<size_t>(v.slowest)];
  s.typical = v.typical;
  s.lag_s = s.slow.own_s - s.typical.own_s;
  s.share = s.lag_s / s.typical.period_s;
  const double excess[3] = {s.slow.input_s - s.typical.input_s, s.slow.other_s - s.typical.other_s,
                            s.slow.compute_s - s.typical.compute_s};
  const int top = static_cast<int>(std::max_element(excess, excess + 3) - excess);
  s.cause = excess[top] >= kCauseShare * s.lag_s ? static_cast<LagCause>(top) : LagCause::spread;
  return s;
}

std::string describe_straggler(int epoch, const Straggler& s, const std::vector<std::string>& hosts, int ranks) {
  const bool gpu = s.slow.gpu;
  const bool one = s.ranks.size() == 1;
  const int waiters = ranks - static_cast<int>(s.ranks.size());
  auto host = [&](int r) {
    return static_cast<size_t>(r) < hosts.size() ? hosts[static_cast<size_t>(r)] : std::string();
  };
  // "rank 2 (host h3)", "ranks 1 and 2 (host h2)", "ranks 1 (host h2) and 5 (host h3)".
  std::string who;
  bool one_host = true;
  for (int r : s.ranks) one_host = one_host && host(r) == host(s.ranks[0]);
  if (one_host) {
    who = fmt::format("{} {}", one ? "rank" : "ranks", rank_list(s.ranks));
    if (!host(s.ranks[0]).empty()) who += fmt::format(" (host {})", host(s.ranks[0]));
  } else {
    std::vector<std::string> parts;
    for (int r : s.ranks) parts.push_back(fmt::format("{} (host {})", r, host(r)));
    who = "ranks ";
    for (size_t i = 0; i < parts.size(); ++i) who += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
  }
  const std::string others = waiters == 1 ? "the other rank" : fmt::format("the other {} ranks", waiters);
  const std::string against = waiters == 1 ? fmt::format("against {} ms on the other rank, which", ms(s.typical.own_s))
                                           : fmt::format("against {} ms typical of the other ranks (their median), "
                                                         "which",
                                                         ms(s.typical.own_s));
  std::string line =
      one ? fmt::format("epoch {}: {} held {} back: its own work took {} ms a step{}, {} waited about {} ms a step "
                        "for it ({:.0f}% of the step)",
                        epoch, who, others, ms(s.slow.own_s), gpu ? " (GPU time)" : "", against, ms(s.lag_s),
                        s.share * 100.0)
          : fmt::format("epoch {}: {} held {} back: rank {}, the slowest, took {} ms a step for its own work{}, {} "
                        "waited about {} ms a step for it ({:.0f}% of the step)",
                        epoch, who, others, s.rank, ms(s.slow.own_s), gpu ? " (GPU time)" : "", against,
                        ms(s.lag_s), s.share * 100.0);
  const std::string in_rank = one ? "" : fmt::format(" In rank {},", s.rank);
  const std::string most = one ? ". Most of it is" : fmt::format(". In rank {}, most of it is", s.rank);
  const std::string the_others = waiters == 1 ? "the other rank" : "the others";
  switch (s.cause) {
    case LagCause::input:
      line += fmt::format("{} its input: it waited {} ms a step for its batch, {} {} ms (reading or decoding its data "
                          "is slower there)",
                          most, ms(s.slow.input_s), the_others, ms(s.typical.input_s));
      break;
    case LagCause::other:
      line += fmt::format("{} outside the step: its callbacks and the loop took {} ms a step, {} {} ms{}", most,
                          ms(s.slow.other_s), the_others, ms(s.typical.other_s),
                          s.rank == 0 ? " (rank 0 alone runs the progress bar, checkpoints, TensorBoard and the other "
                                        "master-only callbacks)"
                                      : "");
      break;
    case LagCause::compute:
      line += gpu ? fmt::format("{} its forward, backward and update on the GPU: {} ms a step there, {} {} ms; its host "
                                "queued them in {} ms a step, {} in {} ms (a slower, throttled or shared GPU; or, "
                                "where queuing took about as long, a host too busy to keep its GPU fed)",
                                most, ms(s.slow.compute_s), the_others, ms(s.typical.compute_s), ms(s.slow.queue_s),
                                the_others, ms(s.typical.queue_s))
                  : fmt::format("{} its forward, backward and update: {} ms a step, {} {} ms (a slower or busier CPU, "
                                "or fewer cores for this rank)",
                                most, ms(s.slow.compute_s), the_others, ms(s.typical.compute_s));
      break;
    case LagCause::spread:
      line += fmt::format(".{} {}o one part explains most of it: input {} ms against {}, callbacks and loop {} "
                          "against {}, forward, backward and update {} against {}",
                          in_rank, one ? "N" : "n", ms(s.slow.input_s), ms(s.typical.input_s), ms(s.slow.other_s),
                          ms(s.typical.other_s),
                          ms(s.slow.compute_s), ms(s.typical.compute_s));
      break;
  }
  return line;
}

std::optional<CommBound> find_comm_bound(double least_s, const std::vector<RankWork>& ranks, bool one_host) {
  if (ranks.size() < 2) return std::nullopt;
  CommBound c;
  c.exposed_s = least_s;
  c.one_host = one_host;
  std::vector<double> period;
  for (const RankWork& w : ranks) {
    if (w.steps < kStragglerMinSteps) return std::nullopt;
    period.push_back(w.period_s);
    c.gpu = c.gpu || w.gpu;
  }
  const double p = median(period);
  c.share = p > 0 ? c.exposed_s / p : 0.0;
  if (c.exposed_s < kCommMinS || c.share < kCommShare) return std::nullopt;
  return c;
}

std::string describe_comm_bound(int epoch, const CommBound& c, int64_t threshold_bytes, bool automatic) {
  const std::string threshold = threshold_bytes % 1024 == 0 ? fmt::format("{} KB", threshold_bytes / 1024)
                                                            : fmt::format("{} bytes", threshold_bytes);
  std::string fusion =
      automatic ? fmt::format("the fusion threshold was chosen from a measurement ({})", threshold)
                : fmt::format("the fusion threshold is {} (--fusion-threshold auto, TNT_FUSION_THRESHOLD=auto, chooses "
                              "one from a measurement of this job)",
                              threshold);
  std::string line = fmt::format(
      "epoch {}: after its backward every rank waited at least {} ms a step{} for the gradients' allreduce to finish "
      "({:.0f}% of the step): communication that backward does not hide limits this job. ",
      epoch, ms(c.exposed_s), c.gpu ? " (GPU time)" : "", c.share * 100.0);
  if (c.one_host && c.gpu) {
    return line + fmt::format("The ranks share one host: their allreduce goes over its GPUs' links (NVLink or PCIe), "
                              "so a larger batch a rank, or fewer ranks, may train faster; {}",
                              fusion);
  }
  if (c.one_host) {
    return line + fmt::format("The ranks share one host: their allreduce goes through its memory and competes with "
                              "training for its cores, so fewer ranks, or more cores a rank, may train faster; {}",
                              fusion);
  }
  fusion[0] = 'T';
  return line + fusion + ". `tarantella predict` (docs/scaling.md) tells what a faster network, fewer ranks or a "
                         "larger batch a rank would give";
}

EpochBalance epoch_balance(RankBalance& balance, Communicator& comm, EpochTiming& timing) {
  const std::vector<RankWork> all = balance.gather(comm);
  EpochBalance e;
  int slowest = -1;
  e.slowest_ratio = slowest_ratio(all, &slowest);
  e.judged = all.size() > 1 && std::all_of(all.begin(), all.end(), [&](const RankWork& w) {
    return w.steps >= kStragglerMinSteps && w.steps == all[0].steps;
  });
  if (slowest >= 0 && all[static_cast<size_t>(slowest)].steps > 0) {
    timing.slowest_rank = slowest;
    timing.slowest_own_seconds = all[static_cast<size_t>(slowest)].own_s;
    slowest_ratio(all, nullptr, &timing.typical_own_seconds);
  }
  e.straggler = find_straggler(all);
  // The same decision on every rank (from the gathered numbers): the allreduce of the
  // steps' waits runs on all of them or on none.
  if (e.judged) {
    const double least = balance.least_exposed(comm);
    e.comm = find_comm_bound(least, all, balance.one_host());
    std::vector<double> period;
    for (const RankWork& w : all) period.push_back(w.period_s);
    const double p = median(period);
    e.exposed_share = p > 0 ? least / p : 0.0;
  }
  return e;
}

RankBalance::RankBalance(std::unique_ptr<timeline::DeviceEvents> events) : events_(std::move(events)) {}

RankBalance::RankBalance(Device device)
    : RankBalance(device.is_cuda() ? timeline::cuda_events(device.index) : nullptr) {}

RankBalance::~RankBalance() {
  // Destroying an event whose work is still queued is allowed: CUDA frees it when it runs.
  if (events_) {
    for (void* e : all_) events_->destroy(e);
  }
}

void* RankBalance::event() {
  if (free_.empty()) {
    void* e = events_->create();
    all_.push_back(e);
    free_.push_back(e);
  }
  void* e = free_.back();
  free_.pop_back();
  events_->record(e);
  return e;
}

void RankBalance::release(void* e) {
  if (e) free_.push_back(e);
}

void RankBalance::release(Step& st) {
  release(st.ref);
  release(st.end);
  release(st.update);
  release(st.update_end);
  for (auto& [a, b] : st.waits) {
    release(a);
    release(b);
  }
  st = Step{};
}

void RankBalance::add_exposed(double seconds) {
  exposed_ += seconds;
  if (exposed_seen_++ % exposed_stride_ != 0) return;
  exposed_samples_.push_back(seconds);
  if (exposed_samples_.size() <= kMaxExposedSamples) return;
  // Full: keep every second one (steps 0, 2s, 4s, ...) and take every 2s-th from now on.
  for (size_t i = 0; 2 * i < exposed_samples_.size(); ++i) exposed_samples_[i] = exposed_samples_[2 * i];
  exposed_samples_.resize((exposed_samples_.size() + 1) / 2);
  exposed_stride_ *= 2;
}

void RankBalance::read_complete(bool wait) {
  if (wait && !pending_.empty()) events_->synchronize(pending_.back().update_end);
  while (!pending_.empty()) {
    Step& st = pending_.front();
    // One stream: its last event complete means every earlier one is.
    if (!events_->complete(st.update_end)) break;
    double ms = events_->elapsed_ms(st.ref, st.end) + events_->elapsed_ms(st.update, st.update_end);
    for (const auto& [a, b] : st.waits) ms -= events_->elapsed_ms(a, b);
    own_ += std::max(0.0, ms) * 1e-3;
    add_exposed(std::max(0.0, events_->elapsed_ms(st.end, st.update)) * 1e-3);
    ++gpu_steps_;
    release(st);
    pending_.pop_front();
  }
}

void RankBalance::epoch_begin() {
  if (events_) {
    // Read what ran; a step left half queued (one that threw) gives its events back.
    read_complete(true);
    release(current_);
    release(std::exchange(ref_event_, nullptr));
  }
  ref_t_ = begin_t_ = -1;
  own_ = input_ = other_ = queue_ = period_ = exposed_ = 0;
  steps_ = gpu_steps_ = periods_ = exposed_seen_ = 0;
  exposed_stride_ = 1;
  exposed_samples_.clear();
}

void RankBalance::step_begin(double t) {
  if (begin_t_ >= 0) {
    period_ += t - begin_t_;
    ++periods_;
  }
  begin_t_ = input_t_ = t;
  // The ranks met in this epoch already; the meeting is this step's alone (a step that never
  // reached the next one leaves none, on CPU ranks as on GPU ranks).
  step_ref_t_ = std::exchange(ref_t_, -1.0);
  counted_ = step_ref_t_ >= 0;
  if (events_) {
    release(current_);  // a step that never ended (it threw)
    current_.ref = std::exchange(ref_event_, nullptr);
  }
}

void RankBalance::input_done(double t) { input_s_ = t - input_t_; }

void RankBalance::compute_begin(double t) {
  compute_t_ = t;
  waited_s_ = 0;
}

void RankBalance::wait_begin(double t) {
  wait_t_ = t;
  if (events_) current_.waits.emplace_back(event(), nullptr);
}

void RankBalance::wait_end(double t) {
  waited_s_ += t - wait_t_;
  if (events_ && !current_.waits.empty() && !current_.waits.back().second) current_.waits.back().second = event();
}

void RankBalance::backward_end(double t) {
  backward_t_ = t;
  if (events_) current_.end = event();
}

void RankBalance::update_begin(double t) {
  update_t_ = t;
  if (events_) current_.update = event();
}

void RankBalance::update_done() {
  if (events_) current_.update_end = event();
}

void RankBalance::step_end(double t) {
  if (events_) {
    const bool whole = counted_ && current_.ref && current_.end && current_.update && current_.update_end &&
                       std::all_of(current_.waits.begin(), current_.waits.end(),
                                   [](const auto& w) { return w.second != nullptr; });
    if (!whole) {  // the epoch's first step
      release(current_);
      return;
    }
    pending_.push_back(std::exchange(current_, Step{}));
  } else if (!counted_) {
    return;
  }
  const double other = std::max(0.0, compute_t_ - step_ref_t_ - input_s_);
  const double queue = std::max(0.0, backward_t_ - compute_t_ - waited_s_) + std::max(0.0, t - update_t_);
  if (events_) {
    read_complete(false);
  } else {
    own_ += input_s_ + other + queue;
    add_exposed(std::max(0.0, update_t_ - backward_t_));
  }
  queue_ += queue;
  input_ += input_s_;
  other_ += other;
  ++steps_;
}

void RankBalance::met(double t) {
  ref_t_ = t;
  if (events_) {
    release(std::exchange(ref_event_, nullptr));
    ref_event_ = event();
  }
}

double RankBalance::least_exposed(Communicator& comm) {
  // After gather, which read every step: the samples are those of the gathered steps, as
  // many on every rank as the caller checked.
  if (exposed_samples_.empty()) return 0.0;
  const std::vector<double> least = comm.allreduce_min(exposed_samples_);
  double sum = 0;
  for (double v : least) sum += v;
  return sum / static_cast<double>(least.size());
}

bool RankBalance::one_host() const {
  return std::all_of(hosts_.begin(), hosts_.end(), [](const std::string& h) { return h.empty(); });
}

RankWork RankBalance::local() const {
  RankWork w;
  w.gpu = events_ != nullptr;
  const int64_t n = events_ ? std::min(steps_, gpu_steps_) : steps_;
  if (n == 0) return w;
  w.steps = n;
  w.own_s = own_ / static_cast<double>(events_ ? gpu_steps_ : steps_);
  w.input_s = input_ / static_cast<double>(steps_);
  w.other_s = other_ / static_cast<double>(steps_);
  w.queue_s = queue_ / static_cast<double>(steps_);
  w.compute_s = events_ ? std::max(0.0, w.own_s - w.input_s - w.other_s) : w.queue_s;
  w.period_s = periods_ > 0 ? period_ / static_cast<double>(periods_) : 0.0;
  w.exposed_s = exposed_ / static_cast<double>(events_ ? gpu_steps_ : steps_);
  return w;
}

std::vector<RankWork> RankBalance::gather(Communicator& comm) {
  if (events_) read_complete(true);
  const RankWork me = local();
  const double mine[kFields] = {me.own_s,    me.input_s,  me.other_s, me.compute_s, me.queue_s, me.period_s,
                                static_cast<double>(me.steps), me.gpu ? 1.0 : 0.0, me.exposed_s};
  const int p = comm.size();
  std::vector<double> all(static_cast<size_t>(kFields * p));
  comm.allgather(mine, all.data(), kFields, DType::f64, Device::cpu());
  std::vector<RankWork> out(static_cast<size_t>(p));
  for (int q = 0; q < p; ++q) {
    const double* f = all.data() + static_cast<ptrdiff_t>(q) * kFields;
    out[static_cast<size_t>(q)] = {.own_s = f[0], .input_s = f[1], .other_s = f[2], .compute_s = f[3],
                                   .queue_s = f[4], .period_s = f[5], .steps = static_cast<int64_t>(f[6]),
                                   .gpu = f[7] != 0.0, .exposed_s = f[8]};
  }
  // The host names once per communicator size (a parameter-server fit may have dropped a
  // worker since: then every rank gathers them again, alike).
  if (hosts_.size() != static_cast<size_t>(p)) {
    int64_t words[kHostWords] = {};
    char name[kHostWords * sizeof(int64_t) + 1] = {};
    if (::gethostname(name, sizeof name - 1) != 0) std::snprintf(name, sizeof name, "?");
    std::memcpy(words, name, sizeof words);
    std::vector<int64_t> names(static_cast<size_t>(kHostWords * p));
    comm.allgather(words, names.data(), kHostWords, DType::i64, Device::cpu());
    hosts_.assign(static_cast<size_t>(p), "");
    bool one_host = true;
    for (int q = 0; q < p; ++q) {
      char buf[kHostWords * sizeof(int64_t) + 1] = {};
      std::memcpy(buf, names.data() + static_cast<ptrdiff_t>(q) * kHostWords, kHostWords * sizeof(int64_t));
      hosts_[static_cast<size_t>(q)] = buf;
      one_host = one_host && hosts_[static_cast<size_t>(q)] == hosts_[0];
    }
    if (one_host) hosts_.assign(static_cast<size_t>(p), "");
  }
  return out;
}

bool same_stragglers(const Straggler& warned, const Straggler& now, const std::vector<std::string>& hosts) {
  auto among = [](int r, const std::vector<int>& set) { return std::find(set.begin(), set.end(), r) != set.end(); };
  // Each warning's slowest among the other's named ranks: which of two equally slow ranks is
  // the slower, or a rank near the threshold named in one epoch and not the next, is no news.
  if (!among(now.rank, warned.ranks) || !among(warned.rank, now.ranks)) return false;
  // But two or more ranks named or no longer named are, and so is one rank more on a host
  // that the warning named no rank on (a second slow host).
  std::vector<int> changed;
  for (int r : now.ranks) {
    if (!among(r, warned.ranks)) changed.push_back(r);
  }
  for (int r : warned.ranks) {
    if (!among(r, now.ranks)) changed.push_back(r);
  }
  if (changed.size() > 1) return false;
  auto host_of = [&](int r) { return static_cast<size_t>(r) < hosts.size() ? hosts[static_cast<size_t>(r)] : ""; };
  const bool one_host = std::all_of(hosts.begin(), hosts.end(), [](const std::string& h) { return h.empty(); });
  if (changed.empty() || one_host) return true;
  if (among(changed[0], warned.ranks)) return true;  // one rank fewer: its host was named
  // One rank more: old news on a host the warning named another rank on.
  const std::string h = host_of(changed[0]);
  for (int r : warned.ranks) {
    if (!h.empty() && host_of(r) == h) return true;
  }
  return false;
}

bool RankBalance::worth_warning(const EpochBalance& e) {
  const std::optional<Straggler>& s = e.straggler;
  if (!s) {
    if (e.judged && e.slowest_ratio < kStragglerForgetRatio) warned_.reset();
    return false;
  }
  const bool same = warned_ && same_stragglers(*warned_, *s, hosts_) && warned_->cause == s->cause &&
                    s->lag_s < 1.5 * warned_->lag_s && s->lag_s > warned_->lag_s / 1.5;
  if (same) return false;
  warned_ = s;
  return true;
}

bool RankBalance::worth_comm_warning(const EpochBalance& e) {
  const std::optional<CommBound>& c = e.comm;
  if (!c) {
    if (e.judged && e.exposed_share < kCommForgetShare) comm_warned_.reset();
    return false;
  }
  if (comm_warned_ && c->share < 1.5 * comm_warned_->share && c->share > comm_warned_->share / 1.5) return false;
  comm_warned_ = c;
  return true;
}

void RankBalance::warn(int epoch, const EpochBalance& e, int64_t threshold_bytes, bool automatic) {
  // Every rank keeps the same memory of what was said (the same numbers everywhere).
  const bool straggler = worth_warning(e);
  const bool comm = worth_comm_warning(e);
  if (!is_master_rank()) return;
  if (straggler) log_warning("{}", describe_straggler(epoch, *e.straggler, hosts_, static_cast<int>(hosts_.size())));
  if (comm) log_warning("{}", describe_comm_bound(epoch, *e.comm, threshold_bytes, automatic));
}

}  // namespace tnt::detail
