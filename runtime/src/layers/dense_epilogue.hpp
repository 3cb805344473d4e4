// What Dense applies after x W^T + b (DenseOptions::activation and ::dropout), decided once
// per forward call and kept for its backward by both engines (dense.cpp, dense_cuda.cu).
#pragma once

#include "tarantella/layers/dense.hpp"
#include "tarantella/layers/dropout.hpp"

#include "layers/dropout_mask.hpp"

#include <cstdint>

namespace tnt::detail {

struct DenseEpilogue {
  bool relu = false;
  bool dropout = false;  // applied in this call (training and a rate above 0)
  uint64_t key = 0;      // the mask of a Dropout named like the layer
  uint64_t base = 0;     // counter of the output's element 0
  float rate = 0.0f;
  float keep_scale = 1.0f;

  bool any() const { return relu || dropout; }

  static DenseEpilogue make(const Dense& layer, const RunContext& rc, const Shape& out_shape) {
    DenseEpilogue e;
    e.relu = layer.options().activation == DenseActivation::relu;
    e.dropout = rc.training && layer.options().dropout > 0.0;
    if (e.dropout) {
      e.key = dropout_mask_key(layer.name(), rc);
      e.base = Dropout::mask_counter(rc, out_shape);
      e.rate = static_cast<float>(layer.options().dropout);
      e.keep_scale = static_cast<float>(1.0 / (1.0 - layer.options().dropout));
    }
    return e;
  }
};

}  // namespace tnt::detail
