#include "comm/arrivals.hpp"

#include "tarantella/check.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <optional>

namespace tnt::detail {

namespace {

constexpr int kMaxAddrs = 8;
constexpr int kHostChars = 64;

// What each rank tells the others about its channel (exchanged with one MPI_Allgather).
struct ChannelRecord {
  uint32_t addrs[kMaxAddrs];  // IPv4, network order
  uint16_t port;              // 0: no channel
  uint8_t n_addrs;
  char host[kHostChars + 1];
};

std::string own_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

// This host's IPv4 addresses other than loopback, of interfaces that are up.
std::vector<uint32_t> own_addresses() {
  std::vector<uint32_t> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr && out.size() < kMaxAddrs; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_UP) == 0 || (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    const uint32_t addr = reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr;
    if (std::find(out.begin(), out.end(), addr) == out.end()) out.push_back(addr);
  }
  ::freeifaddrs(list);
  return out;
}

uint64_t random_token() {
  uint64_t value = 0;
  if (::getrandom(&value, sizeof value, 0) != static_cast<ssize_t>(sizeof value)) {
    value = static_cast<uint64_t>(Clock::now().time_since_epoch().count()) * 0x9e3779b97f4a7c15ull ^
            static_cast<uint64_t>(::getpid());
  }
  return value;
}

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(std::min<long long>(left, 60'000)) : 0;
}

// A position is at most kHistory lines of about a hundred characters; more is not ours.
constexpr size_t kMaxAnswer = 64 * 1024;

// On a nonblocking socket: the answer may be larger than one send takes.
void send_all(int fd, const std::string& data, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, remaining_ms(deadline)) > 0) continue;
    }
    return;
  }
}

}  // namespace

Arrivals::Arrivals(MPI_Comm comm) : slots_(new Slot[kSlots]) {
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);

  ChannelRecord mine{};
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 64) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      mine.port = ntohs(a.sin_port);
      listen_fd_ = fd;
    } else {
      ::close(fd);
    }
  }
  const std::vector<uint32_t> addrs = own_addresses();
  mine.n_addrs = static_cast<uint8_t>(addrs.size());
  std::copy(addrs.begin(), addrs.end(), mine.addrs);
  const std::string host = own_host_name();
  std::snprintf(mine.host, sizeof mine.host, "%s", host.c_str());

  // The same token on every rank: rank 0's.
  token_ = rank_ == 0 ? random_token() : 0;
  MPI_Bcast(&token_, 1, MPI_UINT64_T, 0, comm);
  std::vector<ChannelRecord> all(static_cast<size_t>(size_));
  if (MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm) != MPI_SUCCESS) {
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
    all.assign(all.size(), ChannelRecord{});
  }
  peers_.resize(all.size());
  for (size_t q = 0; q < all.size(); ++q) {
    Peer& p = peers_[q];
    all[q].host[kHostChars] = '\0';
    p.host = all[q].host;
    p.port = all[q].port;
    // Ranks that call themselves by this rank's host name are reached over loopback first
    // (they share its network); every rank also by the addresses it listed.
    if (p.host == host) p.addrs.push_back(htonl(INADDR_LOOPBACK));
    const int n = std::min<int>(all[q].n_addrs, kMaxAddrs);
    p.addrs.insert(p.addrs.end(), all[q].addrs, all[q].addrs + n);
    one_host_ = one_host_ && p.host == host;
  }
  if (listen_fd_ < 0) return;
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
    return;
  }
  server_ = std::thread([this] { serve(); });
}

Arrivals::~Arrivals() {
  if (server_.joinable()) {
    const uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
    server_.join();
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

int Arrivals::next_slot() {
  int s = next_slot_;
  next_slot_ = next_slot_ + 1 < kSlots ? next_slot_ + 1 : 1;
  return s;
}

void Arrivals::reset(int slot) {
  Slot& s = slots_[slot];
  std::lock_guard lock(s.mutex);
  s.entered = 0;
  s.done = 0;
  for (Entry& e : s.history) e.seq = 0;
}

void Arrivals::enter(int slot, int64_t seq, const OpDesc& op) {
  Slot& s = slots_[slot];
  std::lock_guard lock(s.mutex);
  s.entered = seq;
  s.history[seq % kHistory] = {seq, op};
}

void Arrivals::finish(int slot, int64_t seq) {
  Slot& s = slots_[slot];
  std::lock_guard lock(s.mutex);
  s.done = std::max(s.done, seq);
}

RankPosition Arrivals::local(int slot) const {
  Entry history[kHistory];
  RankPosition p;
  {
    const Slot& s = slots_[slot];
    std::lock_guard lock(s.mutex);
    p.entered = s.entered;
    p.done = s.done;
    std::copy(std::begin(s.history), std::end(s.history), history);
  }
  // Formatted outside the lock: the collective thread never waits for a message.
  p.answered = true;
  p.finished = finished_.load(std::memory_order_relaxed);
  for (int64_t seq = std::max<int64_t>(1, p.entered - kHistory + 1); seq <= p.entered; ++seq) {
    const Entry& e = history[seq % kHistory];
    if (e.seq == seq) p.recent.push_back({seq, e.op.key(), e.op.str()});
  }
  return p;
}

std::string Arrivals::answer(int slot) const { return encode(local(slot)); }

// The answering thread: one query per connection, "TOKEN SLOT\n" -> the position in
// encode()'s form, then the connection is closed. Queries come only from ranks that have
// waited past the grace period, so they are answered one after another; a client that
// sends nothing is given up after half a second.
void Arrivals::serve() {
  const std::string token = fmt::format("{:016x}", token_);
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) continue;
    const auto deadline = Clock::now() + std::chrono::milliseconds(500);
    std::string line;
    char buf[64];
    while (line.find('\n') == std::string::npos && line.size() < 64) {
      pollfd p{c, POLLIN, 0};
      if (::poll(&p, 1, remaining_ms(deadline)) <= 0) break;
      const ssize_t n = ::read(c, buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, static_cast<size_t>(n));
    }
    char got[17] = {};
    int slot = -1;
    if (std::sscanf(line.c_str(), "%16s %d", got, &slot) == 2 && token == got && slot >= 0 && slot < kSlots) {
      send_all(c, answer(slot), deadline);
      answered_.fetch_add(1, std::memory_order_relaxed);
    }
    ::close(c);
  }
}

std::vector<RankPosition> Arrivals::query(int slot, double budget_s) const {
  std::vector<RankPosition> out(static_cast<size_t>(size_));
  out[static_cast<size_t>(rank_)] = local(slot);
  if (!enabled()) return out;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(budget_s));
  const std::string request = fmt::format("{:016x} {}\n", token_, slot);

  // One attempt per (rank, address), all under way at once, the first answer per rank wins;
  // ranks are asked in waves so that a large job does not run out of file descriptors.
  struct Attempt {
    int fd = -1;
    int rank = 0;
    bool sent = false;
    std::string reply;
  };
  constexpr int kWave = 256;
  for (int first = 0; first < size_; first += kWave) {
    std::vector<Attempt> attempts;
    for (int q = first; q < std::min(size_, first + kWave); ++q) {
      const Peer& p = peers_[static_cast<size_t>(q)];
      if (q == rank_ || p.port == 0) continue;
      for (uint32_t addr : p.addrs) {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) continue;
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(p.port);
        a.sin_addr.s_addr = addr;
        if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
          ::close(fd);
          continue;
        }
        attempts.push_back({fd, q, false, {}});
      }
    }
    auto drop = [](Attempt& t) {
      if (t.fd >= 0) ::close(t.fd);
      t.fd = -1;
    };
    while (true) {
      std::vector<pollfd> fds;
      std::vector<size_t> which;
      for (size_t i = 0; i < attempts.size(); ++i) {
        Attempt& t = attempts[i];
        if (t.fd < 0) continue;
        if (out[static_cast<size_t>(t.rank)].answered) {  // answered on another address
          drop(t);
          continue;
        }
        fds.push_back({t.fd, static_cast<short>(t.sent ? POLLIN : POLLOUT), 0});
        which.push_back(i);
      }
      if (fds.empty()) break;
      const int ready = ::poll(fds.data(), fds.size(), remaining_ms(deadline));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) break;  // out of time: the rest did not answer
      for (size_t k = 0; k < fds.size(); ++k) {
        if (fds[k].revents == 0) continue;
        Attempt& t = attempts[which[k]];
        if (!t.sent) {
          int err = 0;
          socklen_t len = sizeof err;
          if (::getsockopt(t.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0 ||
              ::send(t.fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
            drop(t);
            continue;
          }
          t.sent = true;
          continue;
        }
        // The answer ends when the other side closes; a wrong token or another program at
        // that address closes without one (decode fails).
        char buf[4096];
        const ssize_t n = ::read(t.fd, buf, sizeof buf);
        if (n > 0 && t.reply.size() < kMaxAnswer) {
          t.reply.append(buf, static_cast<size_t>(n));
        } else if (n == 0) {
          decode(t.reply, out[static_cast<size_t>(t.rank)]);
          drop(t);
        } else if (n > 0 || !(errno == EAGAIN || errno == EINTR)) {
          drop(t);
        }
      }
    }
    for (Attempt& t : attempts) drop(t);
  }
  return out;
}


std::string OpDesc::str() const {
  std::string args;
  auto add = [&](const std::string& part) { args += (args.empty() ? "" : ", ") + part; };
  if (algo) add(algo);
  if (root >= 0) add(fmt::format("root {}", root));
  if (count >= 0) add(unit ? fmt::format("{} {}", count, unit) : fmt::format("{} x {}", count, dtype_name(dtype)));
  if (show_device) add(device.str());
  std::string out = args.empty() ? std::string(name) : fmt::format("{}({})", name, args);
  if (label) out += fmt::format(" in {}", label);
  return out;
}

std::string OpDesc::key() const {
  // The device's kind, not its index: each rank has its own GPU.
  return fmt::format("{}|{}|{}|{}|{}|{}|{}|{}", name, algo ? algo : "", root, count, dtype_name(dtype), unit ? unit : "",
                     show_device ? (device.is_cpu() ? "cpu" : "cuda") : "", label ? label : "");
}

}  // namespace tnt::detail
