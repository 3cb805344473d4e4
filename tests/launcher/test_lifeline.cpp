// Lifelines (lifeline.hpp) between a launcher and steps in this process, over loopback:
// the launcher's address, the parallel connect, hello and goodbye, and the three ways a
// lifeline ends (a goodbye, a close, silence). Silence is simulated by passing later times,
// so nothing here waits for a timeout.
#include "lifeline.hpp"
#include "report.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

using namespace tnt::launcher;
using namespace std::chrono_literals;

namespace {

// Accepts what is queued on the server until `want` lifelines have come (at most 5 s).
std::vector<LifelineHello> accept_lifelines(ReportServer& server, size_t want) {
  std::vector<LifelineHello> hellos;
  std::vector<RankReport> reports;
  for (int i = 0; i < 50 && hellos.size() < want; ++i) {
    pollfd p{server.fd(), POLLIN, 0};
    ::poll(&p, 1, 100);
    server.accept_pending(reports, &hellos);
  }
  return hellos;
}

// A port on loopback that refuses connections: bound, never listened on.
struct RefusingPort {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int port = 0;
  RefusingPort() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~RefusingPort() { ::close(fd); }
};

}  // namespace

TEST_CASE("lifeline: the launcher's address", "[lifeline]") {
  auto a = parse_launcher_address("login1,10.0.0.1,192.168.1.5:4711:abcdef:15000");
  REQUIRE(a);
  CHECK(a->hosts == std::vector<std::string>{"login1", "10.0.0.1", "192.168.1.5"});
  CHECK(a->port == "4711");
  CHECK(a->token == "abcdef");
  CHECK(a->heartbeat_s == 15.0);
  auto old = parse_launcher_address("node1:4711:abcdef");  // without lifelines
  REQUIRE(old);
  CHECK(old->hosts == std::vector<std::string>{"node1"});
  CHECK(old->heartbeat_s == 0);
  CHECK_FALSE(parse_launcher_address("garbage"));
  CHECK_FALSE(parse_launcher_address(":1:t"));
  CHECK_FALSE(parse_launcher_address("h:1:t:soon"));
  CHECK_FALSE(parse_launcher_address("h:1:t:1:extra"));
}

TEST_CASE("lifeline: heartbeats are a sixth of the timeout, within 0.1 to 5 s", "[lifeline]") {
  CHECK(heartbeat_interval(15) == 2500ms);
  CHECK(heartbeat_interval(0.3) == 100ms);
  CHECK(heartbeat_interval(600) == 5000ms);
}

TEST_CASE("lifeline: a step reaches the launcher by whichever address answers", "[lifeline]") {
  auto server = ReportServer::open("launcher-host", 15);
  REQUIRE(server);
  auto parsed = parse_launcher_address(server->address());
  REQUIRE(parsed);
  CHECK(parsed->heartbeat_s == 15.0);
  // A step on another host than the launcher's tries the name and every address at once
  // (names from /etc/hosts only here: nothing may look up a name outside this machine).
  LauncherAddress a = *parsed;
  RefusingPort refusing;
  a.hosts = {"localhost", "127.0.0.1"};
  const auto t0 = std::chrono::steady_clock::now();
  const int fd = connect_to_launcher(a, "a-step-host", t0 + 2s);
  CHECK(fd >= 0);
  CHECK(std::chrono::steady_clock::now() - t0 < 1500ms);
  if (fd >= 0) ::close(fd);
  // Nothing answers: -1 by the deadline.
  LauncherAddress none = a;
  none.hosts = {"127.0.0.1"};
  none.port = std::to_string(refusing.port);
  CHECK(connect_to_launcher(none, "a-step-host", std::chrono::steady_clock::now() + 1s) == -1);
}

TEST_CASE("lifeline: goodbye, close and silence", "[lifeline]") {
  auto server = ReportServer::open("launcher-host", 6);
  REQUIRE(server);
  const std::string address = server->address();
  Lifelines lines(6);

  // Three steps on "other" hosts (they reach the launcher over its addresses, not by name).
  auto a = std::make_unique<LifelineClient>(address, "hostA", 0, 0);
  auto b = std::make_unique<LifelineClient>(address, "hostB", 1, 0);
  auto c = std::make_unique<LifelineClient>(address, "hostC", 2, 0);
  REQUIRE(a->connected());
  REQUIRE(b->connected());
  REQUIRE(c->connected());
  CHECK(a->timeout_s() == 6.0);
  const auto hellos = accept_lifelines(*server, 3);
  REQUIRE(hellos.size() == 3);
  auto now = std::chrono::steady_clock::now();
  for (const auto& h : hellos) lines.adopt(h, now);
  CHECK(hellos[0].host == "hostA");
  CHECK(hellos[1].rank == 1);
  std::vector<int> fds;
  lines.poll_fds(fds);
  CHECK(fds.size() == 3);
  CHECK(lines.next_wake() <= now + 6s);

  // Everybody hears everybody.
  CHECK(lines.service(now).empty());
  for (int i = 0; i < 20; ++i) {
    CHECK(a->service(now) == LifelineClient::State::alive);
    std::this_thread::sleep_for(10ms);
  }

  // a says goodbye (from a thread: it waits for the launcher to close its side).
  std::thread bye([&] { a->farewell(); });
  std::vector<LostRank> found;
  for (int i = 0; i < 100 && fds.size() == 3; ++i) {
    std::this_thread::sleep_for(10ms);
    auto f = lines.service(std::chrono::steady_clock::now());
    found.insert(found.end(), f.begin(), f.end());
    fds.clear();
    lines.poll_fds(fds);
  }
  bye.join();
  CHECK(found.empty());  // a goodbye is no loss
  CHECK(fds.size() == 2);

  // b's step dies: its connection closes without a goodbye.
  b.reset();
  for (int i = 0; i < 100 && found.empty(); ++i) {
    std::this_thread::sleep_for(10ms);
    auto f = lines.service(std::chrono::steady_clock::now());
    found.insert(found.end(), f.begin(), f.end());
  }
  REQUIRE(found.size() == 1);
  CHECK(found[0].rank == 1);
  CHECK(found[0].host == "hostB");
  CHECK(found[0].kind == LostRank::Kind::lost);
  CHECK_THAT(describe_lost(found[0]), Catch::StartsWith("lost (") && Catch::Contains("died"));

  // A gap in the launcher's own running (it was stopped) is not c's silence.
  now = std::chrono::steady_clock::now();
  CHECK(lines.service(now).empty());
  CHECK(lines.service(now + 20s).empty());
  // c goes quiet (no heartbeats from it): with the launcher running all along, it is
  // unreachable once the timeout has passed, and named once.
  found.clear();
  auto t = now + 20s;
  for (int i = 0; i < 20 && found.empty(); ++i) {
    t += 500ms;
    found = lines.service(t);
  }
  REQUIRE(found.size() == 1);
  CHECK(found[0].rank == 2);
  CHECK(found[0].kind == LostRank::Kind::unreachable);
  CHECK(found[0].silent_s >= 6.0);
  CHECK(found[0].silent_s < 7.0);
  CHECK_THAT(describe_lost(found[0]), Catch::StartsWith("unreachable (no heartbeat for 6 s"));
  CHECK(lines.service(t + 500ms).empty());
  // ... and c, whose lifeline the launcher closed, knows the launcher is gone.
  LifelineClient::State state = LifelineClient::State::alive;
  for (int i = 0; i < 100 && state == LifelineClient::State::alive; ++i) {
    std::this_thread::sleep_for(10ms);
    state = c->service(std::chrono::steady_clock::now());
  }
  CHECK(state == LifelineClient::State::closed);
}

TEST_CASE("lifeline: a step that hears nothing counts the launcher as unreachable", "[lifeline]") {
  auto server = ReportServer::open("launcher-host", 3);
  REQUIRE(server);
  LifelineClient step(server->address(), "hostA", 0, 0);
  REQUIRE(step.connected());
  const auto hellos = accept_lifelines(*server, 1);  // accepted, but never served
  REQUIRE(hellos.size() == 1);
  const auto now = std::chrono::steady_clock::now();
  CHECK(step.service(now) == LifelineClient::State::alive);
  // A gap in the step's own running is not the launcher's silence ...
  auto t = now + 10s;
  CHECK(step.service(t) == LifelineClient::State::alive);
  // ... but 3 s of silence while it runs is.
  for (int i = 0; i < 11; ++i) {
    t += 250ms;
    CHECK(step.service(t) == LifelineClient::State::alive);
  }
  t += 250ms;
  CHECK(step.service(t) == LifelineClient::State::unreachable);
  CHECK(step.service(t + 1s) == LifelineClient::State::unreachable);  // it stays so
  ::close(hellos[0].fd);

  // Lifelines off (heartbeat 0 in the address), or no address at all: no lifeline.
  auto quiet = ReportServer::open("launcher-host");
  REQUIRE(quiet);
  CHECK_FALSE(LifelineClient(quiet->address(), "hostA", 0, 0).connected());
  CHECK(LifelineClient("", "hostA", 0, 0).service(now) == LifelineClient::State::none);
}
