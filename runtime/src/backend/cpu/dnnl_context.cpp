#include "backend/cpu/dnnl_context.hpp"

#include "tarantella/check.hpp"
#include "tarantella/runtime.hpp"

#include <mutex>

namespace tnt::cpu {

namespace {
struct DnnlContext {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<void>> cache;
};

DnnlContext& context() {
  static DnnlContext ctx;  // the private singleton of the CPU backend (see the header)
  return ctx;
}
}  // namespace

dnnl::engine& dnnl_engine() { return context().engine; }
dnnl::stream& dnnl_stream() { return context().stream; }

std::shared_ptr<void> dnnl_cache_find(const std::string& key) {
  DnnlContext& c = context();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.cache.find(key);
  return it == c.cache.end() ? nullptr : it->second;
}

void dnnl_cache_insert(const std::string& key, std::shared_ptr<void> value) {
  DnnlContext& c = context();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.cache.emplace(key, std::move(value));
}

dnnl::memory::dims dnnl_dims(const Shape& shape) { return dnnl::memory::dims(shape.begin(), shape.end()); }

dnnl::memory::data_type dnnl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return dnnl::memory::data_type::f32;
    case DType::bf16: return dnnl::memory::data_type::bf16;
    default: break;
  }
  TNT_THROW("the CPU engines take f32 or bf16 tensors, not {}", dtype_name(dtype));
}

dnnl::memory::desc plain_desc(const Shape& shape, MemoryFormat format, DType dtype) {
  const dnnl::memory::data_type type = dnnl_type(dtype);
  dnnl::memory::dims dims = dnnl_dims(shape);
  dnnl::memory::dims strides(dims.size());
  if (format == MemoryFormat::channels_last) {
    TNT_CHECK(shape.size() == 4, "a channels_last descriptor needs a 4-D shape, not {}", shape_str(shape));
    // (N, C, H, W) logical, NHWC in memory: C varies fastest, then W, H, N.
    const int64_t c = dims[1], h = dims[2], w = dims[3];
    strides = {h * w * c, 1, w * c, c};
    return dnnl::memory::desc(dims, type, strides);
  }
  int64_t s = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    strides[i] = s;
    s *= dims[i];
  }
  return dnnl::memory::desc(dims, type, strides);
}

dnnl::memory::desc plain_desc(const Tensor& t) { return plain_desc(t.shape(), t.memory_format(), t.dtype()); }

dnnl::memory wrap(const Tensor& t, const dnnl::memory::desc& desc) {
  TNT_CHECK(t.device().is_cpu() && (t.dtype() == DType::f32 || t.dtype() == DType::bf16),
            "oneDNN engine given {}", t.str());
  // A floating descriptor must have the tensor's dtype; a byte one (a batch norm's u8 ReLU
  // mask) lies over an f32 tensor used as bytes, large enough for it.
  const auto type = desc.data_type();
  const bool bytes = type == dnnl::memory::data_type::u8 || type == dnnl::memory::data_type::s8;
  TNT_CHECK(bytes ? t.nbytes() >= desc.get_size() : type == dnnl_type(t.dtype()),
            "oneDNN engine given {} for a descriptor of another dtype or size", t.str());
  return dnnl::memory(desc, dnnl_engine(), t.raw());
}

dnnl::memory wrap(const Tensor& t) { return wrap(t, plain_desc(t)); }

bool has_bf16_instructions() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & bf16) == bf16;  // AMX's mask holds AVX512-BF16's
}

std::string isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic: return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: break;
  }
  return "unknown";
}

bool native_bf16_for(AutoSwitch mode, bool bf16_instructions) {
  return mode.on() || (mode.automatic() && bf16_instructions);
}

bool native_bf16() {
  static const bool instructions = has_bf16_instructions();  // fixed for the process
  return native_bf16_for(config().cpu_bf16, instructions);
}

std::string emulation_reason(DType dtype) {
  if (dtype == DType::bf16 && native_bf16()) return "";
  if (dtype != DType::bf16) {
    return "oneDNN trains in f16 on no CPU we build for; --dtype=bf16 multiplies in bf16 on CPUs with "
           "AVX512-BF16 or AMX";
  }
  if (config().cpu_bf16.off()) return fmt::format("{}=0", env::cpu_bf16);
  return fmt::format("this CPU has no AVX512-BF16 or AMX: oneDNN's instruction set here is {}; meant for trying "
                     "a GPU program out on a CPU", isa_name());
}

void throw_no_bf16(const std::string& what, const char* dnnl_message) {
  const std::string where = fmt::format("{}: oneDNN has no bf16 implementation on this CPU (instruction set {}; "
                                        "oneDNN says: {})", what, isa_name(), dnnl_message);
  if (config().cpu_bf16.on()) {
    throw InputError(fmt::format("{}; {}=1 asks for bf16 products on any CPU: unset it, or set it to auto (bf16 "
                                 "products where the CPU has AVX512-BF16 or AMX) or 0",
                                 where, env::cpu_bf16));
  }
  throw InputError(where + "; give it f32 inputs, or let a network with set_compute_dtype(bf16) choose");
}

dnnl::memory scratch(const dnnl::memory::desc& desc, Tensor& owner) {
  size_t bytes = desc.get_size();
  owner = Tensor::empty({static_cast<int64_t>((bytes + 3) / 4)}, DType::f32, Device::cpu());
  return dnnl::memory(desc, dnnl_engine(), owner.raw());
}

dnnl::memory wrap_scratch(const Tensor& owner, const dnnl::memory::desc& desc) {
  TNT_CHECK(owner.device().is_cpu() && owner.nbytes() >= desc.get_size(), "a oneDNN scratch of {} for {} bytes",
            owner.str(), desc.get_size());
  return dnnl::memory(desc, dnnl_engine(), owner.raw());
}

void reorder_into(const dnnl::memory& src, const dnnl::memory& dst) {
  // Reorder primitives are cached too: keyed by the two layouts.
  std::string key = "reorder|" + key_of(src.get_desc()) + "|" + key_of(dst.get_desc());
  auto prim = dnnl_cached<dnnl::reorder>(key, [&] { return dnnl::reorder(src, dst); });
  prim->execute(dnnl_stream(), const_cast<dnnl::memory&>(src), const_cast<dnnl::memory&>(dst));
  dnnl_stream().wait();
}

void reorder_add_into(const dnnl::memory& src, const dnnl::memory& dst) {
  std::string key = "reorder_add|" + key_of(src.get_desc()) + "|" + key_of(dst.get_desc());
  auto prim = dnnl_cached<dnnl::reorder>(key, [&] {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    return dnnl::reorder(src, dst, attr);
  });
  prim->execute(dnnl_stream(), const_cast<dnnl::memory&>(src), const_cast<dnnl::memory&>(dst));
  dnnl_stream().wait();
}

dnnl::memory reorder_to(const dnnl::memory& src, const dnnl::memory::desc& desc, Tensor* keep) {
  if (src.get_desc() == desc) return src;
  Tensor owner;
  dnnl::memory dst = scratch(desc, owner);
  reorder_into(src, dst);
  if (keep) *keep = owner;
  else TNT_THROW("reorder_to: the new buffer needs an owner");
  return dst;
}

void execute(dnnl::primitive& p, const std::unordered_map<int, dnnl::memory>& args) {
  p.execute(dnnl_stream(), args);
  dnnl_stream().wait();
}

std::string key_of(const Shape& shape) { return shape_str(shape); }

std::string key_of(const dnnl::memory::desc& desc) {
  const dnnl_memory_desc_t& c = desc.data;
  std::string k = fmt::format("t{}f{}:", static_cast<int>(c.data_type), static_cast<int>(c.format_kind));
  for (int i = 0; i < c.ndims; ++i) k += fmt::format("{},", c.dims[i]);
  if (c.format_kind == dnnl_blocked) {
    const auto& b = c.format_desc.blocking;
    k += "s";
    for (int i = 0; i < c.ndims; ++i) k += fmt::format("{},", b.strides[i]);
    k += "b";
    for (int i = 0; i < b.inner_nblks; ++i) k += fmt::format("{}/{},", b.inner_idxs[i], b.inner_blks[i]);
  }
  return k;
}

void matmul(const dnnl::memory& a, const dnnl::memory& b, const dnnl::memory* bias, const dnnl::memory& c,
            bool accumulate) {
  std::string key = fmt::format("matmul|{}|{}|{}|{}|{}", key_of(a.get_desc()), key_of(b.get_desc()),
                                bias ? key_of(bias->get_desc()) : "-", key_of(c.get_desc()), accumulate);
  auto prim = dnnl_cached<dnnl::matmul>(key, [&] {
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    dnnl::matmul::desc d = bias ? dnnl::matmul::desc(a.get_desc(), b.get_desc(), bias->get_desc(), c.get_desc())
                                : dnnl::matmul::desc(a.get_desc(), b.get_desc(), c.get_desc());
    return dnnl::matmul(dnnl::matmul::primitive_desc(d, attr, dnnl_engine()));
  });
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  if (bias) args.emplace(DNNL_ARG_BIAS, *bias);
  execute(*prim, args);
}

}  // namespace tnt::cpu
