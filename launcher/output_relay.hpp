// mpirun's standard output, passed on by the launcher when its own standard output is a
// pipe or a socket, that is when its reader can go away (`tarantella ... | head -1`).
// mpirun itself meets a closed output with "SIGPIPE detected ... aborting" and, in Open
// MPI 4.1, a crash dump of its own, and the ranks it then kills are blamed for the failure.
// Through the relay mpirun never writes to the closed pipe: the launcher finds the reader
// gone when it next has output to pass on (as a pipeline's writer meets SIGPIPE at its
// next write), stops the job once and says why (job.hpp), and keeps reading mpirun's
// output (to nowhere) so that mpirun is never blocked while it stops.
//
// A file or a device other than a terminal (or /dev/null) comes through the relay too:
// mpirun ignores a failed write (a full disk, /dev/full, ulimit -f) and the output would be
// lost without a word; the launcher stops the job at the first failed write, naming the
// error (job.hpp). A terminal is left to mpirun. A write that the kernel reports only at
// close (NFS's ENOSPC) is still not seen.
// Writes never block the launcher's loop: at most a pipe's atomic size (PIPE_BUF) goes in
// one write, and only when poll() says there is room; a socket is written without waiting.
#pragma once

#include <chrono>
#include <functional>
#include <poll.h>
#include <string>
#include <vector>

namespace tnt::launcher {

class OutputRelay {
 public:
  // Whether output written to `fd` needs the relay (a pipe, a socket, a file, a device but
  // a terminal or /dev/null).
  static bool wanted(int fd);

  // `source`: the read end of mpirun's standard output (owned: closed here). `sink`: the
  // launcher's standard output (not owned).
  OutputRelay(int source, int sink);
  ~OutputRelay();
  OutputRelay(const OutputRelay&) = delete;
  OutputRelay& operator=(const OutputRelay&) = delete;

  // The descriptors for poll(), with the events of interest now.
  void poll_fds(std::vector<pollfd>& out) const;
  // Moves what it can without blocking. True once: the call that found the reader gone.
  bool service();
  bool sink_closed() const { return closed_; }
  // Once closed: the failed write's errno, where it was not the reader's going away (EPIPE,
  // ECONNRESET, a hang-up), e.g. ENOSPC; else 0.
  int sink_error() const { return error_; }
  // After mpirun has ended: what is left in the source (until end of file, or `deadline`
  // for a source that a process left behind still holds) goes out, waiting for a slow
  // reader as long as it reads, until `stop()` says to stop: it is called whenever
  // `stop_fd` (the launcher's signalfd) is readable, and reads it (other signals than a
  // stop come there too). With stop_fd -1 the reader too is waited for until `deadline`
  // only. What is not written by then is dropped. True when that found the reader gone.
  bool finish(std::chrono::steady_clock::time_point deadline, int stop_fd = -1,
              const std::function<bool()>& stop = {});

  // Bytes kept for a slow reader before mpirun's output is left to wait in its pipe.
  static constexpr size_t max_pending = 1 << 20;

 private:
  bool read_source();
  bool write_sink();  // false: the reader is gone, or a write failed (error_)

  int source_ = -1, sink_ = -1;
  bool sink_is_socket_ = false;
  bool closed_ = false;
  int error_ = 0;
  std::string pending_;
};

}  // namespace tnt::launcher
