#include "ps/ledger.hpp"

#include "tarantella/check.hpp"

#include <algorithm>

namespace tnt::ps {

void Ledger::learn_steps(int64_t steps) {
  if (steps < 0) return;
  if (steps_ >= 0) {
    TNT_INPUT_CHECK(steps_ == steps, "parameter-server training: workers disagree on their batches per epoch ({} and {})",
                    steps_, steps);
    return;
  }
  steps_ = steps;
  for (auto [w, pushed] : unknown_) add({static_cast<int64_t>(w), std::min(pushed, steps), steps});
  unknown_.clear();
}

int64_t Ledger::lose(size_t w) {
  lost_.push_back(w);
  waiting_[w] = false;
  int64_t pushed = pushes_[w];
  int64_t left = 0;
  if (steps_ < 0) {
    unknown_.emplace_back(w, pushed);  // no worker has said; none has asked, so no grants
  } else {
    add({static_cast<int64_t>(w), std::min(pushed, steps_), steps_});
    left += std::max<int64_t>(0, steps_ - pushed);
    pushed = std::max<int64_t>(0, pushed - steps_);
  }
  for (Part p : grants_[w]) {
    const int64_t used = std::min(pushed, p.end - p.first);
    pushed -= used;
    p.first += used;
    left += p.end - p.first;
    add(p);
  }
  grants_[w].clear();
  return left;
}

std::vector<Ledger::Answer> Ledger::serve(const std::vector<bool>& gone) {
  std::vector<Answer> out;
  if (stopping_) pool_.clear();
  const auto live = std::max<int64_t>(1, std::count(gone.begin(), gone.end(), false));
  for (size_t w = 0; w < waiting_.size() && !pool_.empty(); ++w) {
    if (!waiting_[w] || gone[w]) continue;
    Part& front = pool_.front();
    const int64_t n = front.end - front.first;
    const int64_t chunk = std::max<int64_t>(1, (n + live - 1) / live);
    const Part give{front.owner, front.first, front.first + chunk};
    front.first += chunk;
    if (front.first >= front.end) pool_.pop_front();
    grants_[w].push_back(give);
    waiting_[w] = false;
    out.push_back({w, give});
  }
  if (!pool_.empty()) return out;
  bool any = false;
  for (size_t w = 0; w < waiting_.size(); ++w) {
    if (!gone[w] && !waiting_[w]) return out;
    any = any || waiting_[w];
  }
  if (!any) return out;
  for (size_t w = 0; w < waiting_.size(); ++w) {
    if (waiting_[w]) out.push_back({w, std::nullopt});
  }
  ++epoch_;
  std::fill(waiting_.begin(), waiting_.end(), false);
  std::fill(pushes_.begin(), pushes_.end(), 0);
  for (auto& g : grants_) g.clear();
  stopping_ = false;
  for (size_t w : lost_) {
    if (steps_ >= 0) add({static_cast<int64_t>(w), 0, steps_});
  }
  return out;
}

}  // namespace tnt::ps
