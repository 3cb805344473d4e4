// What JobResult says of a job that ended (job.hpp): the failure before an interrupt, the
// losses that are news, and whether a restart could help.
#include "job.hpp"

#include <fmt/format.h>

#include <csignal>

namespace tnt::launcher {

namespace {

bool stopped_by_signal(const RankReport& r) {
  return r.signaled && (r.code == SIGINT || r.code == SIGTERM || r.code == SIGHUP || r.code == SIGQUIT ||
                        r.code == SIGKILL);
}

}  // namespace

const RankReport* JobResult::failed_before_interrupt() const {
  for (size_t i = 0; i < failures_before_interrupt && i < failures.size(); ++i) {
    if (!stopped_by_signal(failures[i])) return &failures[i];
  }
  return nullptr;
}

std::vector<LostRank> JobResult::news() const {
  std::vector<LostRank> out;
  for (const Loss& l : lost) {
    if ((l.failures_before == 0 && !l.in_stop) || l.rank.kind == LostRank::Kind::unreachable) out.push_back(l.rank);
  }
  return out;
}

std::vector<LostRank> JobResult::stopped_with_job() const {
  std::vector<LostRank> out;
  for (const Loss& l : lost) {
    if (l.in_stop && l.failures_before == 0 && l.rank.kind == LostRank::Kind::lost) out.push_back(l.rank);
  }
  return out;
}

std::string restart_futility(const JobResult& result) {
  if (result.interrupted_by || result.failures.empty() || result.lost_first()) return "";
  // The watch ended the job: ranks that did not start or end in time may on another try.
  if (result.verdict && result.verdict->reason != RankWatch::Reason::teardown) return "";
  const RankReport& first = result.failures.front();
  const std::string who =
      fmt::format("rank {} (host {}, local rank {})", first.rank, first.host, first.local_rank);
  // 126 and 127: exec failed (as in a shell); 1: the step could not set the rank up (no
  // GPU where the plan has GPU ranks, a topology it cannot bind to). Either is said on the
  // rank's stderr. Anything else before a start (the step killed) may not happen again.
  const bool setup_code = !first.signaled && (first.code == 1 || first.code == 126 || first.code == 127);
  if (result.started.count(first.rank) == 0 && setup_code) {
    return fmt::format("{} could not start its program ({}), and a restart would start it the same way", who,
                       describe_status(first));
  }
  if (!first.signaled && first.code == usage_exit_code) {
    return fmt::format("{} exited with code {}, a usage error (its command line or input was refused), which a "
                       "restart would repeat", who, usage_exit_code);
  }
  return "";
}

}  // namespace tnt::launcher
