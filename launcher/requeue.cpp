#include "requeue.hpp"

#include "env_names.hpp"

#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace tnt::launcher {

namespace {

// --resume, --resume=auto (or true, 1, yes), as the programs of models/ take them
// (flags.cpp); --resume=false (0, no) is none. The last one given counts.
bool has_resume_flag(const std::vector<std::string>& program) {
  bool resume = false;
  for (size_t i = 1; i < program.size(); ++i) {
    const std::string& a = program[i];
    if (a == "--") break;
    if (a == "--resume") resume = true;
    if (a.rfind("--resume=", 0) == 0) {
      const std::string v = a.substr(9);
      resume = v == "auto" || v == "true" || v == "1" || v == "yes";
    }
  }
  return resume;
}

}  // namespace

RequeueDecision decide_requeue(const Options& options, const Environment& env, std::optional<int> warned_by,
                               bool stopped, int status) {
  RequeueDecision d;
  if (!options.requeue || !warned_by) return d;
  const std::string sig = fmt::format("SIG{}", ::sigabbrev_np(*warned_by));
  const std::optional<std::string> job = lookup(env, "SLURM_JOB_ID");
  if (status != 0) {
    d.message = fmt::format("--requeue: the job ended with status {} after {}, not with the checkpoint of a stop; "
                            "not requeued",
                            status, sig);
    return d;
  }
  if (!stopped) {
    d.message = fmt::format("--requeue: {} came, but no program stopped on it (they ran to their end, or do not take "
                            "it): not requeued",
                            sig);
    return d;
  }
  if (!job || job->empty()) {
    d.message = fmt::format("--requeue: {} stopped the job, but this is not a SLURM job (no SLURM_JOB_ID): nothing "
                            "to requeue; run the same command with --resume=auto to continue",
                            sig);
    return d;
  }
  if (!has_resume_flag(options.program)) {
    d.message = fmt::format("--requeue: {} stopped the job, but job {} is not requeued: the program's arguments "
                            "have no --resume=auto, so it would train from the start again; submit it with "
                            "--resume=auto to continue from the checkpoint",
                            sig, *job);
    return d;
  }
  d.requeue = true;
  d.job_id = *job;
  d.message = fmt::format("{} stopped the job after a step, with its checkpoint; requeueing SLURM job {} "
                          "(scontrol requeue {}): it runs again and continues from there",
                          sig, *job, *job);
  return d;
}

std::vector<std::string> with_requeue_warnings(std::vector<std::string> warnings, const Options& options,
                                               const Environment& env) {
  if (!options.requeue) return warnings;
  const std::optional<std::string> job = lookup(env, "SLURM_JOB_ID");
  if (!job || job->empty()) {
    warnings.push_back("--requeue: this is not a SLURM job (no SLURM_JOB_ID): a warning signal will stop the job "
                       "with its checkpoint, but there is nothing to requeue");
  }
  if (!has_resume_flag(options.program)) {
    warnings.push_back("--requeue: the program's arguments have no --resume=auto: a requeued run would train from "
                       "the start again, so the job will not be requeued");
  }
  return warnings;
}

std::string run_requeue(const std::string& job_id, std::chrono::seconds limit) {
  const char* custom = std::getenv(env::scontrol);
  const std::string scontrol = custom && *custom ? custom : "scontrol";
  int out[2];
  if (::pipe(out) != 0) return fmt::format("pipe: {}", ::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out[0]);
    ::close(out[1]);
    return fmt::format("fork: {}", ::strerror(errno));
  }
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(out[1], STDERR_FILENO);
    ::close(out[0]);
    ::close(out[1]);
    ::execlp(scontrol.c_str(), scontrol.c_str(), "requeue", job_id.c_str(), static_cast<char*>(nullptr));
    std::fprintf(stderr, "cannot run %s: %s\n", scontrol.c_str(), ::strerror(errno));
    ::_exit(127);
  }
  ::close(out[1]);
  std::string said;
  int status = 0;
  bool ended = false;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!ended) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) {
      ended = true;
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  char buf[512];
  ssize_t n = 0;
  while (said.size() < 4000 && (n = ::read(out[0], buf, sizeof buf)) > 0) said.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
  if (!ended) {
    return fmt::format("{} requeue {} did not answer within {} s", scontrol, job_id, limit.count());
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  const std::string how = WIFEXITED(status) ? fmt::format("exit code {}", WEXITSTATUS(status))
                                            : fmt::format("signal {}", WTERMSIG(status));
  return fmt::format("{} requeue {} failed ({}){}{}", scontrol, job_id, how, said.empty() ? "" : ": ", said);
}

}  // namespace tnt::launcher
