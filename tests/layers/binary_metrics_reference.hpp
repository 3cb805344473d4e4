// Independent reference computations for the binary metric tests: confusion counts by plain
// comparison, and the exact ROC AUC from sorted scores (the Mann-Whitney statistic: the
// fraction of (positive, negative) pairs where the positive scores higher, ties counting
// half), with no histogram anywhere.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace tnt::test {

struct Confusion {
  int64_t tp = 0, fp = 0, fn = 0, tn = 0;
};

// scores: probabilities; labels: 0 or 1. A NaN score is a wrong answer.
inline Confusion confusion_of(const std::vector<float>& scores, const std::vector<int>& labels, double threshold) {
  Confusion c;
  for (size_t i = 0; i < scores.size(); ++i) {
    const bool positive = labels[i] == 1;
    if (std::isnan(scores[i])) {
      (positive ? c.fn : c.fp) += 1;
      continue;
    }
    const bool predicted = static_cast<double>(scores[i]) > threshold;
    if (positive) {
      (predicted ? c.tp : c.fn) += 1;
    } else {
      (predicted ? c.fp : c.tn) += 1;
    }
  }
  return c;
}

inline double exact_auc(const std::vector<float>& scores, const std::vector<int>& labels) {
  std::vector<std::pair<float, int>> v;
  for (size_t i = 0; i < scores.size(); ++i) v.emplace_back(scores[i], labels[i]);
  std::sort(v.begin(), v.end());
  double pairs = 0, negatives_below = 0, positives = 0;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    double pos = 0, neg = 0;
    for (; j < v.size() && v[j].first == v[i].first; ++j) (v[j].second == 1 ? pos : neg) += 1;
    pairs += pos * (negatives_below + 0.5 * neg);
    negatives_below += neg;
    positives += pos;
    i = j;
  }
  return pairs / (positives * negatives_below);
}

// How far a histogram AUC with `bins` equal bins over [0, 1] may be from the exact one: only
// pairs whose scores share a bin are scored differently (half, where the exact order gives 0,
// 1/2 or 1), so by at most half of them. scores in [0, 1].
inline double binning_bound(const std::vector<float>& scores, const std::vector<int>& labels, int64_t bins) {
  std::vector<double> pos(static_cast<size_t>(bins)), neg(static_cast<size_t>(bins));
  double p = 0, n = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    const auto b = std::min<int64_t>(static_cast<int64_t>(std::floor(static_cast<double>(scores[i]) * bins)), bins - 1);
    (labels[i] == 1 ? pos : neg)[static_cast<size_t>(b)] += 1;
    (labels[i] == 1 ? p : n) += 1;
  }
  double shared = 0;
  for (int64_t b = 0; b < bins; ++b) shared += pos[static_cast<size_t>(b)] * neg[static_cast<size_t>(b)];
  return 0.5 * shared / (p * n);
}

}  // namespace tnt::test
