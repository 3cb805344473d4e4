// The allreduce's cost measured on the spot, for the scaling model (comm/scaling_model.hpp):
// sizes from 4 KB up to `largest` (the job's gradients together, within [64 KB, 16 MB]),
// each allreduced several times on the communicator in use, in the memory the gradients
// live in; the slowest rank's median time per size, fitted to a + b * bytes. The sizes stop
// where the job's buckets stop, so the line is fitted where it is used (a link is not
// exactly a line: tc tbf on the test bed passes a 256 KB burst at the line rate).
// Collective; about a second on CPU ranks.
#pragma once

#include "comm/scaling_model.hpp"
#include "tarantella/comm.hpp"

namespace tnt::comm {

scaling::AllreduceFit measure_allreduce(Communicator& comm, Device device, int64_t largest);

}  // namespace tnt::comm
