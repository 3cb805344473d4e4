#include "backend/cpu/dnnl_context.hpp"

#include "tarantella/check.hpp"

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

dnnl::memory::desc plain_desc(const Shape& shape, MemoryFormat format) {
  dnnl::memory::dims dims = dnnl_dims(shape);
  dnnl::memory::dims strides(dims.size());
  if (format == MemoryFormat::channels_last) {
    TNT_CHECK(shape.size() == 4, "a channels_last descriptor needs a 4-D shape, not {}", shape_str(shape));
    // (N, C, H, W) logical, NHWC in memory: C varies fastest, then W, H, N.
    const int64_t c = dims[1], h = dims[2], w = dims[3];
    strides = {h * w * c, 1, w * c, c};
    return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, strides);
  }
  int64_t s = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    strides[i] = s;
    s *= dims[i];
  }
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, strides);
}

dnnl::memory::desc plain_desc(const Tensor& t) { return plain_desc(t.shape(), t.memory_format()); }

dnnl::memory wrap(const Tensor& t, const dnnl::memory::desc& desc) {
  TNT_CHECK(t.device().is_cpu() && t.dtype() == DType::f32, "oneDNN engine given {}", t.str());
  return dnnl::memory(desc, dnnl_engine(), t.raw());
}

dnnl::memory wrap(const Tensor& t) { return wrap(t, plain_desc(t)); }

dnnl::memory scratch(const dnnl::memory::desc& desc, Tensor& owner) {
  size_t bytes = desc.get_size();
  owner = Tensor::empty({static_cast<int64_t>((bytes + 3) / 4)}, DType::f32, Device::cpu());
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
