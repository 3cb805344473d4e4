// Two kinds of failure, because main answers them differently: InputError is the user's
// to fix (a flag, a hostfile line, a missing program) and is reported without a stack of
// context; SystemError is the machine refusing (fork, socket, topology) and carries errno.
#pragma once

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tnt::launcher {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct SystemError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "what: strerror(errno)", read at the call so errno is still the one that failed.
inline SystemError system_error(const std::string& what) {
  return SystemError(what + ": " + std::strerror(errno));
}

}  // namespace tnt::launcher
