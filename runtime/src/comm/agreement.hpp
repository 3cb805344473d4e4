// "Do all ranks hold the same list?": the one check behind every place where ranks must
// agree before they start collectives that would otherwise hang on a mismatch (the
// Reducer's gradient list, the Model's precision and loss scale). The caller turns a disagreement into
// its own message and throws it on every rank.
#pragma once

#include "tarantella/comm.hpp"

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tnt::detail {

struct Disagreement {
  size_t entry = 0;  // index of the first entry on which the ranks differ
  // That entry's text on each rank, grouped: (text, ranks holding it), in order of the
  // lowest rank. A rank with fewer entries shows "(none: ...)" for the missing one.
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  std::string describe() const;  // "rank(s) 0, 2: <text>; rank(s) 1: <text>"
};

// Collective over comm; every rank returns the same value. nullopt when all ranks hold
// equal lists (compared by 64-bit hashes: one small allgather when they agree).
std::optional<Disagreement> find_disagreement(Communicator& comm, const std::vector<std::string>& entries);

std::string rank_list(const std::vector<int>& ranks);  // "0, 2, 5"

}  // namespace tnt::detail
