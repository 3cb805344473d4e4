#include "report.hpp"

#include "text.hpp"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sstream>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tnt::launcher {

namespace {

constexpr const char* protocol = "tnt-report-2";
constexpr int io_timeout_ms = 2000;

using Clock = std::chrono::steady_clock;

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

// Reads until '\n' or EOF, at most `limit` bytes, giving up at the deadline.
std::string read_line(int fd, Clock::time_point deadline, size_t limit = 512) {
  std::string line;
  char c = 0;
  while (line.size() < limit) {
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, remaining_ms(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == '\n') break;
    line += c;
  }
  return line;
}

constexpr struct {
  RankReport::Kind kind;
  bool signaled;
  const char* word;
} kinds[] = {
    {RankReport::Kind::ended, false, "exit"},          {RankReport::Kind::ended, true, "signal"},
    {RankReport::Kind::started, false, "started"},     {RankReport::Kind::stopped, false, "stopped"},
    {RankReport::Kind::continued, false, "continued"},
};

const char* kind_word(const RankReport& r) {
  for (const auto& k : kinds) {
    if (k.kind == r.kind && (k.kind != RankReport::Kind::ended || k.signaled == r.signaled)) return k.word;
  }
  return "exit";
}

std::optional<RankReport> parse_report(const std::string& line, const std::string& token) {
  std::istringstream in(line);
  std::string proto, tok, word;
  RankReport r;
  if (!(in >> proto >> tok >> r.rank >> r.local_rank >> r.host >> word >> r.code)) return std::nullopt;
  if (proto != protocol || tok != token) return std::nullopt;
  for (const auto& k : kinds) {
    if (word == k.word) {
      r.kind = k.kind;
      r.signaled = k.signaled;
      return r;
    }
  }
  return std::nullopt;
}

// getrandom(2) rather than std::random_device: the latter probes the CPU with cpuid,
// which costs a VM exit on virtual machines, and this runs at every launch.
std::string random_token() {
  std::uint64_t value = 0;
  if (::getrandom(&value, sizeof value, 0) != static_cast<ssize_t>(sizeof value)) {
    value = static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()) ^ static_cast<std::uint64_t>(::getpid());
  }
  return fmt::format("{:016x}", value);
}

// Connects to `ai`, sends `line`, and with `wait_until_read` waits for the launcher to
// close the connection (its sign that the line has been read).
bool send_line(const addrinfo& ai, const std::string& line, Clock::time_point deadline, bool wait_until_read) {
  int fd = ::socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai.ai_protocol);
  if (fd < 0) return false;
  int rc = ::connect(fd, ai.ai_addr, ai.ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    if (::poll(&p, 1, remaining_ms(deadline)) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
        err == 0) {
      rc = 0;
    }
  }
  bool sent = false;
  // The socket is non-blocking, but one short line always fits a fresh send buffer.
  if (rc == 0 && ::send(fd, line.data(), line.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(line.size())) {
    ::shutdown(fd, SHUT_WR);
    if (wait_until_read) read_line(fd, deadline);  // returns at EOF: the launcher has read the report
    sent = true;
  }
  ::close(fd);
  return sent;
}

}  // namespace

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

std::string describe_status(const RankReport& r) {
  if (!r.signaled) return fmt::format("exit code {}", r.code);
  const char* abbrev = ::sigabbrev_np(r.code);
  return abbrev != nullptr ? fmt::format("signal {} (SIG{})", r.code, abbrev) : fmt::format("signal {}", r.code);
}

int shell_status(const RankReport& r) {
  if (r.signaled) return 128 + r.code;
  return r.code != 0 ? r.code : 1;
}

ReportServer::ReportServer(int fd, std::string address, std::string token)
    : fd_(fd), address_(std::move(address)), token_(std::move(token)) {}

ReportServer::ReportServer(ReportServer&& other) noexcept
    : fd_(other.fd_), address_(std::move(other.address_)), token_(std::move(other.token_)) {
  other.fd_ = -1;
}

ReportServer::~ReportServer() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<ReportServer> ReportServer::open(const std::string& this_host) {
  // IPv6 with v4-mapped addresses accepts both families; plain IPv4 where IPv6 is off.
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd >= 0) {
    int off = 0;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return std::nullopt;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      return std::nullopt;
    }
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  // As many pending connections as the kernel allows (net.core.somaxconn): every rank
  // reports its start at about the same moment.
  if (::listen(fd, SOMAXCONN) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    ::close(fd);
    return std::nullopt;
  }
  const int port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                                : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  std::string token = random_token();
  return ReportServer(fd, fmt::format("{}:{}:{}", this_host, port, token), token);
}

void ReportServer::accept_pending(std::vector<RankReport>& out) {
  while (true) {
    int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN: nothing queued
    }
    std::string line = read_line(c, Clock::now() + std::chrono::milliseconds(io_timeout_ms));
    if (auto f = parse_report(line, token_)) out.push_back(std::move(*f));
    ::close(c);  // the sender's cue that the report has been read
  }
}

bool send_report(const std::string& address, const std::string& this_host, const RankReport& r,
                 bool wait_until_read) {
  // host:port:token, where the host may itself not contain ':' (IPv6 literals are not used).
  auto parts = split(address, ':');
  if (parts.size() != 3) return false;
  const std::string host(parts[0]), port(parts[1]), token(parts[2]);

  // The launcher's own host is reached over loopback without a name lookup (which would
  // load the resolver's libraries into every step). The listening socket accepts IPv4
  // and, where IPv6 exists, v4-mapped addresses, so 127.0.0.1 always works; ::1 is for a
  // host whose IPv6 socket does not take v4-mapped connections.
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  std::vector<addrinfo*> lists;  // each from one getaddrinfo, freed alike
  if (host == this_host) {
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    for (const char* loopback : {"127.0.0.1", "::1"}) {
      addrinfo* res = nullptr;
      if (::getaddrinfo(loopback, port.c_str(), &hints, &res) == 0) lists.push_back(res);
    }
  } else {
    addrinfo* res = nullptr;
    if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) == 0) lists.push_back(res);
  }

  const std::string line = fmt::format("{} {} {} {} {} {} {}\n", protocol, token, r.rank, r.local_rank, r.host,
                                       kind_word(r), r.code);
  const auto deadline = Clock::now() + std::chrono::milliseconds(io_timeout_ms);
  bool sent = false;
  for (addrinfo* list : lists) {
    for (addrinfo* ai = list; ai != nullptr && !sent; ai = ai->ai_next) {
      sent = send_line(*ai, line, deadline, wait_until_read);
    }
  }
  for (addrinfo* res : lists) ::freeaddrinfo(res);
  return sent;
}

}  // namespace tnt::launcher
