// The rules of TNT_CUDNN_ATTENTION=auto (layers/attention_choice.hpp), testable without a
// GPU: when cuDNN's results count as agreeing with the other engine's, when its dropout is
// consistent, and when it is fast enough to take a shape. The trial that feeds them runs
// on a GPU (layers_attention_cudnn_cuda_auto).
#include <catch2/catch.hpp>

#include "layers/attention_choice.hpp"

#include <cmath>
#include <limits>

namespace rules = tnt::attention_choice;

TEST_CASE("auto attention: an output agrees within 2^-4 of the reference's largest value", "[attention_choice]") {
  CHECK(rules::agrees(0.0, 1.0));
  CHECK(rules::agrees(1.0 / 16, 1.0));
  CHECK_FALSE(rules::agrees(1.0 / 16 + 1e-9, 1.0));
  CHECK(rules::agrees(0.6, 10.0));
  CHECK_FALSE(rules::agrees(0.7, 10.0));
  // A reference that cannot judge: all zero, or not finite.
  CHECK_FALSE(rules::agrees(0.0, 0.0));
  CHECK_FALSE(rules::agrees(0.0, std::numeric_limits<double>::infinity()));
  CHECK_FALSE(rules::agrees(0.0, std::nan("")));
  // A result with NaN (max_difference counts NaN as infinite) or infinities.
  CHECK_FALSE(rules::agrees(std::numeric_limits<double>::infinity(), 1.0));
  CHECK_FALSE(rules::agrees(std::nan(""), 1.0));
}

TEST_CASE("auto attention: dropout's backward must match its forward", "[attention_choice]") {
  // <V, dV> = <o, o> up to rounding.
  CHECK(rules::dropout_backward_consistent(1000.0, 1000.0));
  CHECK(rules::dropout_backward_consistent(1000.0, 1050.0));
  CHECK(rules::dropout_backward_consistent(1000.0, 950.0));
  // A backward without the 1 / (1 - r) of rate 0.1 gives 0.9 of it; another mask less still.
  CHECK_FALSE(rules::dropout_backward_consistent(1000.0, 900.0));
  CHECK_FALSE(rules::dropout_backward_consistent(1000.0, 1111.0));
  CHECK_FALSE(rules::dropout_backward_consistent(1000.0, 500.0));
  CHECK_FALSE(rules::dropout_backward_consistent(0.0, 0.0));
  CHECK_FALSE(rules::dropout_backward_consistent(1000.0, std::nan("")));
}

TEST_CASE("auto attention: dropout keeps the mean where the noise allows a check", "[attention_choice]") {
  CHECK(rules::dropout_mean_checkable(4096, 0.1));
  CHECK(rules::dropout_mean_checkable(1 << 20, 0.5));
  CHECK_FALSE(rules::dropout_mean_checkable(4095, 0.1));
  CHECK_FALSE(rules::dropout_mean_checkable(1 << 20, 0.6));
  CHECK(rules::dropout_mean_agrees(1.0, 1.0));
  CHECK(rules::dropout_mean_agrees(1.05, 1.0));
  CHECK(rules::dropout_mean_agrees(0.95, 1.0));
  // Kept probabilities not scaled by 1 / (1 - 0.1): 0.9. The mask inverted: about 0.11.
  CHECK_FALSE(rules::dropout_mean_agrees(0.9, 1.0));
  CHECK_FALSE(rules::dropout_mean_agrees(0.11, 1.0));
  CHECK_FALSE(rules::dropout_mean_agrees(1.0, 0.0));
  CHECK_FALSE(rules::dropout_mean_agrees(std::nan(""), 1.0));
}

TEST_CASE("auto attention: dropout's noise is r / (1 - r) of the undropped output", "[attention_choice]") {
  // <o, o>, <o, o_0>, <o_0, o_0> -> |o - o_0|^2 / |o_0|^2.
  CHECK(rules::dropout_noise(1.0, 1.0, 1.0) == 0.0);
  CHECK(rules::dropout_noise(1.2, 1.0, 1.0) == Approx(0.2));
  CHECK(rules::dropout_noise(4.0, 1.0, 1.0) == Approx(3.0));
  const double r = 0.1, expected = r / (1.0 - r);
  CHECK(rules::dropout_noise_agrees(expected, r));
  CHECK(rules::dropout_noise_agrees(0.6 * expected, r));
  CHECK(rules::dropout_noise_agrees(1.9 * expected, r));
  // A dropout that drops nothing; one that keeps with probability r instead of 1 - r
  // ((1 - r) / r = 9 at rate 0.1); and no rate at all.
  CHECK_FALSE(rules::dropout_noise_agrees(0.0, r));
  CHECK_FALSE(rules::dropout_noise_agrees(0.4 * expected, r));
  CHECK_FALSE(rules::dropout_noise_agrees((1.0 - r) / r, r));
  CHECK_FALSE(rules::dropout_noise_agrees(expected, 0.0));
  CHECK_FALSE(rules::dropout_noise_agrees(std::nan(""), r));
}

TEST_CASE("auto attention: cuDNN takes a shape where it is 2% faster", "[attention_choice]") {
  CHECK(rules::prefer_cudnn(1.0, 3.4));
  CHECK(rules::prefer_cudnn(0.975, 1.0));
  CHECK_FALSE(rules::prefer_cudnn(0.99, 1.0));
  CHECK_FALSE(rules::prefer_cudnn(1.0, 1.0));
  CHECK_FALSE(rules::prefer_cudnn(2.0, 1.0));
  // Not measured (a failed timing) never prefers cuDNN.
  CHECK_FALSE(rules::prefer_cudnn(-1.0, 1.0));
  CHECK_FALSE(rules::prefer_cudnn(1.0, -1.0));
  CHECK_FALSE(rules::prefer_cudnn(0.0, 1.0));
  CHECK_FALSE(rules::prefer_cudnn(std::nan(""), 1.0));
}
