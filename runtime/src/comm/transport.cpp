#include "comm/transport.hpp"

#include "core/timeline_events.hpp"
#include "tarantella/check.hpp"

namespace tnt::comm {

std::vector<FusedBucket> fuse_buckets(const TransportSetup& setup) {
  std::vector<FusedBucket> out;
  for (size_t b = 0; b < setup.plan.buckets.size(); ++b) {
    const PlannedBucket& pb = setup.plan.buckets[b];
    FusedBucket f;
    for (size_t g : pb.gradients) f.members.push_back(setup.grads[g]);
    f.offsets = pb.offsets;
    f.dtype = pb.dtype;
    f.bytes = pb.bytes;
    f.algo = setup.comm.resolve(setup.options.algo, pb.device);
    f.what = fmt::format("Reducer bucket {} ({} B)", b, pb.bytes);
    std::string names;
    for (size_t g : pb.gradients) names += (names.empty() ? "" : ", ") + setup.names[g];
    f.trace_args = fmt::format(R"("bucket":{},"bytes":{},"tensors":"{}")", b, pb.bytes, timeline::escape(names));
    // On one rank nothing is sent (the Reducer only scales the gradients in place): a fused
    // buffer would be as large as the bucketed gradients and never used.
    if (pb.gradients.size() > 1 && setup.comm.size() > 1) {
      f.fused = Tensor::empty({pb.elements}, pb.dtype, pb.device);  // (bucket elements,)
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace tnt::comm
