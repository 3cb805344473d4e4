// Weight initialisers. A value depends only on (seed, parameter full name, index), through
// the counter-based generator of tarantella/random.hpp: initial weights depend on the seed
// and the parameter's full name, not on the device, the number of ranks or the order in
// which layers were built.
//
// Conventions (fans from PyTorch layouts [out, in, k...]: fan_in = in * prod(k),
// fan_out = out * prod(k); a 1-D tensor has fan_in = fan_out = its length):
//   glorot_uniform  U(-l, l), l = sqrt(6 / (fan_in + fan_out))      (Keras, PyTorch xavier)
//   glorot_normal   N(0, s),  s = sqrt(2 / (fan_in + fan_out))      (PyTorch xavier_normal_)
//   he_uniform      U(-l, l), l = sqrt(6 / fan_in)                  (Keras, PyTorch kaiming, a=0)
//   he_normal       N(0, s),  s = sqrt(2 / fan_in)                  (PyTorch kaiming_normal_)
//   truncated_normal(mean, s): N(mean, s) restricted to [mean - 2s, mean + 2s] (as Keras/TF).
// The *_normal variance-scaling initialisers use the plain normal (PyTorch's convention),
// not Keras' truncated normal with a corrected stddev.
#pragma once

#include "tarantella/random.hpp"
#include "tarantella/tensor.hpp"

#include <cstdint>
#include <string>

namespace tnt {

struct Initializer {
  enum class Kind {
    zeros, ones, constant, uniform, normal, truncated_normal,
    glorot_uniform, glorot_normal, he_uniform, he_normal
  };
  Kind kind = Kind::zeros;
  double a = 0.0;  // constant: value; uniform: low; normal/truncated_normal: mean
  double b = 0.0;  // uniform: high; normal/truncated_normal: stddev

  static Initializer zeros() { return {Kind::zeros}; }
  static Initializer ones() { return {Kind::ones}; }
  static Initializer constant(double v) { return {Kind::constant, v}; }
  static Initializer uniform(double lo, double hi) { return {Kind::uniform, lo, hi}; }
  static Initializer normal(double mean, double stddev) { return {Kind::normal, mean, stddev}; }
  static Initializer truncated_normal(double mean, double stddev) { return {Kind::truncated_normal, mean, stddev}; }
  static Initializer glorot_uniform() { return {Kind::glorot_uniform}; }
  static Initializer glorot_normal() { return {Kind::glorot_normal}; }
  static Initializer he_uniform() { return {Kind::he_uniform}; }
  static Initializer he_normal() { return {Kind::he_normal}; }

  // Fills t (any device, any floating dtype; host values are drawn in double and then
  // converted) for the parameter called `full_name`.
  void apply(Tensor& t, uint64_t seed, const std::string& full_name) const;
  std::string str() const;  // "glorot_uniform", "normal(0, 0.02)"
};

}  // namespace tnt
