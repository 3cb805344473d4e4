// How the launcher learns what each rank's program does. mpirun only knows that some
// process failed; the per-rank step knows its rank, host and the program's exact status.
// So each rank's step sends one line over TCP to a socket the launcher listens on, for
// each of these events: the program has started (exec succeeded), it was stopped by a
// signal, it continued, its runtime began and finished joining the job (MPI_Init), and it
// ended (every end, exit 0 included). The launcher watches
// the job with them (rank_watch.hpp).
//
// A report of a failure is sent before the rank exits, and the step waits until the
// launcher has read it: a rank that fails first therefore reports before mpirun can even
// start tearing the others down, and the launcher's arrival order is the order of
// failures. Other reports do not wait: the connection is made (so the line is queued in
// the launcher's kernel) and the step goes on.
//
// The address reaches the ranks in TNT_LAUNCHER_REPORT as HOSTS:PORT:TOKEN:HEARTBEAT_MS,
// where HOSTS is the launcher's host name followed by its IPv4 addresses (comma-separated):
// a step on the launcher's own host connects to the loopback address directly, without a
// name lookup; any other tries the name and every address at once and keeps the first
// connection that succeeds, so the launcher is reached even where its host name resolves
// to an address the ranks cannot route to (a login node, a test bed's bridge). The token
// keeps stray connections from posing as reports. HEARTBEAT_MS is the lifeline's timeout
// (lifeline.hpp; 0: no lifeline).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace tnt::launcher {

struct RankReport {
  // joining, joined: the program's runtime is about to enter MPI_Init, and has left it
  // (env::join_fd); a program without the runtime sends neither.
  // stop_requested: the program stopped training on a stop request (tnt::request_stop_after_step,
  // a warning signal), with its checkpoint where it writes one.
  enum class Kind {
    started, stopped, continued, ended, joining, joined, finalizing, stop_requested,
    ps_begin, ps_end  // a worker entered / left parameter-server training (a loss there is survived)
  };
  int rank = -1;
  int local_rank = -1;
  std::string host;
  bool signaled = false;  // ended: killed by signal `code`
  int code = 0;           // ended: exit code or signal number; stopped: the signal that stopped it
  Kind kind = Kind::ended;

  bool failed() const { return kind == Kind::ended && (signaled || code != 0); }
};

// A rank whose lifeline (lifeline.hpp) tells the launcher that it is gone without an end
// report: `lost` when its connection closed (the step, its Open MPI daemon or its host died),
// `unreachable` when nothing came through it for the heartbeat timeout (the host is down or
// cut off). Made by the launcher, never sent by a step.
struct LostRank {
  enum class Kind { lost, unreachable };
  int rank = -1;
  int local_rank = -1;
  std::string host;
  Kind kind = Kind::lost;
  double silent_s = 0;  // unreachable: seconds without a heartbeat
};

// "lost (...)" or "unreachable (...)", the way a failure is described.
std::string describe_lost(const LostRank& lost);

// "exit code 3" or "signal 9 (SIGKILL)"
std::string describe_status(const RankReport& report);
// For a rank that failed first: what its failure most often means where that is not plain
// (SIGKILL: the kernel's out-of-memory killer), as lines to print after it; else empty.
std::string failure_hint(const RankReport& r);

// What a shell would report for this failure: the code, or 128 + the signal.
int shell_status(const RankReport& report);

// "SIGSTOP", or "signal 40" for a signal without a name.
std::string signal_name(int sig);

// The run identifier of --max-restarts: the launch's start (seconds since the epoch), '-',
// 16 random hex digits. A restart tells what was written since its launch began by it.
std::string random_run_id();

// The parts of TNT_LAUNCHER_REPORT.
struct LauncherAddress {
  std::vector<std::string> hosts;  // the launcher's host name, then its addresses
  std::string port, token;
  double heartbeat_s = 0;  // the lifeline's timeout; 0: no lifeline
};
std::optional<LauncherAddress> parse_launcher_address(const std::string& text);

// A connected (blocking, close-on-exec) socket to the launcher, or -1 when none of its
// addresses answered by the deadline.
int connect_to_launcher(const LauncherAddress& address, const std::string& this_host,
                        std::chrono::steady_clock::time_point deadline);

// The first line a lifeline sends: the protocol word, the token, rank, local rank, host.
inline constexpr const char* lifeline_protocol = "tnt-lifeline-1";

// A lifeline the report server accepted: the connection (non-blocking) and whose it is.
struct LifelineHello {
  int fd = -1;
  int rank = -1;
  int local_rank = -1;
  std::string host;
};

class ReportServer {
 public:
  // nullopt when no listening socket can be made (the job still runs, without reports).
  // `heartbeat_s` goes into the address for the steps' lifelines (0: none).
  static std::optional<ReportServer> open(const std::string& this_host, double heartbeat_s = 0);
  ReportServer(ReportServer&& other) noexcept;
  ReportServer& operator=(ReportServer&&) = delete;
  ReportServer(const ReportServer&) = delete;
  ~ReportServer();

  int fd() const { return fd_; }
  const std::string& address() const { return address_; }

  // Accepts every connection already queued and appends their reports, in arrival order.
  // Lifelines go to `lifelines` (their connections stay open) or, without it, are closed.
  void accept_pending(std::vector<RankReport>& out, std::vector<LifelineHello>* lifelines = nullptr);

 private:
  ReportServer(int fd, std::string address, std::string token);
  int fd_ = -1;
  std::string address_;
  std::string token_;
};

// Sends one report to `address`; with `wait_until_read`, also waits (briefly) until the
// launcher has read it. Returns false when the launcher could not be reached.
bool send_report(const std::string& address, const std::string& this_host, const RankReport& report,
                 bool wait_until_read = true);

}  // namespace tnt::launcher
