// Where a training program's run writes its files (--model_dir), and the rules that keep
// earlier runs and unrelated files safe:
//
// - --model_dir not given: every run gets a directory of its own under the program's
//   default, <base>/run-YYYYmmdd-HHMMSS (-2, -3, ... when one of that second exists),
//   named on the master when it starts; <base>/latest is a symbolic link to the newest.
//   --resume continues the newest run under <base> that holds a checkpoint. So the
//   documented commands run in any order and none replaces another's output, as
//   TensorBoard-style tools keep one directory per run.
// - --model_dir given: that directory holds one run. An earlier run's output there is
//   refused unless the run continues it (--resume) or replaces it (--overwrite).
// - The directory is the run's alone: the master holds an flock(2) lock on
//   <dir>/.tarantella-lock for the whole run (released by the kernel when the process ends,
//   however it ends), so a second run on it is refused, naming the first one's process.
//   Nothing is written or removed through a symbolic link: an output, train/ or
//   validation/ that is a link is refused, naming it.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace tnt_models {

// How a program uses --model_dir.
struct ModelDir {
  std::string path;                  // --model_dir, or its default
  bool given = true;                 // --model_dir was given; false: `path` is the base of run directories
  std::vector<std::string> outputs;  // the files the program writes there
  bool can_resume = false;           // the program has --resume
  bool resume = false;               // ... and it was given
  bool resume_auto = false;          // --resume=auto: nothing to continue starts a new run there
  bool overwrite = false;            // --overwrite was given
  std::string checkpoint;            // which of `outputs` a restart continues from ("": none)
  std::string checkpoint_flag;       // the flag that would write one when `checkpoint` is "" (said on a restart)
};

// The directory a run writes, decided by the master and known to every rank.
struct RunDir {
  std::string path;    // <path>/history.csv, ...
  bool resume = false; // training continues from <path>/<checkpoint>: --resume, or a restart
  // The master's lock on the directory (null on other ranks): keep it until the run ends.
  std::shared_ptr<void> lock;
};

// Collective, before any training: the master (the only rank that writes files) decides the
// directory (a new run directory when --model_dir was not given), creates it, locks it and
// looks for the outputs of an earlier run in it, and every rank gets its verdict. A
// directory holding any of them is refused unless the run continues it (--resume) or
// replaces it (--overwrite: the master then removes those outputs and the TensorBoard event
// files events.out.tfevents.* in <path>/train and <path>/validation, and nothing else, so a
// run that fails early leaves no mix of old and new, and TensorBoard shows the new run
// alone). With --resume the directory must exist (nothing is created); a path that is a file
// is refused. Throws tnt::InputError on every rank alike, naming the directory and the
// choices (--resume only when `checkpoint` is there: a run stopped in its first epoch leaves
// a history.csv and nothing to resume from), when it is refused, locked by another run, holds
// a symbolic link where the run would write, cannot be created, or for --resume together
// with --overwrite.
//
// Restarts (tarantella --max-restarts): the launcher sets TNT_RUN_ID for every attempt of
// one launch and TNT_RESTART to the attempt's number. The first attempt that gets past the
// checks above marks the directory as its launch's (<path>/.tarantella-run holds the id).
// A restart of the same launch in a directory so marked continues from `checkpoint` when it
// exists (whatever --resume and --overwrite say: they were for the first attempt), and
// otherwise starts over, replacing what the failed attempt left; a restart whose first
// attempt never got that far (the directory was refused) is checked as a first attempt.
// Without --model_dir, a restart finds its first attempt's run directory by that mark.
RunDir prepare_model_dir(const ModelDir& dir);

// Collective, as soon as the flags are read: the refusals prepare_model_dir would give for
// the directory as it is now (a file, an earlier run's outputs without --resume or
// --overwrite, --resume with nothing to continue, a symbolic link), so that a program stops
// before it spends time building its model and data. It creates, locks, removes and marks
// nothing; prepare_model_dir still decides (another run's lock, a directory that cannot be
// created, anything that changed in between).
void check_model_dir_early(const ModelDir& dir);

}  // namespace tnt_models
