// Host names looked up before a launch (host_names.hpp), with a stand-in resolver: no test
// here asks a real name server.
#include "error.hpp"
#include "host_names.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

using namespace tnt::launcher;
using namespace std::chrono_literals;

namespace {

HostSelection from_hostfile(const std::string& text) {
  HostList list = parse_hostfile(text, "hosts");
  return {"hostfile 'hosts'", list.hosts, {}, {}};
}

LaunchPlan plan_for(const HostSelection& hosts, const std::string& this_host = "here") {
  return make_plan(Options{}, hosts, 0, nullptr, this_host);
}

// Knows the names in `known`; says "not known" of names ending in .invalid; fails others.
NameResolver stand_in(std::vector<std::string> known, std::atomic<int>* asked = nullptr) {
  return [known, asked](const std::string& name) {
    if (asked) ++*asked;
    if (std::find(known.begin(), known.end(), name) != known.end()) return NameLookup{NameLookup::Result::found, ""};
    if (name.size() > 8 && name.substr(name.size() - 8) == ".invalid") {
      return NameLookup{NameLookup::Result::unknown, "Name or service not known"};
    }
    return NameLookup{NameLookup::Result::failed, "Temporary failure in name resolution"};
  };
}

std::string refusal(const HostSelection& hosts, const NameResolver& resolve) {
  try {
    check_host_names(hosts, plan_for(hosts), resolve, 2000ms);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("host names: an unknown host is refused, naming it and where it was listed", "[host_names]") {
  const auto hosts = from_hostfile("n1\nnosuchhost.invalid:1\n");
  CHECK(refusal(hosts, stand_in({"n1"})) ==
        "hostfile 'hosts', line 2: host 'nosuchhost.invalid' is not a known host name (Name or service not "
        "known); fix the name, or make it resolvable on this machine (DNS, /etc/hosts), or give --skip-host-lookup if "
        "only the launch agent knows it (an ssh alias, a container)");

  HostList list = parse_host_list("n1,a.invalid,b.invalid:2");
  const HostSelection h{"-H", list.hosts, {}, {}};
  const std::string both = refusal(h, stand_in({"n1"}));
  CHECK_THAT(both, Catch::StartsWith("2 hosts are not known host names:\n"));
  CHECK_THAT(both, Catch::Contains("\n  -H, item 2: host 'a.invalid' is not a known host name"));
  CHECK_THAT(both, Catch::Contains("\n  -H, item 3: host 'b.invalid' is not a known host name"));

  const HostSelection slurm{"SLURM job 42", {{"gone.invalid", std::nullopt, "SLURM_JOB_NODELIST"}}, {}, {}};
  CHECK_THAT(refusal(slurm, stand_in({})),
             Catch::StartsWith("SLURM job 42, SLURM_JOB_NODELIST: host 'gone.invalid' is not a known host name"));
}

TEST_CASE("host names: this machine is not looked up; known names pass", "[host_names]") {
  std::atomic<int> asked{0};
  const auto hosts = from_hostfile("localhost\nhere:2\nn1\n");
  CHECK(check_host_names(hosts, plan_for(hosts), stand_in({"n1"}, &asked), 2000ms).empty());
  CHECK(asked == 1);  // n1 only
}

TEST_CASE("host names: a resolver that fails or does not answer is only a warning, in bounded time",
          "[host_names]") {
  const auto hosts = from_hostfile("n1\nflaky\n");
  auto warnings = check_host_names(hosts, plan_for(hosts), stand_in({"n1"}), 2000ms);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0] == "hostfile 'hosts', line 2: host 'flaky' could not be looked up (Temporary failure in name "
                       "resolution); starting the job anyway");

  // A resolver that hangs: the check returns at its limit; the lookup ends in the background.
  auto slow = [](const std::string& name) {
    if (name == "slow") std::this_thread::sleep_for(1500ms);
    return NameLookup{NameLookup::Result::found, ""};
  };
  const auto two = from_hostfile("fast\nslow\n");
  const auto start = std::chrono::steady_clock::now();
  warnings = check_host_names(two, plan_for(two), slow, 200ms);
  CHECK(std::chrono::steady_clock::now() - start < 1000ms);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::StartsWith("no answer from the name resolver within 0 s for 1 host (slow)"));
  std::this_thread::sleep_for(1500ms);  // the stand-in's thread ends before the test does
}

TEST_CASE("host names: many hosts are looked up a few at a time", "[host_names]") {
  std::string text;
  std::vector<std::string> known;
  for (int i = 0; i < 100; ++i) {
    known.push_back("node" + std::to_string(i));
    text += known.back() + "\n";
  }
  text += "typo.invalid\n";
  std::atomic<int> asked{0};
  const auto hosts = from_hostfile(text);
  CHECK_THAT(refusal(hosts, stand_in(known, &asked)), Catch::StartsWith("hostfile 'hosts', line 101: host 'typo.invalid'"));
  CHECK(asked == 101);
}

TEST_CASE("host names: a host that -np leaves without a rank is not looked up", "[host_names][np]") {
  HostList list = parse_host_list("n1:2,n2:2,gone.invalid:2");
  const HostSelection hosts{"-H", list.hosts, {}, {}};
  Options o;
  o.total_ranks = 3;
  std::atomic<int> asked{0};
  const LaunchPlan plan = make_plan(o, hosts, 0, nullptr, "here");
  REQUIRE(plan.hosts.size() == 2);
  CHECK(check_host_names(hosts, plan, stand_in({"n1", "n2"}, &asked), 2000ms).empty());
  CHECK(asked == 2);
  o.total_ranks = 5;  // now gone.invalid has a rank, and is refused by its own line
  CHECK_THROWS_WITH(check_host_names(hosts, make_plan(o, hosts, 0, nullptr, "here"), stand_in({"n1", "n2"}), 2000ms),
                    Catch::StartsWith("-H, item 3: host 'gone.invalid' is not a known host name"));
}
