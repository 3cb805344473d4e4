// Before the ranks exchange a network's tensors one by one (the initial weights, a
// checkpoint the master read), they agree that they built the same network: another layer,
// size or order on one rank would pair tensors of different sizes in the broadcasts (a
// crash inside MPI, or garbage weights).
#pragma once

#include "tarantella/comm.hpp"
#include "tarantella/graph.hpp"

#include <string>

namespace tnt::detail {

// Collective. Throws InputError on every rank, naming `what`, the first parameter or buffer
// that differs and the ranks on each side, when the ranks' networks differ in their
// tensors' names, shapes or dtypes.
void require_same_network(Communicator& comm, Network& network, const std::string& what);
// The same over any list of named tensors (a checkpoint's, optimizer state included).
void require_same_tensors(Communicator& comm, const std::vector<std::pair<std::string, Tensor>>& tensors,
                          const std::string& what);

// Collective. The master's buffers (BatchNorm's running statistics, each rank's own while it
// trains) on every rank: an evaluation then is of the model a checkpoint saves, on every
// rank, as DDP's broadcast of rank 0's buffers gives.
void share_master_buffers(Communicator& comm, Network& network);

// Collective: `t` from `root` on every rank, through host memory where it is on a device.
// Parameter-server jobs have CPU servers beside GPU workers, and one collective needs one
// kind of buffer on every rank; the weights go out once, where the copy costs little.
void broadcast_via_host(Communicator& comm, Tensor& t, int root);

}  // namespace tnt::detail
