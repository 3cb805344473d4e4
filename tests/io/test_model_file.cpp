// Whole-model files (tarantella/model_io.hpp) on 1 and 2 ranks: a Sequential MLP, the
// fashion_mnist CNN, a functional graph with two inputs, a layer called twice and residual
// Adds, and a network with BatchNorm and Dropout each come back with the same architecture,
// names and weights; the loaded model predicts bit for bit what the original predicts and a
// training step from both gives bitwise-equal weights. Every built-in layer's configuration
// round trips; a program's own layer type once registered; every kind of bad file is an
// InputError naming the file on every rank; saving is the master's, atomic, and refuses a
// diverged network.
//
// All comparisons are bitwise (no tolerance): the loaded network runs the same engines on
// the same weights in the same order, on the same rank, so nothing may differ.
#include <catch2/catch.hpp>

#include "job_dir.hpp"
#include "small_nets.hpp"
#include "temp_dir.hpp"
#include "tarantella/tarantella.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

using namespace tnt;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A fresh directory known to every rank, removed at the end.
struct Dir {
  Dir() : path(test::job_dir("tnt_model_file")) {}
  ~Dir() {
    communicator().barrier();
    if (is_master_rank()) fs::remove_all(path);
  }
  std::string file(const std::string& name) const { return path + "/" + name; }
  std::string path;
};

std::vector<uint8_t> bytes_of(const Tensor& t) {
  Tensor h = t.to(Device::cpu());
  std::vector<uint8_t> b(static_cast<size_t>(h.numel()) * dtype_size(h.dtype()));
  if (!b.empty()) std::memcpy(b.data(), h.raw(), b.size());
  return b;
}

// Same shape, dtype and bytes (a bool, so that a failure does not print whole tensors).
bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && bytes_of(a) == bytes_of(b);
}

// Parameters and buffers: same names in the same order, same flags, same bytes.
void require_same_weights(Network& a, Network& b) {
  for (bool buffers : {false, true}) {
    auto pa = buffers ? a.named_buffers() : a.named_parameters();
    auto pb = buffers ? b.named_buffers() : b.named_parameters();
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      INFO(pa[i].name);
      REQUIRE(pa[i].name == pb[i].name);
      CHECK(pa[i].param->trainable == pb[i].param->trainable);
      CHECK(pa[i].param->value.shape() == pb[i].param->value.shape());
      CHECK(pa[i].param->value.dtype() == pb[i].param->value.dtype());
      CHECK(bitwise_equal(pa[i].param->value, pb[i].param->value));
    }
  }
}

// Every float parameter and buffer drawn again under another seed, so that weights that
// were not loaded (left as the loaded Model's constructor drew them) cannot pass for loaded
// ones; running variances stay positive and BatchNorm's step counters are set too.
void perturb(Network& net) {
  for (bool buffers : {false, true}) {
    for (auto& p : buffers ? net.named_buffers() : net.named_parameters()) {
      Tensor& v = p.param->value;
      if (v.dtype() == DType::i64) {
        v.fill_(5);
      } else if (p.name.find("running_var") != std::string::npos) {
        Initializer::uniform(0.5, 2.0).apply(v, 99, p.name);
      } else {
        Initializer::uniform(-0.5, 0.5).apply(v, 99, p.name);
      }
    }
  }
}

template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("another exception than the one expected: " << e.what());
  }
  FAIL("no exception thrown");
  return "";
}

Tensor random_tensor(const Shape& shape, const std::string& key) {
  Tensor t = Tensor::empty(shape);
  Initializer::uniform(-1, 1).apply(t, 3, key);
  return t;
}

Tensor random_labels(int64_t n, int64_t classes, const std::string& key) {
  Tensor y = Tensor::empty({n}, DType::i64);
  CounterRng rng(4, key);
  for (int64_t i = 0; i < n; ++i) {
    y.data<int64_t>()[i] = static_cast<int64_t>(rng.bits(static_cast<uint64_t>(i)) % classes);
  }
  return y;
}

// One global batch of the whole data set (one step), the same on both models.
void fit_one_step(Model& model, const Dataset& data, int64_t n, std::shared_ptr<Optimizer> opt) {
  model.compile(std::move(opt), std::make_shared<SoftmaxCrossEntropy>());
  FitOptions fit;
  fit.batch_size = n;
  fit.epochs = 1;
  fit.verbose = 0;
  model.fit(data, fit);
  REQUIRE(model.global_step() == 1);
}

// The checks every round trip passes: the saved file loads as a Model with the original's
// architecture (JSON), names and weights, predicts what the original predicts, and one
// training step from each gives the same weights and buffers.
template <typename MakeOptimizer>
void check_round_trip(Model& original, const std::string& path, const Dataset& data, int64_t n,
                      MakeOptimizer make_optimizer) {
  save_model(original, path);
  std::unique_ptr<Model> loaded = load_model(path, original.seed());
  CHECK(model_to_json(loaded->network()) == model_to_json(original.network()));
  CHECK(loaded->network().name() == original.network().name());
  CHECK(loaded->network().summary() == original.network().summary());
  require_same_weights(loaded->network(), original.network());

  Tensor a = original.predict(data, 5), b = loaded->predict(data, 5);
  REQUIRE(a.shape() == b.shape());
  CHECK(bitwise_equal(a, b));

  fit_one_step(original, data, n, make_optimizer());
  fit_one_step(*loaded, data, n, make_optimizer());
  require_same_weights(loaded->network(), original.network());
  // The step changed the weights: equality above is not that of two untouched copies.
  CHECK_FALSE(bitwise_equal(original.predict(data, 5), a));
}

std::shared_ptr<Optimizer> adam() { return std::make_shared<Adam>(0.01); }

}  // namespace

TEST_CASE("a Sequential MLP round trips: architecture, position names, weights, predictions, one step") {
  Dir dir;
  auto net = std::make_shared<Sequential>("mlp");
  net->add(std::make_shared<Dense>(8, "fc1"));
  net->add(std::make_shared<ReLU>());  // unnamed: "1" by position
  DenseOptions no_bias;
  no_bias.use_bias = false;
  no_bias.kernel_initializer = Initializer::he_normal();
  net->add(std::make_shared<Dense>(6, no_bias));  // "2"
  net->add(std::make_shared<ReLU>());
  net->add(std::make_shared<Dense>(2, "out"));
  net->build({4});
  Model model(net, 7);
  perturb(*net);

  const std::string path = dir.file("mlp.safetensors");
  check_round_trip(model, path, test::threshold_data("model_file"), 64, adam);

  std::shared_ptr<Network> again = load_network(path);
  auto* seq = dynamic_cast<Sequential*>(again.get());
  REQUIRE(seq != nullptr);  // still a Sequential
  CHECK(seq->is_built());
  std::vector<std::string> names;
  for (Layer* l : again->layers()) names.push_back(l->name());
  CHECK(names == std::vector<std::string>{"fc1", "1", "2", "3", "out"});
  CHECK_FALSE(dynamic_cast<Dense&>(*again->layers()[2]).use_bias());
}

TEST_CASE("the fashion_mnist CNN round trips") {
  Dir dir;
  // models/fashion_mnist's network, with its PyTorch-default uniform initialisers.
  auto torch_default = [](int64_t fan_in) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    return Initializer::uniform(-bound, bound);
  };
  auto conv = [&](int64_t in, int64_t out, const std::string& name) {
    Conv2DOptions o;
    o.padding = 1;
    o.kernel_initializer = o.bias_initializer = torch_default(in * 3 * 3);
    return std::make_shared<Conv2D>(out, 3, o, name);
  };
  auto dense = [&](int64_t in, int64_t out, const std::string& name) {
    DenseOptions o;
    o.kernel_initializer = o.bias_initializer = torch_default(in);
    return std::make_shared<Dense>(out, o, name);
  };
  auto net = std::make_shared<Sequential>("fashion_mnist_cnn");
  net->add(conv(1, 32, "conv1"));
  net->add(std::make_shared<ReLU>("relu1"));
  net->add(std::make_shared<MaxPool2D>(2, "pool1"));
  net->add(conv(32, 64, "conv2"));
  net->add(std::make_shared<ReLU>("relu2"));
  net->add(std::make_shared<MaxPool2D>(2, "pool2"));
  net->add(std::make_shared<Flatten>("flatten"));
  net->add(dense(3136, 128, "fc1"));
  net->add(std::make_shared<ReLU>("relu3"));
  net->add(dense(128, 10, "fc2"));
  net->build({1, 28, 28});
  Model model(net, 11);
  perturb(*net);

  const int64_t n = 12;
  Dataset data = Dataset::from_tensors({random_tensor({n, 1, 28, 28}, "images"), random_labels(n, 10, "labels")});
  check_round_trip(model, dir.file("cnn.safetensors"), data, n, [] { return std::make_shared<SGD>(0.05); });

  // The initialisers came back too: a network made from the JSON alone draws what the
  // original drew at build (seed 0, the same full names).
  std::shared_ptr<Network> fresh = model_from_json(model_to_json(*net));
  Initializer k = dynamic_cast<Conv2D&>(*fresh->layers()[0]).options().kernel_initializer;
  CHECK(k.kind == Initializer::Kind::uniform);
  CHECK(k.a == -1.0 / 3.0);
  CHECK(k.b == 1.0 / 3.0);
}

TEST_CASE("a functional graph round trips: two inputs, a layer called twice, residual Adds, unnamed layers") {
  Dir dir;
  SymTensor x1 = Input({6}, DType::f32, "left"), x2 = Input({6}, DType::f32, "right");
  auto shared = std::make_shared<Dense>(6, "shared_in");  // called on both inputs
  auto h1 = call(shared, x1), h2 = call(shared, x2);
  SymTensor s = call(std::make_shared<Add>(), std::vector<SymTensor>{h1, h2});
  auto block = std::make_shared<Dense>(6);  // unnamed: "dense", called twice in a row
  SymTensor t = call(block, call(block, call(std::make_shared<ReLU>(), s)));
  SymTensor u = call(std::make_shared<Add>("residual"), std::vector<SymTensor>{s, t});
  SymTensor y = call(std::make_shared<Dense>(3, "head"), u);
  auto net = std::make_shared<Network>(std::vector<SymTensor>{x1, x2}, std::vector<SymTensor>{y}, "siamese");
  Model model(net, 21);
  perturb(*net);

  const int64_t n = 10;
  Dataset data = Dataset::from_tensors(
      {random_tensor({n, 6}, "left"), random_tensor({n, 6}, "right"), random_labels(n, 3, "siamese")});
  const std::string path = dir.file("graph.safetensors");
  check_round_trip(model, path, data, n, adam);

  std::shared_ptr<Network> again = load_network(path);
  std::vector<std::string> names, inputs;
  for (Layer* l : again->layers()) names.push_back(l->name());
  for (const SymTensor& in : again->inputs()) inputs.push_back(in.node ? in.str() : "");
  CHECK(names == std::vector<std::string>{"shared_in", "add", "relu", "dense", "residual", "head"});
  CHECK(inputs == std::vector<std::string>{"(None, 6) f32 from left", "(None, 6) f32 from right"});
  // One Dense object behind both calls, so one set of weights.
  CHECK(again->named_parameters().size() == 6);
}

TEST_CASE("BatchNorm and Dropout round trip: running statistics, step counters, masks, frozen weights") {
  Dir dir;
  auto net = std::make_shared<Sequential>("bn_dropout");
  Conv2DOptions conv;
  conv.padding = 1;
  conv.use_bias = false;
  net->add(std::make_shared<Conv2D>(4, 3, conv, "conv"));
  BatchNormOptions bn;
  bn.momentum = 0.2;
  bn.epsilon = 1e-3;
  net->add(std::make_shared<BatchNorm>(bn, "bn"));
  net->add(std::make_shared<ReLU>("relu"));
  net->add(std::make_shared<Dropout>(0.3, "drop"));
  net->add(std::make_shared<Flatten>("flatten"));
  net->add(std::make_shared<Dense>(8, "fc"));
  net->add(std::make_shared<Dropout>(0.5, "drop2"));
  net->add(std::make_shared<Dense>(3, "out"));
  net->build({2, 6, 6});
  Model model(net, 33);
  perturb(*net);
  for (auto& p : net->named_parameters()) {
    if (p.name == "fc.bias") p.param->trainable = false;
  }

  const int64_t n = 16;
  Tensor images = random_tensor({n, 2, 6, 6}, "bn_images");
  Dataset data = Dataset::from_tensors({images, random_labels(n, 3, "bn_labels")});
  const std::string path = dir.file("bn.safetensors");
  save_model(model, path);
  std::unique_ptr<Model> loaded = load_model(path, model.seed());
  auto& lnet = loaded->network();
  for (auto& p : lnet.named_parameters()) CHECK(p.param->trainable == (p.name != "fc.bias"));
  for (auto& b : lnet.named_buffers()) {
    if (b.name == "bn.num_batches_tracked") CHECK(b.param->value.to_double_vector() == std::vector<double>{5});
  }

  // In training, Dropout's masks are keyed on the seed, the layer's name and the step: the
  // loaded network draws the original's (and they do drop: the output differs from inference).
  RunContext rc;
  rc.training = true;
  rc.seed = model.seed();
  rc.step = 3;
  rc.device = Device::cpu();
  Tensor train_a = net->forward({images}, rc, false).at(0);
  Tensor train_b = lnet.forward({images}, rc, false).at(0);
  CHECK(bitwise_equal(train_a, train_b));
  rc.training = false;
  CHECK_FALSE(bitwise_equal(net->forward({images}, rc).at(0), train_a));

  // That training forward moved both networks' running statistics alike.
  require_same_weights(lnet, *net);
  check_round_trip(model, dir.file("bn2.safetensors"), data, n, adam);
}

namespace {

// Every built-in layer type, each with non-default arguments, in one network of two inputs
// (an image, token ids) and two outputs.
std::shared_ptr<Network> every_layer_network() {
  // Image branch: every layer with non-default arguments.
  SymTensor img = Input({3, 9, 9}, DType::f32, "image");
  Conv2DOptions co;
  co.stride = 2;
  co.padding = 1;
  co.use_bias = false;
  co.kernel_initializer = Initializer::he_normal();
  SymTensor a = call(std::make_shared<Conv2D>(5, 3, co, "conv"), img);  // (N, 5, 5, 5)
  BatchNormOptions bo;
  bo.momentum = 0.3;
  bo.epsilon = 1e-4;
  bo.affine = false;
  a = call(std::make_shared<BatchNorm>(bo, "bn"), a);
  a = call(std::make_shared<MaxPool2D>(3, 2, 1, "max"), a);  // (N, 5, 3, 3)
  a = call(std::make_shared<AvgPool2D>(2, 1, 0, "avg"), a);  // (N, 5, 2, 2)
  a = call(std::make_shared<ReLU>("relu"), a);
  a = call(std::make_shared<Sigmoid>("sigmoid"), a);
  a = call(std::make_shared<Tanh>("tanh"), a);
  a = call(std::make_shared<LeakyReLU>(0.125, "leaky"), a);
  a = call(std::make_shared<GlobalAveragePool>("gap"), a);   // (N, 5)
  a = call(std::make_shared<Flatten>("flatten"), a);
  DenseOptions dopt;
  dopt.use_bias = true;
  dopt.kernel_initializer = Initializer::truncated_normal(0.1, 0.02);
  dopt.bias_initializer = Initializer::constant(0.25);
  dopt.activation = DenseActivation::relu;
  dopt.dropout = 0.375;
  a = call(std::make_shared<Dense>(7, dopt, "dense"), a);
  a = call(std::make_shared<Softmax>(1, "softmax"), a);
  a = call(std::make_shared<Dropout>(0.25, "dropout"), a);
  // Sequence branch.
  SymTensor ids = Input({4}, DType::i64, "ids");
  auto embedding = std::make_shared<Embedding>(11, 8, "embedding");
  SymTensor e = call(std::make_shared<PositionEncoding>("position"), call(embedding, ids));
  SymTensor m = call(std::make_shared<MultiHeadAttention>(
                         8, MultiHeadAttentionOptions{.num_heads = 2, .dropout = 0.125, .causal = true}, "attn"),
                     std::vector<SymTensor>{e, ids});
  m = call(std::make_shared<LayerNorm>(1e-3, "norm"), m);
  m = call(std::make_shared<Add>("residual"), std::vector<SymTensor>{e, m});
  m = call(std::make_shared<GELU>(false, "gelu"), m);
  m = call(embedding, m);  // the same matrix projects back: (N, 4, 11)
  return std::make_shared<Network>(std::vector<SymTensor>{img, ids}, std::vector<SymTensor>{a, m}, "everything");
}

}  // namespace

TEST_CASE("every built-in layer's configuration round trips, initialisers included") {
  auto original = every_layer_network();
  Network& net = *original;

  const std::string text = model_to_json(net);
  std::shared_ptr<Network> back = model_from_json(text);
  CHECK(model_to_json(*back) == text);
  std::map<std::string, Layer*> by_name;
  for (Layer* l : back->layers()) by_name[l->name()] = l;
  REQUIRE(by_name.size() == 19);

  auto& conv = dynamic_cast<Conv2D&>(*by_name.at("conv"));
  CHECK(conv.filters() == 5);
  CHECK(conv.kernel_size() == 3);
  CHECK(conv.stride() == 2);
  CHECK(conv.padding() == 1);
  CHECK_FALSE(conv.use_bias());
  CHECK(conv.options().kernel_initializer.kind == Initializer::Kind::he_normal);
  auto& bn = dynamic_cast<BatchNorm&>(*by_name.at("bn"));
  CHECK(bn.momentum() == 0.3);
  CHECK(bn.epsilon() == 1e-4);
  CHECK_FALSE(bn.affine());
  auto& mx = dynamic_cast<MaxPool2D&>(*by_name.at("max"));
  CHECK((mx.pool_size() == 3 && mx.stride() == 2 && mx.padding() == 1));
  auto& av = dynamic_cast<AvgPool2D&>(*by_name.at("avg"));
  CHECK((av.pool_size() == 2 && av.stride() == 1 && av.padding() == 0));
  CHECK(by_name.at("relu")->type() == "ReLU");
  CHECK(by_name.at("sigmoid")->type() == "Sigmoid");
  CHECK(by_name.at("tanh")->type() == "Tanh");
  CHECK(dynamic_cast<LeakyReLU&>(*by_name.at("leaky")).alpha() == 0.125);
  CHECK(by_name.at("gap")->type() == "GlobalAveragePool");
  CHECK(by_name.at("flatten")->type() == "Flatten");
  auto& dense = dynamic_cast<Dense&>(*by_name.at("dense"));
  CHECK(dense.units() == 7);
  CHECK(dense.use_bias());
  CHECK(dense.options().kernel_initializer.kind == Initializer::Kind::truncated_normal);
  CHECK(dense.options().kernel_initializer.a == 0.1);
  CHECK(dense.options().kernel_initializer.b == 0.02);
  CHECK(dense.options().bias_initializer.kind == Initializer::Kind::constant);
  CHECK(dense.options().bias_initializer.a == 0.25);
  CHECK(dense.options().activation == DenseActivation::relu);
  CHECK(dense.options().dropout == 0.375);
  CHECK(dynamic_cast<Softmax&>(*by_name.at("softmax")).axis() == 1);
  CHECK(dynamic_cast<Dropout&>(*by_name.at("dropout")).rate() == 0.25);
  auto& emb = dynamic_cast<Embedding&>(*by_name.at("embedding"));
  CHECK((emb.vocab_size() == 11 && emb.hidden_size() == 8));
  CHECK(by_name.at("position")->type() == "PositionEncoding");
  auto& attn = dynamic_cast<MultiHeadAttention&>(*by_name.at("attn"));
  CHECK((attn.hidden_size() == 8 && attn.num_heads() == 2 && attn.dropout() == 0.125 && attn.causal()));
  CHECK(dynamic_cast<LayerNorm&>(*by_name.at("norm")).eps() == 1e-3);
  CHECK(by_name.at("residual")->type() == "Add");
  CHECK_FALSE(dynamic_cast<GELU&>(*by_name.at("gelu")).approximate());

  // Fresh weights of both networks come from the same initialisers under the same names
  // (seed 0 at build), so they agree bitwise, and so do the outputs.
  require_same_weights(*back, net);
  RunContext rc;
  rc.device = Device::cpu();
  Tensor id_values = Tensor::empty({2, 4}, DType::i64);
  for (int64_t i = 0; i < 8; ++i) id_values.data<int64_t>()[i] = (i * 7) % 11;
  const std::vector<Tensor> in{random_tensor({2, 3, 9, 9}, "everything"), id_values};
  std::vector<Tensor> ya = net.forward(in, rc), yb = back->forward(in, rc);
  REQUIRE(ya.size() == 2);
  REQUIRE(yb.size() == 2);
  CHECK(bitwise_equal(ya[0], yb[0]));
  CHECK(bitwise_equal(ya[1], yb[1]));
  CHECK(yb[1].shape() == Shape{2, 4, 11});
}

TEST_CASE("a Dense written before it had an activation and a dropout loads as linear without dropout") {
  json arch = json::parse(model_to_json(*every_layer_network()));
  int stripped = 0;
  for (json& layer : arch["layers"]) {
    if (layer["type"] != "Dense") continue;
    CHECK(layer["config"]["activation"] == "relu");
    stripped += static_cast<int>(layer["config"].erase("activation") + layer["config"].erase("dropout"));
  }
  REQUIRE(stripped == 2);
  std::shared_ptr<Network> old = model_from_json(arch.dump());
  for (Layer* l : old->layers()) {
    if (l->type() != "Dense") continue;
    const auto& d = dynamic_cast<Dense&>(*l);
    CHECK(d.options().activation == DenseActivation::linear);
    CHECK(d.options().dropout == 0.0);
  }
}

TEST_CASE("any one field of an architecture changed gives a network or an InputError, never another error") {
  // A small in-process fuzzer over the JSON structure: every leaf of the every-layer
  // network's architecture replaced in turn by values of every JSON kind. Each result either
  // loads or is refused with an InputError; anything else escaping (a JSON library error, an
  // internal Error, a crash) fails. Sizes stay small so that no replacement allocates much.
  const json base = json::parse(model_to_json(*every_layer_network()));
  const json flat = base.flatten();
  const std::vector<json> replacements = {nullptr, -1, 0, 3, 1.5, "x", json::array(), json::object(), true};
  int loaded = 0, refused = 0;
  for (const auto& leaf : flat.items()) {
    for (const json& r : replacements) {
      json changed = base;
      changed[json::json_pointer(leaf.key())] = r;
      const std::string text = changed.dump();
      INFO(leaf.key() << " = " << r.dump());
      try {
        model_from_json(text);
        ++loaded;
      } catch (const InputError& e) {
        CHECK_THAT(e.what(), Catch::StartsWith("model JSON: "));
        ++refused;
      } catch (const std::exception& e) {
        FAIL("not an InputError: " << e.what());
      }
    }
  }
  CHECK(refused > 0);
  CHECK(loaded > 0);  // some changes are harmless (another rate, a name), and load
}

namespace {

// A program's own layer type, with two outputs: y0 = factor * gain * x (gain a parameter of
// shape (D)), y1 = x. Its type name is given, so that one class serves a registered and an
// unregistered type.
class Gain : public Layer {
 public:
  Gain(std::string type, double factor, std::string tag, std::string name = "")
      : Layer(std::move(name)), type_(std::move(type)), factor_(factor), tag_(std::move(tag)) {
    default_name("gain");
  }
  std::string type() const override { return type_; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& in) const override { return {in.at(0), in.at(0)}; }
  void build(const std::vector<Shape>& in) override {
    add_parameter("gain", {in.at(0).back()}, Initializer::uniform(0.5, 1.5));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& in, const RunContext&, SavedState& saved) override {
    const Tensor& x = in.at(0);
    const float* g = params_[0]->value.data<float>();
    const int64_t d = x.shape().back();
    Tensor y = Tensor::empty(x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) {
      y.data<float>()[i] = static_cast<float>(factor_) * g[i % d] * x.data<float>()[i];
    }
    saved.tensors = {x};
    return {y, x.clone()};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads, const RunContext&, SavedState& saved) override {
    const Tensor& x = saved.tensors.at(0);
    const float* g = params_[0]->value.data<float>();
    float* dg = params_[0]->grad.data<float>();
    const int64_t d = x.shape().back();
    Tensor dx = Tensor::zeros(x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) {
      float& out = dx.data<float>()[i];
      if (grads[0].defined()) {
        const float dy = grads[0].data<float>()[i];
        out += static_cast<float>(factor_) * g[i % d] * dy;
        dg[i % d] += static_cast<float>(factor_) * x.data<float>()[i] * dy;
      }
      if (grads[1].defined()) out += grads[1].data<float>()[i];
    }
    return {dx};
  }
  double factor() const { return factor_; }
  const std::string& tag() const { return tag_; }

 private:
  std::string type_;
  double factor_;
  std::string tag_;
};

std::shared_ptr<Network> gain_network(const std::string& type) {
  SymTensor x = Input({5}, DType::f32, "x");
  SymTensor h = call(std::make_shared<Dense>(5, "fc"), x);
  std::vector<SymTensor> two = call(std::make_shared<Gain>(type, 1.5, "tagged", "gain"), std::vector<SymTensor>{h});
  // The second output (index 1) feeds the sum: output indices must round trip.
  SymTensor y = call(std::make_shared<Add>("sum"),
                     std::vector<SymTensor>{call(std::make_shared<Dense>(5, "fc2"), two[0]), two[1]});
  SymTensor out = call(std::make_shared<Dense>(2, "head"), y);
  return std::make_shared<Network>(std::vector<SymTensor>{x}, std::vector<SymTensor>{out}, "custom");
}

}  // namespace

TEST_CASE("a program's own layer type: an InputError until registered, then saved and loaded") {
  Dir dir;
  const std::string path = dir.file("custom.safetensors");
  {
    auto net = gain_network("UnregisteredGain");
    const std::string msg = error_of<InputError>([&] { save_model(*net, path); });
    CHECK_THAT(msg, Catch::Contains("layer 'gain'") && Catch::Contains("'UnregisteredGain'") &&
                        Catch::Contains("tnt::register_layer_type"));
    CHECK_FALSE(fs::exists(path));
    communicator().barrier();  // before the master writes that path below
  }
  CHECK(error_of<InputError>([] { register_layer_type("Dense", {}, {}); }).find("to_config and from_config") !=
        std::string::npos);
  CHECK_THAT(error_of<InputError>([] {
               register_layer_type("Dense", [](const Layer&) { return LayerConfig(); },
                                   [](const std::string&, const LayerConfig&) { return LayerPtr(); });
             }),
             Catch::Contains("built-in"));

  register_layer_type(
      "Gain",
      [](const Layer& layer) {
        const auto& g = dynamic_cast<const Gain&>(layer);
        LayerConfig c;
        c.set_double("factor", g.factor());
        c.set_string("tag", g.tag());
        c.set_ints("unused_list", {1, 2, 3});
        return c;
      },
      [](const std::string& name, const LayerConfig& c) -> LayerPtr {
        CHECK(c.get_ints("unused_list") == std::vector<int64_t>{1, 2, 3});
        return std::make_shared<Gain>("Gain", c.get_double("factor"), c.get_string("tag"), name);
      });
  CHECK(layer_type_registered("Gain"));
  CHECK(layer_type_registered("Conv2D"));
  CHECK_FALSE(layer_type_registered("UnregisteredGain"));

  auto net = gain_network("Gain");
  Model model(net, 4);
  perturb(*net);
  const int64_t n = 8;
  Dataset data = Dataset::from_tensors({random_tensor({n, 5}, "gain_x"), random_labels(n, 2, "gain_y")});
  check_round_trip(model, path, data, n, adam);
  auto loaded = load_network(path);
  const auto* g = dynamic_cast<const Gain*>(loaded->layers().at(1));
  REQUIRE(g != nullptr);
  CHECK(g->factor() == 1.5);
  CHECK(g->tag() == "tagged");
}

namespace {

// A copy of a good model file with its architecture JSON changed by `edit`, written by the
// master (every rank then reads it). The first barrier: no rank still reads the previous
// version of `bad`.
void write_edited(const std::string& good, const std::string& bad, const std::function<void(json&)>& edit) {
  communicator().barrier();
  if (is_master_rank()) {
    SafetensorsFile f = read_safetensors(good);
    json arch = json::parse(f.metadata.at("architecture"));
    edit(arch);
    f.metadata["architecture"] = arch.dump();
    write_safetensors(bad, f.tensors, f.metadata);
  }
  communicator().barrier();
}

void write_with(const std::string& good, const std::string& bad, const std::function<void(SafetensorsFile&)>& edit) {
  communicator().barrier();
  if (is_master_rank()) {
    SafetensorsFile f = read_safetensors(good);
    edit(f);
    write_safetensors(bad, f.tensors, f.metadata);
  }
  communicator().barrier();
}

// What loading `path` says, on every rank, as load_model and as load_network.
std::string load_error(const std::string& path) {
  const std::string msg = error_of<InputError>([&] { load_model(path, 1); });
  CHECK(error_of<InputError>([&] { load_network(path); }) == msg);
  CHECK_THAT(msg, Catch::Contains(path));
  return msg;
}

}  // namespace

TEST_CASE("bad model files are InputErrors naming the file and the problem, on every rank") {
  Dir dir;
  auto net = test::small_mlp();
  Model model(net, 2);
  const std::string good = dir.file("good.safetensors");
  save_model(model, good);

  SECTION("truncated") {
    const std::string bad = dir.file("truncated.safetensors");
    if (is_master_rank()) {
      test::Bytes b = test::read_bytes(good);
      b.resize(b.size() / 2);
      test::write_bytes(bad, b);
    }
    communicator().barrier();
    CHECK_THAT(load_error(bad), Catch::Contains("safetensors file"));
  }
  SECTION("not there") { CHECK_THAT(load_error(dir.file("absent.safetensors")), Catch::Contains("absent")); }
  SECTION("weights only") {
    const std::string weights = dir.file("weights.safetensors");
    model.save_weights(weights);
    CHECK_THAT(load_error(weights), Catch::Contains("has no architecture") && Catch::Contains("load_weights"));
  }
  SECTION("an unknown layer type") {
    const std::string bad = dir.file("unknown.safetensors");
    write_edited(good, bad, [](json& a) { a["layers"][0]["type"] = "Mystery"; });
    CHECK_THAT(load_error(bad), Catch::Contains("layer 'fc1' is of type 'Mystery'") &&
                                    Catch::Contains("register_layer_type(\"Mystery\""));
  }
  SECTION("a newer format version") {
    const std::string bad = dir.file("newer.safetensors");
    write_edited(good, bad, [](json& a) { a["format_version"] = 2; });
    CHECK_THAT(load_error(bad), Catch::Contains("format_version 2 is newer") && Catch::Contains("up to 1"));
  }
  SECTION("a missing tensor, an extra one, a wrong shape") {
    const std::string bad = dir.file("tensors.safetensors");
    write_with(good, bad, [](SafetensorsFile& f) {
      NamedTensors kept;
      for (auto& [name, t] : f.tensors) {
        if (name == "fc1.bias") continue;
        kept.emplace_back(name, name == "fc2.weight" ? Tensor::zeros({3, 8}) : t);
      }
      kept.emplace_back("ghost", Tensor::zeros({1}));
      f.tensors = kept;
    });
    CHECK_THAT(load_error(bad), Catch::Contains("1 missing: fc1.bias") && Catch::Contains("1 unexpected: ghost") &&
                                    Catch::Contains("fc2.weight (file (3, 8), expected (2, 8))"));
  }
  SECTION("JSON that is not an architecture") {
    const std::string bad = dir.file("json.safetensors");
    auto with_text = [&](const std::string& text) {
      write_with(good, bad, [&](SafetensorsFile& f) { f.metadata["architecture"] = text; });
      return load_error(bad);
    };
    CHECK_THAT(with_text("{\"layers\": [1, 2"), Catch::Contains("not valid JSON"));
    CHECK_THAT(with_text("[1, 2, 3]"), Catch::Contains("not a JSON object"));
    CHECK_THAT(with_text("{\"hello\": 1}"), Catch::Contains("not a tarantella model architecture"));
    CHECK_THAT(with_text("{\"format\": \"tarantella.model\", \"format_version\": 1}"),
               Catch::Contains("has no 'class'"));
  }
  SECTION("a graph that does not hold together") {
    const std::string bad = dir.file("graph.safetensors");
    write_edited(good, bad, [](json& a) { a["nodes"][1]["inputs"][0][0] = 2; });  // from a later node
    CHECK_THAT(load_error(bad),
               Catch::Contains("nodes[1].inputs[0][0] = 2 is not a node before this one (an index below 1)"));
    write_edited(good, bad, [](json& a) { a["nodes"][1]["layer"] = "nobody"; });
    CHECK_THAT(load_error(bad), Catch::Contains("calls layer 'nobody', which is not among the layers"));
    write_edited(good, bad, [](json& a) { a["layers"][0]["config"]["units"] = -4; });
    CHECK_THAT(load_error(bad), Catch::Contains("layer 'fc1' (Dense) cannot be made from its configuration") &&
                                    Catch::Contains("units must be positive"));
    write_edited(good, bad, [](json& a) { a["layers"][0]["config"].erase("units"); });
    CHECK_THAT(load_error(bad), Catch::Contains("layer 'fc1' (Dense): config 'units' (an integer) is missing"));
    write_edited(good, bad, [](json& a) { a["layers"][0]["config"]["use_bias"] = "yes"; });
    CHECK_THAT(load_error(bad), Catch::Contains("config 'use_bias' = \"yes\" is not a boolean"));
    write_edited(good, bad, [](json& a) { a["layers"][2]["config"]["units"] = 3; });  // 3 classes, 2 in the weights
    CHECK_THAT(load_error(bad), Catch::Contains("fc2.weight (file (2, 8), expected (3, 8))"));
    write_edited(good, bad, [](json& a) { a["nodes"][2]["inputs"][0] = {0, 0}; });  // no longer a chain
    CHECK_THAT(load_error(bad), Catch::Contains("not one chain"));
    write_edited(good, bad, [](json& a) { a["frozen"] = {"fc9.weight"}; });
    CHECK_THAT(load_error(bad), Catch::Contains("frozen[0] = \"fc9.weight\" is not a parameter"));
  }
}

TEST_CASE("saving is the master's, atomic, and refuses bad networks on every rank") {
  Dir dir;
  auto net = test::small_mlp();
  Model model(net, 2);
  const std::string path = dir.file("model.safetensors");
  save_model(model, path);
  communicator().barrier();
  if (is_master_rank()) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path)) names.push_back(e.path().filename().string());
    CHECK(names == std::vector<std::string>{"model.safetensors"});  // no temporary file left
  }
  // The tensors are those of a weights file, so Model::load_weights (and PyTorch) read it.
  model.save_weights(dir.file("weights.safetensors"));
  if (is_master_rank()) {
    std::vector<std::string> a, b;
    for (auto& [name, t] : read_safetensors(path).tensors) a.push_back(name);
    for (auto& [name, t] : read_safetensors(dir.file("weights.safetensors")).tensors) b.push_back(name);
    CHECK(a == b);
    CHECK(read_safetensors(path).metadata.at("format") == "pt");
  }
  Model other(test::small_mlp(), 9);
  other.load_weights(path);
  require_same_weights(other.network(), *net);

  // A directory that does not exist: the user's mistake, on every rank.
  CHECK_THAT(error_of<InputError>([&] { save_model(model, dir.file("no/such/dir/m.safetensors")); }),
             Catch::Contains("no/such/dir") && Catch::Contains("does not exist"));
  // An unbuilt Sequential.
  auto unbuilt = std::make_shared<Sequential>("unbuilt");
  unbuilt->add(std::make_shared<Dense>(3));
  CHECK_THAT(error_of<InputError>([&] { save_model(*unbuilt, dir.file("u.safetensors")); }),
             Catch::Contains("Sequential 'unbuilt' is not built"));
  // A diverged network (on every rank: replicas are identical) leaves the good file as it was.
  test::Bytes before;
  if (is_master_rank()) before = test::read_bytes(path);
  net->named_parameters()[1].param->value.fill_(std::numeric_limits<double>::quiet_NaN());
  const std::string msg = error_of<Error>([&] { save_model(model, path); });
  CHECK_THAT(msg, Catch::Contains("refusing to write model file") && Catch::Contains("fc1.bias"));
  if (is_master_rank()) CHECK(test::read_bytes(path) == before);
}

// Each layer's .cpp registers its own type (nn/layer_types.hpp): a registration lost (a file
// whose static registration did not run, a name misspelt) would show here, not first in a
// user's model file.
TEST_CASE("every built-in layer type registers itself for model files", "[model_file][registry]") {
  for (const char* type : {"ReLU", "Sigmoid", "Tanh", "LeakyReLU", "GELU", "Softmax", "Add", "Flatten",
                           "GlobalAveragePool", "PositionEncoding", "MaxPool2D", "AvgPool2D", "Dense", "Conv2D",
                           "BatchNorm", "MultiHeadAttention", "Dropout", "LayerNorm", "Embedding"}) {
    INFO(type);
    CHECK(tnt::layer_type_registered(type));
    // A built-in type cannot be replaced by a program's registration.
    CHECK_THROWS_WITH(tnt::register_layer_type(
                          type, [](const tnt::Layer&) { return tnt::LayerConfig(); },
                          [](const std::string&, const tnt::LayerConfig&) -> tnt::LayerPtr { return nullptr; }),
                      Catch::Contains("is a built-in layer type"));
  }
}
