// Which tensor holds a NaN or an infinity: what the checkpoint savers refuse to write, and
// what TerminateOnNaN stops on at an epoch's end.
#pragma once

#include "tarantella/optim.hpp"  // NamedTensor

#include <string>
#include <vector>

namespace tnt::detail {

// The name of the first tensor holding a NaN or an infinity, or "" when all are finite.
// The usual answer comes from one fused check per device (one round trip on CUDA); only a
// model that diverged is looked at tensor by tensor, to name the culprit.
std::string first_non_finite(const std::vector<NamedTensor>& tensors);

}  // namespace tnt::detail
