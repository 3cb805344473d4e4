// The process's one oneDNN CPU engine and stream, and a cache of primitives keyed by a
// string that spells out everything a primitive depends on (kind, shapes, strides,
// padding, flags). Creating a oneDNN primitive costs far more than running a small one,
// so every CPU engine looks its primitives up here (once per shape) instead of creating
// them per call. Entries live until the process ends; a model has a handful of shapes.
#pragma once

#include "tarantella/tensor.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <memory>
#include <string>
#include <unordered_map>

namespace tnt::cpu {

dnnl::engine& dnnl_engine();
dnnl::stream& dnnl_stream();

// Returns the cached object for key, creating it with make() on first use.
std::shared_ptr<void> dnnl_cache_find(const std::string& key);
void dnnl_cache_insert(const std::string& key, std::shared_ptr<void> value);

template <class T, class Make>
std::shared_ptr<T> dnnl_cached(const std::string& key, Make make) {
  if (auto p = dnnl_cache_find(key)) return std::static_pointer_cast<T>(p);
  auto value = std::make_shared<T>(make());
  dnnl_cache_insert(key, value);
  return value;
}

dnnl::memory::dims dnnl_dims(const Shape& shape);
// A plain row-major f32 descriptor of shape (nchw, oihw, nc, ...); with channels_last (a
// 4-D shape only), the logical dims (N, C, H, W) with the strides of NHWC memory: oneDNN
// takes the logical order and the strides, so primitives see the same dims in both formats.
dnnl::memory::desc plain_desc(const Shape& shape, MemoryFormat format = MemoryFormat::contiguous);
dnnl::memory::desc plain_desc(const Tensor& t);  // for t's shape and memory format
// Wraps a host f32 tensor's storage (no copy).
dnnl::memory wrap(const Tensor& t, const dnnl::memory::desc& desc);
dnnl::memory wrap(const Tensor& t);  // with plain_desc(t): the tensor's own format

// Memory in `desc`: src itself when its layout already matches, else a new buffer filled
// by a reorder. keep (optional) receives the tensor owning the new buffer.
dnnl::memory reorder_to(const dnnl::memory& src, const dnnl::memory::desc& desc, Tensor* keep = nullptr);
// Copies src into dst (any two layouts of one logical tensor).
void reorder_into(const dnnl::memory& src, const dnnl::memory& dst);
// dst += src, src taken from its layout into dst's: one reorder with a sum post-op, where a
// copy and an axpy would pass over dst twice. Each element is dst + src rounded once (the
// sum's scale is 1), as the axpy's.
void reorder_add_into(const dnnl::memory& src, const dnnl::memory& dst);
// A host tensor of bytes large enough for desc, and a memory over it.
dnnl::memory scratch(const dnnl::memory::desc& desc, Tensor& owner);

void execute(dnnl::primitive& p, const std::unordered_map<int, dnnl::memory>& args);

// Cache-key spellings of a shape and of a memory descriptor (dims, strides, blocking).
std::string key_of(const Shape& shape);
std::string key_of(const dnnl::memory::desc& desc);

// c = a x b (+ bias broadcast over rows) with a cached oneDNN matmul; accumulate adds to c
// instead (a sum post-op). Descriptors carry the strides, so a transpose is a stride swap.
void matmul(const dnnl::memory& a, const dnnl::memory& b, const dnnl::memory* bias, const dnnl::memory& c,
            bool accumulate);

}  // namespace tnt::cpu
