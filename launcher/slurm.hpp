// Reading a SLURM allocation from the environment of a batch script or salloc shell.
// SLURM writes node lists in its compressed form ("node[01-04,07],gpu5") and per-node task
// counts in a run-length form ("4(x2),2"); both are expanded here.
#pragma once

#include "environment.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tnt::launcher {

// "node[01-04,07],gpu5" -> node01 node02 node03 node04 node07 gpu5. Zero padding is kept
// (the width of a range's lower bound), several bracket groups multiply out
// ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2). Throws InputError.
// At most `max_nodes` names (the default: 200,000, above the largest machines' node
// counts; the fuzz harness passes a small one, so that its inputs do not spend their time
// building lists of that size).
inline constexpr size_t kMaxSlurmNodes = 200'000;
std::vector<std::string> expand_nodelist(std::string_view list, size_t max_nodes = kMaxSlurmNodes);

// "4" -> {4}; "4(x2),2" -> {4, 4, 2}, at most `max_nodes` entries (a repeat count is not an
// allocation size). `name` is the variable, for messages. Throws InputError.
std::vector<int> parse_tasks_per_node(std::string_view value, std::string_view name,
                                      size_t max_nodes = kMaxSlurmNodes);

struct SlurmAllocation {
  std::string job_id;
  std::vector<std::string> nodes;
  // One per node: SLURM_TASKS_PER_NODE (the allocation's, set in every job: "2(x3),1"),
  // else SLURM_NTASKS_PER_NODE (--ntasks-per-node); empty when neither is set.
  std::vector<int> tasks_per_node;
  std::string tasks_source;  // which of the two
};

// nullopt outside an allocation (no SLURM_JOB_ID). Throws InputError when the allocation's
// variables cannot be read.
std::optional<SlurmAllocation> slurm_allocation(const Environment& env);

}  // namespace tnt::launcher
