// Pi by Monte Carlo on however many ranks it is started with, the first program of the
// supercomputer centres' distributed-training tutorials: each rank throws its share of N
// points into the unit square, one allreduce adds up the points inside the quarter circle,
// and the master prints pi ~ 4 * inside / N, its error and the time.
//
//   tarantella -np 4 -- build/bin/pi --samples=200000000
//
// Sample i is drawn from the runtime's counter-based generator (tnt::CounterRng) at
// counters 2i and 2i+1, so a point does not depend on which rank draws it: rank r of p takes
// the samples [r N/p, (r+1) N/p) and the count of points inside, an integer, is the same on
// 1, 2 or 3 ranks. So is the printed estimate, bit for bit; only the time changes.
#include <tarantella/tarantella.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numbers>
#include <optional>
#include <string>
#include <string_view>

namespace {

// About a second on one core of a current x86 machine (two Philox blocks per sample: 0.6 s
// for 5e7 on an idle core of the development machine).
constexpr int64_t kDefaultSamples = 80'000'000;
constexpr int64_t kMaxSamples = int64_t{1} << 62;  // counters 2i+1 stay below 2^63
constexpr int kExitUsage = 2;

constexpr const char* kHelp = R"(pi: estimates pi from N random points in the unit square, on every rank of the job.

  pi [--samples=N] [--seed=S]

  --samples=N  points in all, split over the ranks (default 80000000: about a second on
               one core); at most 2^62
  --seed=S     the generator's seed, a whole number from 0 to 2^64-1 (default 0): the same
               seed gives the same estimate on any number of ranks
  -h, --help   this help

Example, 4 ranks on this machine (as mpirun -np 4 python pi.py):
  tarantella -np 4 -- build/bin/pi --samples=200000000
)";

struct Flags {
  int64_t samples = kDefaultSamples;
  uint64_t seed = 0;
  bool help = false;
};

// Before MPI starts, only the environment says which rank this is: one rank prints the
// refusal of a command line for the whole job (they all refuse it alike).
bool first_rank() {
  for (const char* name : {"TNT_RANK", "OMPI_COMM_WORLD_RANK"}) {
    if (const char* text = std::getenv(name)) return std::strcmp(text, "0") == 0;
  }
  return true;
}

std::optional<uint64_t> whole_number(std::string_view text) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - digit) / 10) return std::nullopt;
    v = v * 10 + digit;
  }
  return v;
}

// Returns the problem with the command line, or "" when it parses.
std::string parse(int argc, char** argv, Flags& flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view word = argv[i];
    if (word == "-h" || word == "--help") {
      flags.help = true;
      continue;
    }
    const size_t eq = word.find('=');
    const std::string_view name = word.substr(0, eq);
    if (name != "--samples" && name != "--seed") {
      return word.starts_with("-") ? std::string("unknown flag '") + std::string(name) + "'"
                                   : std::string("unexpected argument '") + std::string(word) + "'";
    }
    std::string_view value;
    if (eq != std::string_view::npos) {
      value = word.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return std::string(name) + ": missing its value";
    }
    const auto n = whole_number(value);
    if (name == "--samples") {
      if (!n || *n == 0 || *n > static_cast<uint64_t>(kMaxSamples)) {
        return "--samples=" + std::string(value) + ": expected a whole number of points from 1 to 2^62";
      }
      flags.samples = static_cast<int64_t>(*n);
    } else {
      if (!n) return "--seed=" + std::string(value) + ": expected a whole number from 0 to 2^64-1";
      flags.seed = *n;
    }
  }
  return "";
}

// Points inside the quarter circle among samples [begin, end). A point's coordinates are
// (x + 1/2) / 2^30 and (y + 1/2) / 2^30 for 30 random bits x and y, so it is inside when
// (2x+1)^2 + (2y+1)^2 < 2^62: exact in 64-bit integers, no rounding at the boundary. The
// grid's bias, of the order of 2^-30, is far below the standard error of any N one can run.
int64_t count_inside(const tnt::CounterRng& rng, int64_t begin, int64_t end) {
  int64_t inside = 0;
  for (int64_t i = begin; i < end; ++i) {
    const uint64_t u = 2 * (rng.bits(2 * static_cast<uint64_t>(i)) >> 2) + 1;
    const uint64_t v = 2 * (rng.bits(2 * static_cast<uint64_t>(i) + 1) >> 2) + 1;
    inside += u * u + v * v < (uint64_t{1} << 62) ? 1 : 0;
  }
  return inside;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (const std::string problem = parse(argc, argv, flags); !problem.empty()) {
    if (first_rank()) std::fprintf(stderr, "pi: %s (see --help)\n", problem.c_str());
    return kExitUsage;
  }
  if (flags.help) {
    if (first_rank()) std::fputs(kHelp, stdout);
    return 0;
  }

  return tnt::run_main(argc, argv, [&] {
    tnt::Communicator& comm = tnt::communicator();
    const int64_t p = comm.size(), r = comm.rank();
    // Rank r's share: N/p samples, one more on the first N mod p ranks.
    const int64_t share = flags.samples / p, extra = flags.samples % p;
    const int64_t begin = r * share + std::min(r, extra);
    const int64_t end = begin + share + (r < extra ? 1 : 0);
    const tnt::CounterRng rng(flags.seed, "pi");

    comm.barrier();  // the time starts when every rank can start
    const auto start = std::chrono::steady_clock::now();
    const int64_t inside = comm.allreduce_sum(count_inside(rng, begin, end));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    if (comm.is_master()) {
      const double n = static_cast<double>(flags.samples);
      const double estimate = 4.0 * static_cast<double>(inside) / n;
      // The estimate is 4 times a binomial proportion: its standard deviation is
      // 4 sqrt(q (1 - q) / N) with q = pi/4 the chance of a point inside.
      const double q = std::numbers::pi / 4;
      const double standard_error = 4.0 * std::sqrt(q * (1 - q) / n);
      std::printf("pi = %.12f (error %+.3e, standard error %.3e)\n", estimate, estimate - std::numbers::pi,
                  standard_error);
      std::printf("samples: %lld on %lld rank%s, %lld inside, seed %llu\n", static_cast<long long>(flags.samples),
                  static_cast<long long>(p), p == 1 ? "" : "s", static_cast<long long>(inside),
                  static_cast<unsigned long long>(flags.seed));
      std::printf("time: %.3f s\n", seconds);
      std::fflush(stdout);
    }
  });
}
