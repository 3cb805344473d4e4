#include "report.hpp"

#include "text.hpp"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <csignal>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
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
    {RankReport::Kind::continued, false, "continued"}, {RankReport::Kind::joining, false, "joining"},
    {RankReport::Kind::joined, false, "joined"},       {RankReport::Kind::finalizing, false, "finalizing"},
    {RankReport::Kind::stop_requested, false, "stop_requested"},
    {RankReport::Kind::ps_begin, false, "ps_begin"},   {RankReport::Kind::ps_end, false, "ps_end"},
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

// Sends `line` on the connected socket `fd` and with `wait_until_read` waits for the
// launcher to close the connection (its sign that the line has been read).
bool send_line(int fd, const std::string& line, Clock::time_point deadline, bool wait_until_read) {
  // One short line always fits a fresh send buffer.
  if (::send(fd, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) return false;
  ::shutdown(fd, SHUT_WR);
  if (wait_until_read) read_line(fd, deadline);  // returns at EOF: the launcher has read the report
  return true;
}

// This host's IPv4 addresses other than loopback, of interfaces that are up, as text.
std::vector<std::string> own_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr && out.size() < 16; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_UP) == 0 || (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text) == nullptr) {
      continue;
    }
    if (std::find(out.begin(), out.end(), text) == out.end()) out.emplace_back(text);
  }
  ::freeifaddrs(list);
  return out;
}

}  // namespace

std::string random_run_id() {
  return fmt::format("{}-{}", static_cast<long long>(::time(nullptr)), random_token());
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

std::string describe_status(const RankReport& r) {
  if (!r.signaled) return fmt::format("exit code {}", r.code);
  const char* abbrev = ::sigabbrev_np(r.code);
  return abbrev != nullptr ? fmt::format("signal {} (SIG{})", r.code, abbrev) : fmt::format("signal {}", r.code);
}

std::string failure_hint(const RankReport& r) {
  if (!r.signaled || r.code != SIGKILL) return {};
  // Nothing in the job sends a first SIGKILL: torchrun's and Horovod's users meet it as
  // "exit -9" with no culprit.
  return fmt::format("tarantella: a SIGKILL that the job did not send is most often the kernel's out-of-memory "
                     "killer: dmesg on host {} says so (\"Out of memory: Killed process\"), or the job's memory limit "
                     "(SLURM's --mem, a container's) was reached; a smaller batch, or fewer ranks a host, needs less\n",
                     r.host);
}

int shell_status(const RankReport& r) {
  if (r.signaled) return 128 + r.code;
  return r.code != 0 ? r.code : 1;
}

std::string describe_lost(const LostRank& l) {
  if (l.kind == LostRank::Kind::lost) {
    return "lost (its per-rank step vanished without reporting an end: the host or its Open MPI daemon died, or "
           "the step was killed)";
  }
  return fmt::format("unreachable (no heartbeat for {:.0f} s: the host is down or cut off from the launcher's)",
                     l.silent_s);
}

std::optional<LauncherAddress> parse_launcher_address(const std::string& text) {
  // HOSTS:PORT:TOKEN[:HEARTBEAT_MS], where the hosts may not contain ':' (no IPv6 literals).
  auto parts = split(text, ':');
  if (parts.size() != 3 && parts.size() != 4) return std::nullopt;
  LauncherAddress a;
  for (auto h : split(parts[0], ',')) {
    if (!h.empty()) a.hosts.emplace_back(h);
  }
  a.port = std::string(parts[1]);
  a.token = std::string(parts[2]);
  if (a.hosts.empty() || a.port.empty() || a.token.empty()) return std::nullopt;
  if (parts.size() == 4) {
    auto ms = parse_unsigned(parts[3]);
    if (!ms) return std::nullopt;
    a.heartbeat_s = static_cast<double>(*ms) / 1000.0;
  }
  return a;
}

int connect_to_launcher(const LauncherAddress& address, const std::string& this_host, Clock::time_point deadline) {
  // The launcher's own host is reached over loopback without a name lookup (which would
  // load the resolver's libraries into every step). The listening socket accepts IPv4
  // and, where IPv6 exists, v4-mapped addresses, so 127.0.0.1 always works; ::1 is for a
  // host whose IPv6 socket does not take v4-mapped connections.
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  std::vector<addrinfo*> lists;  // each from one getaddrinfo, freed alike
  if (address.hosts.front() == this_host) {
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    for (const char* loopback : {"127.0.0.1", "::1"}) {
      addrinfo* res = nullptr;
      if (::getaddrinfo(loopback, address.port.c_str(), &hints, &res) == 0) lists.push_back(res);
    }
  } else {
    for (const std::string& host : address.hosts) {
      addrinfo* res = nullptr;
      if (::getaddrinfo(host.c_str(), address.port.c_str(), &hints, &res) == 0) lists.push_back(res);
    }
  }
  // Every address at once; the first connection made wins. An address this host cannot
  // route to fails at once; one that swallows the connection costs no more than the deadline.
  std::vector<int> fds;
  for (addrinfo* list : lists) {
    for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
      int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
        ::close(fd);
        continue;
      }
      fds.push_back(fd);
    }
  }
  for (addrinfo* res : lists) ::freeaddrinfo(res);
  int winner = -1;
  while (winner < 0) {
    std::vector<pollfd> polled;
    for (int fd : fds) {
      if (fd >= 0) polled.push_back({fd, POLLOUT, 0});
    }
    if (polled.empty()) break;
    const int ready = ::poll(polled.data(), polled.size(), remaining_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    for (const pollfd& p : polled) {
      if (p.revents == 0) continue;
      int err = 0;
      socklen_t len = sizeof err;
      const bool ok = ::getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
      auto it = std::find(fds.begin(), fds.end(), p.fd);
      if (ok && winner < 0) {
        winner = p.fd;
      } else {
        ::close(p.fd);
      }
      *it = -1;
    }
  }
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
  if (winner >= 0) {
    const int flags = ::fcntl(winner, F_GETFL);
    ::fcntl(winner, F_SETFL, flags & ~O_NONBLOCK);
  }
  return winner;
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

std::optional<ReportServer> ReportServer::open(const std::string& this_host, double heartbeat_s) {
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
  std::string hosts = this_host;
  for (const std::string& a : own_addresses()) hosts += "," + a;
  const auto heartbeat_ms = static_cast<unsigned long long>(std::max(0.0, heartbeat_s) * 1000.0 + 0.5);
  return ReportServer(fd, fmt::format("{}:{}:{}:{}", hosts, port, token, heartbeat_ms), token);
}

void ReportServer::accept_pending(std::vector<RankReport>& out, std::vector<LifelineHello>* lifelines) {
  while (true) {
    int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN: nothing queued
    }
    std::string line = read_line(c, Clock::now() + std::chrono::milliseconds(io_timeout_ms));
    if (starts_with(line, lifeline_protocol)) {
      std::istringstream in(line);
      std::string proto, tok;
      LifelineHello hello;
      const bool parsed = static_cast<bool>(in >> proto >> tok >> hello.rank >> hello.local_rank >> hello.host);
      if (lifelines && parsed && proto == lifeline_protocol && tok == token_) {
        ::fcntl(c, F_SETFL, ::fcntl(c, F_GETFL) | O_NONBLOCK);
        hello.fd = c;
        lifelines->push_back(std::move(hello));
        continue;
      }
    } else if (auto f = parse_report(line, token_)) {
      out.push_back(std::move(*f));
    }
    ::close(c);  // the sender's cue that the report has been read
  }
}

bool send_report(const std::string& address, const std::string& this_host, const RankReport& r,
                 bool wait_until_read) {
  auto parsed = parse_launcher_address(address);
  if (!parsed) return false;
  const std::string line = fmt::format("{} {} {} {} {} {} {}\n", protocol, parsed->token, r.rank, r.local_rank, r.host,
                                       kind_word(r), r.code);
  const auto deadline = Clock::now() + std::chrono::milliseconds(io_timeout_ms);
  const int fd = connect_to_launcher(*parsed, this_host, deadline);
  if (fd < 0) return false;
  const bool sent = send_line(fd, line, deadline, wait_until_read);
  ::close(fd);
  return sent;
}

}  // namespace tnt::launcher
