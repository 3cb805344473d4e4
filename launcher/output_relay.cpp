#include "output_relay.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

namespace tnt::launcher {

bool OutputRelay::wanted(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  // /dev/null takes every write: nothing to relay.
  const bool null_device = S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3);
  return S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) || S_ISREG(st.st_mode) ||
         (S_ISCHR(st.st_mode) && !null_device && !::isatty(fd));
}

OutputRelay::OutputRelay(int source, int sink) : source_(source), sink_(sink) {
  ::fcntl(source_, F_SETFL, ::fcntl(source_, F_GETFL) | O_NONBLOCK);
  struct stat st {};
  sink_is_socket_ = ::fstat(sink_, &st) == 0 && S_ISSOCK(st.st_mode);
}

OutputRelay::~OutputRelay() {
  if (source_ >= 0) ::close(source_);
}

void OutputRelay::poll_fds(std::vector<pollfd>& out) const {
  if (source_ >= 0 && pending_.size() < max_pending) out.push_back({source_, POLLIN, 0});
  // Only with something to write: as a pipeline's writer meets SIGPIPE at its next write,
  // not when the reader leaves, a job that says nothing more is not stopped for it.
  if (!closed_ && !pending_.empty()) out.push_back({sink_, POLLOUT, 0});
}

bool OutputRelay::read_source() {
  char buf[65536];
  // Bounded, so that a flood of output does not keep the loop from the job's events.
  for (int reads = 0; source_ >= 0 && reads < 16; ++reads) {
    if (!closed_ && pending_.size() >= max_pending) return true;
    const ssize_t n = ::read(source_, buf, sizeof buf);
    if (n > 0) {
      if (!closed_) pending_.append(buf, static_cast<size_t>(n));  // once closed: to nowhere
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    ::close(source_);  // end of file
    source_ = -1;
  }
  return true;
}

bool OutputRelay::write_sink() {
  while (!pending_.empty()) {
    pollfd p{sink_, POLLOUT, 0};
    if (::poll(&p, 1, 0) <= 0) return true;  // no room now
    if (p.revents & (POLLERR | POLLHUP)) return false;
    ssize_t n = 0;
    if (sink_is_socket_) {
      n = ::send(sink_, pending_.data(), pending_.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    } else {
      // With room in the pipe, a write of at most PIPE_BUF bytes does not block.
      n = ::write(sink_, pending_.data(), std::min<size_t>(pending_.size(), PIPE_BUF));
    }
    if (n > 0) {
      pending_.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n < 0 && errno != EPIPE && errno != ECONNRESET) error_ = errno;  // ENOSPC, EIO, ...
    return false;
  }
  return true;
}

bool OutputRelay::service() {
  if (closed_) {
    read_source();
    return false;
  }
  read_source();
  if (write_sink()) return false;
  closed_ = true;
  pending_.clear();
  read_source();
  return true;
}

bool OutputRelay::finish(std::chrono::steady_clock::time_point deadline, int stop_fd,
                         const std::function<bool()>& stop) {
  using Clock = std::chrono::steady_clock;
  bool found_closed = false;
  while (source_ >= 0 || (!pending_.empty() && !closed_)) {
    std::vector<pollfd> fds;
    poll_fds(fds);
    // The source is read until the deadline; a slow reader that still reads is waited for
    // without one, unless there is no stop to wait for it with.
    const bool bounded = source_ >= 0 || stop_fd < 0;
    if (bounded && Clock::now() >= deadline) break;
    int wait_ms = -1;
    if (bounded) {
      wait_ms = static_cast<int>(
          std::max<long long>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
    }
    if (stop_fd >= 0) fds.push_back({stop_fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) break;
    if (stop_fd >= 0 && (fds.back().revents & POLLIN) && stop && stop()) break;  // the rest is dropped
    if (service()) found_closed = true;
    if (source_ < 0 && closed_) break;
  }
  if (source_ >= 0) {
    ::close(source_);
    source_ = -1;
  }
  pending_.clear();
  return found_closed;
}

}  // namespace tnt::launcher
