// Running the mpirun command and standing by until it ends. mpirun runs in its own process
// group, so a Ctrl-C at the terminal reaches only the launcher, which then stops the job
// exactly once (SIGTERM to mpirun, which stops every rank; SIGKILL to mpirun's group
// after a grace period). mpirun also gets SIGTERM should the launcher itself die.
// Meanwhile the launcher collects the ranks' failure reports (report.hpp).
#pragma once

#include "report.hpp"

#include <optional>
#include <string>
#include <vector>

namespace tnt::launcher {

struct JobResult {
  int mpirun_status = 0;            // as from waitpid
  std::optional<int> interrupted_by;  // SIGINT, SIGTERM, SIGHUP or SIGQUIT received by the launcher
  std::vector<RankFailure> failures;  // in the order they were reported; the first failed first
};

// `server` may be null (no reports). Throws SystemError when mpirun cannot be started.
JobResult run_job(const std::vector<std::string>& command, ReportServer* server);

}  // namespace tnt::launcher
