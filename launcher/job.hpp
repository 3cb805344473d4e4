// Running the mpirun command and standing by until it ends. The launcher stops the job
// exactly once when it gets SIGINT, SIGTERM, SIGHUP or SIGQUIT: mpirun stops every rank on
// one SIGTERM, but on a second signal it exits at once and leaves its ranks behind. So a
// signal that the terminal sent (Ctrl-C reaches the whole foreground process group, mpirun
// included) is not passed on again; one sent to the launcher alone is passed on as SIGTERM.
// mpirun stays in the launcher's process group so that it can still read a terminal's
// input for rank 0. If mpirun has not finished 3 s later it is killed; the ranks' own steps
// then stop their programs (rank_setup.hpp). mpirun also gets SIGTERM should the launcher
// itself die. Meanwhile the launcher collects the ranks' reports (report.hpp) and, with a
// RankWatch (rank_watch.hpp), ends the job the same way when ranks do not start, or do
// not end, in time: it never waits forever on a job that cannot finish.
#pragma once

#include "rank_watch.hpp"
#include "report.hpp"

#include <optional>
#include <string>
#include <vector>

namespace tnt::launcher {

struct JobResult {
  int mpirun_status = 0;            // as from waitpid
  std::optional<int> interrupted_by;  // SIGINT, SIGTERM, SIGHUP or SIGQUIT received by the launcher
  std::optional<RankWatch::Verdict> verdict;  // the watch ended the job (already printed)
  std::vector<RankReport> failures;  // in the order they were reported; the first failed first
};

// `server` may be null (no reports); `watch` may be null (nothing watched), and is only
// useful with a server. Throws SystemError when mpirun cannot be started.
JobResult run_job(const std::vector<std::string>& command, ReportServer* server, RankWatch* watch);

}  // namespace tnt::launcher
