#include "error.hpp"
#include "hostfile.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

using namespace tnt::launcher;

namespace {

std::string error_of(const std::string& text, const std::string& name = "hosts") {
  try {
    parse_hostfile(text, name);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string list_error_of(const std::string& list) {
  try {
    parse_host_list(list);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("hostfile: the three forms, comments and blank lines", "[hostfile]") {
  const std::string text =
      "# cluster A\n"
      "\n"
      "node1\n"
      "node2 slots=4   # two sockets\n"
      "  node3:2\n"
      "\t\n"
      "node4.example.org\tslots=1\r\n"
      "#node5\n";
  auto list = parse_hostfile(text, "hosts");
  REQUIRE(list.hosts.size() == 4);
  CHECK(list.warnings.empty());
  CHECK(list.hosts[0].name == "node1");
  CHECK_FALSE(list.hosts[0].slots);
  CHECK(list.hosts[1].name == "node2");
  CHECK(list.hosts[1].slots == 4);
  CHECK(list.hosts[2].name == "node3");
  CHECK(list.hosts[2].slots == 2);
  CHECK(list.hosts[3].name == "node4.example.org");
  CHECK(list.hosts[3].slots == 1);
  CHECK(list.hosts[2].origin == "line 5");
}

TEST_CASE("hostfile: duplicates are merged with a warning", "[hostfile]") {
  auto list = parse_hostfile("a slots=2\nb\na:3\nb\n", "f");
  REQUIRE(list.hosts.size() == 2);
  CHECK(list.hosts[0].name == "a");
  CHECK(list.hosts[0].slots == 5);
  CHECK(list.hosts[1].name == "b");
  CHECK(list.hosts[1].slots == 2);  // neither line gave slots: each is one, as Open MPI counts
  REQUIRE(list.warnings.size() == 2);
  CHECK_THAT(list.warnings[0], Catch::Contains("hostfile 'f', line 3: host 'a' is already listed (line 1)") &&
                                   Catch::Contains("slots=5"));
  CHECK_THAT(list.warnings[1], Catch::Contains("line 4: host 'b'") && Catch::Contains("slots=2"));
}

TEST_CASE("hostfile: a line without slots counts as one slot when merged with one that has them", "[hostfile]") {
  // As Open MPI counts: `a:2` then `a` is 3 slots, in either order, and the entry keeps
  // its first place and its first line as its origin.
  for (const std::string text : {"a:2\nb\na\n", "a\nb\na slots=2\n"}) {
    INFO(text);
    auto list = parse_hostfile(text, "f");
    REQUIRE(list.hosts.size() == 2);
    CHECK(list.hosts[0].name == "a");
    CHECK(list.hosts[0].slots == 3);
    CHECK(list.hosts[0].origin == "line 1");
    CHECK(list.hosts[1].name == "b");
    REQUIRE(list.warnings.size() == 1);
    CHECK(list.warnings[0] == "hostfile 'f', line 3: host 'a' is already listed (line 1); merged into one entry "
                              "with slots=3");
  }
  auto three = parse_hostfile("a\na\na:4\n", "f");
  REQUIRE(three.hosts.size() == 1);
  CHECK(parse_hostfile("a\na\n", "f").hosts[0].slots == 2);  // no slots anywhere: a line each, as Open MPI
  CHECK_FALSE(parse_hostfile("a\nb\n", "f").hosts[0].slots);  // one line without slots: -n or the default decides
  CHECK(three.hosts[0].slots == 6);                             // 1 + 1 + 4 once any line gives slots
  CHECK(error_of("a:1000000\na\n", "f") == "hostfile 'f', line 2: host 'a' has more than 1000000 slots in all");
  CHECK(list_error_of("a:999999,a,a") == "-H, item 3: host 'a' has more than 1000000 slots in all");
}

TEST_CASE("hostfile: 100,000 lines parse in linear time", "[hostfile][slow]") {
  // Half the lines repeat a host named earlier, so both the new-host and the merge paths
  // are timed. Merging by scanning the list made 100,000 lines take 26 s (the time grew
  // with the square of the size); a look-up per line takes about 0.2 s. The bound, 5 s of
  // this thread's CPU time, is 25 times that and 5 times less than the quadratic code: CPU
  // time rather than the clock, so that other processes on a loaded machine cannot make
  // the test fail (a ratio of wall times of two sizes was tried and is too noisy: cache
  // misses of the host index alone make 4 times the lines cost 7 to 11 times as much).
  std::string text;
  for (int i = 0; i < 100'000; ++i) text += fmt::format("node{}:2\n", i % 2 == 0 ? i : 2 * (i / 4));
  auto cpu_seconds = [] {
    timespec t{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  };
  const double before = cpu_seconds();
  const HostList list = parse_hostfile(text, "big");
  const double spent = cpu_seconds() - before;
  INFO("100,000 lines: " << spent << " s of CPU time");
  CHECK(spent < 5.0);
  CHECK(list.hosts.size() == 50'000);
  CHECK(list.warnings.size() == 50'000);  // every odd line repeats an even one
  CHECK(list.hosts[1].name == "node2");   // the order of first appearance
  CHECK(list.hosts[0].slots == 2 * 3);    // node0 on lines 0, 1 and 3
}

TEST_CASE("hostfile: every error names the file and the line", "[hostfile]") {
  CHECK(error_of("a\nb slots=0\n") == "hostfile 'hosts', line 2: slots must be an integer from 1 to 1000000, got '0'");
  CHECK(error_of("a slots=abc") == "hostfile 'hosts', line 1: slots must be an integer from 1 to 1000000, got 'abc'");
  CHECK(error_of("\n\na slots=-1") == "hostfile 'hosts', line 3: slots must be an integer from 1 to 1000000, got '-1'");
  CHECK(error_of("a slots=") == "hostfile 'hosts', line 1: slots must be an integer from 1 to 1000000, got ''");
  CHECK(error_of("a slots=2.5") == "hostfile 'hosts', line 1: slots must be an integer from 1 to 1000000, got '2.5'");
  CHECK(error_of("a:") == "hostfile 'hosts', line 1: slots must be an integer from 1 to 1000000, got ''");
  CHECK(error_of("a:x") == "hostfile 'hosts', line 1: slots must be an integer from 1 to 1000000, got 'x'");
  CHECK(error_of("a:99999999999") == "hostfile 'hosts', line 1: slots must be an integer from 1 to 1000000, got '99999999999'");
  CHECK_THAT(error_of("a\n\nb maxslots=4"), Catch::StartsWith("hostfile 'hosts', line 3: unexpected 'maxslots=4'"));
  CHECK(error_of("a slots=4 max_slots=2") == "hostfile 'hosts', line 1: max_slots=2 is less than slots=4");
  CHECK(error_of("a max_slots=2 max-slots=3") == "hostfile 'hosts', line 1: max_slots given twice");
  CHECK(error_of("a max_slots=0") == "hostfile 'hosts', line 1: slots must be an integer from 1 to 1000000, got '0'");
  CHECK_THAT(error_of("a:2 slots=3"), Catch::StartsWith("hostfile 'hosts', line 1: slots given twice"));
  CHECK_THAT(error_of("a slots=2 slots=3"), Catch::StartsWith("hostfile 'hosts', line 1: slots given twice"));
  CHECK_THAT(error_of("no/pe"), Catch::StartsWith("hostfile 'hosts', line 1: 'no/pe' is not a host name"));
  CHECK_THAT(error_of("-n"), Catch::StartsWith("hostfile 'hosts', line 1: '-n' is not a host name"));
  CHECK(error_of("# only comments\n\n   \n") == "hostfile 'hosts' lists no hosts (only blank lines and comments)");
  CHECK(error_of("") == "hostfile 'hosts' lists no hosts (only blank lines and comments)");
}

TEST_CASE("hostfile: an IPv6 address is refused as such, naming the line", "[hostfile]") {
  const std::string refusal = "looks like an IPv6 address, which is not supported here: give the host's name";
  CHECK(error_of("a\n::1 slots=2\n") == "hostfile 'hosts', line 2: '::1' " + refusal + " (or an IPv4 address)");
  CHECK_THAT(error_of("fe80::1:2"), Catch::StartsWith("hostfile 'hosts', line 1: 'fe80::1:2' " + refusal));
  CHECK_THAT(error_of("[::1]:2"), Catch::StartsWith("hostfile 'hosts', line 1: '[::1]:2' " + refusal));
  CHECK_THAT(error_of("2001:db8::7 slots=1"), Catch::StartsWith("hostfile 'hosts', line 1: '2001:db8::7' " + refusal));
  // -H too; one colon stays "host:N".
  CHECK_THAT(list_error_of("a,::1"), Catch::StartsWith("-H a,::1: item 2: '::1' " + refusal));
  CHECK(parse_hostfile("10.0.0.1:2", "hosts").hosts.at(0).slots == 2);
}

TEST_CASE("hostfile: binary garbage is quoted as a short, escaped excerpt", "[hostfile]") {
  std::string garbage = "\x7f" "ELF\x02\x01\x01";
  garbage += std::string("\0\xff\x1b[2J", 6);
  garbage += std::string(5000, 'A');
  const std::string e = error_of(garbage);
  CHECK(e == "hostfile 'hosts', line 1: '\\x7fELF\\x02\\x01\\x01\\x00\\xff\\x1b[2J" + std::string(27, 'A') +
                 "...' is not a host name (letters, digits, '.', '-', '_')");
  // Nothing but printable ASCII reaches the terminal.
  for (char c : e) CHECK((c >= 0x20 && c < 0x7f));
  CHECK(error_of("node1 slots=\x01\x02") ==
        "hostfile 'hosts', line 1: slots must be an integer from 1 to 1000000, got '\\x01\\x02'");
  CHECK(error_of("node1 \x1b]0;title\x07") ==
        "hostfile 'hosts', line 1: unexpected '\\x1b]0;title\\x07' (a line is 'host', 'host slots=N' or 'host:N', "
        "and may end with max_slots=N)");
  CHECK(list_error_of("n1,\x01") == "-H n1,\\x01: item 2: '\\x01' is not a host name (letters, digits, '.', '-', '_')");
}

TEST_CASE("hostfile: reading files", "[hostfile]") {
  char dir_template[] = "/tmp/tnt_hostfile_XXXXXX";
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  const std::string good = dir + "/good", empty = dir + "/empty", missing = dir + "/missing";
  std::ofstream(good) << "n1 slots=2\nn2\n";
  std::ofstream(empty) << "# nothing\n";

  auto list = read_hostfile(good);
  CHECK(list.hosts.size() == 2);
  auto error_reading = [](const std::string& path) {
    try {
      read_hostfile(path);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK(error_reading(missing) == "cannot read hostfile '" + missing + "': No such file or directory");
  CHECK(error_reading(dir) == "hostfile '" + dir + "' is not a regular file (a directory): give a file that lists "
                              "the hosts");
  CHECK_THAT(error_reading(empty), Catch::Contains("lists no hosts"));
  // A device that never ends is refused, not read forever; a FIFO without a writer is
  // refused at once, not waited on.
  CHECK(error_reading("/dev/zero") == "hostfile '/dev/zero' is not a regular file (a character device): give a "
                                      "file that lists the hosts");
  const std::string fifo = dir + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(error_reading(fifo) == "hostfile '" + fifo + "' is not a regular file (a FIFO): give a file that lists "
                               "the hosts");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  std::remove(fifo.c_str());
  // A regular file past the size limit (sparse: no disk is used) is refused unread.
  const std::string huge = dir + "/huge";
  std::ofstream(huge).close();
  REQUIRE(::truncate(huge.c_str(), 17L * 1024 * 1024) == 0);
  CHECK(error_reading(huge) == "hostfile '" + huge + "' is larger than 16384 KiB: not a list of hosts");
  std::remove(huge.c_str());
  if (::geteuid() != 0) {  // root reads files regardless of their mode
    const std::string locked = dir + "/locked";
    std::ofstream(locked) << "n1\n";
    ::chmod(locked.c_str(), 0);
    CHECK_THAT(error_reading(locked), Catch::Contains("Permission denied"));
    std::remove(locked.c_str());
  }
  std::remove(good.c_str());
  std::remove(empty.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("hostfile: the loopback's names are one host, this machine", "[hostfile]") {
  // Before, `localhost` and `127.0.0.1` were two hosts: each got local rank 0 (the same GPU,
  // the same cores).
  auto list = parse_hostfile("localhost slots=2\nb\n127.0.0.1 slots=2\nip6-localhost\nlocalhost.localdomain\n", "f");
  REQUIRE(list.hosts.size() == 2);
  CHECK(list.hosts[0].name == "localhost");
  CHECK(list.hosts[0].slots == 6);
  CHECK(list.hosts[1].name == "b");
  REQUIRE(list.warnings.size() == 3);
  CHECK(list.warnings[0] == "hostfile 'f', line 3: host '127.0.0.1' is this machine's loopback, as 'localhost' is "
                            "(line 1); merged into one entry with slots=4");
  auto h = parse_host_list("127.0.0.1,127.0.1.1:3");
  REQUIRE(h.hosts.size() == 1);
  CHECK(h.hosts[0].slots == 4);
  // Names that only look alike stay apart.
  CHECK(parse_host_list("localhost2,127.0.0.1x,localhost").hosts.size() == 3);
}

TEST_CASE("hostfile: the -H list", "[hostfile]") {
  auto list = parse_host_list("h1,h2:4, h3 ,h1:2");
  REQUIRE(list.hosts.size() == 3);
  CHECK(list.hosts[0].name == "h1");
  CHECK(list.hosts[0].slots == 3);  // 1 (no slots) + 2, as Open MPI counts
  CHECK(list.hosts[1].slots == 4);
  CHECK(list.hosts[2].name == "h3");
  REQUIRE(list.warnings.size() == 1);
  CHECK_THAT(list.warnings[0], Catch::Contains("-H, item 4: host 'h1' is already listed (item 1)"));
  CHECK(list_error_of("h1,,h2") == "-H h1,,h2: item 2 is empty");
  CHECK(list_error_of("h1,h2:0") == "-H h1,h2:0: item 2: slots must be an integer from 1 to 1000000, got '0'");
  CHECK_THAT(list_error_of("h1 h2"), Catch::Contains("'h1 h2' is not a host name"));
}

TEST_CASE("hostfile: the examples in hostfiles/ parse", "[hostfile]") {
  const std::string dir = std::string(TNT_SOURCE_DIR) + "/hostfiles/";
  for (const char* name : {"two-nodes", "slots-form", "colon-form", "localhost"}) {
    INFO(name);
    HostList list;
    REQUIRE_NOTHROW(list = read_hostfile(dir + name));
    CHECK_FALSE(list.hosts.empty());
    CHECK(list.warnings.empty());
  }
  CHECK(read_hostfile(dir + "slots-form").hosts.at(2).slots == 2);
  CHECK(read_hostfile(dir + "colon-form").hosts.size() == 3);
}

TEST_CASE("hostfile: Open MPI's max_slots is read, and merged lines add their caps", "[hostfile]") {
  const HostList list = parse_hostfile("a slots=2 max_slots=4\nb max-slots=3\nc slots=2\na:1\n", "hosts");
  REQUIRE(list.hosts.size() == 3);
  CHECK(list.hosts[0].slots == 3);
  CHECK(list.hosts[0].max_slots == 5);  // 4, and the second line's one slot
  CHECK(list.hosts[1].max_slots == 3);
  CHECK_FALSE(list.hosts[1].slots);
  CHECK_FALSE(list.hosts[2].max_slots);
}
