// Gradient clipping of GradientClipping (tarantella/optim.hpp), in place, on CPU or CUDA.
#pragma once

#include "optim/multi_tensor.hpp"
#include "tarantella/optim.hpp"

#include <vector>

namespace tnt {

// InputError for a non-positive (or NaN) threshold, or norm and global_norm together.
void check_clipping(const GradientClipping& clipping);

// grads: the gradients of one step, all f32 on one device; global_norm is taken over all of them.
void clip_gradients(const GradientClipping& clipping, const std::vector<Tensor>& grads);

// The same for the gradients of a multi-tensor table (on a CUDA device), in at most three
// launches and without a readback; bitwise the result of the call above on those gradients.
void clip_gradients(const GradientClipping& clipping, const optim::MtLaunch& launch);

}  // namespace tnt
