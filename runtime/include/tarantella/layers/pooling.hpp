// Pooling over NCHW images: (N, C, H, W) -> (N, C, Ho, Wo), Ho = (H + 2 padding - pool) /
// stride + 1 (floor). Square windows; stride 0 means stride = pool_size.
// MaxPool2D: padding never wins the max; the gradient goes to the first maximum of a window.
// AvgPool2D: padded positions are excluded from the average (Keras' "same", oneDNN's
// avg_exclude_padding; PyTorch would use count_include_pad=False).
#pragma once

#include "tarantella/layer.hpp"

namespace tnt {

class Pool2DBase : public Layer {
 public:
  Pool2DBase(int64_t pool_size, int64_t stride, int64_t padding, std::string name);
  std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const override;
  int64_t pool_size() const { return pool_; }
  int64_t stride() const { return stride_; }
  int64_t padding() const { return padding_; }

 protected:
  int64_t pool_;
  int64_t stride_;
  int64_t padding_;
};

class MaxPool2D : public Pool2DBase {
 public:
  explicit MaxPool2D(int64_t pool_size, int64_t stride = 0, int64_t padding = 0, std::string name = "");
  MaxPool2D(int64_t pool_size, std::string name) : MaxPool2D(pool_size, 0, 0, std::move(name)) {}
  std::string type() const override { return "MaxPool2D"; }
  bool supports_memory_format(MemoryFormat) const override { return true; }  // keep their input's format
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;
};

class AvgPool2D : public Pool2DBase {
 public:
  explicit AvgPool2D(int64_t pool_size, int64_t stride = 0, int64_t padding = 0, std::string name = "");
  AvgPool2D(int64_t pool_size, std::string name) : AvgPool2D(pool_size, 0, 0, std::move(name)) {}
  std::string type() const override { return "AvgPool2D"; }
  bool supports_memory_format(MemoryFormat) const override { return true; }  // keep their input's format
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;
};

// Mean over H and W: (N, C, H, W) -> (N, C) (Keras' GlobalAveragePooling2D).
class GlobalAveragePool : public Layer {
 public:
  explicit GlobalAveragePool(std::string name = "");
  std::string type() const override { return "GlobalAveragePool"; }
  bool supports_memory_format(MemoryFormat) const override { return true; }  // an (N, C) result from either
  std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const override;
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;
};

}  // namespace tnt
