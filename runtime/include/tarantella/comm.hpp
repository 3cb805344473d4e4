// Communicator: the job's collectives. Host buffers go over MPI (our ring, or
// MPI_Allreduce); device buffers over NCCL. Created by tnt::init; reach it with
// tnt::communicator().
#pragma once

#include "tarantella/config.hpp"
#include "tarantella/device.hpp"
#include "tarantella/tensor.hpp"

#include <memory>

namespace tnt {

class Communicator {
 public:
  // Wraps MPI_COMM_WORLD (MPI must be initialised); device is this rank's device.
  static std::unique_ptr<Communicator> create_world(const Config& config, Device device);
  virtual ~Communicator() = default;
};

}  // namespace tnt
