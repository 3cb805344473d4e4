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

// Collective: a pass over the data (fit, evaluate, predict) that every rank must make alike:
// `facts` ("16 samples", "global batch 4", "4 steps an epoch", ...) must be equal on every
// rank, else the ranks would pair one step's collectives with another's (wrong sums, then a
// wait until TNT_COLLECTIVE_TIMEOUT). Throws InputError on every rank naming `what` and the
// first fact that differs, by rank.
void require_same_pass(Communicator& comm, const std::string& what, const std::vector<std::string>& facts);

}  // namespace tnt::detail
