#include "common/signals.hpp"

#include <tarantella/tarantella.hpp>

#include <fmt/format.h>

#include <array>
#include <csignal>
#include <cstring>

#include <unistd.h>

namespace tnt_models {
namespace {

// Made before the handler is installed: a handler may only write(2) what is ready. Empty on
// the ranks other than the master, which take the signal silently.
std::array<std::array<char, 512>, 2> g_message{};
std::array<size_t, 2> g_length{};

size_t slot_of(int sig) { return sig == SIGUSR1 ? 0 : 1; }

void on_warning_signal(int sig) {
  const int saved = errno;
  const size_t i = slot_of(sig);
  if (g_length[i] > 0) {
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, g_message[i].data(), g_length[i]);
  }
  errno = saved;
}

}  // namespace

void go_on_at_warning_signals(const std::string& program, bool writes_checkpoints) {
  for (const int sig : {SIGUSR1, SIGUSR2}) {
    struct sigaction current {};
    if (::sigaction(sig, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) continue;
    const size_t i = slot_of(sig);
    if (tnt::is_master_rank()) {
      const std::string text = fmt::format(
          "{}: {} received (a batch system's warning before the time limit, say): training goes on; {}\n", program,
          sig == SIGUSR1 ? "SIGUSR1" : "SIGUSR2",
          writes_checkpoints ? "checkpoints are written at the end of each epoch, and --resume continues from the "
                               "last one"
                             : "this run writes no checkpoint (--enable_checkpoint_and_export writes one an epoch)");
      const size_t n = std::min(text.size(), g_message[i].size());
      std::memcpy(g_message[i].data(), text.data(), n);
      g_length[i] = n;
    }
    struct sigaction sa {};
    sa.sa_handler = on_warning_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace tnt_models
