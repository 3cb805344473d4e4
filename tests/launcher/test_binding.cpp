// Pinning plans for synthetic hwloc topologies: the same hwloc path as a real machine,
// with answers that can be written down.
#include "binding.hpp"
#include "error.hpp"
#include "topology.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

using namespace tnt::launcher;
using Cpus = std::vector<unsigned>;

namespace {

Cpus range(unsigned first, unsigned last) {
  Cpus c;
  for (unsigned i = first; i <= last; ++i) c.push_back(i);
  return c;
}

}  // namespace

TEST_CASE("topology: synthetic descriptions", "[topology]") {
  auto t = load_topology("pack:2 numa:1 core:8 pu:1");
  CHECK_FALSE(t.this_system);
  REQUIRE(t.domains.size() == 2);
  CHECK(t.domains[0].os_index == 0);
  CHECK(t.domains[1].os_index == 1);
  CHECK(t.domains[0].cores.size() == 8);
  CHECK(t.domains[1].cores[0] == Cpus{8});

  auto smt = load_topology("pack:1 numa:1 core:2 pu:2");
  REQUIRE(smt.domains.size() == 1);
  CHECK(smt.domains[0].cores == std::vector<Cpus>{{0, 1}, {2, 3}});

  auto no_cores = load_topology("pack:2 pu:3");  // no core level: each PU counts as a core
  REQUIRE(no_cores.domains.size() == 1);  // one NUMA node for the machine
  CHECK(no_cores.domains[0].cores.size() == 6);

  CHECK_THROWS_WITH(load_topology("no such thing"), Catch::Contains("not a synthetic description"));
  CHECK_THROWS_AS(load_topology("/etc/hostname"), InputError);  // exists, not XML
}

TEST_CASE("topology: a file that is not a regular one is refused, naming it", "[topology]") {
  // hwloc reads a topology file to its end: /dev/zero never ends, and a FIFO without a
  // writer blocks for good. Neither may be read.
  char dir_template[] = "/tmp/tnt_topology_XXXXXX";
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template, fifo = dir + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(load_topology("/dev/zero"),
                    "topology file '/dev/zero' is not a regular file (a character device): give an hwloc XML file "
                    "(lstopo FILE.xml) or a synthetic description");
  CHECK_THROWS_WITH(load_topology(fifo), Catch::Contains("topology file '" + fifo + "' is not a regular file (a FIFO)"));
  CHECK_THROWS_WITH(load_topology(dir), Catch::Contains("topology file '" + dir + "' is not a regular file (a directory)"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  std::remove(fifo.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("topology: this machine", "[topology]") {
  auto t = load_topology();
  CHECK(t.this_system);
  CHECK_FALSE(t.domains.empty());
  for (const auto& d : t.domains) CHECK_FALSE(d.cores.empty());
}

TEST_CASE("binding: one rank per NUMA node gets all its cores", "[binding]") {
  auto t = load_topology("pack:2 numa:1 core:8 pu:1");
  auto b = plan_node_bindings(t, 2);
  CHECK(b.warnings.empty());
  REQUIRE(b.ranks.size() == 2);
  CHECK(b.ranks[0].numa_node == 0);
  CHECK(b.ranks[0].cpus == range(0, 7));
  CHECK(b.ranks[0].cores == 8);
  CHECK(b.ranks[1].numa_node == 1);
  CHECK(b.ranks[1].cpus == range(8, 15));

  auto one = plan_node_bindings(t, 1);
  CHECK(one.ranks.at(0).cpus == range(0, 7));
}

TEST_CASE("binding: ranks sharing a NUMA node get disjoint cores", "[binding]") {
  auto t = load_topology("pack:2 numa:1 core:8 pu:1");
  auto b = plan_node_bindings(t, 4);
  REQUIRE(b.warnings.size() == 1);
  CHECK_THAT(b.warnings[0], Catch::Contains("4 ranks per node on 2 NUMA nodes"));
  // Round robin over nodes: ranks 0 and 2 on node 0, ranks 1 and 3 on node 1.
  CHECK(b.ranks[0].numa_node == 0);
  CHECK(b.ranks[0].cpus == range(0, 3));
  CHECK(b.ranks[1].numa_node == 1);
  CHECK(b.ranks[1].cpus == range(8, 11));
  CHECK(b.ranks[2].numa_node == 0);
  CHECK(b.ranks[2].cpus == range(4, 7));
  CHECK(b.ranks[3].cpus == range(12, 15));
  for (const auto& r : b.ranks) CHECK(r.cores == 4);

  auto uneven = plan_node_bindings(load_topology("pack:1 numa:1 core:8 pu:1"), 3);
  CHECK(uneven.ranks[0].cpus == range(0, 2));
  CHECK(uneven.ranks[1].cpus == range(3, 5));
  CHECK(uneven.ranks[2].cpus == range(6, 7));
  CHECK(uneven.ranks[2].cores == 2);
}

TEST_CASE("binding: this machine's shape, 2 ranks on 2 cores", "[binding]") {
  auto b = plan_node_bindings(load_topology("pack:1 numa:1 core:2 pu:1"), 2);
  CHECK(b.ranks[0].cpus == Cpus{0});
  CHECK(b.ranks[1].cpus == Cpus{1});
  CHECK(b.ranks[0].numa_node == 0);
  CHECK(b.ranks[1].numa_node == 0);
  CHECK(b.warnings.size() == 1);
}

TEST_CASE("binding: hyperthreads stay with their core", "[binding]") {
  auto b = plan_node_bindings(load_topology("pack:2 numa:1 core:2 pu:2"), 4);
  CHECK(b.ranks[0].cpus == Cpus{0, 1});
  CHECK(b.ranks[1].cpus == Cpus{4, 5});
  CHECK(b.ranks[2].cpus == Cpus{2, 3});
  CHECK(b.ranks[3].cpus == Cpus{6, 7});
  CHECK(b.ranks[0].cores == 1);
}

TEST_CASE("binding: more ranks than cores share cores, with a warning", "[binding]") {
  auto b = plan_node_bindings(load_topology("pack:1 numa:1 core:2 pu:1"), 3);
  REQUIRE(b.ranks.size() == 3);
  CHECK(b.ranks[0].cpus == Cpus{0});
  CHECK(b.ranks[1].cpus == Cpus{1});
  CHECK(b.ranks[2].cpus == Cpus{0});
  REQUIRE(b.warnings.size() == 2);
  CHECK_THAT(b.warnings[1], Catch::Contains("share a core"));
}

TEST_CASE("binding: cpu lists", "[binding]") {
  CHECK(format_cpu_list({}) == "");
  CHECK(format_cpu_list({3}) == "3");
  CHECK(format_cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
  CHECK_THROWS_AS(plan_node_bindings(NodeTopology{{}, true, "empty"}, 2), InputError);
}
