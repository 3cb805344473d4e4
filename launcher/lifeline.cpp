#include "lifeline.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tnt::launcher {

namespace {

// What travels on a lifeline after the step's hello: single bytes.
constexpr char heartbeat = '.';
constexpr char goodbye = 'F';  // step -> launcher: my end is reported, closing is no loss

std::chrono::milliseconds as_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0 + 0.5));
}

enum class Drained { open, closed };

// Reads everything available without blocking; `heard` is set when anything came, `bye`
// when the goodbye byte was among it.
Drained drain(int fd, bool& heard, bool* bye = nullptr) {
  char buf[256];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      heard = true;
      if (bye && std::find(buf, buf + n, goodbye) != buf + n) *bye = true;
      continue;
    }
    if (n == 0) return Drained::closed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Drained::open;
    return Drained::closed;  // ECONNRESET, ETIMEDOUT, ...
  }
}

bool send_byte(int fd, char c) {
  const ssize_t n = ::send(fd, &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  // A full send buffer is not a loss: the silence timeout decides that.
  return n == 1 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}

}  // namespace

std::chrono::milliseconds heartbeat_interval(double timeout_s) {
  return std::clamp(as_ms(timeout_s / 6.0), std::chrono::milliseconds(100), std::chrono::milliseconds(5000));
}

// ---- the launcher's side ------------------------------------------------------------------

Lifelines::Lifelines(double timeout_s) : timeout_s_(timeout_s), interval_(heartbeat_interval(timeout_s)) {}

Lifelines::~Lifelines() {
  for (Line& l : lines_) close_line(l);
}

void Lifelines::close_line(Line& line) {
  if (line.fd >= 0) ::close(line.fd);
  line.fd = -1;
}

void Lifelines::adopt(const LifelineHello& hello, LifelineClock::time_point now) {
  Line l;
  l.fd = hello.fd;
  l.rank = hello.rank;
  l.local_rank = hello.local_rank;
  l.host = hello.host;
  l.last_heard = now;
  lines_.push_back(std::move(l));
  // The newcomer hears from the launcher at once: its own clock starts now too.
  send_byte(hello.fd, heartbeat);
  if (next_beat_ == LifelineClock::time_point{}) next_beat_ = now + interval_;
}

void Lifelines::poll_fds(std::vector<int>& out) const {
  for (const Line& l : lines_) {
    if (l.fd >= 0) out.push_back(l.fd);
  }
}

LifelineClock::time_point Lifelines::next_wake() const {
  LifelineClock::time_point next = LifelineClock::time_point::max();
  const auto timeout = std::chrono::duration_cast<LifelineClock::duration>(as_ms(timeout_s_));
  bool any = false;
  for (const Line& l : lines_) {
    if (l.fd < 0) continue;
    any = true;
    next = std::min(next, l.last_heard + timeout);
  }
  if (any) next = std::min(next, next_beat_);
  return next;
}

std::vector<LostRank> Lifelines::service(LifelineClock::time_point now) {
  std::vector<LostRank> found;
  if (last_service_ != LifelineClock::time_point{} && now - last_service_ > 3 * interval_) {
    for (Line& l : lines_) l.last_heard = std::max(l.last_heard, now);  // the silence was ours
  }
  last_service_ = now;
  const bool beat = now >= next_beat_;
  if (beat) next_beat_ = now + interval_;
  const auto timeout = std::chrono::duration_cast<LifelineClock::duration>(as_ms(timeout_s_));
  for (Line& l : lines_) {
    if (l.fd < 0) continue;
    bool heard = false;
    const Drained d = drain(l.fd, heard, &l.farewell);
    if (heard) l.last_heard = now;
    if (l.farewell) {
      // Reported and done: close our side, which is the step's cue that it may go.
      close_line(l);
      continue;
    }
    if (d == Drained::closed || (beat && !send_byte(l.fd, heartbeat))) {
      found.push_back({l.rank, l.local_rank, l.host, LostRank::Kind::lost, 0});
      close_line(l);
      continue;
    }
    if (now - l.last_heard >= timeout) {
      const double silent = std::chrono::duration<double>(now - l.last_heard).count();
      found.push_back({l.rank, l.local_rank, l.host, LostRank::Kind::unreachable, silent});
      close_line(l);
    }
  }
  lines_.erase(std::remove_if(lines_.begin(), lines_.end(), [](const Line& l) { return l.fd < 0; }), lines_.end());
  // Found at the same moment: in rank order.
  std::sort(found.begin(), found.end(), [](const LostRank& a, const LostRank& b) { return a.rank < b.rank; });
  return found;
}

// ---- the step's side ----------------------------------------------------------------------

LifelineClient::LifelineClient(const std::string& address, const std::string& this_host, int rank, int local_rank) {
  auto parsed = parse_launcher_address(address);
  if (!parsed || parsed->heartbeat_s <= 0) return;
  timeout_s_ = parsed->heartbeat_s;
  interval_ = heartbeat_interval(timeout_s_);
  const auto now = LifelineClock::now();
  const int fd = connect_to_launcher(*parsed, this_host, now + std::chrono::seconds(3));
  if (fd < 0) return;
  const std::string hello =
      fmt::format("{} {} {} {} {}\n", lifeline_protocol, parsed->token, rank, local_rank, this_host);
  if (::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(hello.size())) {
    ::close(fd);
    return;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  fd_ = fd;
  state_ = State::alive;
  last_heard_ = now;
  next_beat_ = now + interval_;
}

LifelineClient::~LifelineClient() {
  if (fd_ >= 0) ::close(fd_);
}

LifelineClient::State LifelineClient::service(LifelineClock::time_point now) {
  if (state_ != State::alive) return state_;
  if (last_service_ != LifelineClock::time_point{} && now - last_service_ > 3 * interval_) {
    last_heard_ = std::max(last_heard_, now);  // this step was not running: the silence was ours
  }
  last_service_ = now;
  bool heard = false;
  if (drain(fd_, heard) == Drained::closed) {
    state_ = State::closed;
    return state_;
  }
  if (heard) last_heard_ = now;
  if (now - last_heard_ >= std::chrono::duration_cast<LifelineClock::duration>(as_ms(timeout_s_))) {
    state_ = State::unreachable;
    return state_;
  }
  if (now >= next_beat_) {
    next_beat_ = now + interval_;
    if (!send_byte(fd_, heartbeat)) state_ = State::closed;
  }
  return state_;
}

LifelineClient::State LifelineClient::await_word() {
  const auto asked = LifelineClock::now();
  while (state_ == State::alive) {
    const auto now = LifelineClock::now();
    const auto before = last_heard_;
    service(now);
    if (state_ == State::alive && last_heard_ > before && last_heard_ >= asked) break;  // heard: still there
    pollfd p{fd_, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::min<long long>(interval_.count(), 100)));
  }
  return state_;
}

void LifelineClient::farewell() {
  if (fd_ < 0) return;
  if (state_ == State::alive && send_byte(fd_, goodbye)) {
    ::shutdown(fd_, SHUT_WR);
    // Until the launcher closes its side (it has read the goodbye), reading whatever
    // heartbeats still come: a socket closed with unread data would reset the connection,
    // which can cost the launcher the goodbye byte. Bounded: the launcher answers at once.
    const auto deadline = LifelineClock::now() + std::chrono::milliseconds(1000);
    char buf[256];
    while (LifelineClock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - LifelineClock::now()).count();
      if (::poll(&p, 1, static_cast<int>(std::max<long long>(left, 0))) <= 0) break;
      const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
    }
  }
  ::close(fd_);
  fd_ = -1;
  state_ = State::none;
}

}  // namespace tnt::launcher
