// Roles of a parameter-server job: --parameter-servers and --ps-hosts parsed, planned over
// a launch plan, and refused with a message naming the flag when they cannot be placed.
#include "cli.hpp"
#include "error.hpp"
#include "plan.hpp"
#include "ps_plan.hpp"

#include <catch2/catch.hpp>

using namespace tnt::launcher;
using Args = std::vector<std::string>;

namespace {

// The plan of `tarantella <args> -- p` on hosts that resolve to nothing (this machine "x").
LaunchPlan plan_of(const Options& o) { return make_plan(o, select_hosts(o, {}), 0, nullptr, "x"); }

std::string error_of(const Args& args) {
  try {
    Options o = parse_command_line(args);
    plan_ps_roles(o, plan_of(o));
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("ps: no --parameter-servers, no roles", "[ps]") {
  Options o = parse_command_line({"-H", "a:2", "--", "p"});
  CHECK_FALSE(o.parameter_servers);
  CHECK(o.ps_hosts.empty());
  CHECK_FALSE(plan_ps_roles(o, plan_of(o)));
}

TEST_CASE("ps: the first K ranks serve by default", "[ps]") {
  Options o = parse_command_line({"-H", "a:2,b:2", "--parameter-servers", "2", "--", "p"});
  auto roles = plan_ps_roles(o, plan_of(o));
  REQUIRE(roles);
  CHECK(roles->servers == std::vector<int>{0, 1});
  CHECK(roles->workers == std::vector<int>{2, 3});
  CHECK(ps_servers_value(*roles) == "0,1");
  CHECK(ps_role_words(roles, 1) == "parameter server, ");
  CHECK(ps_role_words(roles, 2) == "");
  CHECK(ps_role_words(std::nullopt, 0) == "");
  const std::string text = format_ps_roles(*roles, plan_of(o));
  CHECK(text.find("2 parameter servers: ranks 0, 1 (host a); 2 workers: ranks 2, 3 (host b)") != std::string::npos);
  CHECK(text.find("rank 0  parameter server") != std::string::npos);
  CHECK(text.find("rank 3  worker") != std::string::npos);
}

TEST_CASE("ps: --ps-hosts places the servers on the named hosts, in turn", "[ps]") {
  Options o = parse_command_line({"-H", "a:2,b:2,c:2", "--parameter-servers", "3", "--ps-hosts", "c,b", "--", "p"});
  auto roles = plan_ps_roles(o, plan_of(o));
  REQUIRE(roles);
  // c's first rank (4), b's first (2), then c's second (5).
  CHECK(roles->servers == std::vector<int>{2, 4, 5});
  CHECK(roles->workers == std::vector<int>{0, 1, 3});
  CHECK(format_ps_roles(*roles, plan_of(o)).find("3 parameter servers: ranks 2 (host b), 4, 5 (host c)") !=
        std::string::npos);
}

TEST_CASE("ps: bad role plans are refused, naming the flag", "[ps]") {
  CHECK(error_of({"--parameter-servers", "0", "--", "p"}).find("--parameter-servers 0: must be a positive integer") !=
        std::string::npos);
  CHECK(error_of({"--parameter-servers", "-1", "--", "p"}).find("--parameter-servers -1") != std::string::npos);
  CHECK(error_of({"--parameter-servers", "two", "--", "p"}).find("--parameter-servers two") != std::string::npos);
  CHECK(error_of({"-H", "a:2", "--parameter-servers", "2", "--", "p"}) ==
        "--parameter-servers 2 with 2 ranks leaves no worker: there must be fewer servers than ranks (give more "
        "ranks, or fewer servers)");
  CHECK(error_of({"-H", "a:2", "--parameter-servers", "3", "--", "p"}).find("leaves no worker") != std::string::npos);
  CHECK(error_of({"-H", "a:2,b:2", "--parameter-servers", "1", "--ps-hosts", "z", "--", "p"}) ==
        "--ps-hosts: z is not a host of this job (its hosts: a, b)");
  CHECK(error_of({"-H", "a:2,b:2", "--parameter-servers", "1", "--ps-hosts", "a,b", "--", "p"}) ==
        "--ps-hosts names 2 hosts but --parameter-servers 1 places only 1 server: name at most 1 host");
  CHECK(error_of({"-H", "a:1,b:3", "--parameter-servers", "2", "--ps-hosts", "a", "--", "p"}) ==
        "--parameter-servers 2: the --ps-hosts a hold only 1 rank; name more hosts or give them more ranks");
  CHECK(error_of({"-H", "a:2,b:2", "--ps-hosts", "a", "--", "p"}) ==
        "--ps-hosts a without --parameter-servers K: say how many server ranks to place");
  CHECK(error_of({"-H", "a:2,b:2", "--parameter-servers", "1", "--ps-hosts", "a,,b", "--", "p"}).find(
            "an empty host name") != std::string::npos);
  CHECK(error_of({"-H", "a:2,b:2", "--parameter-servers", "2", "--ps-hosts", "a,a", "--", "p"}).find(
            "host a is named twice") != std::string::npos);
  // -np leaves host c without a rank: it is not a host of the job.
  CHECK(error_of({"-H", "a:2,b:2,c:2", "-np", "3", "--parameter-servers", "1", "--ps-hosts", "c", "--", "p"}) ==
        "--ps-hosts: c is not a host of this job (its hosts: a, b)");
}
