// Mixed precision (tarantella/precision.hpp, Network::set_compute_dtype), on CPU ranks:
// the parts that are shared with the GPU path. The CPU engines compute in f32 (except
// Conv2D and Dense in bf16 on a CPU with bf16 instructions, TNT_CPU_BF16), so here the
// network stores activations and their gradients in bf16/f16 between layers (rounding and
// f16 overflow as on the GPU), while the loss scaler, the skip decision, the unscaling in
// the Reducer, the f32 master weights, the agreement of the ranks and the checkpointed scale
// are the very code a GPU run uses. The half-precision engines themselves are checked
// against the CPU by the gpu-labelled tests.
#include <catch2/catch.hpp>

#include "small_nets.hpp"
#include "temp_dir.hpp"
#include "tarantella/tarantella.hpp"

#include <cmath>
#include <cstring>

namespace {

using tnt::test::weights_of;

constexpr int64_t kSamples = 96;  // 3 global batches of 32
constexpr int64_t kBatch = 32;
constexpr uint64_t kSeed = 11;

// The shared small CNN with a BatchNorm after its bias-free convolution.
std::shared_ptr<tnt::Sequential> make_net() {
  return tnt::test::small_cnn("mp_cnn", /*conv_bias=*/false, std::make_shared<tnt::BatchNorm>("bn1"));
}

tnt::SgdOptions momentum() {
  tnt::SgdOptions o;
  o.momentum = 0.9;
  return o;
}

struct Data {
  tnt::Tensor images;  // (N, 1, 8, 8)
  tnt::Tensor labels;  // (N,) i64
};

Data make_data() {
  Data d{tnt::Tensor::empty({kSamples, 1, 8, 8}), tnt::Tensor::empty({kSamples}, tnt::DType::i64)};
  tnt::CounterRng rng(321, "test_mixed_precision");
  float* x = d.images.data<float>();
  for (int64_t i = 0; i < d.images.numel(); ++i) x[i] = rng.uniform(static_cast<uint64_t>(i));
  // Label: which half of the image is brighter (learnable in a few steps).
  for (int64_t n = 0; n < kSamples; ++n) {
    double top = 0, bottom = 0;
    for (int64_t i = 0; i < 32; ++i) top += x[n * 64 + i];
    for (int64_t i = 32; i < 64; ++i) bottom += x[n * 64 + i];
    d.labels.data<int64_t>()[n] = top > bottom ? 1 : 0;
  }
  return d;
}

double max_abs_diff(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == b[i].size());
    for (size_t j = 0; j < a[i].size(); ++j) m = std::max(m, std::abs(a[i][j] - b[i][j]));
  }
  return m;
}

// FNV-1a over the bytes of every parameter: equal on all ranks iff the replicas agree.
int64_t weights_hash(tnt::Network& net) {
  uint64_t h = 1469598103934665603ull;
  for (auto& p : net.named_parameters()) {
    std::vector<float> v = p.param->value.to_vector();
    const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
    for (size_t i = 0; i < v.size() * sizeof(float); ++i) {
      h ^= bytes[i];
      h *= 1099511628211ull;
    }
  }
  return static_cast<int64_t>(h);
}

void require_replicas_agree(tnt::Network& net) {
  std::vector<int64_t> all = tnt::communicator().allgather(weights_hash(net));
  for (size_t r = 1; r < all.size(); ++r) {
    INFO("rank " << r << " holds different weights than rank 0");
    REQUIRE(all[r] == all[0]);
  }
}

struct Run {
  tnt::History history;
  std::vector<std::vector<double>> weights;
  std::unique_ptr<tnt::Model> model;  // for inspection; freed with the Run, before MPI ends
};

Run train(const tnt::Precision& precision, int epochs) {
  Data d = make_data();
  auto net = make_net();
  auto last = std::make_unique<tnt::Model>(net, kSeed);
  last->compile(std::make_shared<tnt::SGD>(0.05, momentum()), std::make_shared<tnt::SoftmaxCrossEntropy>(),
                {std::make_shared<tnt::Accuracy>()}, precision);
  tnt::FitOptions fit;
  fit.epochs = epochs;
  fit.verbose = 0;
  fit.batch_size = kBatch;
  Run run;
  run.history = last->fit(tnt::Dataset::from_tensors({d.images, d.labels}), fit);
  run.weights = weights_of(*net);
  run.model = std::move(last);
  return run;
}

}  // namespace

TEST_CASE("Precision names and which ones scale the loss", "[mixed_precision]") {
  CHECK(tnt::Precision::from_name("fp32").compute_dtype == tnt::DType::f32);
  CHECK(tnt::Precision::from_name("f32").compute_dtype == tnt::DType::f32);
  CHECK(tnt::Precision::from_name("bf16").compute_dtype == tnt::DType::bf16);
  CHECK(tnt::Precision::from_name("fp16").compute_dtype == tnt::DType::f16);
  CHECK(tnt::Precision::from_name("f16").compute_dtype == tnt::DType::f16);
  CHECK_THROWS_WITH(tnt::Precision::from_name("fp8"), Catch::Contains("'fp8'") && Catch::Contains("bf16"));
  CHECK(tnt::Precision::from_name("fp16").scales_loss());
  CHECK_FALSE(tnt::Precision::from_name("bf16").scales_loss());
  CHECK_FALSE(tnt::Precision::from_name("fp32").scales_loss());
  tnt::Precision p = tnt::Precision::from_name("bf16");
  p.loss_scaling = tnt::LossScaling::dynamic;
  CHECK(p.scales_loss());
  p = tnt::Precision::from_name("fp16");
  p.loss_scaling = tnt::LossScaling::none;
  CHECK_FALSE(p.scales_loss());
  CHECK(tnt::Precision::from_name("fp16").name() == "fp16");
}

TEST_CASE("LossScaler grows, backs off, skips, and gives up on divergence", "[mixed_precision]") {
  tnt::Precision p = tnt::Precision::from_name("fp16");
  p.initial_scale = 1024;
  p.growth_interval = 3;
  tnt::LossScaler s(p);
  REQUIRE(s.enabled());
  CHECK(s.scale() == 1024);
  CHECK(s.update(false));
  CHECK(s.update(false));
  CHECK(s.scale() == 1024);
  CHECK(s.good_steps() == 2);
  CHECK(s.update(false));  // the third good step in a row
  CHECK(s.scale() == 2048);
  CHECK(s.good_steps() == 0);
  CHECK_FALSE(s.update(true));  // overflow: skip and halve
  CHECK(s.scale() == 1024);
  CHECK(s.skipped_steps() == 1);
  CHECK(s.update(false));
  CHECK_FALSE(s.update(true));  // the good-step count starts over
  CHECK(s.good_steps() == 0);
  CHECK(s.scale() == 512);
  // 512 = 2^9: 33 more halvings reach 2^-24 (still allowed), the 34th goes below it.
  for (int i = 0; i < 33; ++i) REQUIRE_FALSE(s.update(true));
  CHECK(s.scale() == std::ldexp(1.0, -24));
  CHECK_THROWS_WITH(s.update(true), Catch::Contains("diverged"));

  tnt::LossScaler off(tnt::Precision::from_name("bf16"));
  CHECK_FALSE(off.enabled());
  CHECK(off.scale() == 1.0);
  CHECK(off.update(true));  // without scaling nothing is skipped

  p.backoff_factor = 1.5;
  CHECK_THROWS_AS(tnt::LossScaler(p), tnt::InputError);
  p.backoff_factor = 0.5;
  p.initial_scale = 0;
  CHECK_THROWS_AS(tnt::LossScaler(p), tnt::InputError);
}

TEST_CASE("a network in bf16 or f16 on the CPU rounds between layers and keeps f32 masters", "[mixed_precision]") {
  Data d = make_data();
  tnt::Tensor x = d.images.slice_rows(0, 16);  // (16, 1, 8, 8)
  tnt::RunContext rc;
  rc.training = true;
  auto net = make_net();
  net->initialize(kSeed);
  std::vector<tnt::Tensor> ref = net->forward({x}, rc);
  net->zero_grad();
  tnt::Tensor dy = tnt::Tensor::full({16, 3}, 1.0 / 16);
  net->backward({dy}, rc);
  std::vector<std::vector<double>> ref_grads;
  for (auto& p : net->named_parameters()) ref_grads.push_back(p.param->grad.to_double_vector());
  const std::vector<float> y32 = ref[0].to_vector();
  double scale = 0;
  for (float v : y32) scale = std::max(scale, std::abs(static_cast<double>(v)));

  // Unit roundoff u (bf16 2^-8, f16 2^-11). 8 roundings lie on a path from the input to
  // the logits (input, conv, bn, relu, pool, fc1, relu, fc2), each a relative error <= u
  // carried on with a gain of about 1, partly cancelling: 4 u of the largest logit
  // (measured: 1.4 u for bf16, 0.9 u for f16).
  for (auto [dt, u] : {std::pair{tnt::DType::bf16, std::ldexp(1.0, -8)}, std::pair{tnt::DType::f16, std::ldexp(1.0, -11)}}) {
    INFO("compute dtype " << tnt::dtype_name(dt));
    net->set_compute_dtype(dt);
    std::vector<tnt::Tensor> out = net->forward({x}, rc);
    REQUIRE(out[0].dtype() == tnt::DType::f32);  // the loss sees f32
    const std::vector<float> y = out[0].to_vector();
    double worst = 0;
    for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(y[i] - y32[i])));
    CHECK(worst <= 4 * u * scale);
    CHECK(worst > 0);  // the rounding really happened
    net->zero_grad();
    std::vector<tnt::Tensor> gin = net->backward({dy}, rc);
    CHECK_FALSE((gin[0].defined() && gin[0].dtype() != tnt::DType::f32));
    size_t i = 0;
    for (auto& p : net->named_parameters()) {
      INFO(p.name);
      REQUIRE(p.param->value.dtype() == tnt::DType::f32);  // master weights
      REQUIRE(p.param->grad.dtype() == tnt::DType::f32);
      std::vector<double> g = p.param->grad.to_double_vector();
      double gmax = 0, gdiff = 0;
      for (size_t j = 0; j < g.size(); ++j) {
        gmax = std::max(gmax, std::abs(ref_grads[i][j]));
        gdiff = std::max(gdiff, std::abs(g[j] - ref_grads[i][j]));
      }
      // Gradients pass the same roundings twice (forward values, backward gradients), but
      // their error is dominated by discrete events: a ReLU or max-pool input near a tie
      // that rounding flips moves a whole contribution, so it does not scale with u. 6% of
      // the largest entry (measured: 2.3% for bf16, 3% for f16, both in conv1.weight).
      CHECK(gdiff <= 0.06 * gmax + 1e-7);
      ++i;
    }
  }

  // f16 overflows above 65504 where f32 does not: the inputs are stored in f16 on entry.
  // (A linear model: ReLU would turn the NaN that inf - inf gives into 0.)
  auto linear = std::make_shared<tnt::Sequential>(
      std::vector<tnt::LayerPtr>{std::make_shared<tnt::Flatten>(), std::make_shared<tnt::Dense>(3)}, "linear");
  linear->build({1, 8, 8});
  tnt::Tensor big = tnt::Tensor::full({2, 1, 8, 8}, 1e5);
  CHECK_FALSE(tnt::ops::has_non_finite(linear->forward({big}, rc)[0]));
  linear->set_compute_dtype(tnt::DType::f16);
  CHECK(tnt::ops::has_non_finite(linear->forward({big}, rc)[0]));
  linear->set_compute_dtype(tnt::DType::bf16);  // bf16 has f32's range
  CHECK_FALSE(tnt::ops::has_non_finite(linear->forward({big}, rc)[0]));
  CHECK_THROWS_AS(net->set_compute_dtype(tnt::DType::i32), tnt::InputError);

  // A network input that is also an output: its gradient joins the one flowing back from
  // the layer in the compute dtype, and comes back as f32. Gradients must be given in f32.
  tnt::SymTensor in = tnt::Input({4});
  auto dense = std::make_shared<tnt::Dense>(4, "dense");
  tnt::Network both({in}, {in, (*dense)(in)}, "both");
  both.set_compute_dtype(tnt::DType::bf16);
  tnt::Tensor x4 = tnt::Tensor::full({2, 4}, 0.5);
  std::vector<tnt::Tensor> outs = both.forward({x4}, rc);
  REQUIRE((outs[0].dtype() == tnt::DType::f32 && outs[1].dtype() == tnt::DType::f32));
  tnt::Tensor ones = tnt::Tensor::full({2, 4}, 1.0);
  std::vector<tnt::Tensor> gx = both.backward({ones, ones}, rc);
  REQUIRE(gx[0].dtype() == tnt::DType::f32);
  // d/dx of sum(x) + sum(x W^T + b) = 1 + column sums of W, within bf16 rounding.
  std::vector<float> w = dense->weight().value.to_vector();  // (4, 4)
  std::vector<float> g = gx[0].to_vector();
  for (int64_t j = 0; j < 4; ++j) {
    double want = 1;
    for (int64_t i = 0; i < 4; ++i) want += w[static_cast<size_t>(i * 4 + j)];
    CHECK(std::abs(g[static_cast<size_t>(j)] - want) <= 4 * std::ldexp(1.0, -8) * (1 + std::abs(want)));
  }
  both.forward({x4}, rc);
  CHECK_THROWS_WITH(both.backward({tnt::ops::cast(ones, tnt::DType::f16), ones}, rc), Catch::Contains("f32 gradients"));
}

TEST_CASE("RunContext::half_outputs: outputs in the compute dtype, gradients taken in it, the same bits", "[mixed_precision]") {
  // What the Model does for a loss that reads half predictions (Loss::reads_half_predictions):
  // the outputs are the widened ones before widening, and a half gradient gives the
  // results of the same values as f32 (the network rounds an f32 gradient to its dtype).
  Data d = make_data();
  tnt::Tensor x = d.images.slice_rows(0, 8);
  auto net = make_net();
  net->initialize(kSeed);
  for (tnt::DType dt : {tnt::DType::bf16, tnt::DType::f16}) {
    INFO("compute dtype " << tnt::dtype_name(dt));
    net->set_compute_dtype(dt);
    tnt::RunContext rc;
    rc.training = true;
    const tnt::Tensor wide = net->forward({x}, rc)[0];
    REQUIRE(wide.dtype() == tnt::DType::f32);
    net->zero_grad();
    const tnt::Tensor dy = tnt::ops::cast(tnt::ops::cast(tnt::Tensor::full({8, 3}, 0.3), dt), tnt::DType::f32);
    net->backward({dy}, rc);
    std::vector<std::vector<double>> want;
    for (auto& p : net->named_parameters()) want.push_back(p.param->grad.to_double_vector());

    rc.half_outputs = true;
    const tnt::Tensor half = net->forward({x}, rc)[0];
    REQUIRE(half.dtype() == dt);
    CHECK(half.to_double_vector() == wide.to_double_vector());
    net->zero_grad();
    net->backward({tnt::ops::cast(dy, dt)}, rc);
    size_t i = 0;
    for (auto& p : net->named_parameters()) {
      INFO(p.name);
      CHECK(p.param->grad.to_double_vector() == want[i++]);
    }
    // A gradient in another half dtype is still refused.
    net->forward({x}, rc);
    const tnt::DType other = dt == tnt::DType::bf16 ? tnt::DType::f16 : tnt::DType::bf16;
    CHECK_THROWS_WITH(net->backward({tnt::ops::cast(dy, other)}, rc), Catch::Contains("f32 gradients"));
  }
}

TEST_CASE("fp16 and bf16 training on p ranks track fp32 and keep the replicas identical", "[mixed_precision]") {
  Run f32 = train(tnt::Precision::from_name("fp32"), 4);
  for (const char* name : {"bf16", "fp16"}) {
    INFO("precision " << name);
    Run mp = train(tnt::Precision::from_name(name), 4);
    tnt::Model* model = mp.model.get();
    require_replicas_agree(model->network());
    const auto& loss = mp.history.history.at("loss");
    REQUIRE(loss.size() == 4);
    CHECK(loss.back() < 0.8 * loss.front());  // it learns
    // After 12 SGD steps with momentum the weights stay within 3e-2 of fp32's, |w| being
    // 0.3-1 here. Not proportional to u: a max-pool window or ReLU that flips under rounding
    // moves a whole gradient (measured, bf16 / f16: 6.2e-3 / 4.2e-4 on 1 rank, 8.1e-3 /
    // 7.9e-3 on 2). Forgetting to unscale the fp16 gradients moves them by far more.
    const bool fp16 = std::string(name) == "fp16";
    CHECK(max_abs_diff(mp.weights, f32.weights) <= 3e-2);
    CHECK(max_abs_diff(mp.weights, f32.weights) > 0);
    CHECK(mp.history.history.count("loss_scale") == (fp16 ? 1u : 0u));
    if (fp16) {
      CHECK(model->loss_scaler().skipped_steps() == 0);  // 65536 is small enough here
      CHECK(model->loss_scaler().scale() == 65536.0);
    }
  }
}

TEST_CASE("one fp16 step moves the weights as one fp32 step does (the loss scale is divided out)", "[mixed_precision]") {
  Data d = make_data();
  tnt::Dataset one_batch = tnt::Dataset::from_tensors({d.images.slice_rows(0, kBatch), d.labels.slice_rows(0, kBatch)});
  std::vector<std::vector<double>> before, delta[2];
  int i = 0;
  for (const char* name : {"fp32", "fp16"}) {
    auto net = make_net();
    tnt::Model model(net, kSeed);
    model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>(), {},
                  tnt::Precision::from_name(name));
    before = weights_of(*net);
    tnt::FitOptions fit;
    fit.verbose = 0;
    fit.batch_size = kBatch;
    model.fit(one_batch, fit);
    delta[i] = weights_of(*net);
    for (size_t t = 0; t < delta[i].size(); ++t)
      for (size_t j = 0; j < delta[i][t].size(); ++j) delta[i][t][j] -= before[t][j];
    ++i;
  }
  double largest = 0;
  for (const auto& t : delta[0])
    for (double v : t) largest = std::max(largest, std::abs(v));
  REQUIRE(largest > 0);
  // Plain SGD: the step is lr times the gradient, so this compares the gradients. 6% of the
  // largest entry, as for the network's gradients above (measured: 0.5%); a scale left
  // in (65536) or divided out twice misses by orders of magnitude, a stray factor 2 by 100%.
  CHECK(max_abs_diff(delta[1], delta[0]) <= 0.06 * largest);
}

TEST_CASE("an overflowing fp16 step is skipped on every rank and the scale kept in checkpoints", "[mixed_precision]") {
  tnt::Precision p = tnt::Precision::from_name("fp16");
  // The loss gradient (about 0.67 / 32 for the true class at the start) times 2^24 is far
  // above f16's 65504: it overflows when it enters the network, so the first steps are
  // skipped until the scale has come down (to 2^21 or so).
  p.initial_scale = std::ldexp(1.0, 24);
  Data d = make_data();
  auto net = make_net();
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.05, momentum()), std::make_shared<tnt::SoftmaxCrossEntropy>(), {}, p);
  std::vector<std::vector<double>> before = weights_of(*net);
  tnt::FitOptions fit;
  fit.epochs = 1;
  fit.verbose = 0;
  fit.batch_size = kBatch;
  tnt::Dataset one_batch = tnt::Dataset::from_tensors({d.images.slice_rows(0, kBatch), d.labels.slice_rows(0, kBatch)});
  model.fit(one_batch, fit);
  CHECK(model.loss_scaler().skipped_steps() == 1);
  CHECK(model.loss_scaler().scale() == std::ldexp(1.0, 23));
  CHECK(max_abs_diff(weights_of(*net), before) == 0);  // no update at all
  CHECK(model.global_step() == 1);                      // but the batch was consumed
  CHECK(model.optimizer().step_count() == 1);           // and the schedule moved on
  require_replicas_agree(*net);

  // Further steps come down to a usable scale and train; all ranks skip the same steps.
  fit.epochs = 4;
  fit.initial_epoch = 1;
  tnt::History h = model.fit(tnt::Dataset::from_tensors({d.images, d.labels}), fit);
  const int64_t skipped = model.loss_scaler().skipped_steps();
  CHECK(skipped > 1);
  CHECK(model.loss_scaler().scale() == std::ldexp(1.0, 24 - static_cast<int>(skipped)));
  CHECK(max_abs_diff(weights_of(*net), before) > 0);
  std::vector<int64_t> skips = tnt::communicator().allgather(skipped);
  for (int64_t s : skips) CHECK(s == skipped);
  require_replicas_agree(*net);

  // The scale survives a checkpoint; a model compiled with the default scale takes it over.
  tnt::test::TempDir dir("mixed_precision");
  std::string base = dir.path.string();
  tnt::communicator().broadcast(base, tnt::master_rank());  // the master's directory for all
  const std::string path = base + "/ck.safetensors";
  model.save_checkpoint(path, 4);
  auto net2 = make_net();
  tnt::Model model2(net2, kSeed + 1);
  model2.compile(std::make_shared<tnt::SGD>(0.05, momentum()), std::make_shared<tnt::SoftmaxCrossEntropy>(), {},
                 tnt::Precision::from_name("fp16"));
  CHECK(model2.loss_scaler().scale() == 65536.0);
  CHECK(model2.load_checkpoint(path) == 4);
  CHECK(model2.loss_scaler().scale() == model.loss_scaler().scale());
  CHECK(model2.loss_scaler().good_steps() == model.loss_scaler().good_steps());

  // A damaged scale in the file is named.
  tnt::Checkpoint ck = tnt::Checkpoint::read(path);
  ck.set_metadata("loss_scale", "-3");
  const std::string bad = base + "/bad.safetensors";
  if (tnt::is_master_rank()) ck.write(bad);
  tnt::communicator().barrier();
  CHECK_THROWS_WITH(model2.load_checkpoint(bad), Catch::Contains("loss_scale='-3'"));
  tnt::communicator().barrier();  // nobody reads the master's directory once it is removed
}

TEST_CASE("ranks that compile with different precisions are refused", "[mixed_precision]") {
  // On one rank the same program must train: the check itself must not refuse agreement.
  const bool disagree = tnt::size() >= 2;
  Data d = make_data();
  auto net = make_net();
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.05), std::make_shared<tnt::SoftmaxCrossEntropy>(), {},
                tnt::Precision::from_name(disagree && tnt::rank() == 1 ? "fp16" : "bf16"));
  tnt::FitOptions fit;
  fit.verbose = 0;
  fit.batch_size = kBatch;
  tnt::Dataset data = tnt::Dataset::from_tensors({d.images, d.labels});
  if (disagree) {
    CHECK_THROWS_WITH(model.fit(data, fit), Catch::Contains("different precisions") && Catch::Contains("rank(s) 1: fp16"));
  } else {
    CHECK_NOTHROW(model.fit(data, fit));
  }

  // The same dtype, but another loss scale on rank 1 (another initial_scale, or a rank that
  // resumed from another checkpoint): the summed gradients would mix two scales.
  tnt::Precision p = tnt::Precision::from_name("fp16");
  if (disagree && tnt::rank() == 1) p.initial_scale = 1024;
  tnt::Model model2(make_net(), kSeed);
  model2.compile(std::make_shared<tnt::SGD>(0.05), std::make_shared<tnt::SoftmaxCrossEntropy>(), {}, p);
  if (disagree) {
    CHECK_THROWS_WITH(model2.fit(data, fit), Catch::Contains("different precisions") &&
                                                 Catch::Contains("rank(s) 1: fp16 with loss scale 1024"));
  } else {
    CHECK_NOTHROW(model2.fit(data, fit));
  }
}
