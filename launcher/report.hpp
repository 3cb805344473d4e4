// How the launcher learns what each rank's program does. mpirun only knows that some
// process failed; the per-rank step knows its rank, host and the program's exact status.
// So each rank's step sends one line over TCP to a socket the launcher listens on, for
// each of these events: the program has started (exec succeeded), it was stopped by a
// signal, it continued, and it ended (every end, exit 0 included). The launcher watches
// the job with them (rank_watch.hpp).
//
// A report of a failure is sent before the rank exits, and the step waits until the
// launcher has read it: a rank that fails first therefore reports before mpirun can even
// start tearing the others down, and the launcher's arrival order is the order of
// failures. Other reports do not wait: the connection is made (so the line is queued in
// the launcher's kernel) and the step goes on.
//
// The address (host:port:token) reaches the ranks in TNT_LAUNCHER_REPORT; the token keeps
// stray connections from posing as reports. A step on the launcher's own host connects
// to the loopback address directly, without a name lookup.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tnt::launcher {

struct RankReport {
  enum class Kind { started, stopped, continued, ended };
  int rank = -1;
  int local_rank = -1;
  std::string host;
  bool signaled = false;  // ended: killed by signal `code`
  int code = 0;           // ended: exit code or signal number; stopped: the signal that stopped it
  Kind kind = Kind::ended;

  bool failed() const { return kind == Kind::ended && (signaled || code != 0); }
};

// "exit code 3" or "signal 9 (SIGKILL)"
std::string describe_status(const RankReport& report);

// What a shell would report for this failure: the code, or 128 + the signal.
int shell_status(const RankReport& report);

// "SIGSTOP", or "signal 40" for a signal without a name.
std::string signal_name(int sig);

class ReportServer {
 public:
  // nullopt when no listening socket can be made (the job still runs, without reports).
  static std::optional<ReportServer> open(const std::string& this_host);
  ReportServer(ReportServer&& other) noexcept;
  ReportServer& operator=(ReportServer&&) = delete;
  ReportServer(const ReportServer&) = delete;
  ~ReportServer();

  int fd() const { return fd_; }
  const std::string& address() const { return address_; }

  // Accepts every connection already queued and appends their reports, in arrival order.
  void accept_pending(std::vector<RankReport>& out);

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
