// `tarantella predict` (launcher/predict.cpp) and --profile-scaling: the flags and their
// errors, which links the network takes from where, and the binary run on a profile
// fixture (data/predict_profile.json) whose numbers are worked out by hand below.
#include "cli.hpp"
#include "error.hpp"
#include "exports.hpp"
#include "paths.hpp"
#include "predict.hpp"
#include "process.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sstream>
#include <thread>

using namespace tnt::launcher;
using Args = std::vector<std::string>;
using Catch::Matchers::Contains;
namespace sc = tnt::comm::scaling;

namespace {

const std::string fixture = std::string(TNT_SOURCE_DIR) + "/tests/launcher/data/predict_profile.json";

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string predict_error(const Args& args) {
  return error_of([&] { parse_predict_command_line(args); });
}

sc::Profile one_node_profile(int ranks, const char* transport = "ring") {
  sc::Profile p;
  p.ranks = ranks;
  p.ranks_per_node = ranks;
  p.transport = transport;
  if (ranks > 1) p.allreduce = sc::AllreduceFit{ranks, 2e-5 * (ranks - 1), 2.0 * (ranks - 1) / ranks * 1e-9};
  return p;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "tnt_predict_test.XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

tnt_test::Outcome run_predict(const Args& args) {
  Args argv{TNT_LAUNCHER_BIN, "predict"};
  argv.insert(argv.end(), args.begin(), args.end());
  return tnt_test::run(argv, tnt_test::clean_environment(), std::chrono::seconds(60));
}

}  // namespace

TEST_CASE("predict: defaults and flags", "[predict]") {
  auto o = parse_predict_command_line({"p.json", "--network", "ib-ndr"});
  CHECK(o.profile == "p.json");
  CHECK(o.nodes == std::vector<int>{1, 2, 4, 8, 16});
  CHECK_FALSE(o.devices_per_node);
  CHECK(o.network == "ib-ndr");
  o = parse_predict_command_line({"--nodes", "1,3,64", "--devices-per-node", "8", "--link-gbps", "25",
                                  "--latency-us", "0", "--fusion-threshold", "0.5", "p.json"});
  CHECK(o.nodes == std::vector<int>{1, 3, 64});
  CHECK(o.devices_per_node == 8);
  CHECK(o.link_gbps == 25);
  CHECK(o.latency_us == 0);
  CHECK(o.fusion_threshold_kb == 0.5);
  CHECK(parse_predict_command_line({"--help"}).help);
}

TEST_CASE("predict: bad flags are named", "[predict]") {
  CHECK_THAT(predict_error({}), Contains("no PROFILE"));
  CHECK_THAT(predict_error({"p.json", "q.json"}), Contains("unexpected argument 'q.json'"));
  CHECK_THAT(predict_error({"p.json", "--nodes", "1,0"}), Contains("--nodes 1,0") && Contains("'0'"));
  CHECK_THAT(predict_error({"p.json", "--nodes", ""}), Contains("--nodes"));
  CHECK_THAT(predict_error({"p.json", "--devices-per-node", "-1"}), Contains("--devices-per-node -1"));
  CHECK_THAT(predict_error({"p.json", "--network", "token-ring"}),
             Contains("--network token-ring") && Contains("ib-ndr"));
  CHECK_THAT(predict_error({"p.json", "--intra", "usb"}), Contains("--intra usb") && Contains("nvlink"));
  CHECK_THAT(predict_error({"p.json", "--link-gbps", "0", "--latency-us", "1"}), Contains("--link-gbps 0"));
  CHECK_THAT(predict_error({"p.json", "--link-gbps", "10"}), Contains("--link-gbps without --latency-us"));
  CHECK_THAT(predict_error({"p.json", "--network", "10gbe", "--link-gbps", "10", "--latency-us", "1"}),
             Contains("give one"));
  CHECK_THAT(predict_error({"p.json", "--intra-latency-us", "nan", "--intra-gbps", "1"}),
             Contains("--intra-latency-us nan"));
  CHECK_THAT(predict_error({"p.json", "--fusion-threshold", "-3"}), Contains("--fusion-threshold -3"));
  CHECK_THAT(predict_error({"p.json", "--allreduce", "tree"}), Contains("--allreduce tree"));
  CHECK_THAT(predict_error({"p.json", "--csv", "a", "--csv", "b"}), Contains("--csv given 2 times"));
  // Before: matplotlib's traceback after the table; a bad --csv refused after the table.
  CHECK_THAT(predict_error({"p.json", "--plot", "p.txt"}), Contains("--plot p.txt: the extension gives the image's format"));
  CHECK_NOTHROW(parse_predict_command_line({"p.json", "--plot", "p.PNG"}));
  CHECK_THAT(predict_error({"p.json", "--csv", "/nonexistent-dir/x.csv"}),
             Contains("--csv /nonexistent-dir/x.csv: /nonexistent-dir is no such directory"));
  // Before: -9.0072e+15 KB in the table, exit 0.
  // A latency of 1e30 us printed steps of 4.2e28 ms: refused, as a link of 1e30 Gbit/s is.
  CHECK_THAT(predict_error({"p.json", "--link-gbps", "10", "--latency-us", "1e30"}),
             Contains("--latency-us 1e30: at most 1e+09 microseconds"));
  CHECK_THAT(predict_error({"p.json", "--link-gbps", "1e30", "--latency-us", "1"}),
             Contains("--link-gbps 1e30: must be a positive number of Gbit/s, at most 1e9"));
  CHECK_THAT(predict_error({"p.json", "--fusion-threshold", "1e30"}),
             Contains("--fusion-threshold 1e30: at most 16777216 KB"));
  // Before: a row of -2147483648 ranks and a negative efficiency, exit 0.
  PredictOptions o = parse_predict_command_line({"p.json", "--network", "10gbe", "--devices-per-node", "65536",
                                                 "--nodes", "1,32768"});
  CHECK_THAT(error_of([&] { resolve_network(o, one_node_profile(2), nullptr); }),
             Contains("--nodes 32768 with 65536 rank(s) a node: 2147483648 ranks, beyond the 16777216"));
}

TEST_CASE("predict: where each link comes from", "[predict]") {
  PredictOptions o = parse_predict_command_line({"p.json", "--nodes", "1,2"});
  SECTION("one node, two ranks: the measured link within the node; none between nodes") {
    CHECK_THAT(error_of([&] { resolve_network(o, one_node_profile(2), nullptr); }),
               Contains("network between nodes is unknown") && Contains("--network"));
    o.nodes = {1};
    std::vector<std::string> said;
    const sc::Network net = resolve_network(o, one_node_profile(2), &said);
    // a = 2(p-1) latency, b = 2(p-1)/p / bandwidth: 10 us and 1e9 B/s.
    CHECK(net.intra.latency_s == Approx(1e-5));
    CHECK(net.intra.bytes_per_s == Approx(1e9));
    CHECK(net.ranks_per_node == 2);
    CHECK_FALSE(net.hierarchical);  // a CPU profile: the host transport's flat ring
    CHECK_THAT(said.at(0), Contains("measured"));
  }
  SECTION("a preset between nodes, its numbers") {
    o = parse_predict_command_line({"p.json", "--network", "ib-hdr", "--devices-per-node", "4"});
    const sc::Network net = resolve_network(o, one_node_profile(2, "nccl"), nullptr);
    CHECK(net.inter.bytes_per_s == Approx(200e9 / 8));
    CHECK(net.inter.latency_s == Approx(1e-6));
    CHECK(net.ranks_per_node == 4);
    CHECK(net.hierarchical);  // an NCCL profile
  }
  SECTION("one rank profiled, several a node asked for: the link within a node is needed") {
    o = parse_predict_command_line({"p.json", "--network", "10gbe", "--devices-per-node", "4"});
    CHECK_THAT(error_of([&] { resolve_network(o, one_node_profile(1), nullptr); }), Contains("--intra"));
    o = parse_predict_command_line({"p.json", "--network", "10gbe", "--devices-per-node", "4", "--intra", "pcie4"});
    CHECK(resolve_network(o, one_node_profile(1), nullptr).intra.bytes_per_s == Approx(32e9));
  }
}

TEST_CASE("predict: the CSV's columns", "[predict]") {
  sc::SweepRow row;
  row.nodes = 2;
  row.at_threshold.ranks = 8;
  row.at_threshold.step_s = 0.1;
  row.at_threshold.threshold_bytes = 32768;
  row.best.threshold_bytes = 1 << 20;
  const std::string csv = predict_csv({row});
  CHECK(csv.rfind("nodes,ranks,step_ms,throughput,efficiency,hidden_comm,", 0) == 0);
  CHECK_THAT(csv, Contains("\n2,8,100.0000,") && Contains(",32,1024,"));
}

TEST_CASE("--profile-scaling exports an absolute path", "[predict]") {
  auto o = parse_command_line({"--profile-scaling", "p.json", "--", "./train"});
  REQUIRE(o.exports.size() == 1);
  CHECK(o.exports[0].first == "TNT_PROFILE_SCALING");
  CHECK(o.exports[0].second == (std::filesystem::current_path() / "p.json").string());
  CHECK_THAT(error_of([] { parse_command_line({"--profile-scaling", "", "--", "p"}); }), Contains("path is empty"));
  CHECK_THAT(error_of([] { parse_command_line({"-x", "TNT_PROFILE_SCALING=a", "--profile-scaling", "b", "--", "p"}); }),
             Contains("give one"));
}

TEST_CASE("--fusion-threshold auto is exported as TNT_FUSION_THRESHOLD=auto", "[predict]") {
  auto o = parse_command_line({"--fusion-threshold", "auto", "--", "./train"});
  CHECK(o.fusion_threshold_auto);
  CHECK_FALSE(o.fusion_threshold_kb);
  bool exported = false;
  for (const auto& e : rank_exports(o, Environment{})) exported |= e.first == "TNT_FUSION_THRESHOLD" && e.second == "auto";
  CHECK(exported);
  CHECK_THAT(error_of([] { parse_command_line({"--fusion-threshold", "AUTO", "--", "p"}); }),
             Contains("--fusion-threshold AUTO") && Contains("or auto"));
  CHECK_THAT(error_of([] { parse_command_line({"-x", "TNT_FUSION_THRESHOLD=8", "--fusion-threshold", "auto", "--", "p"}); }),
             Contains("give one"));
}

TEST_CASE("predict: a row of one node is the same whatever other rows are asked for", "[predict][binary]") {
  // A profile of 2 ranks on one node whose allreduces beside backward took far longer than
  // its probe's (the factor reaches the model's limit). Rows of several nodes run on a given
  // link, to which the factor does not apply; before, asking for them dropped the factor from
  // the one-node row too (2.869 ms there against 2.963 ms alone).
  const std::string overlap = std::string(TNT_SOURCE_DIR) + "/tests/launcher/data/predict_profile_overlap.json";
  auto row_of_one = [](const std::string& out) {
    std::stringstream ss(out);
    for (std::string line; std::getline(ss, line);) {
      if (line.rfind("     1      2 ", 0) == 0) return line;
    }
    return std::string("(no row of 1 node)");
  };
  auto alone = run_predict({overlap, "--network", "10gbe", "--nodes", "1"});
  auto both = run_predict({overlap, "--network", "10gbe", "--nodes", "1,2"});
  INFO(alone.describe() << both.describe());
  REQUIRE(alone.exited(0));
  REQUIRE(both.exited(0));
  CHECK_THAT(row_of_one(alone.out), Contains("2.963"));
  CHECK(row_of_one(both.out) == row_of_one(alone.out));
  CHECK_THAT(both.out, Contains("so to the rows of one node"));
  CHECK_THAT(alone.out, Contains("64.00 x the probe's time, the most the model takes"));
}

TEST_CASE("tarantella predict on a profile fixture", "[predict][binary]") {
  TempDir dir;
  const std::string csv = (dir.path / "p.csv").string();
  // One rank a node, 8 Gbit/s = 1e9 B/s and 10 us between nodes. One node: no allreduce, a
  // step of 10 + 20 + 2 + 1 = 33 ms. Two nodes: each 4 MB gradient is its own bucket at
  // 32 KB and takes 2 * 10 us + 4 ms; C at 5-9.02 ms, B at 12-16.02, A at 20-24.02: 4.02 ms
  // after backward, a step of 37.02 ms, 64 samples in it, efficiency 33 / 37.02.
  auto r = run_predict({fixture, "--nodes", "1,2,4", "--devices-per-node", "1", "--link-gbps", "8", "--latency-us",
                        "10", "--csv", csv});
  INFO(r.describe());
  REQUIRE(r.exited(0));
  CHECK_THAT(r.out, Contains("the model at the profile's own 2 rank(s)"));
  CHECK_THAT(r.out, Contains("37.020"));
  const std::string text = slurp(csv);
  std::vector<std::string> lines;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) lines.push_back(line);
  REQUIRE(lines.size() == 4);
  CHECK(lines[1].rfind("1,1,33.0000,969.70,1.0000,1.0000,32,", 0) == 0);
  CHECK(lines[2].rfind("2,2,37.0200,1728.80,0.8914,", 0) == 0);  // 64 / 0.03702 = 1728.795
  CHECK(lines[3].rfind("4,4,", 0) == 0);
  CHECK_FALSE(std::filesystem::exists(csv + ".tmp"));

  CHECK_THAT(r.out, Contains("a step: input 0.000, forward 10.000, backward 20.000, wait for gradients 4.000, "
                              "optimizer 2.000, other 1.000 ms"));
  CHECK_THAT(r.out, !Contains("the GPU"));  // a CPU profile

  SECTION("a GPU profile says where the GPU waited") {
    // The same profile from a GPU whose step is 40 ms: 4 ms (10%) waiting for its input, 6 ms
    // (15%) idle at the readback; a second one with 1 ms of each (2.5%: not said).
    const std::string gpu = (dir.path / "gpu.json").string();
    std::string body = slurp(fixture);
    auto put = [&](const std::string& from, const std::string& to) {
      const auto at = body.find(from);
      REQUIRE(at != std::string::npos);
      body.replace(at, from.size(), to);
    };
    put("\"device\": \"cpu\"", "\"device\": \"cuda:0\"");
    put("\"transport\": \"ring\"", "\"transport\": \"nccl\"");
    put("\"input_s\": 0.0,", "\"input_s\": 0.004,");
    put("\"other_s\": 0.001,", "\"other_s\": 0.006,");
    std::ofstream(gpu) << body;
    auto g = run_predict({gpu, "--nodes", "1", "--devices-per-node", "2"});
    INFO(g.describe());
    REQUIRE(g.exited(0));
    CHECK_THAT(g.out, Contains("the GPU waited 4.000 ms a step (10%) for its input"));
    CHECK_THAT(g.out, Contains("the GPU idled 6.000 ms a step (15%) waiting for the host"));
    put("\"input_s\": 0.004,", "\"input_s\": 0.001,");
    put("\"other_s\": 0.006,", "\"other_s\": 0.001,");
    std::ofstream(gpu) << body;
    g = run_predict({gpu, "--nodes", "1", "--devices-per-node", "2"});
    REQUIRE(g.exited(0));
    CHECK_THAT(g.out, !Contains("the GPU waited") && !Contains("the GPU idled"));
  }
  SECTION("a plot") {
    const std::string png = (dir.path / "p.png").string();
    auto p = run_predict({fixture, "--nodes", "1,2", "--network", "10gbe", "--plot", png});
    INFO(p.describe());
    REQUIRE(p.exited(0));
    CHECK(slurp(png).rfind("\x89PNG", 0) == 0);
  }
  SECTION("help") {
    auto h = run_predict({"--help"});
    CHECK(h.exited(0));
    CHECK_THAT(h.out, Contains("Examples:") && Contains("ib-ndr") && Contains("--devices-per-node"));
  }
  SECTION("bad input: exit status 2 and a line naming it") {
    auto e = run_predict({fixture, "--nodes", "1,2"});
    CHECK(e.exited(2));
    CHECK_THAT(e.err, Contains("--network"));
    e = run_predict({(dir.path / "none.json").string()});
    CHECK(e.exited(2));
    CHECK_THAT(e.err, Contains("none.json': no such file"));
    const std::string broken = (dir.path / "broken.json").string();
    std::string body = slurp(fixture);
    body.replace(body.find("\"backward_s\": 0.020"), 19, "\"backward_s\": \"x\"");
    std::ofstream(broken) << body;
    e = run_predict({broken, "--nodes", "1"});
    CHECK(e.exited(2));
    CHECK_THAT(e.err, Contains("broken.json") && Contains("'backward_s' is not a number"));
    e = run_predict({fixture, "--nodes", "1", "--csv", (dir.path / "no" / "dir.csv").string()});
    CHECK(e.exited(2));
    CHECK_THAT(e.err, Contains("--csv") && Contains("dir.csv"));
  }
}

TEST_CASE("predict: the Goyal et al. 2017 comparison of docs/scaling.md", "[predict][binary]") {
  // The numbers docs/scaling.md quotes; rounding as the CSV writes them.
  TempDir dir;
  const std::string csv = (dir.path / "g.csv").string();
  auto r = run_predict({std::string(TNT_SOURCE_DIR) + "/tests/launcher/data/resnet50_p100_goyal2017.json", "--nodes",
                        "1,8,16,32", "--devices-per-node", "8", "--intra", "nvlink-p100", "--network", "50gbe",
                        "--allreduce", "hierarchical", "--csv", csv});
  INFO(r.describe());
  REQUIRE(r.exited(0));
  const std::string text = slurp(csv);
  CHECK_THAT(text, Contains("\n1,8,230.0"));
  CHECK_THAT(text, Contains("\n8,64,230.2"));
  CHECK_THAT(text, Contains("\n16,128,230.5"));
  // 256 GPUs: 271.3 ms and 84.8% at threshold 0, 78% hidden; 99.6% at the best, 2 KB.
  CHECK_THAT(text, Contains("\n32,256,271.2") && Contains(",0.848") && Contains(",0.78") && Contains(",0,2,") &&
                       Contains(",0.996"));
}

TEST_CASE("--csv and --plot write through links and into devices, never replacing them", "[predict]") {
  namespace fs = std::filesystem;
  TempDir dir;
  const fs::path target = dir.path / "target.csv", link = dir.path / "link.csv", fifo = dir.path / "fifo";
  std::ofstream(target) << "old\n";
  fs::create_symlink(target, link);
  write_output_file("--csv", link.string(), "a,b\n");
  CHECK(fs::is_symlink(fs::symlink_status(link)));  // before: replaced by a regular file
  CHECK(slurp(target.string()) == "a,b\n");
  CHECK_FALSE(fs::exists(dir.path / "link.csv.tmp"));
  CHECK_FALSE(fs::exists(dir.path / "target.csv.tmp"));
  // A full device fails by name (before: exit 0, and /dev/full replaced by a file as root).
  CHECK_THROWS_WITH(write_output_file("--csv", "/dev/full", "a,b\n"),
                    Contains("--csv /dev/full: cannot write it: No space left on device"));
  CHECK(fs::is_character_file("/dev/full"));
  write_output_file("--csv", "/dev/null", "a,b\n");
  CHECK(fs::is_character_file("/dev/null"));
  // A FIFO is written into (a reader is there), not replaced.
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // there before the write, as a pipe's is
  REQUIRE(reader >= 0);
  write_output_file("--csv", fifo.string(), "x\n");
  char got[8] = {};
  CHECK(::read(reader, got, sizeof got) == 2);
  ::close(reader);
  CHECK(std::string(got) == "x\n");
  CHECK(fs::is_fifo(fifo));
  CHECK_THROWS_WITH(write_output_file("--plot", dir.path.string(), "x"), Contains("a directory, not a file"));
  // A link to nothing: its target is created, the link kept; a relative link from its folder.
  fs::create_directory(dir.path / "sub");
  fs::create_symlink("sub/made.csv", dir.path / "dangling");
  write_output_file("--csv", (dir.path / "dangling").string(), "d\n");
  CHECK(fs::is_symlink(fs::symlink_status(dir.path / "dangling")));
  CHECK(slurp((dir.path / "sub/made.csv").string()) == "d\n");
  // A loop, and a FIFO nobody reads (before: the open waited for ever), are refused.
  fs::create_symlink("loop2", dir.path / "loop1");
  fs::create_symlink("loop1", dir.path / "loop2");
  CHECK_THROWS_WITH(write_output_file("--csv", (dir.path / "loop1").string(), "x"), Contains("a link that leads nowhere"));
  // A reader that opens the FIFO a moment later is waited for, as `> fifo` waits; none at all
  // is named after 10 s (before: the open blocked for ever).
  std::string late;
  std::thread reader_later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    late = slurp(fifo.string());
  });
  write_output_file("--csv", fifo.string(), "late\n");
  reader_later.join();
  CHECK(late == "late\n");
  CHECK_THROWS_WITH(write_output_file("--csv", fifo.string(), "x"), Contains("a FIFO that nothing read within 10 s"));
  // /dev/stdout or /dev/fd/N on a pipe: the kernel's link to a pipe, which no path names (the
  // links were followed by hand: "No such file or directory"). Written into, never replaced.
  int p[2];
  REQUIRE(::pipe(p) == 0);
  write_output_file("--csv", fmt::format("/proc/self/fd/{}", p[1]), "piped\n");
  ::close(p[1]);
  char buf[16] = {};
  CHECK(::read(p[0], buf, sizeof buf) == 6);
  ::close(p[0]);
  CHECK(std::string(buf) == "piped\n");
  // A full device is the machine's failure, not the user's input: exit 1, not 2.
  CHECK_THROWS_AS(write_output_file("--csv", "/dev/full", "a"), SystemError);
}
