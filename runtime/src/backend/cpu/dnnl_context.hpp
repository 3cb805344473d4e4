// The process's one oneDNN CPU engine and stream, and a cache of primitives keyed by a
// string that spells out everything a primitive depends on (kind, shapes, strides,
// padding, flags). Creating a oneDNN primitive costs far more than running a small one,
// so every CPU engine looks its primitives up here (once per shape) instead of creating
// them per call. Entries live until the process ends; a model has a handful of shapes.
#pragma once

#include "tarantella/config.hpp"
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
// oneDNN's type for f32 or bf16 (the two dtypes the CPU engines take); throws for others.
dnnl::memory::data_type dnnl_type(DType dtype);
// A plain row-major descriptor of shape (nchw, oihw, nc, ...); with channels_last (a 4-D
// shape only), the logical dims (N, C, H, W) with the strides of NHWC memory: oneDNN takes
// the logical order and the strides, so primitives see the same dims in both formats.
dnnl::memory::desc plain_desc(const Shape& shape, MemoryFormat format = MemoryFormat::contiguous,
                              DType dtype = DType::f32);
dnnl::memory::desc plain_desc(const Tensor& t);  // for t's shape, memory format and dtype
// Wraps a host f32 or bf16 tensor's storage (no copy); desc must have the tensor's dtype.
dnnl::memory wrap(const Tensor& t, const dnnl::memory::desc& desc);
dnnl::memory wrap(const Tensor& t);  // with plain_desc(t): the tensor's own format

// bf16 mixed precision on the CPU (TNT_CPU_BF16, docs/library.md). Whether this CPU has
// instructions for bf16 products (AVX512-BF16, or AMX), as oneDNN sees it: its effective
// instruction set, which ONEDNN_MAX_CPU_ISA may lower.
bool has_bf16_instructions();
// The instruction set oneDNN uses, in its own words ("avx512_core_bf16", "avx2", ...).
std::string isa_name();
// The decision for a knob's mode and an instruction set (testable without such a CPU):
// on = bf16 products, off = f32 products, automatic = bf16 where the CPU has the instructions.
bool native_bf16_for(AutoSwitch mode, bool bf16_instructions);
// Whether Conv2D and Dense multiply bf16 activations in bf16 in this process (the knob and
// this CPU); the other layers compute in f32 between bf16 activations either way.
bool native_bf16();
// Why a network computing in `dtype` on this CPU runs its Conv2D and Dense layers in f32
// (the emulation), for the Model's warning; empty where they multiply in bf16.
std::string emulation_reason(DType dtype);
// Creates a oneDNN primitive descriptor with make(); where oneDNN has no bf16
// implementation on this CPU (TNT_CPU_BF16=1 on a CPU without AVX-512), throws an
// InputError naming the layer, the knob and the instruction set instead of oneDNN's words.
[[noreturn]] void throw_no_bf16(const std::string& what, const char* dnnl_message);
template <class Make>
auto bf16_primitive(const std::string& what, bool bf16, Make make) -> decltype(make()) {
  if (!bf16) return make();
  try {
    return make();
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;  // another failure keeps oneDNN's words
    throw_no_bf16(what, e.what());
  }
}

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
// A memory in desc over an owner that scratch() made for it (of any dtype's desc).
dnnl::memory wrap_scratch(const Tensor& owner, const dnnl::memory::desc& desc);

void execute(dnnl::primitive& p, const std::unordered_map<int, dnnl::memory>& args);

// Cache-key spellings of a shape and of a memory descriptor (dims, strides, blocking).
std::string key_of(const Shape& shape);
std::string key_of(const dnnl::memory::desc& desc);

// c = a x b (+ bias broadcast over rows) with a cached oneDNN matmul; accumulate adds to c
// instead (a sum post-op). Descriptors carry the strides, so a transpose is a stride swap.
void matmul(const dnnl::memory& a, const dnnl::memory& b, const dnnl::memory* bias, const dnnl::memory& c,
            bool accumulate);

}  // namespace tnt::cpu
