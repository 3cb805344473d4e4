#include "rank_watch.hpp"

#include "env_names.hpp"
#include "error.hpp"
#include "text.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <fmt/ranges.h>

namespace tnt::launcher {

namespace {

// A report names a rank; the plan has it, or it is not ours.
bool in_plan(int rank, size_t size) { return rank >= 0 && static_cast<size_t>(rank) < size; }

}  // namespace

RankWatch::RankWatch(std::vector<RankSlot> ranks, WatchLimits limits, Clock::time_point launched)
    : slots_(std::move(ranks)), state_(slots_.size()), limits_(limits), launched_(launched) {}

void RankWatch::record(const RankReport& r, Clock::time_point now) {
  if (!in_plan(r.rank, state_.size())) return;
  State& s = state_[static_cast<size_t>(r.rank)];
  switch (r.kind) {
    case RankReport::Kind::started: s.started = true; break;
    case RankReport::Kind::stopped:
      s.stopped = true;
      s.stop_signal = r.code;
      s.stopped_at = now;
      break;
    case RankReport::Kind::continued: s.stopped = false; break;
    case RankReport::Kind::joining:
      s.joining = true;
      s.joining_at = now;
      break;
    case RankReport::Kind::joined: s.joined = s.joining = true; break;
    case RankReport::Kind::stop_requested:
    case RankReport::Kind::ps_begin:
    case RankReport::Kind::ps_end: break;
    case RankReport::Kind::finalizing:
      s.finalizing = true;
      s.finalizing_at = now;
      break;
    case RankReport::Kind::ended:
      s.ended = true;
      s.stopped = false;
      s.exit_code = r.code;
      s.signaled = r.signaled;
      if (r.failed() && std::find(tolerated_.begin(), tolerated_.end(), r.rank) != tolerated_.end()) break;
      if (!first_end_) {
        first_end_ = now;
        first_end_rank_ = r.rank;
      }
      if (r.failed()) {
        if (!first_failure_) first_failure_ = now;
        failures_.push_back(r);
      }
      break;
  }
  if (!left_found_) {
    std::vector<int> left, waiting;
    left_early(left, waiting);
    if (!left.empty()) left_found_ = now;
  }
}

void RankWatch::left_early(std::vector<int>& left, std::vector<int>& waiting) const {
  left.clear();
  waiting.clear();
  for (size_t r = 0; r < state_.size(); ++r) {
    const State& s = state_[r];
    if (s.joined) {  // MPI_Init returned somewhere: every rank entered it
      left.clear();
      waiting.clear();
      return;
    }
    // A failure is mpirun's to act on (it ends the job at once); an exit 0 it waits on.
    if (s.ended && !s.joining && !s.signaled && s.exit_code == 0) left.push_back(static_cast<int>(r));
    if (s.joining && !s.ended) waiting.push_back(static_cast<int>(r));
  }
  if (left.empty() || waiting.empty()) {
    left.clear();
    waiting.clear();
  }
}

std::vector<int> RankWatch::waiting_in_init() const {
  std::vector<int> waiting;
  for (size_t r = 0; r < state_.size(); ++r) {
    const State& s = state_[r];
    if (s.joined) return {};  // MPI_Init returned somewhere: every rank got into it
    if (s.joining && !s.ended) waiting.push_back(static_cast<int>(r));
  }
  return waiting;
}

std::optional<RankWatch::InitWait> RankWatch::init_wait(Clock::time_point now) const {
  const std::vector<int> waiting = waiting_in_init();
  if (waiting.empty()) return std::nullopt;
  std::vector<int> missing;
  for (size_t r = 0; r < state_.size(); ++r) {
    const State& s = state_[r];
    if (s.started && !s.joining && !s.ended) missing.push_back(static_cast<int>(r));
  }
  Clock::time_point since = Clock::time_point::max();
  for (int r : waiting) since = std::min(since, state_[static_cast<size_t>(r)].joining_at);
  const auto waited = std::chrono::duration_cast<std::chrono::seconds>(now - since).count();
  if (missing.empty()) {
    // Every rank is in MPI_Init and none got through: MPI_Init returns within seconds once
    // all are in, unless what connects them (an Open MPI daemon, a host) does not answer.
    bool all_in = true;
    for (const State& s : state_) all_in = all_in && s.joining;
    if (!all_in) return std::nullopt;
    since = Clock::time_point::min();
    for (int r : waiting) since = std::max(since, state_[static_cast<size_t>(r)].joining_at);
    const auto all_waited = std::chrono::duration_cast<std::chrono::seconds>(now - since).count();
    return InitWait{fmt::format("all {} ranks have been in MPI_Init (tnt::init) for {} s and none has got through "
                                "it: an Open MPI daemon or a host that does not answer ({})",
                                state_.size(), all_waited, describe(waiting)),
                    since};
  }
  return InitWait{fmt::format("{} {} waited {} s in MPI_Init (tnt::init) for {}, which {} not reached it: a program "
                              "that works long before tnt::init, or one stuck before it",
                              describe(waiting), waiting.size() == 1 ? "has" : "have", waited, describe(missing),
                              missing.size() == 1 ? "has" : "have"),
                  since};
}

std::optional<RankWatch::InitWait> RankWatch::finalize_wait(Clock::time_point now) const {
  // A parameter-server job's ranks end apart by design (a worker done before the others).
  if (!tolerated_.empty()) return std::nullopt;
  std::vector<int> waiting, missing;
  Clock::time_point since = Clock::time_point::max();
  for (size_t r = 0; r < state_.size(); ++r) {
    const State& s = state_[r];
    if (s.ended) continue;
    if (s.finalizing) {
      waiting.push_back(static_cast<int>(r));
      since = std::min(since, s.finalizing_at);
    } else if (s.started) {
      missing.push_back(static_cast<int>(r));
    }
  }
  if (waiting.empty() || missing.empty()) return std::nullopt;
  const auto waited = std::chrono::duration_cast<std::chrono::seconds>(now - since).count();
  return InitWait{fmt::format("{} {} waited {} s in MPI_Finalize (tnt::finalize, the end of the program) for {}, "
                              "which {} not reached it: still working (writing files, say) or stuck there",
                              describe(waiting), waiting.size() == 1 ? "has" : "have", waited, describe(missing),
                              missing.size() == 1 ? "has" : "have"),
                  since};
}

std::optional<std::string> RankWatch::stopped_ranks(Clock::time_point now) const {
  std::vector<int> stopped;
  Clock::time_point since = Clock::time_point::max();
  for (size_t r = 0; r < state_.size(); ++r) {
    const State& s = state_[r];
    if (s.stopped && !s.ended) {
      stopped.push_back(static_cast<int>(r));
      since = std::min(since, s.stopped_at);
    }
  }
  if (stopped.empty()) return std::nullopt;
  const auto for_s = std::chrono::duration_cast<std::chrono::seconds>(now - since).count();
  return fmt::format("{} {} stopped ({} s the longest): the others wait for {}", describe(stopped),
                     stopped.size() == 1 ? "is" : "are", for_s, stopped.size() == 1 ? "it" : "them");
}

void RankWatch::record_lost(const LostRank& l, Clock::time_point now) {
  if (!in_plan(l.rank, state_.size())) return;
  State& s = state_[static_cast<size_t>(l.rank)];
  if (s.ended) return;
  s.ended = true;
  s.stopped = false;
  if (!first_end_) {
    first_end_ = now;
    first_end_rank_ = l.rank;
  }
  if (!first_failure_) first_failure_ = now;
}

void RankWatch::paused(Clock::duration gap) {
  launched_ += gap;
  for (State& s : state_) {
    if (s.stopped) s.stopped_at += gap;
    if (s.finalizing) s.finalizing_at += gap;
  }
  if (first_end_) *first_end_ += gap;
  if (first_failure_) *first_failure_ += gap;
}

std::string RankWatch::describe(const std::vector<int>& ranks) const {
  // Enough to find the culprits on a large job without a line of thousands of ranks.
  constexpr size_t shown = 8;
  std::string out;
  for (size_t i = 0; i < ranks.size() && i < shown; ++i) {
    const RankSlot& s = slots_[static_cast<size_t>(ranks[i])];
    if (i > 0) out += ", ";
    const State& st = state_[static_cast<size_t>(ranks[i])];
    const std::string stopped = st.stopped ? fmt::format(", stopped by {}", signal_name(st.stop_signal)) : "";
    out += fmt::format("rank {} (host {}, local rank {}{})", s.rank, s.host, s.local_rank, stopped);
  }
  if (ranks.size() > shown) out += fmt::format(" and {} more", ranks.size() - shown);
  return out;
}

Clock::time_point RankWatch::next_check() const {
  if (decided_) return Clock::time_point::max();
  Clock::time_point next = Clock::time_point::max();
  auto after = [](Clock::time_point t, Seconds d) {
    return t + std::chrono::duration_cast<Clock::duration>(d);
  };
  if (left_found_) next = std::min(next, *left_found_);
  // Stopped after the start check while others wait in MPI_Init: due a start limit later.
  if (limits_.start.count() > 0 && start_checked_ && !first_failure_ && !waiting_in_init().empty()) {
    for (const State& s : state_) {
      if (s.stopped && !s.ended) next = std::min(next, after(s.stopped_at, limits_.start));
    }
  }
  if (limits_.start.count() > 0 && !start_checked_) next = std::min(next, after(launched_, limits_.start));
  if (limits_.exit.count() > 0 && first_end_) {
    next = std::min(next, after(first_failure_ ? *first_failure_ : *first_end_, exit_limit()));
  }
  return next;
}

std::optional<RankWatch::Verdict> RankWatch::check(Clock::time_point now) {
  if (decided_ || now < next_check()) return std::nullopt;
  const auto ranks = static_cast<int>(slots_.size());
  auto count = [&](size_t n) { return fmt::format("{} of {} rank{}", n, ranks, ranks == 1 ? "" : "s"); };

  if (left_found_ && now >= *left_found_) {
    std::vector<int> left, waiting;
    left_early(left, waiting);
    if (!left.empty()) {
      decided_ = true;
      const bool one = left.size() == 1;
      return Verdict{Reason::left,
                     fmt::format("{} exited 0 without joining the job (its program ended before tnt::init, or never "
                                 "called it), while {} {} for {} in MPI_Init: the job cannot finish",
                                 describe(left), describe(waiting), waiting.size() == 1 ? "waits" : "wait",
                                 one ? "it" : "them")};
    }
    left_found_.reset();  // a rank joined since: the rule no longer holds
  }

  if (limits_.start.count() > 0 && !start_checked_ && now >= launched_ + std::chrono::duration_cast<Clock::duration>(limits_.start)) {
    start_checked_ = true;
    // After a failure mpirun stops the job itself (and the exit timeout bounds that):
    // ranks it did not start then are not the news.
    if (!first_failure_) {
      std::vector<int> missing, stopped;
      for (int r = 0; r < ranks; ++r) {
        const State& s = state_[static_cast<size_t>(r)];
        if (!s.started && !s.ended) missing.push_back(r);
        if (s.stopped && !s.ended) stopped.push_back(r);
      }
      std::vector<std::string> parts;
      const std::string limit = fmt::format("{} s (--start-timeout, {})", format_seconds(limits_.start),
                                            env::start_timeout);
      if (!missing.empty()) {
        parts.push_back(fmt::format("{} did not start within {}: {}", count(missing.size()), limit, describe(missing)));
      }
      if (!stopped.empty()) {
        parts.push_back(fmt::format("{} {} stopped {} after the launch: {}", count(stopped.size()),
                                    stopped.size() == 1 ? "was" : "were", limit, describe(stopped)));
      }
      if (!parts.empty()) {
        decided_ = true;
        return Verdict{Reason::start, fmt::format("{}", fmt::join(parts, "; "))};
      }
    }
  }

  // After the start check, a rank stopped for the start limit while the others wait in
  // MPI_Init (which returns nowhere until every rank is in it) hangs the job the same way.
  if (limits_.start.count() > 0 && start_checked_ && !first_failure_) {
    const std::vector<int> waiting = waiting_in_init();
    std::vector<int> stopped;
    for (int r = 0; r < ranks && !waiting.empty(); ++r) {
      const State& s = state_[static_cast<size_t>(r)];
      if (s.stopped && !s.ended && now >= s.stopped_at + std::chrono::duration_cast<Clock::duration>(limits_.start)) {
        stopped.push_back(r);
      }
    }
    if (!stopped.empty()) {
      decided_ = true;
      return Verdict{Reason::start,
                     fmt::format("{} {} stopped for {} s (--start-timeout, {}) while {} {} for {} in MPI_Init: {}",
                                 count(stopped.size()), stopped.size() == 1 ? "was" : "were",
                                 format_seconds(limits_.start), env::start_timeout, describe(waiting),
                                 waiting.size() == 1 ? "waits" : "wait", stopped.size() == 1 ? "it" : "them",
                                 describe(stopped))};
    }
  }

  if (limits_.exit.count() > 0 && first_end_) {
    const Clock::time_point since = first_failure_ ? *first_failure_ : *first_end_;
    if (now < since + std::chrono::duration_cast<Clock::duration>(exit_limit())) return std::nullopt;
    decided_ = true;
    const std::string later =
        exit_limit() < limits_.exit
            ? fmt::format("{} s later (mpirun ends a job within seconds of a failure)", format_seconds(exit_limit()))
            : fmt::format("{} s later (--exit-timeout, {})", format_seconds(limits_.exit), env::exit_timeout);
    if (!failures_.empty()) {
      const RankReport& f = failures_.front();
      return Verdict{Reason::teardown, fmt::format("{} failed first ({}), but {} mpirun still had not ended the job",
                                                   describe({f.rank}), describe_status(f), later)};
    }
    std::vector<int> running;
    for (int r = 0; r < ranks; ++r) {
      if (!state_[static_cast<size_t>(r)].ended) running.push_back(r);
    }
    if (running.empty()) {
      return Verdict{Reason::teardown, fmt::format("every rank's program has ended (the first: {}), but {} "
                                                   "mpirun still had not",
                                                   describe({first_end_rank_}), later)};
    }
    return Verdict{Reason::exit, fmt::format("{} exited 0, but {} {} still had not ended: {}",
                                             describe({first_end_rank_}), later, count(running.size()),
                                             describe(running))};
  }
  return std::nullopt;
}

}  // namespace tnt::launcher
