#include "comm/rank_positions.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

namespace tnt::detail {

namespace {
// Tabs and newlines separate the wire form's fields and lines.
std::string one_field(std::string text) {
  std::replace_if(text.begin(), text.end(), [](char ch) { return ch == '\t' || ch == '\n' || ch == '\r'; }, ' ');
  return text;
}
}  // namespace

const OpRecord* RankPosition::at(int64_t seq) const {
  for (const OpRecord& r : recent) {
    if (r.seq == seq) return &r;
  }
  return nullptr;
}

std::string RankPosition::str() const {
  if (!answered) return "did not answer";
  auto named = [&](int64_t seq) {
    const OpRecord* r = at(seq);
    return r ? fmt::format("#{} {}", seq, r->text) : fmt::format("#{}", seq);
  };
  if (inside()) return "in " + named(entered);
  if (finished) {
    return done == 0 ? "finished its program (in tnt::finalize), no collective called"
                     : fmt::format("finished its program (in tnt::finalize; last collective: {})", named(done));
  }
  if (done == 0) return "in no collective (none entered yet)";
  return fmt::format("in no collective (last finished: {})", named(done));
}

std::string encode(const RankPosition& position) {
  std::string out = fmt::format("{} {} {}\n", position.entered, position.done, position.finished ? 1 : 0);
  for (const OpRecord& r : position.recent) out += fmt::format("{}\t{}\t{}\n", r.seq, one_field(r.key), one_field(r.text));
  return out + ".\n";  // the end: an answer cut short (a send given up) does not decode
}

bool decode(const std::string& text, RankPosition& out) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line)) return false;
  long long entered = -1, done = -1;
  int finished = -1;
  char extra = 0;
  if (std::sscanf(line.c_str(), "%lld %lld %d %c", &entered, &done, &finished, &extra) != 3 || entered < 0 ||
      done < 0 || (finished != 0 && finished != 1)) {
    return false;
  }
  RankPosition p;
  p.answered = true;
  p.entered = entered;
  p.done = done;
  p.finished = finished == 1;
  bool ended = false;
  while (!ended && std::getline(in, line)) {
    if (line == ".") {
      ended = true;
      continue;
    }
    const size_t a = line.find('\t');
    const size_t b = a == std::string::npos ? a : line.find('\t', a + 1);
    if (b == std::string::npos) return false;
    OpRecord r;
    try {
      size_t used = 0;
      r.seq = std::stoll(line.substr(0, a), &used);
      if (used != a || r.seq <= 0) return false;
    } catch (const std::exception&) {
      return false;
    }
    r.key = line.substr(a + 1, b - a - 1);
    r.text = line.substr(b + 1);
    p.recent.push_back(std::move(r));
  }
  if (!ended || std::getline(in, line)) return false;
  out = std::move(p);
  return true;
}

std::optional<Mismatch> find_mismatch(const std::vector<RankPosition>& ranks) {
  // seq -> key -> (text, ranks); std::map keeps the numbers ascending, so the first
  // disagreement found is the earliest one any two ranks remember.
  std::map<int64_t, std::vector<std::pair<std::string, std::pair<std::string, std::vector<int>>>>> calls;
  for (int q = 0; q < static_cast<int>(ranks.size()); ++q) {
    if (!ranks[static_cast<size_t>(q)].answered) continue;
    for (const OpRecord& r : ranks[static_cast<size_t>(q)].recent) {
      auto& at = calls[r.seq];
      auto it = std::find_if(at.begin(), at.end(), [&](const auto& k) { return k.first == r.key; });
      if (it == at.end()) it = at.insert(at.end(), {r.key, {r.text, {}}});
      it->second.second.push_back(q);
    }
  }
  for (const auto& [seq, keys] : calls) {
    if (keys.size() < 2) continue;
    Mismatch m;
    m.seq = seq;
    for (const auto& k : keys) m.groups.push_back(k.second);
    std::sort(m.groups.begin(), m.groups.end(), [](const auto& a, const auto& b) { return a.second[0] < b.second[0]; });
    return m;
  }
  return std::nullopt;
}

std::vector<int> finished_before(const std::vector<RankPosition>& ranks, int64_t seq) {
  std::vector<int> out;
  for (int q = 0; q < static_cast<int>(ranks.size()); ++q) {
    const RankPosition& p = ranks[static_cast<size_t>(q)];
    if (p.answered && p.finished && p.entered < seq) out.push_back(q);
  }
  return out;
}

std::string describe_positions(const std::vector<RankPosition>& ranks, const RankListFormat& format) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // in order of the lowest rank
  for (int q = 0; q < static_cast<int>(ranks.size()); ++q) {
    const std::string where = ranks[static_cast<size_t>(q)].str();
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == where; });
    if (it == groups.end()) it = groups.insert(groups.end(), {where, {}});
    it->second.push_back(q);
  }
  std::string out;
  for (const auto& [where, list] : groups) out += fmt::format("{}rank(s) {}: {}", out.empty() ? "" : "; ", format(list), where);
  return out;
}

std::string describe_mismatch(const Mismatch& m, const RankListFormat& format) {
  std::string out = fmt::format("as collective #{}, ", m.seq);
  for (size_t i = 0; i < m.groups.size(); ++i) {
    const char* sep = i == 0 ? "" : (i + 1 == m.groups.size() ? " and " : ", ");
    out += fmt::format("{}rank(s) {} called {}", sep, format(m.groups[i].second), m.groups[i].first);
  }
  return out;
}

}  // namespace tnt::detail
