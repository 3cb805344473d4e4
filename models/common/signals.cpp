#include "common/signals.hpp"

#include <tarantella/tarantella.hpp>

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <csignal>
#include <cstring>

#include <unistd.h>

namespace tnt_models {
namespace {

// Made before the handler is installed: a handler may only write(2) what is ready. Empty on
// the ranks other than the master, which take the signal silently.
std::array<std::array<char, 512>, 2> g_message{};
std::array<size_t, 2> g_length{};
bool g_stops = false;                  // set before the handler is armed
volatile std::sig_atomic_t g_signal = 0;  // the last warning signal taken
std::atomic<int> g_armed{0};  // take_warning_signals has run (lock-free: async-signal-safe)
std::atomic<int> g_early{0};  // a signal held before that
static_assert(std::atomic<int>::is_always_lock_free, "the handler's atomics must be lock-free");

size_t slot_of(int sig) { return sig == SIGUSR1 ? 0 : 1; }

void on_warning_signal(int sig) {
  const int saved = errno;
  g_signal = sig;
  if (g_armed.load() == 0) {
    g_early.store(sig);  // take_warning_signals acts on it
    errno = saved;
    return;
  }
  if (g_stops) tnt::request_stop_after_step();  // an atomic store: async-signal-safe
  const size_t i = slot_of(sig);
  if (g_length[i] > 0) {
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, g_message[i].data(), g_length[i]);
  }
  errno = saved;
}

// Ours, or the default: anything else is the user's choice and stays.
bool ours_to_take(int sig) {
  struct sigaction current {};
  return ::sigaction(sig, nullptr, &current) == 0 &&
         (current.sa_handler == SIG_DFL || current.sa_handler == on_warning_signal);
}

void install(int sig) {
  struct sigaction sa {};
  sa.sa_handler = on_warning_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(sig, &sa, nullptr);
}

const char* signal_name(int sig) { return sig == SIGUSR1 ? "SIGUSR1" : sig == SIGUSR2 ? "SIGUSR2" : "a signal"; }

}  // namespace

void hold_warning_signals() {
  for (const int sig : {SIGUSR1, SIGUSR2}) {
    if (ours_to_take(sig)) install(sig);
  }
}

void take_warning_signals(const std::string& program, bool stop_with_checkpoint) {
  g_stops = stop_with_checkpoint;
  for (const int sig : {SIGUSR1, SIGUSR2}) {
    if (!ours_to_take(sig)) continue;
    const size_t i = slot_of(sig);
    if (tnt::is_master_rank()) {
      const std::string text = fmt::format(
          "{}: {} received (a batch system's warning before the time limit, say): {}\n", program, signal_name(sig),
          stop_with_checkpoint ? "training stops after the current step, with a checkpoint of it; --resume "
                                 "continues from there"
                               : "training goes on; this run writes no checkpoint (--enable_checkpoint_and_export "
                                 "writes one), so stopping would save nothing");
      const size_t n = std::min(text.size(), g_message[i].size());
      std::memcpy(g_message[i].data(), text.data(), n);
      g_length[i] = n;
    }
    install(sig);
  }
  g_armed.store(1);  // after the messages and g_stops: a sequentially consistent store
  // One that came while held (during the program's start) is taken now, as it would have been.
  if (const int early = g_early.exchange(0); early != 0) on_warning_signal(early);
}

bool stopped_on_warning_signal(const tnt::Model& model, const std::string& program, const std::string& checkpoint) {
  if (!model.stopped_on_request()) return false;
  const int64_t part = model.partial_epoch_steps();
  tnt::print("{}: stopped after step {} on {} (the run is not finished): {} holds it{}; run the same command with "
             "--resume=auto (or --resume) to continue",
             program, model.global_step(), signal_name(g_signal), checkpoint,
             part > 0 ? fmt::format(", {} step{} into its epoch", part, part == 1 ? "" : "s")
                      : std::string(" at the end of its epoch"));
  return true;
}

}  // namespace tnt_models
