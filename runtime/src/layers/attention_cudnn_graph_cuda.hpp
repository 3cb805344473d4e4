// The cuDNN flash-attention engine's two operation graphs (attention_cudnn_graph_cuda.cpp):
// built node by node for a key and a bias layout, for the plans of attention_cudnn_cuda.cpp
// and for tests to read back. Internal to the engine.
#pragma once

#include "backend/cuda/cudnn_graph.hpp"
#include "layers/attention_cudnn_cuda.hpp"

namespace tnt::cuda::attention_graph {

// Non-virtual tensors, by unique id (the variant pack names them so).
enum Uid : int64_t {
  kQ = 1,
  kKT = 2,
  kV = 3,         // forward: V [B, H, Tk, d]; backward: V^T [B, H, d, Tk]
  kO = 4,
  kStats = 5,
  kScale = 6,     // by value
  kBias = 7,
  kSeed = 8,
  kOffset = 9,
  kMaskValue = 10,  // by value: causal's replacement logit
  kDropScale = 11,  // by value: 1 / (1 - rate)
  kDropKeep = 12,   // by value: 1 - rate (backward: the dO.O row sums times it)
  kDO = 13,
  kDQ = 14,
  kDK = 15,
  kDV = 16,
  kSoftmaxSum = 17,  // backward: (B, H, Tq, 1) f32 scratch of ours
  kDQAccum = 18,     // backward: (B, H, Tq, d) f32 scratch of ours, zeroed
  kFirstVirtual = 1000,
};

// One graph's descriptors (graph::GraphParts), virtual uids from kFirstVirtual.
struct GraphParts : graph::GraphParts {
  GraphParts() : graph::GraphParts(kFirstVirtual) {}
};

// The forward graph (S = scale Q K^T + bias, masked; softmax with its statistics; dropout;
// O = P V) and the backward graph of key, with the padding bias in `layout`.
void build_forward(GraphParts& p, const CudnnAttentionKey& key, const CudnnBiasLayout& layout);
void build_backward(GraphParts& p, const CudnnAttentionKey& key, const CudnnBiasLayout& layout);

}  // namespace tnt::cuda::attention_graph
