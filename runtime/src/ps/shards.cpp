#include "ps/shards.hpp"

#include "core/context.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/runtime.hpp"

#include <fmt/ranges.h>

#include <chrono>
#include <set>
#include <thread>

namespace tnt::ps {

void wait_servers(std::vector<MPI_Request>& reqs, const std::vector<int>& peer, const std::string& what) {
  const double limit = config().collective_timeout_s;
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    int done = 0;
    TNT_MPI_CHECK(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE));
    if (done) return;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (limit > 0 && waited > limit) {
      std::set<int> silent;
      for (size_t i = 0; i < reqs.size(); ++i) {
        int one = 0;
        MPI_Test(&reqs[i], &one, MPI_STATUS_IGNORE);
        if (!one) silent.insert(peer[i]);
      }
      throw CommError(fmt::format("parameter-server training: server rank(s) {} did not answer {} within {} s "
                                  "(TNT_COLLECTIVE_TIMEOUT): the server is lost or stopped, or holds the pull back "
                                  "for max_staleness while a slower worker no longer pushes",
                                  fmt::join(silent, ", "), what, limit));
    }
    // Yield the core after a short spin: on a shared machine the server needs it.
    if (polls > 200) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace tnt::ps
