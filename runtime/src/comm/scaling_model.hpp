// The scaling model: a job's step time at N nodes from one short profile, as a plain
// function of its inputs (no MPI, no tensors), so that the runtime (--fusion-threshold auto),
// the launcher (`tarantella predict`) and the unit tests (tests/comm/test_scaling_model.cpp)
// share one implementation. docs/scaling.md explains the model and what it leaves out.
//
// The idea. A step is input + forward + backward + optimizer + other + the small
// collectives (metrics), measured once. During backward each gradient becomes final at a
// measured time; the bucket plan (comm/bucket_plan) groups the gradients as the Reducer
// would at a given threshold; each bucket is allreduced on ONE communication channel, in
// bucket order, starting when it is complete and the bucket before it is done. What is
// still in flight when backward ends is added to the step. The per-rank batch stays as
// profiled (weak scaling), so the compute parts do not change with the rank count; only the
// allreduces do (the buckets' and the small collectives', collectives_s()). Corrections
// measured by the profile: a collective starts when its slowest rank is ready
// (straggle_s), and a bucket's allreduce a launch delay after it is ready (launch_delay_s);
// allreduces in training take comm_factor times the probe's time; backward is slower while
// allreduces run beside it on shared cores (backward_alone_s); the wait for gradients ends
// finish_s after the last allreduce.
//
// Allreduce of n bytes over p = nodes * ranks_per_node ranks, ring algorithm (each of the
// reduce-scatter and the allgather takes p-1 steps moving n/p bytes per rank):
//   one node       2(p-1) * intra.latency + 2(p-1)/p * n / intra.bandwidth
//   hierarchical   within the node (r = ranks_per_node) as above with p = r, plus across the
//                  N nodes 2(N-1) * inter.latency + 2(N-1)/N * n / inter.bandwidth (the r
//                  ranks of a node share its link, so the node moves all n bytes)
//   flat ring      2(p-1) * max(latency + n/p / bandwidth) over intra and inter: every step
//                  waits for its slowest edge (our host ring, MPI's ring)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tnt::comm::scaling {

// One message of n bytes over the link costs latency_s + n / bytes_per_s.
struct Link {
  double latency_s = 0;
  double bytes_per_s = 0;
};

struct Network {
  int nodes = 1;
  int ranks_per_node = 1;
  Link intra;  // between ranks of one node
  Link inter;  // between nodes (one link per node)
  bool hierarchical = true;  // false: one flat ring over all ranks (the host transport)
  // While backward runs, an allreduce takes this many times the links' time (after it, the
  // links' time): comm_factor() below, where the links are the profile's probe's.
  double comm_factor = 1;
  // On one node, where only `intra` is used: the factor there (negative: comm_factor). A
  // profile of one node measured the links within it, not those between nodes: a row of one
  // node keeps its factor when rows of several nodes run on given links without one.
  double comm_factor_one_node = -1;
  double factor_at(int nodes_now) const {
    return nodes_now == 1 && comm_factor_one_node >= 0 ? comm_factor_one_node : comm_factor;
  }
};

// A straight line time = a_s + b_s_per_byte * bytes fitted to allreduces of a few sizes over
// `ranks` ranks.
struct AllreduceFit {
  int ranks = 0;
  double a_s = 0;
  double b_s_per_byte = 0;
};

struct ProfiledGradient {
  std::string name;
  int64_t bytes = 0;
  double ready_s = 0;  // since backward began
};

struct Profile {
  // Where it was measured.
  int ranks = 1;
  int nodes = 1;
  int ranks_per_node = 1;
  std::string device = "cpu";
  std::string transport = "ring";  // the allreduce the Reducer used: ring, mpi or nccl
  int steps = 0;                   // steps the medians are taken over
  int64_t threshold_bytes = 32 * 1024;
  int64_t samples_per_rank = 0;  // per step
  // Per step, medians over the profiled steps (seconds).
  double input_s = 0;
  double forward_s = 0;  // forward and loss
  double backward_s = 0;
  // Backward with no allreduce beside it (steps with one bucket, sent after backward); 0
  // where not measured. Where communication shares the cores, backward_s is longer.
  double backward_alone_s = 0;
  double optimizer_s = 0;
  double other_s = 0;  // the rest of the measured step: callbacks, the host's own work
  // The step's small collectives outside the gradient buckets (the metrics' allreduce after
  // the step, a token-level loss's count in forward): their time on the host (median), how
  // many a step and their bytes together. Not in other_s or forward_s. 0 where not recorded
  // (older profiles: there the metrics' allreduce is inside other_s).
  double collectives_s = 0;
  int collectives = 0;
  int64_t collective_bytes = 0;
  double step_s = 0;   // the whole measured step, for comparison with the prediction
  double exposed_comm_s = 0;  // measured wait after backward, for comparison
  // The allreduces' time in training: per step, the sum over buckets of start to end on
  // the master (median); 0 where not recorded.
  double comm_s = 0;
  // How long a bucket waits, once it is ready and the channel is free, before its allreduce
  // starts: the communication thread's wake-up (per bucket: the mean over a step's buckets,
  // median over steps). 0 where not recorded.
  double launch_delay_s = 0;
  // finalize()'s time after the later of backward's end and the last allreduce's end: the
  // waiting thread's wake-up and the unpacking of the summed buckets (median). 0 where not
  // recorded.
  double finish_s = 0;
  // input + forward + backward of every rank at every profiled step (empty: not recorded).
  // A bucket's allreduce can go no faster than its slowest rank is ready, so the spread of
  // these says how much later than the master's the collective starts at p ranks.
  std::vector<double> compute_samples_s;
  std::vector<ProfiledGradient> gradients;  // in registration order
  std::optional<AllreduceFit> allreduce;   // measured on the profile's ranks
};

// One point-to-point step of the ring from the line fitted over p ranks (p >= 2):
// a = 2(p-1) latency, b = 2(p-1)/p / bandwidth.
Link link_from_fit(const AllreduceFit& fit);
// b by least squares over the larger half of the sizes, a as the median intercept of the
// smaller half under that slope (the smallest size's time where that is not above 0); b
// clamped at 0. Throws std::invalid_argument for fewer than two
// distinct sizes.
AllreduceFit fit_allreduce(const std::vector<int64_t>& bytes, const std::vector<double>& seconds, int ranks);

// The median of v (the mean of the middle two for an even count); 0 for none. Profiles and
// the automatic threshold take medians of step times, robust to a stalled step.
double median(std::vector<double> v);

// How much later than a typical rank the slowest of `ranks` is ready, each step: the
// expected maximum of `ranks` draws from the profile's compute samples, less their median
// (E[max] = sum over the sorted samples x_(i) of x_(i) ((i/n)^p - ((i-1)/n)^p)). 0 for one
// rank or fewer than two samples.
double straggle_s(const Profile& profile, int ranks);

// How much slower the allreduces run while backward runs beside them than the profile's
// probe says: the factor (at least 1, at most 64) for which the model's channel at the
// profile's own setting takes as long as profile.comm_s, less the slowest rank's lag at
// the profile's ranks (the first bucket waits for it, and the model adds it apart). After
// backward ends an allreduce runs at the probe's speed. 1 where the profile has no comm_s
// or no probe. On CPU ranks whose communication thread shares the cores with backward (a
// CPU quota, oversubscription) it is well above 1; where it has a core of its own, near 1.
double comm_factor(const Profile& profile);
inline constexpr double kMaxCommFactor = 64;  // comm_factor's search ends there

// The network the profile ran on, as its probe measured it: one flat ring of its ranks over
// the fitted link (the model then gives back the fit's a + b * bytes), with comm_factor()
// of the profile. nullopt without a probe or on one rank. --fusion-threshold auto predicts
// its own ranks with it.
std::optional<Network> measured_network(const Profile& profile);

// Time of one allreduce of `bytes` over the network's ranks; 0 for one rank.
double allreduce_s(int64_t bytes, const Network& net);

// One allreduce of a few bytes, as MPI runs it (recursive doubling): ceil(log2 r) rounds
// within a node and ceil(log2 N) between nodes, each a message of all `bytes` over the
// link; 0 for one rank.
double small_allreduce_s(int64_t bytes, const Network& net);

// The profile's small collectives a step on `net`: the measured collectives_s times their
// small_allreduce_s() on `net` over that on the profile's own measured network (so at the
// profile's own setting, as measured: the wait for a late rank and MPI's own costs included,
// carried in proportion to the rounds and the links). Without a probe (one rank: only the
// host's part was measured), collectives_s plus their small_allreduce_s() on `net`.
double collectives_s(const Profile& profile, const Network& net);

struct Prediction {
  int ranks = 1;
  int64_t threshold_bytes = 0;
  int buckets = 0;
  double step_s = 0;
  double throughput = 0;    // samples per second over all ranks
  double comm_s = 0;        // total allreduce time
  double straggle_s = 0;    // the slowest rank's lag, added to every bucket's ready time
  double backward_s = 0;    // backward as predicted: between alone and beside allreduces
  double exposed_s = 0;     // the part after backward ended
  double collectives_s = 0;  // the small collectives outside the buckets (collectives_s())
  double hidden_share = 1;  // (comm - exposed) / comm; 1 with no communication
};

Prediction predict(const Profile& profile, const Network& net, int64_t threshold_bytes);

// 0, 1 KB, 2 KB, ... doubling up to the first that makes one bucket, and the profile's own.
std::vector<int64_t> candidate_thresholds(const Profile& profile);
// The candidate with the smallest predicted step; on a tie, the smaller threshold.
Prediction best_prediction(const Profile& profile, const Network& net);

struct SweepRow {
  int nodes = 1;
  Prediction at_threshold;  // the threshold asked for
  double efficiency = 1;    // throughput / (nodes * throughput on one node), same threshold
  Prediction best;
  double best_efficiency = 1;  // against one node at its own best threshold
};
// `net` gives everything but the node count.
std::vector<SweepRow> sweep(const Profile& profile, Network net, const std::vector<int>& nodes,
                            int64_t threshold_bytes);

// The profile file (JSON, "format": "tarantella-scaling-profile", "version": 1). Reading
// throws std::invalid_argument naming `what` (the file) and the field that is wrong.
std::string profile_to_json(const Profile& profile);
Profile profile_from_json(const std::string& text, const std::string& what);

}  // namespace tnt::comm::scaling
