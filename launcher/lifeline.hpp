// Lifelines: how the launcher and every rank's step know that the other side is still
// there, across hosts. Open MPI notices a daemon that dies (its connection closes) but not
// a host that is cut off: its TCP connections simply go quiet, `mpirun` then waits for that
// host forever, and the cut-off ranks (and their daemon) live on with nobody to end them.
//
// So each rank's step keeps one TCP connection to the launcher's report socket for as long
// as its program runs (opened with a line `tnt-lifeline-1 TOKEN RANK LOCAL_RANK HOST`), and
// both sides send a heartbeat byte on it every `interval(timeout)`:
//
// - The launcher learns that a rank is *lost* when its lifeline closes without the step's
//   farewell (the step, its Open MPI daemon or its whole host died: the kernel closes the
//   connection), and that it is *unreachable* when nothing came through for the heartbeat
//   timeout (the host is down or the network between them is cut). It ends the job then
//   (job.hpp) and names the ranks and hosts.
// - The step learns that the launcher is gone when the lifeline closes, and that it is
//   unreachable when nothing came through for the timeout; either way the job cannot go on,
//   so the step ends its program (and, when cut off, the Open MPI daemon that started it,
//   which would otherwise wait forever): a cut-off host is left with no process of the job.
//
// The timeout is --heartbeat-timeout (TNT_HEARTBEAT_TIMEOUT, default 15 s; 0 turns
// lifelines off). Silence is only counted while this side runs: after a gap of more than
// three heartbeats between two service() calls (this process was stopped, or its machine
// suspended) the other side is given a fresh timeout. Pure of processes: the sockets are
// given, time is passed in.
#pragma once

#include "report.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace tnt::launcher {

using LifelineClock = std::chrono::steady_clock;

inline constexpr double default_heartbeat_timeout_s = 15;

// How often each side sends a heartbeat for a given timeout: a sixth of it, within
// [0.1 s, 5 s], so that several are missed before the timeout passes.
std::chrono::milliseconds heartbeat_interval(double timeout_s);

// The launcher's side: the lifelines of every rank whose step connected.
class Lifelines {
 public:
  explicit Lifelines(double timeout_s);
  ~Lifelines();
  Lifelines(const Lifelines&) = delete;
  Lifelines& operator=(const Lifelines&) = delete;

  void adopt(const LifelineHello& hello, LifelineClock::time_point now);
  // The descriptors to poll for input.
  void poll_fds(std::vector<int>& out) const;
  // Reads what came, sends the heartbeats that are due, and returns the ranks found lost or
  // unreachable since the last call (each once).
  std::vector<LostRank> service(LifelineClock::time_point now);
  // When service() next has something to do.
  LifelineClock::time_point next_wake() const;
  double timeout_s() const { return timeout_s_; }

 private:
  struct Line {
    int fd = -1;
    int rank = -1, local_rank = -1;
    std::string host;
    LifelineClock::time_point last_heard{};
    bool farewell = false;  // the step said goodbye: its end is not a loss
  };
  void close_line(Line& line);

  double timeout_s_;
  std::chrono::milliseconds interval_;
  std::vector<Line> lines_;
  LifelineClock::time_point next_beat_{};
  LifelineClock::time_point last_service_{};  // a long gap since: this side was not running
};

// The step's side.
class LifelineClient {
 public:
  enum class State {
    none,         // no lifeline (no launcher address, lifelines off, or it could not connect)
    alive,        // heard from the launcher within the timeout
    closed,       // the launcher closed it: the launcher is gone
    unreachable,  // nothing for the timeout: the launcher's host is down or cut off
  };

  // Connects (for at most a few seconds) and says hello; State::none when that fails.
  LifelineClient(const std::string& address, const std::string& this_host, int rank, int local_rank);
  ~LifelineClient();
  LifelineClient(const LifelineClient&) = delete;
  LifelineClient& operator=(const LifelineClient&) = delete;

  bool connected() const { return fd_ >= 0; }
  double timeout_s() const { return timeout_s_; }
  // Reads, sends a heartbeat when one is due, and says how the launcher is. Once closed or
  // unreachable, it stays so.
  State service(LifelineClock::time_point now);
  // Waits (at most the timeout) until the launcher is heard from again, or found closed or
  // unreachable; returns which. For a step whose report did not get through.
  State await_word();
  // The program has ended and its end is reported: tell the launcher this is no loss.
  void farewell();

 private:
  int fd_ = -1;
  double timeout_s_ = 0;
  std::chrono::milliseconds interval_{1000};
  LifelineClock::time_point last_heard_{}, next_beat_{}, last_service_{};
  State state_ = State::none;
};

}  // namespace tnt::launcher
