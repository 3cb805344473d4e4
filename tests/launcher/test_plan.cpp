#include "error.hpp"
#include "plan.hpp"
#include "shell_words.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <unistd.h>

using namespace tnt::launcher;

namespace {

Options options_with(std::optional<int> n = std::nullopt) {
  Options o;
  o.ranks_per_node = n;
  o.program = {"p"};
  return o;
}

HostSelection hosts_of(const std::string& list) {
  Options o = options_with();
  o.hosts = list;
  return select_hosts(o, {});
}

}  // namespace

TEST_CASE("plan: ranks fill a host before the next; rank 0 on the first", "[plan]") {
  auto plan = make_plan(options_with(), hosts_of("a,b:3,c:2"), 0, nullptr, "a");
  REQUIRE(plan.hosts.size() == 3);
  CHECK(plan.hosts[0].ranks == 1);  // no slots, no GPU: 1 CPU rank
  CHECK(plan.hosts[1].ranks == 3);
  CHECK(plan.hosts[2].ranks == 2);
  REQUIRE(plan.ranks.size() == 6);
  const char* hosts[] = {"a", "b", "b", "b", "c", "c"};
  const int locals[] = {0, 0, 1, 2, 0, 1};
  for (int r = 0; r < 6; ++r) {
    INFO("rank " << r);
    CHECK(plan.ranks[r].rank == r);
    CHECK(plan.ranks[r].host == hosts[r]);
    CHECK(plan.ranks[r].local_rank == locals[r]);
    CHECK(plan.ranks[r].device == "cpu");
    CHECK_FALSE(plan.ranks[r].binding);
  }
  CHECK(plan.ranks[3].local_size == 3);
  CHECK(plan.hosts[0].local);
  CHECK_FALSE(plan.hosts[1].local);
}

TEST_CASE("plan: -n beats slots, with a warning", "[plan]") {
  auto plan = make_plan(options_with(2), hosts_of("a,b:3"), 0, nullptr, "x");
  CHECK(plan.hosts[0].ranks == 2);
  CHECK(plan.hosts[1].ranks == 2);
  REQUIRE(plan.warnings.size() == 1);
  CHECK_THAT(plan.warnings[0], Catch::Contains("-n 2 overrides the slots"));
}

TEST_CASE("plan: the warning about slots names the flag the user wrote", "[plan]") {
  for (const char* flag : {"-n", "--n-per-node", "--devices-per-node"}) {
    const Options o = parse_command_line({flag, "3", "--", "prog"});
    auto plan = make_plan(o, hosts_of("a:2,b:2"), 0, nullptr, "x");
    REQUIRE(plan.warnings.size() == 1);
    CHECK(plan.warnings[0] == fmt::format("{} 3 overrides the slots given for the hosts", flag));
  }
  const Options eq = parse_command_line({"--devices-per-node=3", "--", "prog"});
  CHECK_THAT(make_plan(eq, hosts_of("a:2"), 0, nullptr, "x").warnings.at(0),
             Catch::StartsWith("--devices-per-node 3 overrides"));
}

TEST_CASE("plan: GPUs", "[plan]") {
  SECTION("default: one rank per GPU of this node") {
    auto plan = make_plan(options_with(), hosts_of("a,b"), 4, nullptr, "a");
    CHECK(plan.device == DeviceKind::gpu);
    REQUIRE(plan.ranks.size() == 8);
    CHECK(plan.ranks[0].device == "cuda:0");
    CHECK(plan.ranks[3].device == "cuda:3");
    CHECK(plan.ranks[4].device == "cuda:0");
    CHECK(plan.warnings.empty());
  }
  SECTION("fewer ranks than GPUs") {
    auto plan = make_plan(options_with(2), hosts_of("a"), 4, nullptr, "a");
    CHECK(plan.device == DeviceKind::gpu);
    CHECK(plan.ranks[1].device == "cuda:1");
  }
  SECTION("more ranks than GPUs: CPU ranks and a warning, as the original") {
    auto plan = make_plan(options_with(4), hosts_of("a"), 2, nullptr, "a");
    CHECK(plan.device == DeviceKind::cpu);
    CHECK(plan.ranks[3].device == "cpu");
    REQUIRE(plan.warnings.size() == 1);
    CHECK_THAT(plan.warnings[0], Catch::Contains("4 ranks per node but this node has 2 GPUs"));
  }
  SECTION("--no-gpu") {
    Options o = options_with(2);
    o.no_gpu = true;
    auto plan = make_plan(o, hosts_of("a"), 4, nullptr, "a");
    CHECK(plan.device == DeviceKind::cpu);
    CHECK(plan.warnings.empty());
    o.ranks_per_node.reset();
    CHECK(make_plan(o, hosts_of("a"), 4, nullptr, "a").hosts[0].ranks == 1);
  }
  SECTION("no GPU, no warning") {
    auto plan = make_plan(options_with(3), hosts_of("a"), 0, nullptr, "a");
    CHECK(plan.device == DeviceKind::cpu);
    CHECK(plan.warnings.empty());
  }
  CHECK(device_name(DeviceKind::gpu, 5, 4) == "cuda:1");
  CHECK(device_name(DeviceKind::cpu, 5, 4) == "cpu");
}

TEST_CASE("plan: pinning on a synthetic two-socket node", "[plan]") {
  auto topo = load_topology("pack:2 numa:1 core:8 pu:1");
  Options o = options_with(4);
  o.pin = PinMode::socket;
  auto plan = make_plan(o, hosts_of("a,b"), 0, &topo, "a");
  REQUIRE(plan.ranks.size() == 8);
  for (const auto& r : plan.ranks) REQUIRE(r.binding);
  CHECK(plan.ranks[0].binding->numa_node == 0);
  CHECK(plan.ranks[1].binding->numa_node == 1);
  CHECK(plan.ranks[5].binding->numa_node == 1);  // local rank 1 on host b
  CHECK(format_cpu_list(plan.ranks[6].binding->cpus) == "4-7");
  CHECK(plan.topology_source == "synthetic topology 'pack:2 numa:1 core:8 pu:1'");
  REQUIRE(plan.warnings.size() == 1);  // once, not once per host

  const std::string table = format_plan(plan);
  CHECK_THAT(table, Catch::Contains("8 ranks on 2 hosts (hosts from -H); CPU ranks; pinned to NUMA nodes, memory preferred"));
  CHECK_THAT(table, Catch::Contains("rank  host  local_rank  device  numa_node  cores"));
  CHECK_THAT(table, Catch::Contains("     6  b              2  cpu             0  4 (cpus 4-7)"));
  CHECK_THAT(table, Catch::Contains("each host applies the same rule"));

  o.pin = PinMode::socket_strict;
  CHECK_THAT(format_plan(make_plan(o, hosts_of("a"), 0, &topo, "a")), Catch::Contains("memory bound there"));
  CHECK_THROWS_AS(make_plan(o, hosts_of("a"), 0, nullptr, "a"), InputError);
}

TEST_CASE("plan: the unpinned table", "[plan]") {
  auto plan = make_plan(options_with(2), select_hosts(options_with(), {}), 0, nullptr, "vm");
  const std::string table = format_plan(plan);
  CHECK_THAT(table, Catch::StartsWith("2 ranks on 1 host (hosts from this machine); CPU ranks; not pinned\n"));
  CHECK_THAT(table, Catch::Contains("     1  localhost           1  cpu             -  all\n"));
}

TEST_CASE("plan: local hosts", "[plan]") {
  CHECK(is_local_host("localhost", "vm"));
  CHECK(is_local_host("vm", "vm"));
  CHECK(is_local_host("vm.cluster", "vm"));
  CHECK(is_local_host("vm", "vm.cluster"));
  CHECK_FALSE(is_local_host("vm2", "vm"));
}

// docs/coming-from.md maps other launchers' command lines to tarantella's: each row whose
// left side asks for a number of ranks (-np N, --nproc_per_node N on one machine), with
// hosts (-H a:2,b:2) or without, must plan that many ranks on those hosts.
TEST_CASE("plan: docs/coming-from.md's launcher mappings give the ranks they claim", "[plan][docs]") {
  std::ifstream doc(std::string(TNT_SOURCE_DIR) + "/docs/coming-from.md");
  REQUIRE(doc);
  const std::regex row(R"(^\| (.*) \| `tarantella ([^`]*)` \|$)");
  const std::regex total(R"((?:-np|--nproc_per_node) (\d+))");
  const std::regex host_list(R"( -H ([^ `]+))");
  int rows = 0;
  for (std::string line; std::getline(doc, line);) {
    std::smatch m, count, hosts;
    if (!std::regex_match(line, m, row)) continue;
    const std::string theirs = m[1], ours = m[2];
    if (!std::regex_search(theirs, count, total)) continue;
    INFO(line);
    ++rows;
    std::vector<std::string> args = split_shell_words(ours);
    const auto sep = std::find(args.begin(), args.end(), "--");
    REQUIRE(sep != args.end());
    args.erase(sep + 1, args.end());
    args.push_back("./train");
    Options o = parse_command_line(args);
    std::vector<std::string> named;  // the left side's hosts, in order
    if (std::regex_search(theirs, hosts, host_list)) {
      for (const auto& h : parse_host_list(hosts[1].str()).hosts) named.push_back(h.name);
    }
    // A hostfile in a mapping stands for the left side's hosts, one name per line.
    const std::string hostfile = "/tmp/tnt_coming_from_hosts." + std::to_string(::getpid());
    if (o.hostfile) {
      std::ofstream(hostfile) << fmt::format("{}\n", fmt::join(named, "\n"));
      o.hostfile = hostfile;
    }
    const LaunchPlan plan = make_plan(o, select_hosts(o, {}), 0, nullptr, "here");
    CHECK(plan.ranks.size() == std::stoul(count[1]));
    std::vector<std::string> planned;
    for (const auto& h : plan.hosts) planned.push_back(h.name);
    std::remove(hostfile.c_str());
    if (!named.empty()) {
      CHECK(planned == named);
    } else {
      CHECK(planned.size() == 1);
      CHECK(plan.hosts.at(0).local);
    }
  }
  CHECK(rows >= 3);
}
