// Initialisers and the counter-based generator behind them. A value depends only on
// (seed, key, index): initial weights depend on the seed and the parameter's full name, not
// on the device, the number of ranks or the order in which layers were built.
#pragma once

#include "tarantella/tensor.hpp"

#include <cstdint>
#include <string>

namespace tnt {

// Stateless generator: Philox-4x32-10 keyed by (seed, hash of key), counter = element index.
class CounterRng {
 public:
  CounterRng(uint64_t seed, const std::string& key);
  CounterRng(uint64_t seed, uint64_t key);
  uint32_t bits(uint64_t counter) const;     // 32 random bits for element `counter`
  float uniform(uint64_t counter) const;     // [0, 1)
  float normal(uint64_t counter) const;      // standard normal (Box-Muller on two draws)

 private:
  uint64_t key_;
};

uint64_t hash_string(const std::string& text);  // FNV-1a 64

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

  // Fills t (any device) for the parameter called `full_name`. Fans follow PyTorch's
  // layouts: [out, in, k...] gives fan_in = in * prod(k), fan_out = out * prod(k).
  void apply(Tensor& t, uint64_t seed, const std::string& full_name) const;
};

}  // namespace tnt
