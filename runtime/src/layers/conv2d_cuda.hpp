// The CUDA engine of Conv2D (conv2d_cuda.cu), called by conv2d.cpp.
// What every engine may assume, and the mixed-precision rules: backend/dispatch.hpp.
// Semantics: NCHW cross-correlation, square kernel, stride and symmetric padding; x (N, C, H, W),
// W (F, C, k, k), y (N, F, Ho, Wo). With saved.need_input_grads == false backward returns an
// undefined dx and needs no backward-data algorithm.
// Memory formats: y is in rc.memory_format; x may be in either format (converted), dx is in
// x's format, dy must be in y's. Algorithms are timed once per problem unless
// TNT_CUDNN_AUTOTUNE=0; a channels_last input of 1-3 channels may run padded to 4 or 8
// (TNT_CONV_PAD_CHANNELS; conv2d_cuda.cu's header).
#pragma once

#include "tarantella/layers/conv2d.hpp"

#include <vector>

namespace tnt::cuda {

std::vector<Tensor> conv2d_forward(Conv2D& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                   SavedState& saved);
std::vector<Tensor> conv2d_backward(Conv2D& layer, const std::vector<Tensor>& grad_outputs,
                                    const RunContext& rc, SavedState& saved);
// How many (problem, direction) pairs this process has timed so far (tests: the cache of
// timed choices is shared, TNT_CUDNN_AUTOTUNE=0 times nothing).
int64_t conv2d_autotune_searches();
// How many forwards this process ran with zero channels added to the input (channel padding,
// conv2d_cuda.cu's header; tests: TNT_CONV_PAD_CHANNELS reached the layer).
int64_t conv2d_padded_forwards();
// Tests: with on, a direction whose cuDNN graphs are timed (TNT_CUDNN_CONV_GRAPH) takes the
// fastest graph that agrees with the algorithm even where the algorithm is faster, so that
// the graph path runs; and how many convolution calls ran a graph so far.
void conv2d_force_graphs(bool on);
int64_t conv2d_graph_runs();

}  // namespace tnt::cuda
