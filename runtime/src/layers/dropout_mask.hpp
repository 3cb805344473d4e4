// The dropout mask rule (tarantella/layers/dropout.hpp), shared by Dropout and by Dense's
// dropout (tarantella/layers/dense.hpp) so that both draw the same mask for the same name.
#pragma once

#include "tarantella/layer.hpp"

#include <cstdint>
#include <string>

namespace tnt::detail {

// CounterRng(rc.seed, "<layer_name>/dropout/<step>").key().
uint64_t dropout_mask_key(const std::string& layer_name, const RunContext& rc);

}  // namespace tnt::detail
