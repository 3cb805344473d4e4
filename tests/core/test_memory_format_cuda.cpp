// Memory formats on a GPU: the CUDA conversion against the host loop byte for byte, for
// every element size; copies between host and device keep the format; tnt::ops with
// operands in two formats (the conversion before the CUDA dispatch) against the CPU. All
// values are small integers, exact in every dtype used, so every comparison is exact
// (tolerance 0): a misplaced element is a wrong number.
#include "gpu_test_util.hpp"

#include "tarantella/ops.hpp"

#include <cstring>
#include <numeric>

using namespace tnt;
using tnt::test::gpu;

namespace {

Tensor iota(const Shape& shape, DType dtype = DType::f32) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  std::iota(v.begin(), v.end(), 0.0f);
  Tensor f = Tensor::from_vector(v, shape);
  return dtype == DType::f32 ? f : ops::cast(f, dtype);
}

std::vector<char> bytes(const Tensor& t) {
  Tensor h = t.to(Device::cpu());
  std::vector<char> out(h.nbytes());
  std::memcpy(out.data(), h.raw(), h.nbytes());
  return out;
}

}  // namespace

TEST_CASE("CUDA: channels_last conversion equals the host's, every element size", "[memory_format][gpu]") {
  const Shape shape{3, 5, 7, 2};  // odd sizes: no symmetry hides a transposition
  for (DType d : {DType::u8, DType::f16, DType::bf16, DType::f32, DType::i64}) {
    INFO("dtype " << dtype_name(d));
    Tensor host = iota(shape, d);  // 0..209: exact in every dtype here (u8 to 255, bf16 to 256)
    Tensor dev = host.to(gpu());
    Tensor dev_cl = dev.to_memory_format(MemoryFormat::channels_last);
    CHECK(dev_cl.is_channels_last());
    CHECK(dev_cl.device() == gpu());
    Tensor host_cl = host.to_memory_format(MemoryFormat::channels_last);
    CHECK(bytes(dev_cl) == bytes(host_cl));
    // Back on the device, and to the host keeping the format.
    CHECK(bytes(dev_cl.contiguous()) == bytes(host));
    Tensor back = dev_cl.to(Device::cpu());
    CHECK(back.is_channels_last());
    CHECK(back.to_double_vector() == host.to_double_vector());
    // copy_from across formats and devices: logical contents.
    Tensor into = Tensor::zeros(shape, d, gpu());
    into.copy_from(host_cl);
    CHECK(bytes(into) == bytes(host));
  }
}

TEST_CASE("CUDA: ops with operands in two formats equal the CPU's", "[memory_format][gpu]") {
  const Shape shape{2, 3, 4, 5};
  Tensor a = iota(shape);
  Tensor b = iota(shape);
  ops::scale(b, 2.0);
  Tensor a_cl = a.to_memory_format(MemoryFormat::channels_last);
  const Tensor want = ops::add(a_cl, b);  // CPU, channels_last (tested in test_memory_format)
  REQUIRE(want.is_channels_last());

  Tensor s = ops::add(a_cl.to(gpu()), b.to(gpu()));
  CHECK(s.is_channels_last());
  CHECK(bytes(s) == bytes(want));
  Tensor y = a_cl.to(gpu());
  ops::axpy(2.0, a.to(gpu()), y);  // y channels_last, x contiguous: 3a
  CHECK(y.is_channels_last());
  std::vector<double> three(static_cast<size_t>(a.numel()));
  for (size_t i = 0; i < three.size(); ++i) three[i] = 3.0 * static_cast<double>(i);
  CHECK(y.to_double_vector() == three);
  Tensor h = ops::cast(a_cl.to(gpu()), DType::bf16);  // 0..119: exact in bf16
  CHECK(h.is_channels_last());
  CHECK(h.to_double_vector() == a.to_double_vector());
  Tensor dst = Tensor::zeros(shape, DType::f16, gpu());
  ops::copy_cast(a_cl.to(gpu()), dst);
  CHECK_FALSE(dst.is_channels_last());
  CHECK(dst.to_double_vector() == a.to_double_vector());
  CHECK(ops::sum(a_cl.to(gpu())) == ops::sum(a));
  Tensor am = ops::argmax_rows(a_cl.to(gpu()));
  CHECK(am.to_double_vector() == std::vector<double>(24, 4.0));  // the last of every row of W
}
