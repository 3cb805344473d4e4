#include "comm/waiter.hpp"

#include "comm/agreement.hpp"
#include "tarantella/check.hpp"
#include "tarantella/config.hpp"
#include "tarantella/runtime.hpp"
#include "tarantella/log.hpp"


#include <algorithm>
#include <exception>
#include <thread>

namespace tnt::detail {

namespace {

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

}  // namespace

Waiter::Waiter(CommImpl& comm, const OpDesc& op)
    : comm_(comm), op_(op), seq_(comm.seq), uncaught_(std::uncaught_exceptions()),
      check_interval_s_(comm.mismatch_grace_s) {}

Waiter::Waiter(CommImpl& comm, const OpDesc& op, int64_t seq)
    : comm_(comm), op_(op), seq_(seq), uncaught_(std::uncaught_exceptions()),
      check_interval_s_(comm.mismatch_grace_s) {}

std::string Waiter::prefix() const { return comm_error_prefix(comm_, op_.str(), seq_); }

Waiter::~Waiter() {
  if (comm_.arrivals && std::uncaught_exceptions() == uncaught_) comm_.arrivals->finish(comm_.slot, seq_);
}

Clock::time_point Waiter::deadline() const {
  if (deadline_ == Clock::time_point{}) {
    const Clock::time_point now = Clock::now();
    started_ = now;
    deadline_ = comm_.deadline();
    next_check_ = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(check_interval_s_));
  }
  return deadline_;
}

void Waiter::check(int rc, const char* call) const {
  if (rc == MPI_SUCCESS) return;
  comm_.broken = true;
  throw CommError(fmt::format("{}: MPI error in {}: {}{}", prefix(), call,
                              mpi_error_string(rc), mismatch_note()));
}

void Waiter::wait(MPI_Request& request, int peer, const char* role) {
  // Spin first: a peer that is running answers within microseconds, and giving the core
  // away on a busy machine can cost a whole scheduler time slice. After spin_us the wait
  // is on a slow link or a late peer, not on a message in flight: it naps between polls.
  // (It used to yield instead; a yielding thread is still runnable, so on CPU ranks the
  // communication thread took half a core from backward for as long as a transfer lasted,
  // a 1.6 MB allreduce at 200 Mbit/s: 60 ms; and in a cpu-capped container it spent the
  // rank's quota, so that the rank was throttled when the next message came: on the test
  // bed under a 0.4-core cgroup, 4 hosts at 1 Gbit/s, the allreduce's fitted latency fell
  // from 5.3 to 0.7 ms with naps, docs/scaling.md.) A nap costs at most its length plus
  // the kernel's timer slack (50 us) on a wait that has already taken spin_us. Napping, it
  // tests once a nap: 64 tests a nap (as while spinning) kept the thread busy a third of
  // the time.
  constexpr auto kNap = std::chrono::microseconds(50);
  int spins = 0;
  bool napping = false;
  Clock::time_point spin_until{};
  while (request != MPI_REQUEST_NULL) {
    int flag = 0;
    check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) return;
    if (napping) {
      poll(Clock::now(), peer, role);
      std::this_thread::sleep_for(kNap);
      continue;
    }
    if ((++spins & 63) != 0) continue;
    Clock::time_point now = Clock::now();
    if (spins == 64) spin_until = now + std::chrono::microseconds(comm_.spin_us);
    poll(now, peer, role);
    napping = now > spin_until;
  }
}

void Waiter::poll(Clock::time_point now, int peer, const char* role) {
  if (now > deadline()) timed_out(peer, role);
  if (now > next_check_) check_peers(now);
  if (comm_.cancel && comm_.cancel->load(std::memory_order_relaxed)) {
    comm_.broken = true;
    throw CommError(fmt::format("{}: cancelled", prefix()));
  }
}

void Waiter::wait_all(std::span<MPI_Request> requests, int peer, const char* role) {
  for (MPI_Request& r : requests) wait(r, peer, role);
}

namespace {
// Across hosts, each rank with its host: "1 (host h2), 3 (host h3)".
RankListFormat rank_list_format(const Arrivals& arrivals) {
  return [&arrivals](const std::vector<int>& list) {
    if (arrivals.one_host()) return rank_list(list);
    std::string out;
    for (size_t i = 0; i < list.size(); ++i) out += fmt::format("{}{} (host {})", i ? ", " : "", list[i], arrivals.host(list[i]));
    return out;
  };
}

// How long a check for a mismatch may wait for answers. Ranks that are running answer
// within milliseconds; one that does not (stopped, cut off) is the timeout's business.
constexpr double kCheckBudgetS = 0.5;
}  // namespace

std::string Waiter::mismatch_note() const {
  if (!comm_.arrivals || !comm_.arrivals->enabled() || comm_.size == 1) return "";
  const Arrivals& arrivals = *comm_.arrivals;
  const std::vector<RankPosition> where = arrivals.query(comm_.slot, kCheckBudgetS);
  const std::optional<Mismatch> m = find_mismatch(where);
  if (!m) return "";
  const RankListFormat format = rank_list_format(arrivals);
  return fmt::format(". The likely cause: the ranks called different collectives: {}. Where each rank is: {}. Fix: {}",
                     describe_mismatch(*m, format), describe_positions(where, format), kMismatchFix);
}

void raise_if_collectives_differ(const Communicator& communicator, const std::string& what) {
  CommImpl& comm = impl_of(communicator);
  if (!comm.arrivals || !comm.arrivals->enabled() || comm.size == 1) return;
  const Arrivals& arrivals = *comm.arrivals;
  const std::vector<RankPosition> where = arrivals.query(comm.slot, kCheckBudgetS);
  const std::optional<Mismatch> m = find_mismatch(where);
  if (!m) return;
  comm.broken = true;
  const RankListFormat format = rank_list_format(arrivals);
  throw CommError(fmt::format("{} on rank {} of {}: the ranks exchanged values that make no sense together, because "
                              "they called different collectives: {}. Where each rank is: {}. Fix: {}",
                              what, comm.rank, comm.size, describe_mismatch(*m, format),
                              describe_positions(where, format), kMismatchFix));
}

void Waiter::check_peers(Clock::time_point now) {
  check_interval_s_ = std::min(check_interval_s_ * 2, kMaxCheckInterval);
  next_check_ = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(check_interval_s_));
  if (!comm_.arrivals || !comm_.arrivals->enabled() || comm_.size == 1) return;
  const Arrivals& arrivals = *comm_.arrivals;
  const std::vector<RankPosition> where = arrivals.query(comm_.slot, kCheckBudgetS);
  if (const std::vector<int> gone = finished_before(where, seq_); !gone.empty()) {
    comm_.broken = true;
    const RankListFormat format = rank_list_format(arrivals);
    throw CommError(fmt::format("{}: rank(s) {} finished the program without calling it, and never will. Where each "
                                "rank is: {}. Fix: {}",
                                prefix(), format(gone), describe_positions(where, format), kMismatchFix));
  }
  const std::optional<Mismatch> m = find_mismatch(where);
  if (!m) report_stall(now, where);
  if (!m) {
    // The query's time is not the collective's: look again a full interval from now.
    next_check_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(check_interval_s_));
    return;
  }
  comm_.broken = true;
  const RankListFormat format = rank_list_format(arrivals);
  throw CommError(fmt::format("{}: the ranks called different collectives: {}. Where each rank is: {}. Fix: {}",
                              prefix(), describe_mismatch(*m, format),
                              describe_positions(where, format), kMismatchFix));
}

void Waiter::report_stall(Clock::time_point now, const std::vector<RankPosition>& where) {
  const double waited = std::chrono::duration<double>(now - started_).count();
  const double timeout = comm_.timeout_s;
  // A quarter of a shorter timeout: still well before it ends the job.
  const double after = timeout > 0 ? std::min(kStallWarningS, timeout / 4) : kStallWarningS;
  if (stall_reported_ || waited < after) return;
  std::vector<int> behind, silent;
  int first_waiting = -1;
  for (int q = 0; q < comm_.size; ++q) {
    const RankPosition& e = where[static_cast<size_t>(q)];
    if (!e.answered) {
      silent.push_back(q);
    } else if (e.entered < seq_) {
      behind.push_back(q);
    } else if (first_waiting < 0) {
      first_waiting = q;
    }
  }
  if (behind.empty() && silent.empty()) return;  // every rank is in it: a slow transfer, not a stall
  stall_reported_ = true;
  // One rank says it for all that wait, whichever it is (the master's log alone would miss a
  // stall of the master), at the level the job's log shows warnings.
  bool warnings_shown = false;
  try {
    warnings_shown = parse_log_level(config().log_level) <= LogLevel::warning;
  } catch (...) {
  }
  if (first_waiting != comm_.rank || !warnings_shown) return;
  const RankListFormat format = rank_list_format(*comm_.arrivals);
  std::string who;
  if (!behind.empty()) who = fmt::format("rank(s) {}, which have not reached it", format(behind));
  if (!silent.empty()) {
    who += fmt::format("{}rank(s) {}, which did not say where they are (stopped, or too busy to answer)",
                       who.empty() ? "" : ", and ", format(silent));
  }
  log_line(LogLevel::warning,
           fmt::format("{}: waiting {:.0f} s for {}. Where each rank is: {}. A rank may be stopped, stuck or much "
                       "slower, or the ranks call different collectives; the job fails after "
                       "TNT_COLLECTIVE_TIMEOUT={}",
                       prefix(), waited, who, describe_positions(where, format),
                       timeout > 0 ? fmt::format("{:g} s", timeout) : std::string("0 (never)")));
}

void Waiter::timed_out(int peer, const char* role) const {
  comm_.broken = true;
  std::string msg = fmt::format("{} did not complete within {} s", prefix(), comm_.timeout_s);
  if (peer >= 0 && peer != comm_.rank) msg += fmt::format("; waiting on rank {}{}{}", peer, role ? " " : "", role ? role : "");
  if (comm_.arrivals && comm_.arrivals->enabled()) {
    const Arrivals& arrivals = *comm_.arrivals;
    const RankListFormat ranks = rank_list_format(arrivals);
    std::vector<RankPosition> where = arrivals.query(comm_.slot, 2.0);
    std::vector<int> missing, silent;
    for (int q = 0; q < comm_.size; ++q) {
      const RankPosition& e = where[static_cast<size_t>(q)];
      if (!e.answered) {
        silent.push_back(q);
      } else if (e.entered < seq_) {
        missing.push_back(q);
      }
    }
    const std::optional<Mismatch> m = find_mismatch(where);
    if (m) msg += fmt::format("; the ranks called different collectives: {}", describe_mismatch(*m, ranks));
    const std::vector<int> gone = finished_before(where, seq_);
    if (!gone.empty()) msg += fmt::format("; rank(s) {} finished the program without calling it", ranks(gone));
    if (!missing.empty()) {
      msg += fmt::format("; rank(s) {} never joined it", ranks(missing));
    } else if (silent.empty() && !m) {
      msg += "; every rank entered it (one may be stuck inside, or ranks disagree on its arguments)";
    }
    if (!silent.empty()) {
      msg += fmt::format("; rank(s) {} did not answer the arrival query (unreachable: host down or cut off, or the "
                         "process stopped or gone)",
                         ranks(silent));
    }
    msg += fmt::format("; where each rank is: {}", describe_positions(where, ranks));
    if (m) msg += fmt::format("; fix: {}", kMismatchFix);
  } else {
    msg += "; which ranks never joined is unknown (the arrival channel has no socket)";
  }
  msg += " (TNT_COLLECTIVE_TIMEOUT)";
  throw CommError(msg);
}

void abandon_requests(CommImpl& comm, std::span<MPI_Request> requests, bool point_to_point) {
  comm.broken = true;
  bool leaked = false;
  for (MPI_Request& r : requests) {
    if (r == MPI_REQUEST_NULL) continue;
    if (point_to_point) {
      MPI_Cancel(&r);
      int flag = 0;
      MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
      if (!flag) {
        MPI_Request_free(&r);
        leaked = true;
      }
    } else {
      // A nonblocking collective may be neither cancelled nor freed: leave it.
      leaked = true;
    }
    r = MPI_REQUEST_NULL;
  }
  if (leaked) comm.scratch.abandon();
}

}  // namespace tnt::detail
