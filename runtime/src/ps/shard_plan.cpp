#include "ps/shard_plan.hpp"

#include "tarantella/check.hpp"

#include <algorithm>

namespace tnt::ps {

std::vector<int> ShardPlan::pieces_of(int server) const {
  std::vector<int> out;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].server == server) out.push_back(static_cast<int>(i));
  }
  return out;
}

ShardPlan plan_shards(const std::vector<VariableShape>& variables, int servers) {
  TNT_CHECK(servers >= 1, "plan_shards: {} servers", servers);
  ShardPlan plan;
  plan.servers = servers;
  plan.shard_elements.assign(static_cast<size_t>(servers), 0);
  plan.shard_bytes.assign(static_cast<size_t>(servers), 0);
  // Doubles: a model of many GB times K still fits exactly enough for choosing a server.
  double total = 0;
  for (const auto& v : variables) total += static_cast<double>(v.rows * v.row_elements * v.element_bytes);
  double at = 0;  // bytes before the current row
  for (size_t i = 0; i < variables.size(); ++i) {
    const VariableShape& v = variables[i];
    const double row_bytes = static_cast<double>(v.row_elements * v.element_bytes);
    for (int64_t r = 0; r < v.rows; ++r) {
      const double middle = at + row_bytes / 2;
      const int s = total > 0 ? std::min(servers - 1, static_cast<int>(middle * servers / total)) : 0;
      if (plan.pieces.empty() || plan.pieces.back().variable != static_cast<int>(i) || plan.pieces.back().server != s) {
        ShardPiece p;
        p.variable = static_cast<int>(i);
        p.server = s;
        p.row_begin = r;
        p.row_end = r;
        p.offset = r * v.row_elements;
        p.shard_offset = plan.shard_elements[static_cast<size_t>(s)];
        plan.pieces.push_back(p);
      }
      ShardPiece& p = plan.pieces.back();
      p.row_end = r + 1;
      p.count += v.row_elements;
      plan.shard_elements[static_cast<size_t>(s)] += v.row_elements;
      plan.shard_bytes[static_cast<size_t>(s)] += v.row_elements * v.element_bytes;
      at += row_bytes;
    }
  }
  return plan;
}

}  // namespace tnt::ps
