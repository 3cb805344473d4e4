// Three rounds, the later ones only when ranks disagree: (1) one hash of the whole list per
// rank; (2) one hash per entry, to find the first entry that differs; (3) that entry's
// text from every rank. Every rank sees the same gathered data, so every rank computes the
// same answer without a further broadcast.
#include "comm/agreement.hpp"

#include "comm/waiter.hpp"

#include "tarantella/check.hpp"
#include "tarantella/random.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace tnt::detail {

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

std::string Disagreement::describe() const {
  std::string out;
  for (const auto& [text, ranks] : groups) out += fmt::format("{}rank(s) {}: {}", out.empty() ? "" : "; ", rank_list(ranks), text);
  return out;
}

std::optional<Disagreement> find_disagreement(Communicator& comm, const std::vector<std::string>& entries) {
  // The order of the entries matters, so the combination is not a plain xor.
  uint64_t all = 1469598103934665603ull;
  for (const std::string& e : entries) all = all * 31 + hash_string(e);
  std::vector<int64_t> hashes = comm.allgather(static_cast<int64_t>(all));
  if (std::all_of(hashes.begin(), hashes.end(), [&](int64_t h) { return h == hashes[0]; })) return std::nullopt;

  const int p = comm.size();
  const int64_t most = comm.allreduce_max(static_cast<int64_t>(entries.size()));
  // Entry hashes with the low bit set, so that 0 can mean "this rank has no such entry".
  std::vector<int64_t> mine(static_cast<size_t>(most), 0);  // (most,)
  for (size_t i = 0; i < entries.size(); ++i) mine[i] = static_cast<int64_t>(hash_string(entries[i]) | 1);
  std::vector<int64_t> every(static_cast<size_t>(p * most));  // (p, most)
  comm.allgather(mine.data(), every.data(), most, DType::i64, Device::cpu());
  int64_t first = 0;
  for (; first < most; ++first) {
    bool same = true;
    for (int q = 1; q < p; ++q) same = same && every[static_cast<size_t>(q * most + first)] == every[static_cast<size_t>(first)];
    if (!same) break;
  }
  // Lists that differ only in the low bit of one entry's hash: not worth a fourth round.
  TNT_CHECK(first < most, "ranks disagree: their lists hash differently, but no entry does");

  const size_t at = static_cast<size_t>(first);
  std::string text = at < entries.size() ? entries[at] : fmt::format("(none: this rank has {} entries)", entries.size());
  const int64_t width = comm.allreduce_max(static_cast<int64_t>(text.size()));
  std::vector<char> padded(static_cast<size_t>(width), '\0');  // (width,)
  std::copy(text.begin(), text.end(), padded.begin());
  std::vector<char> texts(static_cast<size_t>(p * width));  // (p, width)
  comm.allgather(padded.data(), texts.data(), width, DType::u8, Device::cpu());

  Disagreement d;
  d.entry = at;
  for (int q = 0; q < p; ++q) {
    const char* row = texts.data() + static_cast<size_t>(q * width);
    std::string t(row, strnlen(row, static_cast<size_t>(width)));
    auto group = std::find_if(d.groups.begin(), d.groups.end(), [&](const auto& g) { return g.first == t; });
    if (group == d.groups.end()) {
      d.groups.push_back({t, {q}});
    } else {
      group->second.push_back(q);
    }
  }
  return d;
}

void require_same_pass(Communicator& comm, const std::string& what, const std::vector<std::string>& facts) {
  if (std::optional<Disagreement> d = find_disagreement(comm, facts)) {
    raise_if_collectives_differ(comm, what);
    TNT_INPUT_ERROR("{}: the ranks' passes over their data differ ({}); every rank must pass the same dataset (as "
                    "many samples), batch size and epochs, or their steps' collectives would pair up wrongly",
                    what, d->describe());
  }
}

}  // namespace tnt::detail
