// Tensor: a shape, a dtype, a device, a memory format and shared ownership of storage.
// Images are NCHW: shapes are always logical (N, C, H, W), whatever the memory format.
// Copies between host and device are explicit (to(), copy_from()). reshape() and view()
// share storage; clone() copies.
#pragma once

#include "tarantella/check.hpp"
#include "tarantella/device.hpp"
#include "tarantella/dtype.hpp"

#include <cstdint>
#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace tnt {

using Shape = std::vector<int64_t>;

// How the elements of a 4-D tensor lie in memory. `contiguous`: row-major in the logical
// shape (N, C, H, W). `channels_last`: row-major in (N, H, W, C), what cuDNN calls NHWC and
// PyTorch channels_last; tensor cores run convolutions in it without transposes. Only
// 4-D tensors can be channels_last. What keeps the format:
//   - element-wise ops (the result has the format of the first operand), clone(), to(),
//     slice_rows() (N is outermost in both), fill_/zero_;
//   - copy_from() copies logical contents, converting when the formats differ;
//   - to_vector()/to_double_vector() return the logical (N, C, H, W) order;
//   - reshape() to another shape needs a contiguous tensor (contiguous() first); view() is a
//     byte view and always contiguous (fusion buffers): a view of a channels_last tensor
//     sees its elements in memory (N, H, W, C) order;
//   - ops (ops.hpp) convert a second operand to the first's format, and refuse operands
//     that differ in format and shape; a layer gets channels_last tensors only when it
//     says it supports them (Layer::supports_memory_format).
// Networks keep 4-D activations channels_last between the layers that support it when asked
// (Network::set_memory_format); the executor converts at the other layers.
enum class MemoryFormat : uint8_t { contiguous, channels_last };
const char* memory_format_name(MemoryFormat format);  // "contiguous", "channels_last"
// Parses those names and PyTorch's/TensorFlow's: "channels_first" = contiguous; throws InputError.
MemoryFormat parse_memory_format(const std::string& text);
int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "(N, 3, 224, 224)"-style: "(32, 3, 224, 224)"

// Raw storage on one device. Freed through the device's allocator when the last owner goes.
class Storage {
 public:
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
};

class Tensor {
 public:
  Tensor() = default;

  // format channels_last needs a 4-D shape.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu(),
                      MemoryFormat format = MemoryFormat::contiguous);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu(),
                      MemoryFormat format = MemoryFormat::contiguous);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = Device::cpu());
  // Host f32 tensor holding a copy of values (size must equal the shape's element count).
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape);
  template <typename T>
  static Tensor from_data(const T* values, const Shape& shape) {
    Tensor t = empty(shape, dtype_of<T>());
    std::copy(values, values + t.numel(), t.data<T>());
    return t;
  }

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  MemoryFormat memory_format() const { return format_; }
  bool is_channels_last() const { return format_ == MemoryFormat::channels_last; }
  std::string str() const;  // "f32(2, 3) on cpu", "f32(2, 3, 4, 4) channels_last on cuda:0"

  void* raw() const;
  template <typename T>
  T* data() const {
    TNT_CHECK(dtype_of<T>() == dtype_, "tensor of {} accessed as {}", dtype_name(dtype_),
              dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw());
  }

  // Same storage, new shape (element count must match).
  Tensor reshape(const Shape& shape) const;
  // Rows [begin, end) along the first dimension, sharing storage.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Same storage, different dtype/shape at a byte offset (for fusion buffers); bounds-checked.
  Tensor view(const Shape& shape, DType dtype, size_t byte_offset) const;

  // This tensor in `format`: itself (shared) when it already is, else a converted copy on
  // the same device (a tensor that is not 4-D is only ever contiguous).
  Tensor to_memory_format(MemoryFormat format) const;
  Tensor contiguous() const { return to_memory_format(MemoryFormat::contiguous); }

  Tensor to(Device device) const;  // copy to device (a copy even when the device is the same)
  Tensor clone() const;
  void copy_from(const Tensor& src);  // same numel and dtype; any devices
  void zero_();
  void fill_(double value);

  // Host copy as doubles / floats (any dtype, any device): for tests and printing.
  std::vector<float> to_vector() const;
  std::vector<double> to_double_vector() const;

  const std::shared_ptr<Storage>& storage() const { return storage_; }
  size_t byte_offset() const { return offset_; }

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes into storage
  Shape shape_;
  DType dtype_ = DType::f32;
  MemoryFormat format_ = MemoryFormat::contiguous;
};

}  // namespace tnt
