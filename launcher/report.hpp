// How the launcher learns which rank failed first, and how. mpirun only knows that some
// process failed; the per-rank step knows its rank, host and the program's exact status.
// So each rank's step, when its program ends badly, sends one line over TCP to a socket
// the launcher listens on, and waits until the launcher has read it before exiting. A
// rank that fails first therefore reports before mpirun can even start tearing the others
// down, and the launcher's arrival order is the order of failures.
//
// The address (host:port:token) reaches the ranks in TNT_LAUNCHER_REPORT; the token keeps
// stray connections from posing as reports. Everything here is best effort: without a
// socket the launcher still returns mpirun's status, only with less detail.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tnt::launcher {

struct RankFailure {
  int rank = -1;
  int local_rank = -1;
  std::string host;
  bool signaled = false;
  int code = 0;  // exit code, or signal number when signaled
};

// "exit code 3" or "signal 9 (SIGKILL)"
std::string describe_status(const RankFailure& failure);

// What a shell would report for this failure: the code, or 128 + the signal.
int shell_status(const RankFailure& failure);

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
  void accept_pending(std::vector<RankFailure>& out);

 private:
  ReportServer(int fd, std::string address, std::string token);
  int fd_ = -1;
  std::string address_;
  std::string token_;
};

// Sends one report to `address` and waits (briefly) until the launcher has read it.
// Returns false when the launcher could not be reached.
bool send_report(const std::string& address, const std::string& this_host, const RankFailure& failure);

}  // namespace tnt::launcher
