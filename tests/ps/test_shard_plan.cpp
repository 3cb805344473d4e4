// The shard plan of parameter-server training (no MPI): byte balance within one row, big
// variables split by rows, small ones whole, shard offsets dense; and TNT_PS_SERVERS' parse.
#include <catch2/catch.hpp>

#include "ps/parameter_server.hpp"
#include "ps/shard_plan.hpp"
#include "tarantella/check.hpp"

#include <numeric>

using tnt::ps::plan_shards;
using tnt::ps::VariableShape;

namespace {

// Every element of every variable is in exactly one piece, and each server's pieces fill
// its shard buffer without gaps.
void check_cover(const std::vector<VariableShape>& vars, const tnt::ps::ShardPlan& plan) {
  for (size_t v = 0; v < vars.size(); ++v) {
    int64_t next = 0;
    for (const auto& p : plan.pieces) {
      if (p.variable != static_cast<int>(v)) continue;
      CHECK(p.offset == next);
      CHECK(p.count == (p.row_end - p.row_begin) * vars[v].row_elements);
      next += p.count;
    }
    CHECK(next == vars[v].rows * vars[v].row_elements);
  }
  for (int s = 0; s < plan.servers; ++s) {
    int64_t at = 0;
    for (int i : plan.pieces_of(s)) {
      CHECK(plan.pieces[static_cast<size_t>(i)].shard_offset == at);
      at += plan.pieces[static_cast<size_t>(i)].count;
    }
    CHECK(at == plan.shard_elements[static_cast<size_t>(s)]);
  }
}

}  // namespace

TEST_CASE("shard plan: one server holds everything whole", "[ps]") {
  std::vector<VariableShape> vars{{4, 3, 4}, {4, 1, 4}, {1, 1, 4}};
  auto plan = plan_shards(vars, 1);
  REQUIRE(plan.pieces.size() == 3);
  CHECK(plan.shard_elements == std::vector<int64_t>{17});
  check_cover(vars, plan);
}

TEST_CASE("shard plan: balanced by bytes within one row; a big variable split by rows", "[ps]") {
  // An embedding of 1000 rows x 64 and three small tensors: 4 servers.
  std::vector<VariableShape> vars{{1000, 64, 4}, {64, 1, 4}, {10, 64, 4}, {10, 1, 4}};
  auto plan = plan_shards(vars, 4);
  check_cover(vars, plan);
  const int64_t total = std::accumulate(plan.shard_bytes.begin(), plan.shard_bytes.end(), int64_t{0});
  for (int64_t bytes : plan.shard_bytes) CHECK(std::abs(bytes - total / 4) <= 64 * 4);  // one row of the embedding
  int embedding_pieces = 0;
  for (const auto& p : plan.pieces) embedding_pieces += p.variable == 0;
  CHECK(embedding_pieces == 4);
  // The small bias (variable 1) is whole, on one server.
  int bias_pieces = 0;
  for (const auto& p : plan.pieces) bias_pieces += p.variable == 1;
  CHECK(bias_pieces == 1);
}

TEST_CASE("shard plan: more servers than rows leaves some empty, never splits a row", "[ps]") {
  std::vector<VariableShape> vars{{2, 5, 4}};
  auto plan = plan_shards(vars, 3);
  check_cover(vars, plan);
  CHECK(plan.pieces.size() == 2);
  CHECK(std::count(plan.shard_elements.begin(), plan.shard_elements.end(), 0) == 1);
}

TEST_CASE("TNT_PS_SERVERS: the server ranks, or a message naming the variable", "[ps]") {
  using tnt::detail::parse_server_ranks;
  CHECK(parse_server_ranks("", 3) == std::vector<int>{0});
  CHECK(parse_server_ranks("2,0", 4) == std::vector<int>{0, 2});
  auto error_of = [](const std::string& text, int size) -> std::string {
    try {
      parse_server_ranks(text, size);
    } catch (const tnt::InputError& e) {
      return e.what();
    }
    return "(no error)";
  };
  CHECK(error_of("0,1", 2) == "TNT_PS_SERVERS='0,1' makes all 2 ranks servers: no worker is left to train");
  CHECK(error_of("3", 3) == "TNT_PS_SERVERS='3': '3' is not a rank of this job (0 to 2)");
  CHECK(error_of("0,x", 3) == "TNT_PS_SERVERS='0,x': 'x' is not a rank of this job (0 to 2)");
  CHECK(error_of("0,,1", 3) == "TNT_PS_SERVERS='0,,1': '' is not a rank of this job (0 to 2)");
  CHECK(error_of("1,1", 3) == "TNT_PS_SERVERS='1,1': rank 1 is named twice");
  CHECK(error_of("", 1).find("needs at least 2 ranks") != std::string::npos);
}
