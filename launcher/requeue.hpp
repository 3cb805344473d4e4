// --requeue: a SLURM batch job that its warning signal stopped runs again.
//
// sbatch --signal=B:USR1@300 sends SIGUSR1 to the batch script five minutes before the time
// limit; tarantella passes it to the ranks, whose programs stop after the current step with
// a checkpoint of it and exit 0 (models/common/signals.hpp). With --requeue the launcher then
// puts the job back in the queue (scontrol requeue), so that it runs the same script again
// and the program, given --resume=auto, continues from that checkpoint: a run longer than
// the partition's time limit needs no resubmission by hand.
#pragma once

#include "cli.hpp"
#include "environment.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace tnt::launcher {

struct RequeueDecision {
  bool requeue = false;
  std::string job_id;   // SLURM_JOB_ID, when requeue
  std::string message;  // what to tell the user (a full line, without "tarantella: "); "" nothing
};

// Whether the job that just ended with `status` is requeued: only with --requeue, after a
// warning signal (`warned_by`: the first SIGUSR1/SIGUSR2 passed on) that stopped the
// programs, a status of 0, inside a SLURM job, and with --resume or --resume=auto (true, 1,
// yes) among the program's arguments (else the requeued run would start over). Pure: the
// environment is a value.
// `stopped`: a rank's program said it stopped training on the request (its runtime's word,
// RankReport::Kind::stop_requested); one that went on to its end is not requeued.
RequeueDecision decide_requeue(const Options& options, const Environment& env, std::optional<int> warned_by,
                               bool stopped, int status);

// `warnings` and, with --requeue, what makes a requeue impossible, said at the start rather
// than when the signal comes hours later: not a SLURM job (no SLURM_JOB_ID), or no
// --resume/--resume=auto among the program's arguments.
std::vector<std::string> with_requeue_warnings(std::vector<std::string> warnings, const Options& options,
                                               const Environment& env);

// Runs `scontrol requeue JOB_ID` (`scontrol` from PATH, or TNT_SCONTROL), for at most `limit`;
// "" when it succeeded, else why not (its output, its status, or the time it took).
std::string run_requeue(const std::string& job_id, std::chrono::seconds limit = std::chrono::seconds(60));

}  // namespace tnt::launcher
