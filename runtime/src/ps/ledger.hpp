// The sample ledger of parameter-server training, kept by the first server: which batches of
// an epoch are still to be trained once workers are lost. Pure (no MPI), unit-tested in
// tests/ps/test_ledger.cpp.
//
// Every worker trains its own part of the epoch (the dataset's static distribution: the same
// number of batches each), then asks the ledger for more. A lost worker's batches that no
// push of it covered go to the pool: its pushes of the epoch arrive in order and covered its
// own part first, then the parts it was granted, in order. Waiting workers get the pool in
// chunks, shared among the workers left so that they end together; the epoch ends when every
// worker left waits and the pool is empty. In later epochs a lost worker's whole part goes
// to the pool at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

namespace tnt::ps {

// Batches [first, end) of worker `owner`'s part of the epoch (owner: the worker's index).
struct Part {
  int64_t owner = 0, first = 0, end = 0;
  bool operator==(const Part&) const = default;
};

class Ledger {
 public:
  explicit Ledger(size_t workers) : pushes_(workers, 0), grants_(workers), waiting_(workers, false) {}

  int64_t epoch() const { return epoch_; }  // epochs of the fit ended so far
  bool waiting(size_t w) const { return waiting_[w]; }

  // A worker's own part has this many batches (it says so with its messages). InputError
  // if workers disagree.
  void learn_steps(int64_t steps);
  // A push of worker w, of the fit's epoch `epoch`, arrived.
  void count_push(size_t w, int64_t epoch) {
    if (epoch == epoch_) ++pushes_[w];
  }
  // Worker w is lost: what it had not pushed of this epoch goes to the pool. Returns the
  // number of those batches (0 while the part's size is not known yet: added when it is).
  int64_t lose(size_t w);
  // Worker w ended its batches of the epoch (stopping: it leaves the fit's steps early,
  // so the epoch is cut short and nothing more is handed out).
  void ask(size_t w, bool stopping) {
    waiting_[w] = true;
    stopping_ = stopping_ || stopping;
  }

  struct Answer {
    size_t worker = 0;
    std::optional<Part> part;  // nullopt: the epoch is over
  };
  // Parts for waiting workers; when every worker that is not `gone` (lost or done) waits and
  // nothing is left, the end of the epoch for each waiting one, and the ledger moves to the
  // next epoch. `gone` has a flag per worker.
  std::vector<Answer> serve(const std::vector<bool>& gone);

 private:
  void add(const Part& p) {
    if (p.end > p.first) pool_.push_back(p);
  }

  int64_t epoch_ = 0;
  int64_t steps_ = -1;                                // batches of a worker's own part; -1: not known yet
  std::vector<std::pair<size_t, int64_t>> unknown_;  // lost before steps_ was known: (worker, pushes)
  std::vector<int64_t> pushes_;                       // per worker, in this epoch
  std::vector<std::vector<Part>> grants_;             // per worker, in order
  std::vector<size_t> lost_;
  std::vector<bool> waiting_;
  std::deque<Part> pool_;
  bool stopping_ = false;
};

}  // namespace tnt::ps
