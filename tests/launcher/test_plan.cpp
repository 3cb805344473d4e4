#include "error.hpp"
#include "mpirun_command.hpp"
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

namespace {

Options total_of(int n, bool oversubscribe = false) {
  Options o = options_with();
  o.total_ranks = n;
  o.oversubscribe = oversubscribe;
  return o;
}

std::vector<std::pair<std::string, int>> per_host(const LaunchPlan& plan) {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& h : plan.hosts) out.emplace_back(h.name, h.ranks);
  return out;
}

using PerHost = std::vector<std::pair<std::string, int>>;

}  // namespace

TEST_CASE("plan: by-slot placement, the pure rule", "[plan][np]") {
  using V = std::vector<int>;
  CHECK(place_by_slot(6, {4, 2, 3}, false) == V{4, 2, 0});  // fills a host before the next
  CHECK(place_by_slot(3, {4, 2, 3}, false) == V{3, 0, 0});  // fewer than the first host's slots
  CHECK(place_by_slot(9, {4, 2, 3}, false) == V{4, 2, 3});  // all the slots
  CHECK(place_by_slot(5, {1, 3, 1}, false) == V{1, 3, 1});
  CHECK_FALSE(place_by_slot(10, {4, 2, 3}, false));       // more than the slots
  CHECK(place_by_slot(0, {4, 2}, false) == V{0, 0});
  // Oversubscribed: the 4 beyond the 9 slots spread evenly, the first hosts taking the remainder.
  CHECK(place_by_slot(13, {4, 2, 3}, true) == V{6, 3, 4});
  CHECK(place_by_slot(9, {4, 2, 3}, true) == V{4, 2, 3});  // not oversubscribed: the same as without
  CHECK(place_by_slot(7, {1}, true) == V{7});
  CHECK_FALSE(place_by_slot(1, {}, true));
}

TEST_CASE("plan: -np N over hosts with uneven slots", "[plan][np]") {
  const HostSelection hosts = hosts_of("a:4,b:2,c:3");
  SECTION("N below the first host's slots: all on the first, a warning names the idle hosts") {
    const LaunchPlan plan = make_plan(total_of(3), hosts, 0, nullptr, "x");
    CHECK(per_host(plan) == PerHost{{"a", 3}});
    REQUIRE(plan.ranks.size() == 3);
    CHECK(plan.ranks[2].local_rank == 2);
    CHECK(plan.ranks[2].local_size == 3);
    REQUIRE(plan.warnings.size() == 1);
    CHECK(plan.warnings[0] == "-np 3 fills the slots of 1 of the 3 hosts from -H; no rank on b, c");
  }
  SECTION("N across hosts: ranks, local ranks and local sizes follow each host's count") {
    const LaunchPlan plan = make_plan(total_of(7), hosts, 0, nullptr, "x");
    CHECK(per_host(plan) == PerHost{{"a", 4}, {"b", 2}, {"c", 1}});
    REQUIRE(plan.ranks.size() == 7);
    const char* host[] = {"a", "a", "a", "a", "b", "b", "c"};
    const int local[] = {0, 1, 2, 3, 0, 1, 0};
    const int local_size[] = {4, 4, 4, 4, 2, 2, 1};
    for (int r = 0; r < 7; ++r) {
      INFO("rank " << r);
      CHECK(plan.ranks[r].rank == r);
      CHECK(plan.ranks[r].host == host[r]);
      CHECK(plan.ranks[r].local_rank == local[r]);
      CHECK(plan.ranks[r].local_size == local_size[r]);
    }
    CHECK(plan.warnings.empty());
    const std::string table = format_plan(plan);
    CHECK_THAT(table, Catch::StartsWith("7 ranks on 3 hosts (hosts from -H); CPU ranks; not pinned\n"));
  }
  SECTION("N equal to all the slots") {
    const LaunchPlan plan = make_plan(total_of(9), hosts, 0, nullptr, "x");
    CHECK(per_host(plan) == PerHost{{"a", 4}, {"b", 2}, {"c", 3}});
    CHECK(plan.warnings.empty());
  }
  SECTION("N over all the slots: an error with the numbers, unless --oversubscribe") {
    CHECK_THROWS_WITH(make_plan(total_of(10), hosts, 0, nullptr, "x"),
                      "-np 10: more ranks than the 9 slots of the hosts from -H (a 4, b 2, c 3); give at most 9, or "
                      "--oversubscribe to spread the other 1 over the hosts as well");
    const LaunchPlan plan = make_plan(total_of(10, true), hosts, 0, nullptr, "x");
    CHECK(per_host(plan) == PerHost{{"a", 5}, {"b", 2}, {"c", 3}});
    CHECK(plan.ranks.at(4).local_size == 5);
  }
  SECTION("N = 0 is refused (the command line refuses it first)") {
    CHECK_THROWS_WITH(make_plan(total_of(0), hosts, 0, nullptr, "x"),
                      "-np 0: the number of ranks in all must be a positive integer");
  }
  SECTION("the flag as written names itself") {
    Options o = total_of(20);
    o.total_ranks_flag = "--np";
    CHECK_THROWS_WITH(make_plan(o, hosts, 0, nullptr, "x"), Catch::StartsWith("--np 20: more ranks than the 9 slots"));
  }
}

TEST_CASE("plan: -np N without hosts is N ranks on this machine", "[plan][np]") {
  const HostSelection here = select_hosts(options_with(), {});
  CHECK(here.this_machine);
  const LaunchPlan plan = make_plan(total_of(5), here, 0, nullptr, "vm");
  CHECK(per_host(plan) == PerHost{{"localhost", 5}});
  CHECK(plan.hosts[0].local);
  CHECK(plan.warnings.empty());
  // With GPUs the count decides as -n does: 2 ranks on a 4-GPU node are GPU ranks.
  const LaunchPlan gpu = make_plan(total_of(2), here, 4, nullptr, "vm");
  CHECK(gpu.device == DeviceKind::gpu);
  CHECK(gpu.ranks[1].device == "cuda:1");
  CHECK_FALSE(hosts_of("a").this_machine);
}

TEST_CASE("plan: -np N over hosts without slots counts the GPUs, else 1 per host", "[plan][np]") {
  CHECK(per_host(make_plan(total_of(3), hosts_of("a,b,c,d"), 0, nullptr, "x")) == PerHost{{"a", 1}, {"b", 1}, {"c", 1}});
  const LaunchPlan gpu = make_plan(total_of(6), hosts_of("a,b"), 4, nullptr, "x");
  CHECK(per_host(gpu) == PerHost{{"a", 4}, {"b", 2}});
  CHECK(gpu.device == DeviceKind::gpu);
  CHECK(gpu.ranks[5].device == "cuda:1");  // local rank 1 on b
  CHECK_THROWS_WITH(make_plan(total_of(9), hosts_of("a,b"), 4, nullptr, "x"),
                    Catch::StartsWith("-np 9: more ranks than the 8 slots of the hosts from -H (a 4, b 4)"));
}

TEST_CASE("plan: -np N in a SLURM allocation fills the allocation's tasks per node", "[plan][np]") {
  const Environment env{{"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NODELIST", "n[1-3]"}, {"SLURM_TASKS_PER_NODE", "2(x2),1"}};
  const HostSelection hosts = select_hosts(options_with(), env);
  CHECK_FALSE(hosts.this_machine);
  CHECK(per_host(make_plan(total_of(3), hosts, 0, nullptr, "x")) == PerHost{{"n1", 2}, {"n2", 1}});
  const LaunchPlan all = make_plan(total_of(5), hosts, 0, nullptr, "x");
  CHECK(per_host(all) == PerHost{{"n1", 2}, {"n2", 2}, {"n3", 1}});
  CHECK(all.warnings.empty());
  CHECK_THROWS_WITH(make_plan(total_of(8), hosts, 0, nullptr, "x"),
                    "-np 8: more ranks than the 5 slots of the hosts from SLURM job 42 (n1 2, n2 2, n3 1); give at "
                    "most 5, or --oversubscribe to spread the other 3 over the hosts as well");
  CHECK(per_host(make_plan(total_of(8, true), hosts, 0, nullptr, "x")) == PerHost{{"n1", 3}, {"n2", 3}, {"n3", 2}});
  CHECK_THAT(make_plan(total_of(1), hosts, 0, nullptr, "x").warnings.at(0),
             Catch::Contains("fills the slots of 1 of the 3 hosts from SLURM job 42; no rank on n2, n3"));
}

TEST_CASE("plan: pinning with different ranks per host binds each host by its own count", "[plan][np]") {
  auto topo = load_topology("pack:2 numa:1 core:8 pu:1");
  Options o = total_of(5);
  o.pin = PinMode::socket;
  const LaunchPlan plan = make_plan(o, hosts_of("a:4,b:4"), 0, &topo, "a");
  CHECK(per_host(plan) == PerHost{{"a", 4}, {"b", 1}});
  // Four ranks share a's two NUMA nodes (4 cores each); b's only rank has a whole node.
  CHECK(plan.ranks[3].binding->numa_node == 1);
  CHECK(plan.ranks[3].binding->cores == 4);
  CHECK(plan.ranks[4].binding->numa_node == 0);
  CHECK(plan.ranks[4].binding->cores == 8);
}

TEST_CASE("plan: the command gives mpirun each host's own count", "[plan][np]") {
  const LaunchPlan plan = make_plan(total_of(7), hosts_of("a:4,b:2,c:3"), 0, nullptr, "x");
  CommandSpec spec;
  spec.mpirun = "mpirun";
  spec.hosts = plan.hosts;
  spec.self = "tarantella";
  spec.step.program = {"p"};
  const std::string cmd = shell_join(mpirun_command(spec));
  CHECK_THAT(cmd, Catch::Contains("--host a,a,a,a,b,b,c -np 7 --map-by seq"));
}

TEST_CASE("plan: no host gets more ranks than its max_slots", "[plan][np]") {
  const std::string file = fmt::format("/tmp/tnt_plan_max_slots_{}", getpid());
  {
    std::ofstream out(file);
    out << "a slots=2 max_slots=3\nb slots=2 max_slots=2\n";
  }
  Options o = options_with();
  o.hostfile = file;
  const HostSelection hosts = select_hosts(o, {});
  std::remove(file.c_str());
  o.total_ranks = 5;  // the one extra rank goes to a: within both caps
  o.oversubscribe = true;
  CHECK(make_plan(o, hosts, 0, nullptr, "x").ranks.size() == 5);
  o.total_ranks = 6;  // the even spread gives b a third
  try {
    make_plan(o, hosts, 0, nullptr, "x");
    FAIL("6 ranks over max_slots 3 and 2");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Contains("host 'b'") && Catch::Contains("would get 3 ranks, more than its "
                                                                        "max_slots=2"));
  }
  o.total_ranks = 4;  // within the slots: no oversubscription
  CHECK(make_plan(o, hosts, 0, nullptr, "x").ranks.size() == 4);
  o.total_ranks.reset();
  o.oversubscribe = false;
  o.ranks_per_node = 3;  // -n beyond b's cap
  CHECK_THROWS_WITH(make_plan(o, hosts, 0, nullptr, "x"), Catch::Contains("host 'b'"));
}
