// The multi-tensor CUDA steps (one launch per step, optim/multi_tensor.hpp) against the
// per-parameter CUDA kernels and against the CPU engine. Three replicas of one set of
// parameters (sizes 1, 3, 65536, 65537, 200000 around the 65536-element chunk, and a
// frozen one) get the same gradients for three steps:
//   - multi-tensor vs per-parameter on the GPU: bitwise equal parameters, gradients (which
//     clipping rewrites) and optimizer state. Both paths run the same rule per element with
//     the same scalars, and compute clipping norms chunk by chunk in the same order, so any
//     difference is a bug, not rounding.
//   - multi-tensor vs CPU: bitwise equal as well, since the rules round alike on both
//     engines (optim/update_rules.hpp: no fused multiply-adds on either). Only clipping by
//     a norm may differ: the CPU sums the squares in another order, and the double sums
//     may round the float factor to a neighbouring value (1 ulp), which the updates carry
//     on. There |gpu - cpu| <= 5e-7 + 1e-5 |cpu|: 1e-5 (~80 ulps) for three steps of a
//     1-ulp factor difference; 5e-7 (~4 ulps at 1, the gradients' scale: uniform in
//     [-1, 1)) for elements near zero, where momentum * buf + g cancels and keeps the
//     absolute, not the relative, error of g.
// A probe around update_multi_tensor counts the multi-tensor launches, so a step that fell
// back to the per-parameter path (and would agree trivially) fails the test.
#include <catch2/catch.hpp>

#include "gpu_test_util.hpp"
#include "optim/multi_tensor.hpp"
#include "tarantella/optim.hpp"

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

using namespace tnt;

namespace {

const std::vector<int64_t> kSizes = {1, 3, 65536, 65537, 200000};
constexpr int64_t kFrozenSize = 4099;
constexpr int kSteps = 3;

// "p<i>", the name of parameter i (appended rather than "p" + ..., which GCC 12 warns about
// wrongly with -Wrestrict).
std::string pname(size_t i) {
  std::string name = "p";
  name += std::to_string(i);
  return name;
}

// The per-parameter path: update() per tensor, clipping per tensor.
template <class Base>
class PerParameter : public Base {
 public:
  template <class... A>
  explicit PerParameter(A&&... args) : Base(std::forward<A>(args)...) {
    this->set_multi_tensor(false);
  }
};

// The multi-tensor path, counting its launches and the rules of the last one.
template <class Base>
class MultiTensorProbe : public Base {
 public:
  using Base::Base;
  int calls = 0;
  size_t rules = 0;

 protected:
  bool update_multi_tensor(const optim::MultiTensorStep& step, double lr) override {
    ++calls;
    rules = step.classes.size();
    return Base::update_multi_tensor(step, lr);
  }
};

// One set of parameters on one device. Parameter i is called "p<i>"; the last one is frozen.
struct Replica {
  std::vector<std::unique_ptr<Parameter>> params;
  std::unique_ptr<Optimizer> opt;

  Replica(Device device, std::unique_ptr<Optimizer> optimizer, const std::string& key) : opt(std::move(optimizer)) {
    std::vector<int64_t> sizes = kSizes;
    sizes.push_back(kFrozenSize);
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto p = std::make_unique<Parameter>();
      p->value = test::random_tensor({sizes[i]}, key + ".p" + std::to_string(i)).to(device);
      p->grad = Tensor::zeros({sizes[i]}, DType::f32, device);
      params.push_back(std::move(p));
    }
    // Frozen, with a gradient all the same: step() must leave it out.
    params.back()->trainable = false;
  }
  std::vector<NamedParameter> named() {
    std::vector<NamedParameter> out;
    for (size_t i = 0; i < params.size(); ++i) out.push_back({pname(i), params[i].get()});
    return out;
  }
  void set_grads(const std::string& key, int step) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i]->grad.copy_from(
          test::random_tensor(params[i]->grad.shape(), key + ".g" + std::to_string(step) + "." + std::to_string(i)));
    }
  }
};

void require_bitwise(const Tensor& got, const Tensor& want, const std::string& what) {
  INFO(what << ": " << got.str() << " vs " << want.str());
  REQUIRE(got.dtype() == want.dtype());
  REQUIRE(got.numel() == want.numel());
  const Tensor a = got.to(Device::cpu()), b = want.to(Device::cpu());
  const auto* pa = static_cast<const uint8_t*>(a.raw());
  const auto* pb = static_cast<const uint8_t*>(b.raw());
  const size_t elem = a.numel() > 0 ? a.nbytes() / static_cast<size_t>(a.numel()) : 1;
  int64_t differ = 0, first = -1;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(pa + i * elem, pb + i * elem, elem) != 0) {
      if (first < 0) first = i;
      ++differ;
    }
  }
  if (differ > 0) {
    const std::vector<double> va = a.to_double_vector(), vb = b.to_double_vector();
    INFO(differ << " elements differ in their bits; first at " << first << ": " << va[first] << " vs " << vb[first]);
    CHECK(differ == 0);
  }
  REQUIRE(differ == 0);
}

constexpr double kAtol = 5e-7, kRtol = 1e-5;  // clipping by a norm: see the top of the file

// Bitwise, or within kAtol/kRtol where a clipping norm was computed on both engines.
void require_matches_cpu(const Tensor& gpu, const Tensor& cpu, bool norm_clipping, const std::string& what) {
  if (norm_clipping) {
    test::require_close(gpu, cpu, kAtol, kRtol, what);
  } else {
    require_bitwise(gpu, cpu, what);
  }
}

// Between steps: what the test changes (e.g. freezing a parameter) on all three replicas.
using BeforeStep = std::function<void(int step, Replica& r)>;

// Runs the three replicas and compares them; the multi-tensor replica must have launched
// once per step, with `rules` rules in its last launch.
template <class Opt, class Options>
void compare_paths(const std::string& what, double lr, const Options& options, size_t rules,
                   const BeforeStep& before_step = nullptr, const std::function<void(Optimizer&)>& setup = nullptr) {
  auto probe = std::make_unique<MultiTensorProbe<Opt>>(lr, options);
  MultiTensorProbe<Opt>* multi_opt = probe.get();
  Replica cpu(Device::cpu(), std::make_unique<Opt>(lr, options), what);
  Replica per(test::gpu(), std::make_unique<PerParameter<Opt>>(lr, options), what);
  Replica multi(test::gpu(), std::move(probe), what);
  const std::vector<Tensor> frozen_start = {cpu.params.back()->value.clone(), multi.params.back()->value.clone()};
  if (setup) {
    for (Replica* r : {&cpu, &per, &multi}) setup(*r->opt);
  }
  for (int step = 0; step < kSteps; ++step) {
    for (Replica* r : {&cpu, &per, &multi}) {
      if (before_step) before_step(step, *r);
      r->set_grads(what, step);
      r->opt->step(r->named());
    }
  }
  CHECK(multi_opt->calls == kSteps);
  CHECK(multi_opt->rules == rules);
  const bool norm_clipping = options.clipping.norm || options.clipping.global_norm;
  for (size_t i = 0; i < multi.params.size(); ++i) {
    const std::string name = what + " " + pname(i);
    require_bitwise(multi.params[i]->value, per.params[i]->value, name + " (multi-tensor vs per-parameter)");
    require_bitwise(multi.params[i]->grad, per.params[i]->grad, name + ".grad (multi-tensor vs per-parameter)");
    require_matches_cpu(multi.params[i]->value, cpu.params[i]->value, norm_clipping, name + " (multi-tensor vs CPU)");
    require_matches_cpu(multi.params[i]->grad, cpu.params[i]->grad, norm_clipping, name + ".grad (multi-tensor vs CPU)");
  }
  // The frozen parameter is left alone, bit for bit.
  require_bitwise(multi.params.back()->value, frozen_start[1], what + " frozen parameter");
  require_bitwise(cpu.params.back()->value, frozen_start[0], what + " frozen parameter on the CPU");
  // Slots carried over the steps, and step counts.
  const std::vector<NamedTensor> sm = multi.opt->named_state(), sp = per.opt->named_state(),
                                 sc = cpu.opt->named_state();
  REQUIRE(sm.size() == sp.size());
  REQUIRE(sm.size() == sc.size());
  for (size_t i = 0; i < sm.size(); ++i) {
    REQUIRE(sm[i].name == sp[i].name);
    REQUIRE(sm[i].name == sc[i].name);
    require_bitwise(sm[i].tensor, sp[i].tensor, what + " state " + sm[i].name);
    require_matches_cpu(sm[i].tensor, sc[i].tensor, norm_clipping, what + " state " + sm[i].name + " vs CPU");
  }
}

// A decay filter that leaves out p1 and p3 (as the TF ResNet leaves out BatchNorm's): two rules.
bool decay_not_p1_p3(const std::string& name) { return name != "p1" && name != "p3"; }

}  // namespace

TEST_CASE("optim multi-tensor cuda: SGD equals the per-parameter kernels and the CPU") {
  compare_paths<SGD>("mt_sgd", 0.1, SgdOptions{}, 1);
  compare_paths<SGD>("mt_sgd_momentum", 0.1, SgdOptions{.momentum = 0.9, .dampening = 0.1}, 1);
  compare_paths<SGD>("mt_sgd_nesterov", 0.1, SgdOptions{.momentum = 0.9, .weight_decay = 1e-2, .nesterov = true}, 1);
  compare_paths<SGD>("mt_sgd_decay_filter", 0.1,
                     SgdOptions{.momentum = 0.9, .weight_decay = 1e-2, .decay_filter = decay_not_p1_p3}, 2);
}

TEST_CASE("optim multi-tensor cuda: Adam and AdamW equal the per-parameter kernels and the CPU") {
  compare_paths<Adam>("mt_adam", 1e-2, AdamOptions{.weight_decay = 1e-2}, 1);
  compare_paths<AdamW>("mt_adamw", 1e-2, AdamW::default_options(), 1);
  AdamOptions filtered = AdamW::default_options();
  filtered.decay_filter = decay_not_p1_p3;
  compare_paths<AdamW>("mt_adamw_decay_filter", 1e-2, filtered, 2);
}

// random_tensor's gradients are uniform in [-1, 1): the 1-element tensor's norm is below 1.0
// (left alone by clip_norm = 1), the large ones' far above (~148 to ~258: scaled), and the
// global norm (~360) far above 2.0; 1e6 never bites.
TEST_CASE("optim multi-tensor cuda: gradient clipping equals the per-parameter path and the CPU") {
  compare_paths<SGD>("mt_clip_value", 0.1, SgdOptions{.clipping = {.value = 0.25}}, 1);
  compare_paths<SGD>("mt_clip_norm", 0.1, SgdOptions{.momentum = 0.9, .clipping = {.norm = 1.0}}, 1);
  compare_paths<Adam>("mt_clip_global_norm", 1e-2, AdamOptions{.clipping = {.global_norm = 2.0}}, 1);
  compare_paths<SGD>("mt_clip_norm_value", 0.1, SgdOptions{.clipping = {.value = 0.01, .norm = 1.0}}, 1);
  AdamOptions both = AdamW::default_options();
  both.clipping = {.value = 0.5, .global_norm = 2.0};
  compare_paths<AdamW>("mt_clip_global_value", 1e-2, both, 1);
  compare_paths<Adam>("mt_clip_global_idle", 1e-2, AdamOptions{.clipping = {.global_norm = 1e6}}, 1);
}

// p3 is frozen for the second step only: the table is made again without it, then with it;
// afterwards p3 has one update fewer than the others, so the last launch has two rules (the
// classes are (decay, t): Adam's bias corrections differ; SGD's two rules happen to be
// equal), and p3's value after step 2 is that after step 1.
TEST_CASE("optim multi-tensor cuda: a parameter frozen between steps re-plans the table") {
  std::vector<std::vector<float>> p3_after_first(3);
  int replica = 0;
  auto freeze = [&](int step, Replica& r) {
    Parameter& p3 = *r.params[3];
    if (step == 1) {
      p3_after_first[replica] = p3.value.to(Device::cpu()).to_vector();
      p3.trainable = false;
    } else if (step == 2) {
      CHECK(p3.value.to(Device::cpu()).to_vector() == p3_after_first[replica]);
      p3.trainable = true;
    }
    replica = (replica + 1) % 3;
  };
  AdamOptions clipped;
  clipped.clipping = {.global_norm = 2.0};
  compare_paths<Adam>("mt_refreeze_adam", 1e-2, clipped, 2, freeze);
  compare_paths<SGD>("mt_refreeze_sgd", 0.1, SgdOptions{.momentum = 0.9, .clipping = {.norm = 1.0}}, 2, freeze);
}

// Update counts loaded from a checkpoint: with 5 parameters at distinct t, one launch with 5
// rules (each row picks its own; for SGD only p0's first update differs, from t = 1); the
// per-parameter path agrees bitwise.
TEST_CASE("optim multi-tensor cuda: parameters at different update counts take their own rule") {
  // init_state needs parameters of the right shapes (any device: the state follows the
  // parameters to the GPU on the first step), then each parameter gets its own count.
  auto setup = [](Optimizer& opt) {
    std::vector<std::unique_ptr<Parameter>> shapes;
    std::vector<NamedParameter> named;
    for (size_t i = 0; i < kSizes.size(); ++i) {
      shapes.push_back(std::make_unique<Parameter>());
      shapes.back()->value = Tensor::zeros({kSizes[i]});
      named.push_back({pname(i), shapes.back().get()});
    }
    opt.init_state(named);
    for (size_t i = 0; i < kSizes.size(); ++i) {
      opt.load_state(pname(i) + ".step", Tensor::full({1}, static_cast<double>(10 * i), DType::i64));
    }
  };
  compare_paths<Adam>("mt_steps_adam", 1e-2, AdamOptions{}, kSizes.size(), nullptr, setup);
  compare_paths<SGD>("mt_steps_sgd", 0.1, SgdOptions{.momentum = 0.9}, kSizes.size(), nullptr, setup);
}
