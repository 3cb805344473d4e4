// The timeline recorder (io/timeline.hpp, tarantella/timeline.hpp).
//
// Events are buffered per rank under a mutex (the compute and the communication thread both
// add) and formatted when the window moves on to the next step: each line of the part file
// is one event followed by a comma, after a first line "[", which is the form of Chrome's
// JSON array format that is still valid without its closing bracket. The merge gathers the
// same lines by broadcast from every rank (the parts may sit on other hosts' disks).
#include "io/timeline.hpp"

#include "core/context.hpp"
#include "io/temp_files.hpp"
#include "io/timeline_gpu.hpp"
#include "tarantella/check.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"
#include "tarantella/timeline.hpp"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>

namespace tnt {
namespace timeline {

namespace {

constexpr int kClockRounds = 16;

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

// Which clock this process's steady clock is: processes on one booted machine read one
// CLOCK_MONOTONIC (libstdc++'s steady clock) unless a time namespace moves it, so the boot id
// and the time namespace name it. 0 where the boot id cannot be read (not Linux): unknown.
int64_t clock_identity() {
  std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f == nullptr) return 0;
  char boot[64] = {};
  const size_t n = std::fread(boot, 1, sizeof(boot) - 1, f);
  std::fclose(f);
  if (n == 0) return 0;
  std::string key(boot, n);
  char ns[64] = {};
  const ssize_t m = ::readlink("/proc/self/ns/time", ns, sizeof(ns) - 1);  // absent before Linux 5.6
  if (m > 0) key.append(ns, static_cast<size_t>(m));
  uint64_t h = 1469598103934665603ull;  // FNV-1a: a clash of two machines' keys is 2^-64
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h | 1);  // never 0, which means unknown
}

const char* lane_name(Lane lane) {
  switch (lane) {
    case Lane::compute: return "compute";
    case Lane::communication: return "communication";
    case Lane::gpu_compute: return "GPU compute";
    case Lane::gpu_comm: return "GPU comm";
  }
  return "?";
}

std::string thread_name(int rank, Lane lane) {
  return fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":"{}"}}}},)"
                     "\n",
                     rank, static_cast<int>(lane), lane_name(lane));
}

std::string metadata(int rank, const std::string& host) {
  std::string out;
  out += fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"tid":0,"args":{{"name":"rank {} on {}"}}}},)"
                     "\n",
                     rank, rank, escape(host));
  out += fmt::format(R"({{"name":"process_sort_index","ph":"M","pid":{},"tid":0,"args":{{"sort_index":{}}}}},)"
                     "\n",
                     rank, rank);
  for (Lane lane : {Lane::compute, Lane::communication}) out += thread_name(rank, lane);
  return out;
}

// Every rank learns whether every rank managed; the ranks that did not name themselves.
void agree_or_throw(Communicator& comm, const std::string& my_error, const std::string& what) {
  std::vector<int64_t> failed = comm.allgather(int64_t{my_error.empty() ? 0 : 1});
  std::string ranks;
  for (size_t q = 0; q < failed.size(); ++q) {
    if (failed[q]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
  }
  if (ranks.empty()) return;
  if (!my_error.empty()) TNT_INPUT_ERROR("{}", my_error);
  TNT_INPUT_ERROR("{}: failed on rank(s) {}", what, ranks);
}

// A rank's part, opened for writing and locked (flock) while this process writes it:
// another job given the same trace path finds it locked and is refused, rather than
// truncating this one's part (the lock is taken before the file is emptied). A part left by
// a run that ended holds no lock and is replaced. nullptr with errno set; *busy: locked.
std::FILE* open_part(const std::string& path, bool* busy) {
  *busy = false;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return nullptr;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    ::close(fd);
    *busy = true;
    errno = EWOULDBLOCK;
    return nullptr;
  }
  // Another error (a file system without flock, some network mounts): written unlocked.
  std::FILE* f = ::ftruncate(fd, 0) == 0 ? ::fdopen(fd, "w") : nullptr;
  if (f == nullptr) {
    const int err = errno;
    ::close(fd);
    errno = err;
  }
  return f;
}

}  // namespace

Recorder::Recorder(Communicator& comm, std::string path, int64_t first_step, int64_t last_step, Origin origin)
    : path_(std::move(path)), first_step_(first_step), last_step_(last_step), origin_(std::move(origin)) {
  rank_ = comm.rank();
  size_ = comm.size();
  host_ = host_name();
  part_path_ = fmt::format("{}.rank{}", path_, rank_);

  // A directory would fail only at the merge, after training, with the parts left beside it.
  // Any rank that sees one (or a path ending in '/') stops every rank, before anything is
  // written; the message is the same everywhere.
  // A device or FIFO (/dev/stdout) is refused too: the merge's rename would replace it.
  {
    std::error_code ec;
    const auto st = std::filesystem::status(path_, ec);
    const bool directory = path_.back() == '/' || std::filesystem::is_directory(st);
    const bool special = std::filesystem::exists(st) && !directory && !std::filesystem::is_regular_file(st);
    const std::vector<int64_t> seen = comm.allgather(int64_t{directory ? 1 : special ? 2 : 0});
    const bool any_directory = std::find(seen.begin(), seen.end(), 1) != seen.end();
    if (!any_directory && std::find(seen.begin(), seen.end(), 2) != seen.end()) {
      TNT_INPUT_ERROR("timeline: {} is not a regular file (a device, FIFO or socket); the trace is written "
                      "beside it and renamed into place: give a file's path (nothing recorded, nothing written)",
                      origin_.path_text.empty() ? fmt::format("'{}'", path_) : origin_.path_text);
    }
    if (any_directory) {
      const std::filesystem::path dir(path_);
      TNT_INPUT_ERROR("timeline: {} names a directory; the trace is one file: give a file name, such as '{}' "
                      "(nothing recorded, nothing written)",
                      origin_.path_text.empty() ? fmt::format("'{}'", path_) : origin_.path_text,
                      ((dir.has_filename() ? dir : dir.parent_path()) / "trace.json").string());
    }
  }

  // Clock offset to rank 0 (see tarantella/timeline.hpp). A rank that reads rank 0's own
  // clock has offset 0, exactly. The others take the largest of the samples, each a lower
  // bound of the true offset, off by the smallest broadcast latency seen: 0.3 us on an idle
  // machine, but over 0.4 ms on a loaded one, which put the two ranks of one host's
  // allreduce apart in the trace.
  // The barrier first: a rank still on its way to the broadcast would receive late and
  // give a loose bound (rank 0 sends without waiting for the receivers).
  const std::vector<int64_t> clocks = comm.allgather(clock_identity());
  const int64_t master_clock = clocks[static_cast<size_t>(Communicator::master_rank())];
  auto shares_master_clock = [&](int64_t c) { return c != 0 && c == master_clock; };
  const bool one_clock = std::all_of(clocks.begin(), clocks.end(), shares_master_clock);
  double best = -1e300;
  for (int k = 0; k < (one_clock ? 0 : kClockRounds); ++k) {
    comm.barrier();
    double t = detail::now_s();
    comm.broadcast(&t, 1, DType::f64, Device::cpu(), Communicator::master_rank());
    best = std::max(best, t - detail::now_s());
  }
  const bool exact = rank_ == Communicator::master_rank() || shares_master_clock(clocks[static_cast<size_t>(rank_)]);
  offset_s_ = exact ? 0.0 : best;
  offsets_ns_ = comm.allgather(static_cast<int64_t>(std::llround(offset_s_ * 1e9)));
  double time0 = detail::now_s();
  comm.broadcast(&time0, 1, DType::f64, Device::cpu(), Communicator::master_rank());
  origin_s_ = time0;
  log_debug("timeline: rank {} clock offset to rank 0: {:.1f} us", rank_, offset_s_ * 1e6);

  // The master must be able to write beside path (it writes path at the end); another rank
  // whose host does not have that directory (no shared file system) keeps its events in
  // memory only: the merge gathers them through MPI.
  std::string error;
  events_ = metadata(rank_, host_);
  bool busy = false;
  part_ = open_part(part_path_, &busy);
  if (part_ && (std::fputs("[\n", part_) < 0 || std::fputs(events_.c_str(), part_) < 0 || std::fflush(part_) != 0)) {
    const int saved = errno;
    remove_part();  // a full disk: no empty part is left behind
    errno = saved;
  }
  if (busy) {
    error = fmt::format("timeline '{}': another job is writing this trace now (its part '{}' is locked by a running "
                        "process); give each job its own --timeline path",
                        path_, part_path_);
  } else if (!part_) {
    const std::string why = fmt::format("timeline: cannot write '{}' (rank {}'s part of '{}'): {}", part_path_, rank_,
                                        path_, std::strerror(errno));
    if (rank_ == Communicator::master_rank()) {
      error = why;
    } else {
      log_warning("{}; its events are kept in memory until the merge", why);
      part_failed_ = true;
    }
  }
  try {
    agree_or_throw(comm, error, fmt::format("timeline '{}': the master cannot write there", path_));
  } catch (...) {  // refused: no destructor runs, so this rank's part goes here
    remove_part();
    throw;
  }
}

void Recorder::remove_part() {
  if (!part_) return;
  std::remove(part_path_.c_str());  // while this rank holds its lock
  std::fclose(part_);
  part_ = nullptr;
}

Recorder::~Recorder() {
  // A part holding nothing that the trace lacks (no step of the window recorded, or all of
  // it merged) is removed; one with unmerged events stays: a run that ended early keeps them.
  // Only a part this rank holds, removed before its lock goes with the close: another
  // job's (locked by it) stays.
  if (part_ && !unmerged_) std::remove(part_path_.c_str());
  if (part_) std::fclose(part_);
}

void Recorder::add(Lane lane, std::string name, const char* category, double t0, double t1, std::string args) {
  const int64_t step = step_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lk(mu_);
  pending_.push_back({lane, std::move(name), category, t0, t1, step, std::move(args)});
}

void Recorder::format(const Event& e, std::string& out) const {
  const double ts = (e.t0 + offset_s_ - origin_s_) * 1e6;
  const double dur = std::max(0.0, e.t1 - e.t0) * 1e6;
  fmt::format_to(std::back_inserter(out),
                 R"({{"name":"{}","cat":"{}","ph":"X","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},)"
                 R"("args":{{"step":{}{}{}}}}},)"
                 "\n",
                 escape(e.name), e.category, rank_, static_cast<int>(e.lane), ts, dur, e.step,
                 e.args.empty() ? "" : ",", e.args);
}

void Recorder::flush_part() {
  std::vector<Event> events;
  {
    std::lock_guard<std::mutex> lk(mu_);
    events.swap(pending_);
  }
  if (events.empty()) return;
  std::string text;
  text.reserve(events.size() * 160);
  text.swap(gpu_metadata_);  // the GPU lanes' names, once they exist
  for (const Event& e : events) format(e, text);
  events_ += text;
  unmerged_ = true;
  if (part_failed_) return;
  if (!part_) {
    // Removed by an earlier merge: the part starts again with everything so far.
    bool busy = false;
    part_ = open_part(part_path_, &busy);
    if (!part_) {
      log_warning("timeline: cannot create '{}': {}; the merge at the end still has the events", part_path_,
                  busy ? "another job's running process has it locked" : std::strerror(errno));
      part_failed_ = busy;  // the other job's part stays as it is
      return;
    }
    std::fputs("[\n", part_);
    std::fputs(events_.c_str(), part_);
  } else {
    std::fputs(text.c_str(), part_);
  }
  if (std::fflush(part_) != 0) log_warning("timeline: cannot write '{}': {}", part_path_, std::strerror(errno));
}

void Recorder::use_device_events(std::unique_ptr<DeviceEvents> events) {
  gpu_ = std::make_unique<GpuLanes>(std::move(events));
  gpu_metadata_ = thread_name(rank_, Lane::gpu_compute) + thread_name(rank_, Lane::gpu_comm);
}

void* Recorder::device_mark() { return gpu_ ? gpu_->mark() : nullptr; }

void Recorder::device_span(Lane lane, std::string name, void* begin, void* end, std::string args) {
  if (gpu_) gpu_->add(lane, std::move(name), begin, end, std::move(args));
}

void Recorder::device_span_complete(Lane lane, std::string name, void* begin, void* end, std::string args) {
  if (gpu_) gpu_->add_complete(lane, std::move(name), begin, end, std::move(args));
}

void Recorder::gpu_event(GpuEvent e) {
  std::lock_guard<std::mutex> lk(mu_);
  pending_.push_back({e.lane, std::move(e.name), "gpu", e.t0, e.t1, e.step, std::move(e.args)});
}

void Recorder::readback_begin() {
  if (gpu_) gpu_->readback_begin(detail::now_s());
}

void Recorder::readback_wait() {
  if (gpu_) gpu_->readback_wait(detail::now_s());
}

void Recorder::readback_end() {
  if (gpu_) gpu_->readback_end(detail::now_s(), [this](GpuEvent e) { gpu_event(std::move(e)); });
}

void Recorder::finish_gpu() {
  if (!gpu_ || gpu_->idle()) return;
  gpu_->finish([] { return detail::now_s(); }, [this](GpuEvent e) { gpu_event(std::move(e)); });
  if (gpu_->dropped() > 0) log_debug("timeline: {} GPU span(s) could not be measured", gpu_->dropped());
}

void Recorder::step_begin(int64_t step, int epoch, double input_start_s, Device device) {
  if (step > 0 && first_step_seen_ == 0) {
    first_step_seen_ = step;
    if (origin_.window_from_first_step && step > 1) {
      // A resumed run: the default window is this run's first steps, not the whole run's.
      first_step_ += step - 1;
      last_step_ += step - 1;
      if (rank_ == Communicator::master_rank())
        log_info("timeline: recording steps {}-{} into '{}', the first {} of this run (it starts at step {}: steps "
                 "count over the whole run; {} chooses others)",
                 first_step_, last_step_, path_, last_step_ - first_step_ + 1, step, origin_.window_from);
    }
  }
  const bool in = step >= first_step_ && step <= last_step_;
  if (in) recorded_ = true;
  if (step > last_step_seen_) last_step_seen_ = step;
  if (!in) finish_gpu();  // the host waits for the GPU once, after the window
  flush_part();
  step_.store(step, std::memory_order_relaxed);
  recording_.store(in, std::memory_order_relaxed);
  if (in && !gpu_ && device.is_cuda()) use_device_events(cuda_events(device.index));
  if (in) add(Lane::compute, "input", "step", input_start_s, detail::now_s(), fmt::format(R"("epoch":{})", epoch));
  if (in && gpu_) gpu_->step_begin(step, detail::now_s());
}

void Recorder::warn_if_window_missed() {
  // Steps are the same on every rank: the master alone says it.
  if (recorded_ || warned_ || rank_ != Communicator::master_rank()) return;
  warned_ = true;
  const std::string window = fmt::format("the window {}-{} ({})", first_step_, last_step_, origin_.window_from);
  if (first_step_seen_ == 0) {
    log_warning("timeline: nothing recorded for '{}': this run has trained no step so far ({})", path_, window);
    return;
  }
  if (last_step_seen_ < first_step_) {
    log_warning("timeline: nothing recorded for '{}': {} opens at step {}, and training has run {} step(s) so far",
                path_, window, first_step_, last_step_seen_);
    return;
  }
  // The window had passed before this run's first step: a resumed run goes on counting.
  const bool env = origin_.window_from == "TNT_TIMELINE_STEPS";
  log_warning("timeline: nothing recorded for '{}': {} had passed when this run began at step {} (it ran steps "
              "{}-{}; steps count over the whole run, and a resumed run goes on from its checkpoint's step){}",
              path_, window, first_step_seen_, first_step_seen_, last_step_seen_,
              env ? fmt::format("; set TNT_TIMELINE_STEPS to steps from {} on, or leave it unset to record the first "
                                "10 steps of the run",
                                first_step_seen_)
                  : "");
}

void Recorder::merge(Communicator& comm) {
  recording_.store(false, std::memory_order_relaxed);
  finish_gpu();
  flush_part();
  // Over the ranks the communicator has now: a parameter-server job that lost a worker
  // since the recording began merges the workers left (the lost one's part stays a file).
  const int me = comm.rank(), ranks = comm.size();
  const bool master = me == Communicator::master_rank();
  std::string all;
  for (int q = 0; q < ranks; ++q) {
    std::string part = q == me ? events_ : std::string();
    comm.broadcast(part, q);
    if (master) all += part;
  }
  std::string error;
  if (master) {
    // Drop the last event's comma; the array and the object close after it.
    while (!all.empty() && (all.back() == '\n' || all.back() == ',')) all.pop_back();
    // Named as checkpoints' temporary files are (not another job's; a master killed while
    // writing leaves one, which the next merge beside it removes).
    const std::filesystem::path target(path_);
    const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
    io::remove_stale_temps(dir, target.filename().string());
    std::string tmp = io::temp_template(dir, target.filename().string());
    const int fd = ::mkstemp(tmp.data());
    if (fd >= 0) ::fchmod(fd, 0666 & ~io::current_umask());  // mkstemp makes 0600
    std::FILE* f = fd >= 0 ? ::fdopen(fd, "w") : nullptr;
    if (fd >= 0 && f == nullptr) ::close(fd);
    bool ok = f != nullptr;
    if (ok) {
      std::string text = "{\"traceEvents\":[\n" + all + "\n],\n\"displayTimeUnit\":\"ms\",\n";
      text += fmt::format(
          R"("otherData":{{"producer":"tarantella","ranks":{},"ranks_at_start":{},"steps":"{}-{}",)"
          R"x("clock":"steady clock of each rank, moved onto rank 0's (0 where a rank reads rank 0's clock, )x"
          R"x(else the largest of {} broadcast samples; one a rank at the start)","clock_offsets_ns":[{}]}}}})x"
          "\n",
          ranks, size_, recorded_ ? std::max(first_step_, first_step_seen_) : first_step_,
          recorded_ ? std::min(last_step_, last_step_seen_) : last_step_, kClockRounds, fmt::join(offsets_ns_, ","));
      ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
      ok = (std::fclose(f) == 0) && ok;
    }
    if (ok) ok = std::rename(tmp.c_str(), path_.c_str()) == 0;
    if (!ok) {
      error = fmt::format("timeline: cannot write '{}': {}", path_, std::strerror(errno));
      std::remove(tmp.c_str());
    }
  }
  comm.broadcast(error, Communicator::master_rank());
  // A failed write (a full disk) is no input error: exit 1, as any run-time failure.
  if (!error.empty()) throw Error(fmt::format("{} (the per-rank parts {}.rank<R> are left in place)", error, path_));
  remove_part();
  unmerged_ = false;
}

Recorder* current() {
  RuntimeContext* c = context_or_null();
  // The context holds the sink as core knows it; the recorder is the only kind there is.
  return c ? static_cast<Recorder*>(c->timeline.get()) : nullptr;
}

void start_from_config(Communicator& comm, const std::string& path) {
  RuntimeContext* c = context_or_null();
  if (!c || c->timeline || c->config.timeline.empty()) return;
  const std::string& file = path.empty() ? c->config.timeline : path;
  auto [first, last] = parse_step_window(c->config.timeline_steps, "TNT_TIMELINE_STEPS");
  Origin origin;
  origin.path_text = fmt::format("TNT_TIMELINE='{}' (tarantella --timeline)", c->config.timeline);
  origin.window_from = "TNT_TIMELINE_STEPS";
  // Unset, the window is the first steps this run trains: someone who asked for a trace of a
  // resumed run wants one, not a warning that steps 1-10 were run by an earlier process.
  // Given, it is taken as given (a resumed run that began after it gets a warning).
  origin.window_from_first_step = !Config::is_set(env::timeline_steps);
  c->timeline = std::make_shared<Recorder>(comm, file, first, last, std::move(origin));
  c->timeline_started = true;
}

void step_begin(int64_t step, int epoch, double input_start_s, Device device) {
  if (Recorder* r = current()) r->step_begin(step, epoch, input_start_s, device);
}

void epoch_end() {
  if (Recorder* r = current()) r->epoch_end();
}

void fit_end(Communicator& comm) {
  Recorder* r = current();
  if (!r) return;
  r->step_begin(0, 0, 0.0);  // the window closes with training (steps count from 1)
  if (r->has_unmerged()) {
    r->merge(comm);
  } else {
    r->warn_if_window_missed();
  }
}

void discard() {
  if (RuntimeContext* c = context_or_null()) c->timeline.reset();
}

}  // namespace timeline

bool start_timeline(const std::string& path, int64_t first_step, int64_t last_step) {
  TNT_INPUT_CHECK(!path.empty(), "start_timeline: the path is empty");
  TNT_INPUT_CHECK(first_step >= 1 && last_step >= first_step,
                  "start_timeline: steps {}-{}: expected 1 <= first <= last (steps count from 1)", first_step,
                  last_step);
  RuntimeContext* c = context_or_null();
  TNT_CHECK(c, "tarantella is not initialised: call tnt::init() first");
  if (timeline::Recorder* r = timeline::current()) {
    log_warning("start_timeline('{}'): a timeline into '{}' is already recording; keeping it", path, r->path());
    return false;
  }
  timeline::Origin origin;
  origin.path_text = fmt::format("start_timeline's path '{}'", path);
  c->timeline = std::make_shared<timeline::Recorder>(communicator(), path, first_step, last_step, std::move(origin));
  c->timeline_started = true;
  return true;
}

void stop_timeline() {
  RuntimeContext* c = context_or_null();
  if (!c || !c->timeline) return;
  std::shared_ptr<timeline::Events> r = c->timeline;
  c->timeline.reset();
  static_cast<timeline::Recorder&>(*r).merge(communicator());
}

}  // namespace tnt
