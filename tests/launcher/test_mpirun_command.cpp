#include "error.hpp"
#include "exports.hpp"
#include "mpirun_command.hpp"
#include "shell_words.hpp"

#include <catch2/catch.hpp>

using namespace tnt::launcher;
using Words = std::vector<std::string>;

TEST_CASE("mpirun command: one local host, two CPU ranks", "[mpirun]") {
  CommandSpec spec;
  spec.mpirun = "/usr/bin/mpirun";
  spec.hosts = {{"localhost", 2, true}};
  spec.exports = {{"TNT_LAUNCHER", "1"}};
  spec.pass_by_name = {"TNT_LAUNCHER_REPORT"};
  spec.self = "/opt/tnt/bin/tarantella";
  spec.step.program = {"./train", "--epochs=1"};
  CHECK(mpirun_command(spec) ==
        Words{"/usr/bin/mpirun", "--host", "localhost:2", "-np", "2", "--map-by", "slot", "--bind-to", "none",
              "-x", "TNT_LAUNCHER_REPORT", "-x", "TNT_LAUNCHER=1", "/opt/tnt/bin/tarantella", "__tnt_rank_step",
              "--", "./train", "--epochs=1"});
  spec.as_root = true;
  CHECK(mpirun_command(spec)[1] == "--allow-run-as-root");
  // --launch-agent: Open MPI's rsh agent, one word however many it holds, before -x.
  spec.launch_agent = "ssh -p 2222";
  const Words with_agent = mpirun_command(spec);
  CHECK(Words(with_agent.begin() + 10, with_agent.begin() + 13) == Words{"--mca", "plm_rsh_agent", "ssh -p 2222"});
}

TEST_CASE("mpirun command: full host names are kept as they are", "[mpirun]") {
  // Open MPI 4.1 starts its daemons by the name cut at its first dot unless told not to.
  auto keeps = [](const std::vector<HostPlan>& hosts) {
    CommandSpec spec;
    spec.mpirun = "mpirun";
    spec.hosts = hosts;
    spec.self = "/t";
    spec.step.program = {"p"};
    const Words w = mpirun_command(spec);
    for (size_t i = 0; i + 2 < w.size(); ++i) {
      if (w[i] == "--mca" && w[i + 1] == "orte_keep_fqdn_hostnames") return w[i + 2] == "1";
    }
    return false;
  };
  CHECK(keeps({{"n1", 1, false}, {"node2.cluster.example.org", 1, false}}));
  CHECK_FALSE(keeps({{"n1", 1, false}, {"n2", 1, false}}));
  CHECK_FALSE(keeps({{"10.0.0.1", 1, false}, {"localhost", 1, true}}));  // addresses are kept anyway
}

TEST_CASE("mpirun command: two hosts, GPU ranks, pinned, extra MPI arguments", "[mpirun]") {
  CommandSpec spec;
  spec.mpirun = "mpirun";
  spec.hosts = {{"n1", 4, false}, {"n2", 3, false}};
  spec.exports = {{"TNT_LAUNCHER", "1"}, {"TNT_FUSION_THRESHOLD", "0"}, {"OMP_NUM_THREADS", "8"}};
  spec.pass_by_name = {"TNT_LAUNCHER_REPORT", "PATH"};
  spec.mpi_args = {"--mca", "btl_tcp_if_include", "ib0"};
  spec.self = "/t";
  spec.step = {PinMode::socket_strict, DeviceKind::gpu, {"prog"}};
  CHECK(shell_join(mpirun_command(spec)) ==
        "mpirun --host n1,n1,n1,n1,n2,n2,n2 -np 7 --map-by seq --bind-to none -x TNT_LAUNCHER_REPORT -x PATH "
        "-x TNT_LAUNCHER=1 -x TNT_FUSION_THRESHOLD=0 -x OMP_NUM_THREADS=8 --mca btl_tcp_if_include ib0 "
        "/t __tnt_rank_step --pin socket-strict --gpu -- prog");
}

TEST_CASE("mpirun command: several hosts keep their order (mapped in sequence), however many ranks", "[mpirun]") {
  CommandSpec spec;
  spec.mpirun = "mpirun";
  spec.self = "/t";
  spec.step = {PinMode::none, DeviceKind::cpu, {"prog"}};
  // This machine (c) last: Open MPI would map by slot from its own node, so rank 0 on c.
  spec.hosts = {{"a", 1, false}, {"b", 2, false}, {"c", 1, true}};
  CHECK_THAT(shell_join(mpirun_command(spec)), Catch::Contains("--host a,b,b,c -np 4 --map-by seq --bind-to none"));
  // One host: by slot, as ever.
  spec.hosts = {{"c", 3, true}};
  CHECK_THAT(shell_join(mpirun_command(spec)), Catch::Contains("--host c:3 -np 3 --map-by slot"));
  // A list of one host per rank longer than one argument may be: by slot.
  spec.hosts = {{"node-with-a-long-name-0001", 4000, false}, {"node-with-a-long-name-0002", 4000, true}};
  const auto words = mpirun_command(spec);
  CHECK_THAT(shell_join(words),
             Catch::Contains("--host node-with-a-long-name-0001:4000,node-with-a-long-name-0002:4000 -np 8000 --map-by slot"));
  for (const auto& w : words) CHECK(w.size() <= kMaxRankHostList);
}

TEST_CASE("mpirun command: from options to words", "[mpirun]") {
  Options o = parse_command_line({"-n", "3", "--pin-to-socket", "--log-level", "info", "-x", "MSG=a b", "--mpi-args",
                                  "--mca btl self,vader", "--", "sh", "-c", "echo $TNT_RANK"});
  CommandSpec spec;
  spec.mpirun = "/usr/bin/mpirun";
  spec.hosts = {{"localhost", *o.ranks_per_node, true}};
  spec.exports = rank_exports(o, {{"TNT_SEED", "7"}, {"HOME", "/root"}});
  spec.mpi_args = o.mpi_args;
  spec.self = "/b/tarantella";
  spec.step = {o.pin, DeviceKind::cpu, o.program};
  CHECK(shell_join(mpirun_command(spec)) ==
        "/usr/bin/mpirun --host localhost:3 -np 3 --map-by slot --bind-to none -x TNT_LAUNCHER=1 "
        "-x TNT_LOG_LEVEL=INFO -x TNT_SEED=7 -x 'MSG=a b' --mca btl self,vader /b/tarantella __tnt_rank_step "
        "--pin socket -- sh -c 'echo $TNT_RANK'");
}

TEST_CASE("mpirun command: the per-rank step's arguments round-trip", "[mpirun]") {
  for (auto pin : {PinMode::none, PinMode::socket, PinMode::socket_strict}) {
    for (auto dev : {DeviceKind::cpu, DeviceKind::gpu}) {
      RankStepArgs in{pin, dev, {"prog", "--", "-x"}};
      auto words = rank_step_arguments(in);
      REQUIRE(words.front() == rank_step_flag);
      auto out = parse_rank_step_arguments(Words(words.begin() + 1, words.end()));
      CHECK(out.pin == pin);
      CHECK(out.device == dev);
      CHECK(out.program == in.program);
    }
  }
  CHECK_THROWS_AS(parse_rank_step_arguments({"--pin", "wrong", "--", "p"}), InputError);
  CHECK_THROWS_AS(parse_rank_step_arguments({"--what", "--", "p"}), InputError);
  CHECK_THROWS_AS(parse_rank_step_arguments({"--"}), InputError);
  CHECK_THROWS_AS(parse_rank_step_arguments({}), InputError);
}

TEST_CASE("exports: order and precedence", "[exports]") {
  Options o;
  o.fusion_threshold_kb = 0;
  o.output_on_all_devices = true;
  o.exports = {{"A", "1"}, {"TNT_SEED", "from -x"}};
  const Environment env{{"TNT_SEED", "from env"},     {"TNT_FUSION_THRESHOLD", "99"}, {"TNT_ZETA", "z"},
                        {"TNT_RANK", "stale"},        {"TNT_LAUNCHER_REPORT", "x"},   {"PATH", "/bin"},
                        {"TNT_ALPHA", "a"}};
  CHECK(rank_exports(o, env) == std::vector<EnvVar>{{"TNT_LAUNCHER", "1"},
                                                    {"TNT_FUSION_THRESHOLD", "0"},
                                                    {"TNT_OUTPUT_ON_ALL_DEVICES", "1"},
                                                    {"TNT_ALPHA", "a"},
                                                    {"TNT_ZETA", "z"},
                                                    {"A", "1"},
                                                    {"TNT_SEED", "from -x"}});
  Options plain;
  CHECK(rank_exports(plain, {}) == std::vector<EnvVar>{{"TNT_LAUNCHER", "1"}});
}

TEST_CASE("shell words", "[mpirun]") {
  CHECK(split_shell_words("") == Words{});
  CHECK(split_shell_words("  a  b\tc ") == Words{"a", "b", "c"});
  CHECK(split_shell_words("--mca btl 'tcp,self' \"x y\" z\\ w") == Words{"--mca", "btl", "tcp,self", "x y", "z w"});
  CHECK(split_shell_words("a\"b\"'c'") == Words{"abc"});
  CHECK(split_shell_words("\"a \\\"q\\\" \\n\"") == Words{"a \"q\" \\n"});
  CHECK(split_shell_words("''") == Words{""});
  CHECK_THROWS_AS(split_shell_words("'open"), InputError);
  CHECK_THROWS_AS(split_shell_words("\"open"), InputError);
  CHECK(shell_quote("plain-word_1.2/x:y,z=w") == "plain-word_1.2/x:y,z=w");
  CHECK(shell_quote("") == "''");
  CHECK(shell_quote("a b") == "'a b'");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  const Words tricky{"a b", "it's", "$HOME", "", "x"};
  CHECK(split_shell_words(shell_join(tricky)) == tricky);
}
