// Private to runtime/src/nn: the node behind a SymTensor, shared by the files that record
// calls (symbolic.cpp), order and name them (network.cpp), run them (executor.cpp) and
// print them (summary.cpp). A node is one call of a layer, or an Input (layer == null).
#pragma once

#include "tarantella/graph.hpp"

#include <string>
#include <vector>

namespace tnt {

namespace detail {

struct GraphNode {
  Layer* layer = nullptr;          // null for an Input
  LayerPtr owner;                  // keeps the layer alive where it lives in a shared_ptr
  std::vector<SymTensor> inputs;
  std::vector<Shape> shapes;       // per output, -1 where the size follows the batch
  std::vector<DType> dtypes;       // per output
  std::string input_name;          // Inputs only
};

// "(None, 32, 28, 28)": -1 (a size that follows the batch) is shown as None, as in Keras.
std::string sym_shape_str(const Shape& s);

}  // namespace detail

}  // namespace tnt
