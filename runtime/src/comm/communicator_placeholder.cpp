// Temporary until the communication layer lands: a Communicator with no collectives.
#include "tarantella/comm.hpp"

namespace tnt {
std::unique_ptr<Communicator> Communicator::create_world(const Config&, Device) {
  return std::make_unique<Communicator>();
}
}  // namespace tnt
