#include "slurm.hpp"

#include "error.hpp"
#include "text.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace tnt::launcher {

namespace {

// The largest machines have some 160,000 nodes; a list that expands beyond kMaxSlurmNodes
// (200,000) is a mistake (or an attack on the launcher's memory: "n[0-999999]x[0-999999]" is
// a few bytes).
// A host name has at most 253 characters (DNS); with the node count this bounds the memory
// an expansion may take, whatever the list's literal parts hold.
constexpr size_t kMaxNameLength = 253;

void check_name_length(size_t length, std::string_view whole) {
  if (length > kMaxNameLength) {
    throw InputError(fmt::format("SLURM node list '{}' makes a node name longer than {} characters", whole, kMaxNameLength));
  }
}

// One bracket body "01-04,07" -> {"01","02","03","04","07"}.
std::vector<std::string> expand_ranges(std::string_view body, std::string_view whole, size_t max_nodes) {
  std::vector<std::string> out;
  for (auto part : split(body, ',')) {
    auto dash = part.find('-');
    auto lo_text = part.substr(0, dash);
    auto hi_text = dash == std::string_view::npos ? lo_text : part.substr(dash + 1);
    auto lo = parse_unsigned(lo_text), hi = parse_unsigned(hi_text);
    if (!lo || !hi || *hi < *lo) {
      throw InputError(fmt::format("SLURM node list '{}': '{}' is not a number or a range lo-hi", whole, part));
    }
    if (*hi - *lo >= static_cast<decltype(*hi - *lo)>(max_nodes - out.size())) {
      throw InputError(fmt::format("SLURM node list '{}': range '{}' is too large", whole, part));
    }
    const size_t width = lo_text.size();
    // Counted, not `v <= hi`: at hi = 2^64 - 1 that condition is always true (the fuzzer's
    // 'n[18446744073709551615]' looped for good).
    const auto count = *hi - *lo;
    for (decltype(*hi - *lo) k = 0;; ++k) {
      out.push_back(fmt::format("{:0{}}", *lo + k, width));
      if (k == count) break;
    }
  }
  return out;
}

// One comma-free-at-top-level item such as "r[1-2]n[01-02]".
void expand_item(std::string_view item, std::string_view whole, size_t max_nodes, std::vector<std::string>& out) {
  std::vector<std::string> names{""};
  size_t i = 0;
  while (i < item.size()) {
    if (item[i] == '[') {
      auto close = item.find(']', i);
      if (close == std::string_view::npos) {
        throw InputError(fmt::format("SLURM node list '{}': '[' without ']'", whole));
      }
      auto values = expand_ranges(item.substr(i + 1, close - i - 1), whole, max_nodes);
      if (names.size() * values.size() + out.size() > max_nodes) {
        throw InputError(fmt::format("SLURM node list '{}' names more than {} nodes", whole, max_nodes));
      }
      std::vector<std::string> next;
      next.reserve(names.size() * values.size());
      for (const auto& n : names) {
        for (const auto& v : values) {
          check_name_length(n.size() + v.size(), whole);
          next.push_back(n + v);
        }
      }
      names = std::move(next);
      i = close + 1;
    } else if (item[i] == ']') {
      throw InputError(fmt::format("SLURM node list '{}': ']' without '['", whole));
    } else {
      auto next = item.find_first_of("[]", i);
      auto literal = item.substr(i, next == std::string_view::npos ? std::string_view::npos : next - i);
      for (auto& n : names) {
        check_name_length(n.size() + literal.size(), whole);
        n += literal;
      }
      i = next == std::string_view::npos ? item.size() : next;
    }
  }
  out.insert(out.end(), names.begin(), names.end());
}

}  // namespace

std::vector<std::string> expand_nodelist(std::string_view list, size_t max_nodes) {
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i < list.size() && list[i] == '[') ++depth;
    if (i < list.size() && list[i] == ']') --depth;
    if (depth < 0) throw InputError(fmt::format("SLURM node list '{}': ']' without '['", list));
    if (i == list.size() || (list[i] == ',' && depth == 0)) {
      auto item = trim(list.substr(start, i - start));
      if (item.empty()) throw InputError(fmt::format("SLURM node list '{}' has an empty item", list));
      expand_item(item, list, max_nodes, out);
      start = i + 1;
    }
  }
  if (depth != 0) throw InputError(fmt::format("SLURM node list '{}': '[' without ']'", list));
  return out;
}

std::vector<int> parse_tasks_per_node(std::string_view value, std::string_view name, size_t max_nodes) {
  std::vector<int> out;
  for (auto part : split(value, ',')) {
    part = trim(part);
    int repeat = 1;
    auto paren = part.find('(');
    if (paren != std::string_view::npos) {
      auto rep = part.substr(paren);
      if (rep.size() < 4 || rep.substr(0, 2) != "(x" || rep.back() != ')') {
        throw InputError(fmt::format("{}='{}': '{}' is not N or N(xM)", name, value, part));
      }
      auto m = parse_count(rep.substr(2, rep.size() - 3));
      if (!m) throw InputError(fmt::format("{}='{}': '{}' is not N or N(xM)", name, value, part));
      repeat = *m;
      part = part.substr(0, paren);
    }
    auto n = parse_count(part);
    if (!n) throw InputError(fmt::format("{}='{}': '{}' is not a positive number of tasks", name, value, part));
    if (static_cast<size_t>(repeat) > max_nodes - out.size()) {
      throw InputError(fmt::format("{}='{}' counts more than {} nodes", name, value, max_nodes));
    }
    out.insert(out.end(), static_cast<size_t>(repeat), *n);
  }
  return out;
}

std::optional<SlurmAllocation> slurm_allocation(const Environment& env) {
  auto job = lookup(env, "SLURM_JOB_ID");
  if (!job) return std::nullopt;
  SlurmAllocation a;
  a.job_id = *job;
  auto nodelist = lookup(env, "SLURM_JOB_NODELIST");
  if (!nodelist) nodelist = lookup(env, "SLURM_NODELIST");  // the name before SLURM 20
  if (!nodelist || trim(*nodelist).empty()) {
    throw InputError(fmt::format("inside SLURM job {} but SLURM_JOB_NODELIST is not set; "
                                 "give the hosts with --hostfile or -H", a.job_id));
  }
  a.nodes = expand_nodelist(trim(*nodelist));

  // SLURM_TASKS_PER_NODE is what the allocation holds, per node ("2(x3),1" for -N 4 -n 7),
  // and set in every job; SLURM_NTASKS_PER_NODE only with --ntasks-per-node, and then only
  // the most a node may get (-N 3 -n 5 --ntasks-per-node=2 gives 2, 2, 1).
  const char* name = "SLURM_TASKS_PER_NODE";
  auto tpn = lookup(env, name);
  if (!tpn || trim(*tpn).empty()) {
    name = "SLURM_NTASKS_PER_NODE";
    tpn = lookup(env, name);
  }
  if (tpn && !trim(*tpn).empty()) {
    auto counts = parse_tasks_per_node(trim(*tpn), name);
    const bool uniform = std::all_of(counts.begin(), counts.end(), [&](int c) { return c == counts.front(); });
    if (counts.size() == a.nodes.size()) {
      a.tasks_per_node = std::move(counts);
    } else if (uniform) {
      a.tasks_per_node.assign(a.nodes.size(), counts.front());
    } else {
      throw InputError(fmt::format("{}='{}' gives {} counts for {} nodes", name, *tpn, counts.size(),
                                   a.nodes.size()));
    }
    a.tasks_source = name;
  }
  return a;
}

}  // namespace tnt::launcher
