#include "local_checks.hpp"

#include "error.hpp"
#include "paths.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <vector>

namespace tnt::launcher {

namespace {

// Open MPI's session files are small, but on a full file system MPI_Init fails with
// "getting local rank failed" and a NULL communicator, naming neither the disk nor TMPDIR.
void check_free_space(const std::string& tmp, const std::string& folder) {
  constexpr unsigned long long kNeed = 1ULL << 20;  // a few session files, with room to spare
  struct statvfs fs {};
  // No size reported (ramfs, an unbounded tmpfs, some FUSE file systems): nothing to judge.
  if (::statvfs(folder.c_str(), &fs) != 0 || fs.f_blocks == 0) return;
  // Root may use the blocks kept back for it.
  const unsigned long long blocks = ::geteuid() == 0 ? fs.f_bfree : fs.f_bavail;
  const unsigned long long free_bytes = blocks * fs.f_frsize;
  if (free_bytes < kNeed) {
    throw InputError(fmt::format("TMPDIR={}: its file system has {} KB free (Open MPI keeps its session files "
                                 "there, and fails without a word about the disk); free some space, or point TMPDIR "
                                 "elsewhere", tmp, free_bytes >> 10));
  }
}

}  // namespace

void check_local_environment(const Environment& env) {
  // Open MPI asks for the working directory first, and fails with its own block of text
  // (exit 1, which a restart would repeat) where it is gone.
  std::vector<char> cwd(PATH_MAX + 1);
  if (::getcwd(cwd.data(), cwd.size()) == nullptr && errno != ERANGE) {
    throw InputError(fmt::format("the current directory cannot be read ({}): it was removed, or this user may not "
                                 "read it; change to an existing directory (mpirun starts the ranks in it)",
                                 std::strerror(errno)));
  }
  // Open MPI keeps its session files in TMPDIR (unless orte_tmpdir_base says elsewhere):
  // one that is a file, or that this user cannot write, fails with its own text. A missing
  // one it makes.
  if (lookup(env, "OMPI_MCA_orte_tmpdir_base")) return;
  if (const auto tmp = lookup(env, "TMPDIR"); tmp && !tmp->empty()) {
    struct stat st {};
    if (::stat(tmp->c_str(), &st) != 0) {
      if (errno != ENOENT && errno != ENOTDIR) {  // ENOTDIR: a file on the way, named below
        throw InputError(fmt::format("TMPDIR={}: {} (Open MPI keeps its session files there)", *tmp,
                                     std::strerror(errno)));
      }
      // Open MPI makes it, where it can: below the nearest folder that exists.
      std::string parent = *tmp;
      while (!parent.empty() && ::stat(parent.c_str(), &st) != 0) {
        while (parent.size() > 1 && parent.back() == '/') parent.pop_back();
        const size_t slash = parent.rfind('/');
        parent = slash == std::string::npos ? "." : slash == 0 ? "/" : parent.substr(0, slash);
      }
      if (!S_ISDIR(st.st_mode) || ::access(parent.c_str(), W_OK | X_OK) != 0) {
        throw InputError(fmt::format("TMPDIR={} does not exist, and cannot be made: {} is {} (Open MPI keeps its "
                                     "session files there); create it, or unset TMPDIR",
                                     *tmp, parent, S_ISDIR(st.st_mode) ? "a folder this user cannot write" : "no folder"));
      }
      check_free_space(*tmp, parent);
      return;
    }
    if (!S_ISDIR(st.st_mode)) {
      throw InputError(fmt::format("TMPDIR={}: not a directory (Open MPI keeps its session files there)", *tmp));
    }
    if (::access(tmp->c_str(), W_OK | X_OK) != 0) {
      throw InputError(
          fmt::format("TMPDIR={}: this user cannot create files in it (Open MPI keeps its session files there)", *tmp));
    }
    check_free_space(*tmp, *tmp);
  }
}

void add_local_mca(CommandSpec& spec, const Environment& env, std::uint64_t local_ranks, bool remote,
                   bool launch_agent_given) {
  const auto mpi_args_name = [&](const std::string& param) {
    return env.count("OMPI_MCA_" + param) > 0 ||
           std::any_of(spec.mpi_args.begin(), spec.mpi_args.end(),
                       [&](const std::string& a) { return a.find(param) != std::string::npos; });
  };
  // More ranks here than cores to run them: Open MPI, told of N slots on this host, takes
  // the host as not oversubscribed and its ranks spin while they wait (in MPI_Init, in
  // every collective), taking the cores from the ranks with work. 16 ranks on 2 cores: a
  // fashion_mnist step took 50-58 ms spinning, 30-32 ms yielding (docs/launcher.md).
  if (const long cores = usable_cores(); cores > 0 && local_ranks > static_cast<std::uint64_t>(cores) &&
                                             !mpi_args_name("mpi_yield_when_idle")) {
    spec.mpi_args.insert(spec.mpi_args.begin(), {"--mca", "mpi_yield_when_idle", "1"});
  }
  // A job on this machine alone starts no daemon elsewhere, but Open MPI refuses to start
  // without its remote shell (ssh, rsh) on PATH, as in a container without ssh. It gets
  // one that is never run.
  if (!remote && !launch_agent_given && !mpi_args_name("plm_rsh_agent")) {
    const std::string path = env.count("PATH") ? env.at("PATH") : std::string();
    const bool shell_found = find_executable("ssh", path).problem == ExecutableProblem::none ||
                             find_executable("rsh", path).problem == ExecutableProblem::none;
    if (!shell_found && ::access("/bin/false", X_OK) == 0) {
      spec.mpi_args.insert(spec.mpi_args.begin(), {"--mca", "plm_rsh_agent", "/bin/false"});
    }
  }
}

}  // namespace tnt::launcher
