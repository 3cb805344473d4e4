#include "core/context.hpp"
#include "core/cpu_share.hpp"

#include "core/device_api.hpp"
#include "tarantella/build_config.hpp"
#include "tarantella/check.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"

#include <csignal>
#include <fcntl.h>
#include <mpi.h>
#include <sched.h>
#include <sys/resource.h>
#include <system_error>
#include <sys/stat.h>
#include <unistd.h>  // environ

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace tnt {

namespace {

// Set by run_main's end after an error, for finalize: no notes that the error makes moot.
bool g_ending_with_error = false;

}  // namespace

namespace {
// The runtime's state, its one mutable global (see STYLE.md). Besides it there are only
// process-wide tallies and tables that hold no run's state: the host memory counters
// (core/memory.cpp), the print mutex (core/log.cpp) and the layer types registered for model
// files (nn/layer_types.cpp).
std::unique_ptr<RuntimeContext> g_context;

RuntimeContext& ctx() {
  TNT_CHECK(g_context, "tarantella is not initialised: call tnt::init() first");
  return *g_context;
}

// Under the launcher, the rank's step gives the program a pipe (TNT_JOIN_FD; the launcher's
// env_names.hpp) on which this rank says that it enters MPI_Init ('e'), has left it ('j')
// and enters MPI_Finalize ('f'). MPI_Init waits for every rank, so a rank that ends without entering leaves the
// others waiting forever; with this word the launcher names it at once instead of after
// its exit timeout. Not a knob: set by the launcher, read once, and removed from the
// environment so that no process started later writes to a reused descriptor number.
int take_join_fd() {
  const char* text = std::getenv(env::join_fd);
  if (text == nullptr) return -1;
  char* end = nullptr;
  const long fd = std::strtol(text, &end, 10);
  ::unsetenv("TNT_JOIN_FD");
  struct stat st {};
  if (*text == '\0' || *end != '\0' || fd < 3 || fd > 1'000'000 || ::fstat(static_cast<int>(fd), &st) != 0 ||
      !S_ISFIFO(st.st_mode)) {
    return -1;
  }
  ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);  // the program's children have no word to say
  return static_cast<int>(fd);
}

void tell_launcher(int fd, char word) {
  if (fd < 0) return;
  [[maybe_unused]] const ssize_t n = ::write(fd, &word, 1);  // nobody to tell: nothing lost
}

int affinity_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  int n = CPU_COUNT(&set);
  return n > 0 ? n : 1;
}
// Every local rank's affinity mask, gathered over the node: this rank's share of its CPUs
// (detail::cpu_share). A mask that cannot be read counts as this rank's CPUs alone.
int node_cpu_share(MPI_Comm node, int local_rank, int local_size) {
  constexpr int kWords = CPU_SETSIZE / 64;
  cpu_set_t set;
  CPU_ZERO(&set);
  const bool known = sched_getaffinity(0, sizeof(set), &set) == 0;
  std::vector<uint64_t> mine(kWords, 0);
  for (int cpu = 0; known && cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) mine[cpu / 64] |= uint64_t{1} << (cpu % 64);
  std::vector<uint64_t> all(static_cast<size_t>(kWords) * static_cast<size_t>(local_size), 0);
  TNT_MPI_CHECK(MPI_Allgather(mine.data(), kWords, MPI_UINT64_T, all.data(), kWords, MPI_UINT64_T, node));
  if (!known) return 1;
  std::vector<std::vector<uint64_t>> masks(static_cast<size_t>(local_size));
  for (int r = 0; r < local_size; ++r)
    masks[static_cast<size_t>(r)].assign(all.begin() + static_cast<ptrdiff_t>(r) * kWords,
                                         all.begin() + static_cast<ptrdiff_t>(r + 1) * kWords);
  return detail::cpu_share(masks, static_cast<size_t>(local_rank));
}
}  // namespace

RuntimeContext* context_or_null() { return g_context.get(); }

void tell_launcher_stop_requested() {
  if (g_context) tell_launcher(g_context->join_fd, 's');
}

void tell_launcher_ps_training(bool begins) {
  if (g_context) tell_launcher(g_context->join_fd, begins ? 'P' : 'p');
}

void init(int* argc, char*** argv) {
  if (g_context) return;
  // A file-size limit (ulimit -f) would end the process by SIGXFSZ, a core-dumping signal,
  // in the middle of a checkpoint or history write. Ignored (unless the program handles it),
  // the write fails with EFBIG instead, and its writer's error names the file.
  struct sigaction xfsz {};
  if (::sigaction(SIGXFSZ, nullptr, &xfsz) == 0 && xfsz.sa_handler == SIG_DFL) ::signal(SIGXFSZ, SIG_IGN);
  auto c = std::make_unique<RuntimeContext>();
  c->config = Config::from_env();

  const int join_fd = take_join_fd();
  tell_launcher(join_fd, 'e');
  int mpi_ready = 0;
  MPI_Initialized(&mpi_ready);
  if (!mpi_ready) {
    int provided = 0;
    TNT_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    c->we_initialized_mpi = true;
    TNT_CHECK(provided >= MPI_THREAD_SERIALIZED,
              "the MPI library provides thread level {}; tarantella needs at least MPI_THREAD_SERIALIZED",
              provided);
  }
  tell_launcher(join_fd, 'j');
  c->join_fd = join_fd;  // kept for the word at finalize
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  TNT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank));
  TNT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &c->size));
  c->job_rank = c->rank;
  c->job_size = c->size;
  MPI_Comm node;
  TNT_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node));
  MPI_Comm_rank(node, &c->local_rank);
  MPI_Comm_size(node, &c->local_size);
  c->rank_cores = node_cpu_share(node, c->local_rank, c->local_size);
  MPI_Comm_free(&node);

  const std::string& asked = c->config.device;
  if (!asked.empty()) {
    try {
      c->device = Device::parse(asked);
    } catch (const InputError&) {
      TNT_INPUT_ERROR("TNT_DEVICE='{}' is not cpu, cuda, cuda:K, gpu or gpu:K", asked);
    }
  } else if (cuda_available()) {
    // One GPU per rank, as the launcher plans it: with more ranks on the node than GPUs,
    // CPU ranks (NCCL refuses two ranks on one device, and would say so only at the first
    // collective).
    if (c->local_size > cuda_device_count()) {
      if (c->local_rank == 0) {
        log_warning("{} ranks run on this node but it has {} GPU(s): running CPU ranks (start at most {} rank(s) per "
                    "node for one GPU each, or set TNT_DEVICE)",
                    c->local_size, cuda_device_count(), cuda_device_count());
      }
      c->device = Device::cpu();
    } else {
      c->device = Device::cuda(c->local_rank);
    }
  } else {
    c->device = Device::cpu();
  }
  if (c->device.is_cuda()) {
    TNT_INPUT_CHECK(backend::cuda_built(), "TNT_DEVICE={} asks for a GPU, but this libtarantella was built without CUDA",
                    asked);
    TNT_INPUT_CHECK(c->device.index < backend::cuda_device_count(),
                    "TNT_DEVICE={} asks for GPU {}, but this node has {} CUDA device(s)", asked, c->device.index,
                    backend::cuda_device_count());
    backend::cuda_set_device(c->device.index);
  }
  // nccl reduces device buffers only: on a CPU rank it could never apply.
  TNT_INPUT_CHECK(!(c->config.allreduce_algo == "nccl" && c->device.is_cpu()),
                  "TNT_ALLREDUCE_ALGO=nccl needs a GPU rank, but this rank's device is cpu{}; use ring or mpi on CPU "
                  "ranks",
                  asked.empty() ? " (no usable GPU)" : fmt::format(" (TNT_DEVICE={})", asked));
  // By default the rank's share of the node's cores: ranks that are not pinned all see every
  // core, and as many threads each would make them take turns (2 unpinned ranks of ResNet-50
  // on 2 cores ran 2.5x slower with 2 threads each than with 1).
  c->num_threads = c->config.num_threads > 0 ? static_cast<int>(c->config.num_threads) : c->rank_cores;
#ifdef _OPENMP
  omp_set_num_threads(c->num_threads);
#endif
  g_context = std::move(c);
  g_context->comm = Communicator::create_world(g_context->config, g_context->device);
  if (const int cores = affinity_cores(); g_context->config.num_threads > cores) {
    log_warning("TNT_NUM_THREADS={} is more than the {} core(s) rank {} may run on: its compute threads will take "
                "turns on them, which is slower than {} thread(s)",
                g_context->config.num_threads, cores, g_context->rank, cores);
  } else if (const int share = g_context->rank_cores; g_context->config.num_threads > share) {
    log_warning("TNT_NUM_THREADS={} is more than rank {}'s share of its node's cores ({}: its {} core(s) are shared "
                "with other ranks of the node): the ranks' compute threads will take turns, which is slower than {} "
                "thread(s) (--pin-to-socket gives each rank cores of its own)",
                g_context->config.num_threads, g_context->rank, share, cores, share);
  }

  if (g_context->device.is_cuda() && !g_context->config.allreduce_algo.empty() &&
      g_context->config.allreduce_algo != "nccl") {
    log_warning("TNT_ALLREDUCE_ALGO={} applies to host buffers; this rank's gradients are on {} and are reduced with "
                "nccl",
                g_context->config.allreduce_algo, g_context->device.str());
  }
  {
    std::vector<std::string> names;
    for (char** e = environ; e && *e; ++e) {
      const std::string entry(*e);
      names.push_back(entry.substr(0, entry.find('=')));
    }
    for (const std::string& line : Config::misspelled(names)) log_warning("{}", line);
  }
  if (is_master_rank() && log_enabled(LogLevel::info)) {
    log_line(LogLevel::info,
             fmt::format("tarantella {} ({}), {} rank(s), device of rank 0: {}, {} thread(s)\n{}", TNT_VERSION,
                         TNT_WITH_CUDA_BUILD ? "CUDA " TNT_CUDA_VERSION : "CPU only", g_context->size,
                         g_context->device.str(), g_context->num_threads, g_context->config.table()));
  }
}

void finalize() {
  if (!g_context) return;
  bool ours = g_context->we_initialized_mpi;
  // Open MPI 4.1's MPI_Finalize ends with a fence over every process of the job, a lost one
  // included: after a loss it sometimes never returns (seen in about 1 of 3 runs of
  // ps_lost_worker_two_servers). The ranks left have completed all their communication by
  // now, and mpirun --enable-recovery (which the launcher gives such a job) takes an exit
  // without it as any other.
  if (g_context->ranks_lost) ours = false;
  const int join_fd = g_context->join_fd;
  // The arrival channel goes on answering through MPI_Finalize, saying that this rank is
  // done: a rank that still waits in a collective (one called on some ranks only, as an
  // evaluate() under is_master_rank()) learns within its grace that this one will never
  // join, rather than waiting for TNT_COLLECTIVE_TIMEOUT while this one waits in Open MPI's
  // finalize fence. The channel needs no MPI; it stops once MPI_Finalize has returned.
  // A timeline starts with the first fit: a program that never trained (0 epochs, nothing
  // left to resume) would otherwise end without a word about the file it was asked for.
  // Not after an error: its message says what happened (a refused timeline path among them).
  if (!g_context->timeline_started && !g_context->config.timeline.empty() && g_context->rank == 0 &&
      !g_ending_with_error) {
    log_warning("timeline: nothing recorded for '{}': this run has trained no step", g_context->config.timeline);
  }
  std::shared_ptr<void> arrivals;
  if (g_context->comm) arrivals = g_context->comm->announce_finished();
  g_context->comm.reset();
  g_context.reset();
  // The launcher learns that this rank's program is done: ranks that wait here for one
  // that never comes are named (launcher/rank_watch.hpp).
  tell_launcher(join_fd, 'f');
  if (join_fd >= 0) ::close(join_fd);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (ours && !finalized) MPI_Finalize();
  arrivals.reset();
}

bool initialized() { return g_context != nullptr; }
int rank() { return ctx().rank; }
int size() { return ctx().size; }
int local_rank() { return ctx().local_rank; }
int local_size() { return ctx().local_size; }
bool is_master_rank() { return ctx().rank == master_rank(); }
Device default_device() { return ctx().device; }
int num_threads() { return ctx().num_threads; }
int rank_cores() { return ctx().rank_cores; }

namespace {
std::atomic<bool> g_stop_after_step{false};  // lock-free: set from a signal handler
static_assert(std::atomic<bool>::is_always_lock_free);
}  // namespace

void request_stop_after_step() noexcept { g_stop_after_step.store(true, std::memory_order_relaxed); }
bool stop_after_step_requested() noexcept { return g_stop_after_step.load(std::memory_order_relaxed); }
void clear_stop_request() noexcept { g_stop_after_step.store(false, std::memory_order_relaxed); }

const Config& config() {
  if (g_context) return g_context->config;
  static const Config from_env = Config::from_env();
  return from_env;
}

Communicator& communicator() {
  TNT_CHECK(ctx().comm, "the communicator is not available");
  return *ctx().comm;
}

namespace {

// run_main's end after an exception: the message on this rank's standard error, and the job
// ended (MPI_Abort) when other ranks may wait for this one in a collective.
int end_with_error(std::string message, bool input_error) {
  // The job's numbers, as the launcher's lines give them (not a parameter-server fit's
  // worker numbering).
  int r = g_context ? g_context->job_rank : 0;
  int p = g_context ? g_context->job_size : 1;
  if (!g_context) {
    // Refused before the runtime started (a bad TNT_* value): the launcher's variables say
    // which rank this is, so that its message is tagged and shown once, like any other.
    auto number = [](const char* text) {
      int v = -1;
      if (text == nullptr) return -1;
      const char* end = text + std::strlen(text);
      const auto [ptr, ec] = std::from_chars(text, end, v);
      return ec == std::errc() && ptr == end ? v : -1;
    };
    const int er = number(std::getenv(env::rank)), es = number(std::getenv(env::size));
    if (er >= 0 && es > er) {
      r = er;
      p = es;
    }
  }
  // A message of several lines continues indented, so that the launcher can tell its
  // lines from other ranks' (it shows an error that several ranks repeat once).
  while (!message.empty() && message.back() == '\n') message.pop_back();
  for (size_t at = message.find('\n'); at != std::string::npos; at = message.find('\n', at + 3)) {
    message.insert(at + 1, "  ");
  }
  if (p > 1) {
    std::fprintf(stderr, "error (rank %d of %d): %s\n", r, p, message.c_str());
  } else {
    std::fprintf(stderr, "error: %s\n", message.c_str());
  }
  std::fflush(stderr);
  int mpi_ready = 0, mpi_done = 0;
  MPI_Initialized(&mpi_ready);
  MPI_Finalized(&mpi_done);
  // Input the program refuses (a flag's value, a data file, a checkpoint) exits 2, as a
  // refused command line does: the launcher then knows a restart would fail the same way.
  const int status = input_error ? kExitInputError : 1;
  g_ending_with_error = true;
  // Other ranks may be waiting in a collective this rank will never join: end the job
  // rather than let it hang. A refused input is mostly refused on every rank (the checks
  // agree): the master's end then comes first, so that the launcher's "failed first" names
  // the rank whose message is the one printed in full (the others' say "the same error").
  if (mpi_ready && !mpi_done && p > 1) {
    if (input_error && r != 0) ::usleep(300 * 1000);
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  finalize();
  return status;
}

}  // namespace

int run_main(int argc, char** argv, const std::function<void()>& body) {
  try {
    init(&argc, &argv);
    body();
    // Output that could not be written (a full disk, /dev/full, an I/O error) is not a
    // success: the program's results would be lost without a word.
    errno = 0;
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      const int err = errno;
      throw Error(fmt::format("writing the program's standard output failed ({}): its output is incomplete",
                              err != 0 ? std::strerror(err) : "a full disk or device, or an I/O error"));
    }
    finalize();
    return 0;
  } catch (const std::bad_alloc&) {
    // "std::bad_alloc" alone names neither the cause nor a way out. A limit on the address
    // space (ulimit -v) fails allocations long before the host's memory runs out.
    rlimit as{};
    if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
      return end_with_error(fmt::format("out of memory: an allocation failed (std::bad_alloc) under this process's "
                                        "address-space limit of {} MB (ulimit -v; the libraries alone map hundreds "
                                        "of MB): raise it (ulimit -v unlimited)",
                                        as.rlim_cur >> 20),
                            false);
    }
    return end_with_error(
        "out of host memory: an allocation failed (std::bad_alloc). Something is larger than this host can hold: "
        "a batch (the global batch is split over the ranks, but a batch larger than the dataset is padded to its "
        "full size), a dataset held in memory, or the model; every rank on a host holds its own",
        false);
  } catch (const std::system_error& e) {
    // std::thread's EAGAIN says only "Resource temporarily unavailable": no thread, no limit.
    if (e.code() != std::errc::resource_unavailable_try_again) return end_with_error(e.what(), false);
    rlimit procs{};
    const std::string limit = ::getrlimit(RLIMIT_NPROC, &procs) == 0 && procs.rlim_cur != RLIM_INFINITY
                                  ? fmt::format(" (ulimit -u: {})", procs.rlim_cur)
                                  : std::string();
    return end_with_error(fmt::format("a thread could not be started ({}): this user's limit on processes and "
                                      "threads{} or a cgroup's pids.max is reached; fewer data workers, compute "
                                      "threads (TNT_NUM_THREADS) or ranks on this host need fewer",
                                      e.what(), limit),
                          false);
  } catch (const std::exception& e) {
    return end_with_error(e.what(), dynamic_cast<const InputError*>(&e) != nullptr);
  } catch (...) {
    // Not a std::exception (throw 42, a library's own type): the same end, not std::terminate.
    return end_with_error("the program threw an exception that is not a std::exception (no message to show)",
                          false);
  }
}

}  // namespace tnt
