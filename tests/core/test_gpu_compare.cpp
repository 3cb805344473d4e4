// The comparison rule every GPU test uses (tests/support/gpu_test_util.hpp), checked on the
// CPU: a rule that lets a wrong GPU value pass would make every GPU test unable to fail.
#include "gpu_test_util.hpp"

#include <limits>

using tnt::test::element_matches;

namespace {
constexpr double pinf = std::numeric_limits<double>::infinity();
const double qnan = std::numeric_limits<double>::quiet_NaN();
}  // namespace

TEST_CASE("GPU comparison: finite values within the tolerance, and only those", "[compare]") {
  CHECK(element_matches(1.0, 1.0, 0.0));
  CHECK(element_matches(1.0 + 1e-7, 1.0, 1e-6));
  CHECK_FALSE(element_matches(1.0 + 1e-5, 1.0, 1e-6));
  CHECK(element_matches(-0.0, 0.0, 0.0));  // signed zeros compare equal as values
}

TEST_CASE("GPU comparison: a non-finite CPU value is matched exactly", "[compare]") {
  // Equal infinities match (pinf - pinf is NaN: the old rule failed them).
  CHECK(element_matches(pinf, pinf, 1e-3));
  CHECK(element_matches(-pinf, -pinf, 1e-3));
  // Anything else against an infinity fails, however large the tolerance (the old rule
  // allowed rtol * pinf = pinf, so 1.0 or -pinf passed against +pinf).
  CHECK_FALSE(element_matches(1.0, pinf, pinf));
  CHECK_FALSE(element_matches(-pinf, pinf, 1e-3));
  CHECK_FALSE(element_matches(qnan, pinf, 1e-3));
  CHECK_FALSE(element_matches(3e38, pinf, 1e-3));
  // NaN matches only NaN.
  CHECK(element_matches(qnan, qnan, 0.0));
  CHECK_FALSE(element_matches(0.0, qnan, 1e9));
  CHECK_FALSE(element_matches(pinf, qnan, 1e9));
}

TEST_CASE("GPU comparison: a finite CPU value needs a finite GPU value", "[compare]") {
  CHECK_FALSE(element_matches(pinf, 1.0, pinf));
  CHECK_FALSE(element_matches(qnan, 1.0, pinf));
  CHECK_FALSE(element_matches(-pinf, -1e300, 1e300));
}

TEST_CASE("GPU comparison: require_close over tensors passes matching non-finite values", "[compare]") {
  const float f_inf = std::numeric_limits<float>::infinity();
  const float f_nan = std::numeric_limits<float>::quiet_NaN();
  tnt::Tensor cpu = tnt::Tensor::from_vector({1.0f, f_inf, -f_inf, f_nan, -0.0f}, {5});
  tnt::Tensor gpu = tnt::Tensor::from_vector({1.0f + 1e-7f, f_inf, -f_inf, f_nan, 0.0f}, {5});
  tnt::test::require_close(gpu, cpu, 1e-6, 1e-6, "matching values");
}
