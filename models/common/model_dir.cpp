#include "common/model_dir.hpp"

#include "common/wording.hpp"

#include <tarantella/tarantella.hpp>

#include <fmt/ranges.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace tnt_models {
namespace {

namespace fs = std::filesystem;

// The data rows of a history.csv (its lines after the header); 0 when there is none.
int64_t history_rows(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return 0;
  int64_t lines = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line != "\r") ++lines;
  }
  return std::max<int64_t>(0, lines - 1);
}

constexpr const char* kRunMarker = ".tarantella-run";
constexpr const char* kLockFile = ".tarantella-lock";
constexpr const char* kLatest = "latest";
constexpr const char* kRunPrefix = "run-";

// TNT_RESTART and TNT_RUN_ID, as the launcher set them (0 and "" outside a launch with
// --max-restarts).
int restart_number() {
  const char* text = std::getenv(tnt::env::restart);
  return text != nullptr ? std::atoi(text) : 0;
}

std::string run_id() {
  const char* text = std::getenv(tnt::env::run_id);
  return text != nullptr ? text : "";
}

// When this launch began (seconds since the epoch): the launcher's TNT_RUN_ID begins with
// it ("1795000000-<token>"); 0 where the id does not say (one set by hand).
time_t launch_time() {
  const std::string id = run_id();
  const size_t dash = id.find('-');
  if (dash == 0 || dash == std::string::npos || dash > 12) return 0;
  time_t t = 0;
  for (size_t i = 0; i < dash; ++i) {
    if (id[i] < '0' || id[i] > '9') return 0;
    t = t * 10 + (id[i] - '0');
  }
  return t;
}

// Whether `path` was modified since this launch began (unknown begin: false).
bool changed_since_launch(const fs::path& path) {
  const time_t began = launch_time();
  struct stat st {};
  return began > 0 && ::lstat(path.c_str(), &st) == 0 && st.st_mtime >= began;
}

std::string read_marker(const std::string& dir) {
  const fs::path path = fs::path(dir) / kRunMarker;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return "";
  std::ifstream in = tnt::open_regular_file(path.string(), fmt::format("--model_dir={}: run marker", dir));
  std::string id;
  std::getline(in, id);
  return id;
}

// Written as a new temporary file and renamed, so a crash leaves the old marker or the new
// one, and a link placed at a fixed temporary name is never written through.
std::string write_marker(const std::string& dir, const std::string& id) {
  try {
    tnt::write_file_atomically((fs::path(dir) / kRunMarker).string(), id + "\n",
                               fmt::format("--model_dir={}: run marker", dir));
  } catch (const tnt::InputError& e) {
    return e.what();
  }
  return "";
}

std::string remove_marker(const std::string& dir) {
  std::error_code ec;
  fs::remove(fs::path(dir) / kRunMarker, ec);
  return ec ? fmt::format("--model_dir={}: cannot remove the run marker {}: {}", dir, kRunMarker, ec.message()) : "";
}

bool is_link(const fs::path& path) {
  std::error_code ec;
  return fs::is_symlink(fs::symlink_status(path, ec));
}

// The master's lock on a run's directory: an flock(2) on <dir>/.tarantella-lock, which
// holds the owner's process id and host. The kernel drops it when the process ends, however
// it ends, so a crashed run leaves no stale lock; the file itself stays (removing it would
// let a third run lock a new file while the second still holds the old one).
class DirLock {
 public:
  explicit DirLock(int fd) : fd_(fd) {}
  ~DirLock() { ::close(fd_); }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_;
};

std::string this_host() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "this host";
  return name;
}

struct LockResult {
  std::shared_ptr<void> lock;  // null: not locked
  std::string error;           // another run holds it, or the file cannot be used
};

// "another run is using it (process N on HOST, holding <lock file>)": the owner the lock
// file's holder wrote into it.
std::string in_use_message(const std::string& dir, const std::string& path, int fd) {
  char text[512] = {};
  const ssize_t n = ::pread(fd, text, sizeof(text) - 1, 0);
  std::string owner = n > 0 ? std::string(text, static_cast<size_t>(n)) : std::string();
  while (!owner.empty() && (owner.back() == '\n' || owner.back() == ' ')) owner.pop_back();
  const size_t space = owner.find(' ');
  const std::string who = owner.empty() ? std::string("another process")
                          : space == std::string::npos
                              ? fmt::format("process {}", owner)
                              : fmt::format("process {} on {}", owner.substr(0, space), owner.substr(space + 1));
  return fmt::format("--model_dir={}: another run is using it ({}, holding {}); two runs in one directory would mix "
                     "their files: wait for it to end, or choose another --model_dir",
                     dir, who, path);
}

// Whether a run holds the directory's lock now, without taking it or writing anything (a
// dry check, or one before the lock file may be made): its message, or "".
std::string held_by_another(const std::string& dir) {
  const std::string path = (fs::path(dir) / kLockFile).string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return "";
  std::string message;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) message = in_use_message(dir, path, fd);
  ::close(fd);  // a shared lock taken here goes with it
  return message;
}

LockResult lock_dir(const std::string& dir) {
  const std::string path = (fs::path(dir) / kLockFile).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    if (errno == ELOOP) {
      return {nullptr, fmt::format("--model_dir={}: {} is a symbolic link; a run writes nothing through a link "
                                   "in its directory: remove it, or choose another --model_dir",
                                   dir, path)};
    }
    return {nullptr, fmt::format("--model_dir={}: cannot create its lock file {}: {}", dir, path, std::strerror(errno))};
  }
  // A restart of tarantella --max-restarts starts once the failed attempt's job has ended,
  // but its master may take a moment longer to be gone from the process table of a loaded
  // host: a restart waits up to 10 s for it to let go.
  const int tries = restart_number() > 0 ? 50 : 1;
  int locked = -1;
  for (int i = 0; i < tries; ++i) {
    locked = ::flock(fd, LOCK_EX | LOCK_NB);
    if (locked == 0 || errno != EWOULDBLOCK || i + 1 == tries) break;
    ::usleep(200 * 1000);
  }
  if (locked != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      std::string message = in_use_message(dir, path, fd);
      ::close(fd);
      return {nullptr, message};
    }
    // A file system without flock (some network mounts): the run goes on unguarded.
    ::close(fd);
    tnt::log_warning("--model_dir={}: cannot lock {} ({}): a second run started there at the same time would not "
                     "be noticed",
                     dir, path, std::strerror(err));
    return {};
  }
  const std::string owner = fmt::format("{} {}\n", ::getpid(), this_host());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, owner.data(), owner.size(), 0) != static_cast<ssize_t>(owner.size())) {
    tnt::log_warning("--model_dir={}: cannot write the owner into {}: {}", dir, path, std::strerror(errno));
  }
  return {std::make_shared<DirLock>(fd), ""};
}

// The TensorBoard event files a program's run left (TensorBoard callback: events.out.tfevents.*
// in <model_dir>/train and <model_dir>/validation), relative to the directory. Nothing else
// there is the program's: other files stay. train/ and validation/ that are symbolic links
// were refused before (check_links), and an entry is removed, never followed.
std::vector<std::string> event_files(const std::string& path) {
  std::vector<std::string> files;
  for (const char* sub : {"train", "validation"}) {
    std::error_code ec;
    if (!fs::is_directory(fs::symlink_status(fs::path(path) / sub, ec))) continue;
    for (fs::directory_iterator it(fs::path(path) / sub, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind("events.out.tfevents.", 0) == 0 && fs::is_regular_file(it->symlink_status(ec))) {
        files.push_back(std::string(sub) + "/" + name);
      }
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Removes the outputs found and the earlier run's TensorBoard event files, so that a run
// started again shows in TensorBoard alone.
std::string remove_outputs(const std::string& path, const std::vector<std::string>& found, const char* why) {
  std::vector<std::string> names = found;
  for (std::string& name : event_files(path)) names.push_back(std::move(name));
  std::error_code ec;
  for (const std::string& name : names) {
    fs::remove(fs::path(path) / name, ec);
    if (ec) return fmt::format("{}: cannot remove {}/{}: {}", why, path, name, ec.message());
  }
  return "";
}

// A run writes (and --overwrite removes) only inside its directory: an output, or the
// TensorBoard directories, that is a symbolic link would take that out of it (a link to
// another directory, or a dangling one that a write would create somewhere else).
std::string check_links(const std::string& path, const std::vector<std::string>& outputs) {
  std::vector<std::string> names = outputs;
  for (const char* name : {"train", "validation", kRunMarker}) names.emplace_back(name);
  for (const std::string& name : names) {
    const fs::path p = fs::path(path) / name;
    if (!is_link(p)) continue;
    std::error_code ec;
    const fs::path target = fs::read_symlink(p, ec);
    return fmt::format("--model_dir={}: {} is a symbolic link (to {}); a run writes and removes files only inside its "
                       "directory, never through a link: remove the link, or choose another --model_dir",
                       path, p.string(), ec ? std::string("?") : target.string());
  }
  return "";
}

// "run-20260101-120000" and "run-20260101-120000-3": (time, number) to order them by; false
// for other names.
bool run_key(const std::string& name, std::string& time, long& number) {
  if (name.rfind(kRunPrefix, 0) != 0) return false;
  const std::string rest = name.substr(std::strlen(kRunPrefix));
  if (rest.size() < 15 || rest[8] != '-') return false;
  time = rest.substr(0, 15);
  number = 1;
  if (rest.size() > 15) {
    if (rest[15] != '-' || rest.size() == 16) return false;
    char* end = nullptr;
    number = std::strtol(rest.c_str() + 16, &end, 10);
    if (*end != '\0') return false;
  }
  return true;
}

// The run directories under `base`, oldest first.
std::vector<std::string> run_dirs(const std::string& base) {
  std::vector<std::pair<std::pair<std::string, long>, std::string>> runs;
  std::error_code ec;
  for (fs::directory_iterator it(base, ec), end; !ec && it != end; it.increment(ec)) {
    std::string time;
    long number = 0;
    const std::string name = it->path().filename().string();
    if (run_key(name, time, number) && fs::is_directory(it->symlink_status(ec))) {
      runs.push_back({{time, number}, (fs::path(base) / name).string()});
    }
  }
  std::sort(runs.begin(), runs.end());
  std::vector<std::string> paths;
  for (auto& r : runs) paths.push_back(std::move(r.second));
  return paths;
}

// Points <base>/latest at `name`: a new link renamed over the old one, so a reader sees the
// old or the new. A `latest` that is not a link (the user's own file) is left alone.
void point_latest(const std::string& base, const std::string& name) {
  const fs::path latest = fs::path(base) / kLatest;
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(latest, ec);
  if (fs::exists(st) && !fs::is_symlink(st)) {
    tnt::log_warning("{} is not a symbolic link: not pointing it at the new run {}", latest.string(), name);
    return;
  }
  const fs::path tmp = fs::path(base) / fmt::format(".latest.{}", ::getpid());
  fs::remove(tmp, ec);
  fs::create_directory_symlink(name, tmp, ec);
  if (!ec) fs::rename(tmp, latest, ec);
  if (ec) {
    fs::remove(tmp, ec);
    tnt::log_warning("cannot point {} at {}", latest.string(), name);
  }
}

// A new directory <base>/run-YYYYmmdd-HHMMSS[-N] (mkdir is atomic, so two runs started in
// the same second get different ones).
std::string new_run_dir(const std::string& base, std::string& error) {
  std::error_code ec;
  fs::create_directories(base, ec);
  if (ec || !fs::is_directory(base, ec)) {
    error = fmt::format("--model_dir not given, and its default {} cannot be made a directory: {}", base,
                        ec ? ec.message() : std::string("it is a file"));
    return "";
  }
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm local{};
  ::localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &local);
  for (int n = 1; n < 1000; ++n) {
    const std::string name = n == 1 ? fmt::format("{}{}", kRunPrefix, stamp) : fmt::format("{}{}-{}", kRunPrefix, stamp, n);
    const std::string path = (fs::path(base) / name).string();
    if (::mkdir(path.c_str(), 0777) == 0) {
      point_latest(base, name);
      return path;
    }
    if (errno != EEXIST) {
      error = fmt::format("--model_dir not given: cannot create the run directory {}: {}", path, std::strerror(errno));
      return "";
    }
  }
  error = fmt::format("--model_dir not given: {} holds 999 runs of this second already", base);
  return "";
}

struct Verdict {
  Verdict() = default;
  Verdict(std::string e, bool r = false, std::string p = "", std::string n = "")  // NOLINT: {error} reads well
      : error(std::move(e)), resume(r), path(std::move(p)), note(std::move(n)) {}
  std::string error;  // "" when training may go ahead
  bool resume = false;
  std::string path;   // the run's directory
  std::string note;   // what the master says about the directory ("" = nothing)
};

// Where a run without --model_dir goes: a new run directory, or, for --resume, the newest
// run with a checkpoint, or, for a restart, the directory its first attempt marked. A dry
// run (check_model_dir_early) makes no new directory: its verdict has no path then.
Verdict choose_run_dir(const ModelDir& dir, bool dry) {
  const std::string id = run_id();
  if (restart_number() > 0 && !id.empty()) {
    for (const std::string& path : run_dirs(dir.path)) {
      if (read_marker(path) == id) return {"", false, path, ""};
    }
  }
  if (dir.resume) {
    const std::vector<std::string> runs = run_dirs(dir.path);
    for (auto it = runs.rbegin(); it != runs.rend(); ++it) {
      std::error_code ec;
      if (fs::exists(fs::path(*it) / dir.checkpoint, ec)) {
        return {"", false, *it,
                fmt::format("--resume without --model_dir: continuing {} (the newest run under {} with a checkpoint)",
                            *it, dir.path)};
      }
    }
    // A run of a version that wrote into the default directory itself.
    std::error_code ec;
    if (!dir.checkpoint.empty() && fs::exists(fs::path(dir.path) / dir.checkpoint, ec)) {
      return {"", false, dir.path, fmt::format("--resume without --model_dir: continuing the run in {}", dir.path)};
    }
    if (!dir.resume_auto) {
      return {fmt::format("--resume without --model_dir: no run under {} has a checkpoint ({}) to continue; give "
                          "--model_dir=DIR of the run to continue, or leave out --resume to start a new one",
                          dir.path, dir.checkpoint.empty() ? std::string("none is written") : dir.checkpoint)};
    }
  }
  Verdict v;
  if (dry) return v;
  v.path = new_run_dir(dir.path, v.error);
  if (v.error.empty()) {
    std::error_code ec;  // "latest is the newest" only where it points at this run (not a file of the user's)
    const fs::path latest = fs::path(dir.path) / kLatest;
    const bool pointed = fs::is_symlink(fs::symlink_status(latest, ec)) &&
                         fs::read_symlink(latest, ec) == fs::path(v.path).filename();
    v.note = fmt::format("Writing to {} (a new directory for each run without --model_dir{})", v.path,
                         pointed ? fmt::format("; {}/{} is the newest", dir.path, kLatest) : std::string());
    if (dir.resume_auto) {
      v.note = fmt::format("--resume=auto without --model_dir: no run under {} has a checkpoint to continue, so a "
                           "new one starts\n{}",
                           dir.path, v.note);
    }
  }
  return v;
}

// The master's verdict on the directory `path` (--model_dir, or the run directory chosen).
// A dry run creates, locks, removes and marks nothing: it gives the refusals that the
// directory's state gives now (another run's lock is left to the real check).
Verdict check_model_dir_on_master(const ModelDir& dir, const std::string& path, std::shared_ptr<void>& lock,
                                  bool dry) {
  std::error_code ec;
  const bool exists = fs::exists(path, ec);
  if (exists && !fs::is_directory(path, ec)) {
    return {fmt::format("--model_dir={}: is a file, expected a directory", path)};
  }
  // A run to continue must be there: a misspelt --model_dir is named, not created empty.
  // (A restart of tarantella --max-restarts gets here too: its directory exists, or its
  // first attempt never got past this check.)
  if (!exists && dir.resume && !dir.resume_auto) {
    return {fmt::format("--model_dir={}: no such directory, so no run to continue (--resume); give the directory "
                        "of the earlier run, or leave out --resume to start one there",
                        path)};
  }
  // Nor is a directory without its checkpoint made the run's (before: refused later, with a
  // lock file left in a directory of the user's). A restart finds its own state below.
  if (exists && dir.resume && !dir.resume_auto && restart_number() == 0 && !dir.checkpoint.empty() &&
      !fs::exists(fs::path(path) / dir.checkpoint, ec)) {
    // A run using the directory (an --overwrite that has just removed the checkpoint) is
    // what to say then; no lock file is made or written here.
    if (std::string held = held_by_another(path); !held.empty()) return {held};
    return {fmt::format("--resume: no checkpoint at {}, so no run to continue there; give the directory of the "
                        "earlier run, or --resume=auto to start a new one there when it holds none",
                        (fs::path(path) / dir.checkpoint).string())};
  }
  if (dry && !exists) return {};
  if (!dry) {
    fs::create_directories(path, ec);
    if (ec) {
      // A link to nowhere "exists" to mkdir: name where it points instead of EEXIST.
      std::error_code lec;
      if (fs::is_symlink(fs::symlink_status(path, lec)) && !fs::exists(path, lec)) {
        return {fmt::format("--model_dir={}: a symbolic link to {}, which does not exist; create that directory, or "
                            "give another --model_dir",
                            path, fs::read_symlink(path, lec).string())};
      }
      return {fmt::format("--model_dir={}: cannot create it: {}", path, ec.message())};
    }
    // Locked before anything is looked at: two runs started together cannot both find the
    // directory free.
    LockResult locked = lock_dir(path);
    if (!locked.error.empty()) return {locked.error};
    lock = locked.lock;
  }
  if (std::string e = check_links(path, dir.outputs); !e.empty()) return {e};
  std::vector<std::string> found;
  for (const std::string& name : dir.outputs) {
    if (fs::exists(fs::path(path) / name, ec)) found.push_back(name);
  }
  const std::string id = run_id();
  if (restart_number() > 0 && !id.empty() && read_marker(path) == id) {
    // A restart of this launch, in the directory its first attempt took.
    if (dry) return {};
    if (!dir.checkpoint.empty() && fs::exists(fs::path(path) / dir.checkpoint, ec)) return {"", true, path};
    // Said, not done silently: the launcher's "succeeded after 1 restart" would otherwise
    // hide that the first attempt's epochs were trained again.
    const std::string why = dir.checkpoint.empty()
                                ? "this run writes no checkpoint" +
                                      (dir.checkpoint_flag.empty() ? std::string() : " (" + dir.checkpoint_flag + ")")
                                : "the first attempt ended before its first checkpoint";
    return {remove_outputs(path, found, "restart"), false, path,
            fmt::format("Restart {} (TNT_RESTART): {}, so training starts over in {}", restart_number(), why, path)};
  }
  if (restart_number() > 0 && !id.empty()) {
    // Not this launch's any more: another run took the directory after this launch began
    // (by hand, with --overwrite or --resume, or a launch of its own), as a marker of
    // another launch or outputs written since then say. Continuing its checkpoint or
    // applying the first attempt's --overwrite would take over or destroy that run's work.
    // What is older than the launch was there before it: the first attempt ended before it
    // marked the directory (a lost node while resnet50 scanned its data), and the restart
    // is checked as the first attempt was.
    const std::string marker = read_marker(path);
    const bool marked_since = !marker.empty() && changed_since_launch(fs::path(path) / kRunMarker);
    const bool written_since = marker.empty() && std::any_of(found.begin(), found.end(), [&](const std::string& f) {
                                 return changed_since_launch(fs::path(path) / f);
                               });
    if (marked_since || written_since) {
      return {fmt::format("--model_dir={}: restart {} (TNT_RESTART) of this launch finds the directory taken by "
                          "another run since its first attempt ({}), so it neither continues nor replaces that run; "
                          "give the job its own --model_dir",
                          path, restart_number(),
                          marker.empty() ? fmt::format("a run without --max-restarts wrote {}", fmt::join(found, ", "))
                                         : std::string("another launch marked it"))};
    }
  }
  if (dir.resume_auto) {
    // Nothing to continue is no error: a new run starts here, and what a run without a
    // checkpoint left (one that failed in its first epoch) is replaced, as a restart does.
    const bool has_checkpoint = !dir.checkpoint.empty() && fs::exists(fs::path(path) / dir.checkpoint, ec);
    if (!has_checkpoint) {
      // A history of two rows or more is a run that had a checkpoint: an epoch's row is
      // written before its checkpoint, so a run stopped between the two in its first epoch
      // leaves one row and none. That checkpoint was removed (to save space, say), and
      // replacing the run would lose its history and final model without a word.
      if (const int64_t rows = history_rows(fs::path(path) / "history.csv"); rows >= 2) {
        return {fmt::format("--resume=auto: {} has no checkpoint to continue, but its history.csv records {}: the "
                            "run's checkpoint was removed, and a new run would replace what it left ({}); give "
                            "--overwrite to start over, or choose another --model_dir",
                            path, count_of(rows, "epoch"), fmt::join(found, ", "))};
      }
      if (dry) return {};
      if (std::string e = remove_outputs(path, found, "--resume=auto"); !e.empty()) return {e};
      if (std::string e = id.empty() ? remove_marker(path) : write_marker(path, id); !e.empty()) return {e};
      return {"", false, path,
              fmt::format("--resume=auto: {} has no checkpoint to continue{}, so a new run starts there", path,
                          found.empty() ? std::string() : " (what a run without one left there is replaced)")};
    }
  }
  if (!found.empty() && !dir.resume && !dir.overwrite) {
    // A run stopped before its first checkpoint (interrupted in epoch 1) leaves a history
    // but nothing to continue from: --resume would only fail there.
    const bool resumable =
        dir.can_resume && !dir.checkpoint.empty() && std::find(found.begin(), found.end(), dir.checkpoint) != found.end();
    if (dir.can_resume && !resumable) {
      return {fmt::format("--model_dir={} holds an earlier run's {} but no checkpoint to resume from ({}): give "
                          "--overwrite to replace it, or choose another --model_dir",
                          path, fmt::join(found, ", "), dir.checkpoint.empty() ? "none is written" : dir.checkpoint)};
    }
    return {fmt::format("--model_dir={} already holds the output of an earlier run ({}): give {}--overwrite to replace "
                        "it, or choose another --model_dir",
                        path, fmt::join(found, ", "),
                        dir.can_resume ? "--resume to continue training from its checkpoint, " : "")};
  }
  if (dry) return {};
  if (dir.overwrite) {
    if (std::string e = remove_outputs(path, found, "--overwrite"); !e.empty()) return {e};
  }
  // This launch's from now on: its restarts continue here. A run without restarts takes it
  // as well: an earlier launch's marker goes, so that launch's restart cannot continue this
  // run's checkpoint as its own.
  if (std::string e = id.empty() ? remove_marker(path) : write_marker(path, id); !e.empty()) return {e};
  return {"", dir.resume, path};
}

Verdict decide_on_master(const ModelDir& dir, std::shared_ptr<void>& lock, bool dry) {
  if (dir.given) return check_model_dir_on_master(dir, dir.path, lock, dry);
  Verdict chosen = choose_run_dir(dir, dry);
  if (!chosen.error.empty() || chosen.path.empty()) return chosen;
  Verdict v = check_model_dir_on_master(dir, chosen.path, lock, dry);
  if (!chosen.note.empty()) v.note = v.note.empty() ? chosen.note : chosen.note + "\n" + v.note;
  return v;
}

}  // namespace

namespace {

void check_flags(const ModelDir& dir) {
  TNT_INPUT_CHECK(!dir.path.empty(), "--model_dir is empty: give the directory of the run (a shell variable "
                                     "that was not set?), or leave the flag out for a new directory under the default");
  TNT_INPUT_CHECK(!(dir.resume && dir.overwrite),
                  "--resume and --overwrite: give one of them (--resume continues the run in --model_dir={}, "
                  "--overwrite replaces it)",
                  dir.path);
}

// Only the master sees the directory for sure (other hosts may not share its file system),
// so it decides and the ranks learn its verdict: all of them stop, or none.
Verdict decide(const ModelDir& dir, std::shared_ptr<void>& lock, bool dry) {
  Verdict verdict = tnt::is_master_rank() ? decide_on_master(dir, lock, dry) : Verdict{};
  tnt::communicator().broadcast(verdict.error, tnt::master_rank());
  if (!verdict.error.empty()) throw tnt::InputError(verdict.error);
  return verdict;
}

}  // namespace

void check_model_dir_early(const ModelDir& dir) {
  check_flags(dir);
  std::shared_ptr<void> no_lock;
  decide(dir, no_lock, true);
}

RunDir prepare_model_dir(const ModelDir& dir) {
  check_flags(dir);
  RunDir run;
  Verdict verdict = decide(dir, run.lock, false);
  tnt::communicator().broadcast(verdict.path, tnt::master_rank());
  int64_t resume = verdict.resume ? 1 : 0;
  tnt::communicator().broadcast(&resume, 1, tnt::DType::i64, tnt::Device::cpu(), tnt::master_rank());
  if (!verdict.note.empty()) tnt::print("{}", verdict.note);
  if (resume != 0 && !dir.resume) {
    tnt::print("Restart {} (TNT_RESTART): continuing from {}/{}", restart_number(), verdict.path, dir.checkpoint);
  }
  run.path = verdict.path;
  run.resume = resume != 0;
  return run;
}

}  // namespace tnt_models
