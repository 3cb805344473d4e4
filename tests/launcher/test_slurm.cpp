#include "error.hpp"
#include "plan.hpp"
#include "slurm.hpp"

#include <catch2/catch.hpp>

using namespace tnt::launcher;
using Names = std::vector<std::string>;

namespace {

std::string error_of(const std::string& list) {
  try {
    expand_nodelist(list);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("slurm: node list expansion", "[slurm]") {
  CHECK(expand_nodelist("node1") == Names{"node1"});
  CHECK(expand_nodelist("a,b,c") == Names{"a", "b", "c"});
  CHECK(expand_nodelist("node[01-04,07],gpu5") == Names{"node01", "node02", "node03", "node04", "node07", "gpu5"});
  CHECK(expand_nodelist("n[8-11]") == Names{"n8", "n9", "n10", "n11"});
  CHECK(expand_nodelist("n[098-101]") == Names{"n098", "n099", "n100", "n101"});
  CHECK(expand_nodelist("n[3]") == Names{"n3"});
  CHECK(expand_nodelist("r[1-2]n[01-02]") == Names{"r1n01", "r1n02", "r2n01", "r2n02"});
  CHECK(expand_nodelist("gpu-[1-2]-ib,cpu[5,7]") == Names{"gpu-1-ib", "gpu-2-ib", "cpu5", "cpu7"});
  CHECK(expand_nodelist("a.example.org,b[0-1].example.org") ==
        Names{"a.example.org", "b0.example.org", "b1.example.org"});
}

TEST_CASE("slurm: node list errors", "[slurm]") {
  CHECK_THAT(error_of("node[1-3"), Catch::Contains("'[' without ']'"));
  CHECK_THAT(error_of("node1-3]"), Catch::Contains("']' without '['"));
  CHECK_THAT(error_of("node[3-1]"), Catch::Contains("'3-1' is not a number or a range"));
  CHECK_THAT(error_of("node[a-b]"), Catch::Contains("'a-b'"));
  CHECK_THAT(error_of("node[1,,2]"), Catch::Contains("''"));
  CHECK_THAT(error_of("a,,b"), Catch::Contains("empty item"));
  CHECK_THAT(error_of("node[1-3]"), Catch::Equals("(no error)"));
  // Found by fuzzing: each range was bounded but not their product or their sum, so a
  // few bytes asked for gigabytes of names.
  CHECK_THAT(error_of("r[1-1000]n[1-1000]x[1-2]"), Catch::Contains("more than 200000 nodes"));
  CHECK_THAT(error_of("n[0-999999,0-999999]"), Catch::Contains("too large"));
  CHECK_THAT(error_of("r[1-400]n[1-500]"), Catch::Equals("(no error)"));  // exactly the limit
  CHECK_THAT(error_of("r[1-400]n[1-501]"), Catch::Contains("more than 200000 nodes"));
  // ... and a long literal repeated in every name of a large expansion.
  CHECK_THAT(error_of("n[1-1000]" + std::string(300, 'x')), Catch::Contains("longer than 253 characters"));
  CHECK_THAT(error_of(std::string(253, 'a')), Catch::Equals("(no error)"));
}

TEST_CASE("slurm: tasks per node", "[slurm]") {
  CHECK(parse_tasks_per_node("4", "V") == std::vector<int>{4});
  CHECK(parse_tasks_per_node("4(x2)", "V") == std::vector<int>{4, 4});
  CHECK(parse_tasks_per_node("2(x3),1", "V") == std::vector<int>{2, 2, 2, 1});
  CHECK_THROWS_AS(parse_tasks_per_node("x", "V"), InputError);
  CHECK_THROWS_AS(parse_tasks_per_node("0", "V"), InputError);
  CHECK_THROWS_AS(parse_tasks_per_node("4(2)", "V"), InputError);
  CHECK_THROWS_WITH(parse_tasks_per_node("4(x)", "SLURM_NTASKS_PER_NODE"),
                    Catch::Contains("SLURM_NTASKS_PER_NODE='4(x)'"));
  // Each repeat is at most 10^6, but not their sum: 64 KB of "1(x1000000)," asked for 5e9
  // ints (20 GB) before. The total counts against the node bound.
  CHECK_THROWS_WITH(parse_tasks_per_node("1(x1000000),1(x1000000)", "SLURM_TASKS_PER_NODE"),
                    Catch::Contains("counts more than 200000 nodes"));
  CHECK(parse_tasks_per_node("1(x200000)", "V").size() == 200000);
  CHECK_THROWS_AS(parse_tasks_per_node("1(x199999),2,3", "V"), InputError);
  // The bound is the caller's (the fuzz harness passes a small one).
  CHECK_THROWS_AS(parse_tasks_per_node("1(x4)", "V", 3), InputError);
  CHECK_THROWS_WITH(expand_nodelist("n[1-4]", 3), Catch::Contains("too large"));
  CHECK(expand_nodelist("n[1-3]", 3).size() == 3);
}

// Found by the fuzzer (a hang): a range ending at the largest number looped for good.
TEST_CASE("slurm: a range at the largest number ends", "[slurm]") {
  CHECK(expand_nodelist("n[18446744073709551615]") == std::vector<std::string>{"n18446744073709551615"});
  CHECK(expand_nodelist("n[18446744073709551614-18446744073709551615]") ==
        std::vector<std::string>{"n18446744073709551614", "n18446744073709551615"});
}

TEST_CASE("slurm: the allocation from the environment", "[slurm]") {
  CHECK_FALSE(slurm_allocation({{"SLURM_JOB_NODELIST", "a"}}));  // no job id: not inside an allocation

  auto a = slurm_allocation({{"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NODELIST", "n[1-3]"}});
  REQUIRE(a);
  CHECK(a->job_id == "42");
  CHECK(a->nodes == Names{"n1", "n2", "n3"});
  CHECK(a->tasks_per_node.empty());

  auto b = slurm_allocation(
      {{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "n[1-3]"}, {"SLURM_NTASKS_PER_NODE", "4(x2)"}});
  REQUIRE(b);
  CHECK(b->tasks_per_node == std::vector<int>{4, 4, 4});  // uniform: every node

  auto c = slurm_allocation(
      {{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "n[1-3]"}, {"SLURM_NTASKS_PER_NODE", "2(x2),1"}});
  CHECK(c->tasks_per_node == std::vector<int>{2, 2, 1});

  CHECK_THROWS_WITH(slurm_allocation({{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "n[1-3]"},
                                      {"SLURM_NTASKS_PER_NODE", "2,1"}}),
                    Catch::Contains("gives 2 counts for 3 nodes"));
  CHECK_THROWS_WITH(slurm_allocation({{"SLURM_JOB_ID", "7"}}), Catch::Contains("SLURM_JOB_NODELIST is not set"));
  auto old = slurm_allocation({{"SLURM_JOB_ID", "7"}, {"SLURM_NODELIST", "x[1-2]"}});
  CHECK(old->nodes == Names{"x1", "x2"});

  // Without --ntasks-per-node only SLURM_TASKS_PER_NODE is set: sbatch -N 4 -n 7.
  auto d = slurm_allocation(
      {{"SLURM_JOB_ID", "8"}, {"SLURM_JOB_NODELIST", "n[1-4]"}, {"SLURM_TASKS_PER_NODE", "2(x3),1"}});
  REQUIRE(d);
  CHECK(d->tasks_per_node == std::vector<int>{2, 2, 2, 1});
  CHECK(d->tasks_source == "SLURM_TASKS_PER_NODE");
  // Both set (sbatch -N 3 -n 5 --ntasks-per-node=2): --ntasks-per-node is only the most a
  // node may get; the allocation's own count wins.
  auto e = slurm_allocation({{"SLURM_JOB_ID", "8"}, {"SLURM_JOB_NODELIST", "n[1-3]"},
                             {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_TASKS_PER_NODE", "2(x2),1"}});
  CHECK(e->tasks_per_node == std::vector<int>{2, 2, 1});
  CHECK(e->tasks_source == "SLURM_TASKS_PER_NODE");
  CHECK_THROWS_WITH(slurm_allocation({{"SLURM_JOB_ID", "8"}, {"SLURM_JOB_NODELIST", "n[1-3]"},
                                      {"SLURM_TASKS_PER_NODE", "2,1"}}),
                    Catch::Contains("SLURM_TASKS_PER_NODE='2,1' gives 2 counts for 3 nodes"));
}

TEST_CASE("slurm: hosts and ranks per node inside an allocation", "[slurm][plan]") {
  const Environment env{{"SLURM_JOB_ID", "9"}, {"SLURM_JOB_NODELIST", "gpu[01-02]"}, {"SLURM_NTASKS_PER_NODE", "3"}};
  Options o;
  o.program = {"p"};

  auto sel = select_hosts(o, env);
  CHECK(sel.source == "SLURM job 9");
  auto plan = make_plan(o, sel, 0, nullptr, "gpu01");
  REQUIRE(plan.hosts.size() == 2);
  CHECK(plan.hosts[0].name == "gpu01");
  CHECK(plan.hosts[0].ranks == 3);
  CHECK(plan.hosts[0].local);
  CHECK_FALSE(plan.hosts[1].local);
  CHECK(plan.ranks.size() == 6);

  o.ranks_per_node = 2;  // -n beats SLURM_NTASKS_PER_NODE
  CHECK(make_plan(o, select_hosts(o, env), 0, nullptr, "x").hosts[1].ranks == 2);

  // SLURM_TASKS_PER_NODE, per node.
  Environment uneven = env;
  uneven.erase("SLURM_NTASKS_PER_NODE");
  uneven["SLURM_TASKS_PER_NODE"] = "2,1";
  o.ranks_per_node.reset();
  auto uneven_plan = make_plan(o, select_hosts(o, uneven), 0, nullptr, "gpu01");
  CHECK(uneven_plan.hosts[0].ranks == 2);
  CHECK(uneven_plan.hosts[1].ranks == 1);
  CHECK(uneven_plan.ranks.size() == 3);

  // Without either: the node's GPUs.
  Environment no_tasks = env;
  no_tasks.erase("SLURM_NTASKS_PER_NODE");
  auto gpu_plan = make_plan(o, select_hosts(o, no_tasks), 4, nullptr, "x");
  CHECK(gpu_plan.hosts[0].ranks == 4);
  CHECK(gpu_plan.device == DeviceKind::gpu);

  o.hosts = "other";  // -H beats the allocation
  CHECK(select_hosts(o, env).hosts.at(0).name == "other");
  o.hosts.reset();
  CHECK(select_hosts(o, {}).source == "this machine");
  CHECK(select_hosts(o, {}).hosts.at(0).name == "localhost");
}
