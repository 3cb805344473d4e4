// Which server holds which rows of which variable (parameter-server training). Pure: the
// same inputs give the same plan on every rank, so nobody sends it.
//
// The variables, in the model's order, are laid end to end as rows (a tensor's first
// dimension; a 0-d tensor is one row) and that byte line is cut into K equal stretches;
// each row goes to the server whose stretch holds the row's middle. So servers are balanced
// to within one row's bytes, a tensor larger than a stretch (a big embedding) is split by
// rows over several servers, and small tensors stay whole.
#pragma once

#include <cstdint>
#include <vector>

namespace tnt::ps {

struct VariableShape {
  int64_t rows = 1;
  int64_t row_elements = 1;  // elements per row
  int64_t element_bytes = 4;
};

// Rows [row_begin, row_end) of variable `variable`, held by `server`; its elements are
// [offset, offset + count) of the variable (row-major), and [shard_offset, shard_offset +
// count) of that server's shard buffer (its pieces in plan order).
struct ShardPiece {
  int variable = 0;
  int server = 0;
  int64_t row_begin = 0, row_end = 0;
  int64_t offset = 0, count = 0;
  int64_t shard_offset = 0;
};

struct ShardPlan {
  int servers = 1;
  std::vector<ShardPiece> pieces;         // by variable, then rows
  std::vector<int64_t> shard_elements;    // per server
  std::vector<int64_t> shard_bytes;       // per server
  std::vector<int> pieces_of(int server) const;  // indices into pieces, in shard order
};

ShardPlan plan_shards(const std::vector<VariableShape>& variables, int servers);

}  // namespace tnt::ps
