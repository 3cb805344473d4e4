// The allreduce's cost measured on the spot, for the scaling model (comm/scaling_model.hpp):
// a few sizes from a few KB to a few MB, each allreduced several times on the communicator
// in use, in the memory the gradients live in; the slowest rank's median time per size,
// fitted to a + b * bytes. Collective; about a second on CPU ranks.
#pragma once

#include "comm/scaling_model.hpp"
#include "tarantella/comm.hpp"

namespace tnt::comm {

scaling::AllreduceFit measure_allreduce(Communicator& comm, Device device);

}  // namespace tnt::comm
