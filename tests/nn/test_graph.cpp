// The model graph with small test-only layers whose gradients are known in closed form:
// Scale (y = w * x, one scalar weight), Fork (two outputs: w * x and x), Sum (a + b, which
// returns the SAME gradient tensor for both inputs, to catch in-place accumulation).
// All values are small integers, so every expected number below is exact in f32.
#include <catch2/catch.hpp>

#include "tarantella/graph.hpp"
#include "tarantella/layer.hpp"
#include "tarantella/layers/add.hpp"

#include <numeric>
#include <string>
#include <vector>

using namespace tnt;

namespace {

class Scale : public Layer {
 public:
  explicit Scale(std::string name = "", float init = 1.0f) : Layer(std::move(name)), init_(init) {
    default_name("scale");
  }
  std::string type() const override { return "Scale"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& in) const override { return {in.at(0)}; }
  void build(const std::vector<Shape>&) override {
    add_parameter("w", {1}, Initializer::constant(init_));
    params_[0]->value.fill_(init_);
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& in, const RunContext&, SavedState& saved) override {
    ++forward_calls;
    const float w = params_[0]->value.data<float>()[0];
    Tensor y = Tensor::empty(in[0].shape());
    for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = w * in[0].data<float>()[i];
    saved.tensors = {in[0]};
    return {y};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g, const RunContext&, SavedState& saved) override {
    const Tensor& x = saved.tensors.at(0);
    const float w = params_[0]->value.data<float>()[0];
    Tensor dx = Tensor::empty(x.shape());
    double dw = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      dx.data<float>()[i] = w * g[0].data<float>()[i];
      dw += static_cast<double>(x.data<float>()[i]) * g[0].data<float>()[i];
    }
    params_[0]->grad.data<float>()[0] += static_cast<float>(dw);
    return {dx};
  }
  float w() { return params_[0]->value.data<float>()[0]; }
  float dw() { return params_[0]->grad.data<float>()[0]; }
  int forward_calls = 0;

 private:
  float init_;
};

class Fork : public Layer {
 public:
  explicit Fork(std::string name = "", float init = 1.0f) : Layer(std::move(name)), init_(init) {
    default_name("fork");
  }
  std::string type() const override { return "Fork"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& in) const override { return {in.at(0), in.at(0)}; }
  void build(const std::vector<Shape>&) override {
    add_parameter("w", {1}, Initializer::constant(init_));
    params_[0]->value.fill_(init_);
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& in, const RunContext&, SavedState& saved) override {
    const float w = params_[0]->value.data<float>()[0];
    Tensor y = Tensor::empty(in[0].shape());
    for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = w * in[0].data<float>()[i];
    saved.tensors = {in[0]};
    return {y, in[0].clone()};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g, const RunContext&, SavedState& saved) override {
    const Tensor& x = saved.tensors.at(0);
    const float w = params_[0]->value.data<float>()[0];
    REQUIRE(g.size() == 2);
    REQUIRE(g[0].defined());
    REQUIRE(g[1].defined());  // the graph fills a missing gradient with zeros
    Tensor dx = Tensor::empty(x.shape());
    double dw = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      dx.data<float>()[i] = w * g[0].data<float>()[i] + g[1].data<float>()[i];
      dw += static_cast<double>(x.data<float>()[i]) * g[0].data<float>()[i];
    }
    params_[0]->grad.data<float>()[0] += static_cast<float>(dw);
    return {dx};
  }
  float dw() { return params_[0]->grad.data<float>()[0]; }

 private:
  float init_;
};

class Sum : public Layer {
 public:
  explicit Sum(std::string name = "") : Layer(std::move(name)) { default_name("sum"); }
  std::string type() const override { return "Sum"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& in) const override { return {in.at(0)}; }
  std::vector<Tensor> forward(const std::vector<Tensor>& in, const RunContext&, SavedState&) override {
    Tensor y = Tensor::empty(in[0].shape());
    for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = in[0].data<float>()[i] + in[1].data<float>()[i];
    return {y};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g, const RunContext&, SavedState&) override {
    return {g[0], g[0]};
  }
};

RunContext training() {
  RunContext rc;
  rc.training = true;
  return rc;
}

Tensor iota(const Shape& shape, float start = 1.0f) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  std::iota(v.begin(), v.end(), start);
  return Tensor::from_vector(v, shape);
}

std::vector<float> filled(int64_t n, float value) { return std::vector<float>(static_cast<size_t>(n), value); }

}  // namespace

TEST_CASE("graph: a chain computes y = w2 * w1 * x and the chain rule") {
  auto s1 = std::make_shared<Scale>("s1", 2.0f);
  auto s2 = std::make_shared<Scale>("s2", 3.0f);
  SymTensor x = Input({3});
  Network net({x}, {call(s2, call(s1, x))}, "chain");
  REQUIRE(x.shape() == Shape{-1, 3});

  Tensor in = iota({2, 3});  // 1..6, sum 21
  std::vector<Tensor> out = net.forward({in}, training());
  REQUIRE(out.size() == 1);
  CHECK(out[0].shape() == Shape{2, 3});
  CHECK(out[0].to_vector() == std::vector<float>{6, 12, 18, 24, 30, 36});

  net.zero_grad();
  std::vector<Tensor> gin = net.backward({Tensor::full({2, 3}, 1.0)}, training());
  CHECK(gin.at(0).to_vector() == filled(6, 6.0f));
  CHECK(s1->dw() == 3.0f * 21);  // d/dw1 sum(w2 w1 x) = w2 * sum(x)
  CHECK(s2->dw() == 2.0f * 21);

  // Gradients add up over passes until zero_grad().
  net.forward({in}, training());
  net.backward({Tensor::full({2, 3}, 1.0)}, training());
  CHECK(s1->dw() == 2 * 3.0f * 21);
  net.zero_grad();
  CHECK(s1->dw() == 0.0f);
}

TEST_CASE("graph: a layer called twice accumulates, and its hook fires after its last backward") {
  // h = s1(x); y = sum(s1(h), s2(x)) = (w1^2 + w2) x
  auto s1 = std::make_shared<Scale>("s1", 2.0f);
  auto s2 = std::make_shared<Scale>("s2", 3.0f);
  auto add = std::make_shared<Sum>("add");
  SymTensor x = Input({4});
  SymTensor h = call(s1, x);
  SymTensor y = call(add, {call(s1, h), call(s2, x)});
  Network net({x}, {y}, "residual");

  std::vector<NamedParameter> named = net.named_parameters();
  REQUIRE(named.size() == 2);
  CHECK(named[0].name == "s1.w");
  CHECK(named[1].name == "s2.w");

  Tensor in = iota({1, 4});  // sum 10
  Tensor grad_out = Tensor::full({1, 4}, 1.0);
  CHECK(net.forward({in}, training())[0].to_vector() == std::vector<float>{7, 14, 21, 28});
  CHECK(s1->forward_calls == 2);

  net.zero_grad();
  std::vector<size_t> order;
  std::vector<float> at_hook;
  std::vector<Tensor> gin = net.backward({grad_out}, training(), [&](size_t index, Parameter& p) {
    order.push_back(index);
    at_hook.push_back(p.grad.data<float>()[0]);
    CHECK(&p == net.trainable_parameters().at(index).param);
  });
  // Backward runs add, s2, s1 (second call), s1 (first call): s2 is final first.
  CHECK(order == std::vector<size_t>{1, 0});
  // dw1 = sum(x * w1 * 1) [first call] + sum(h * 1) [second call] = 2*10 + 2*10
  CHECK(s1->dw() == 40.0f);
  CHECK(s2->dw() == 10.0f);
  CHECK(at_hook == std::vector<float>{10.0f, 40.0f});  // the values were final at the hook
  CHECK(gin.at(0).to_vector() == filled(4, 7.0f));
  // Sum returns one tensor for both inputs; summing must not have written into it, nor into
  // the caller's gradient.
  CHECK(grad_out.to_vector() == filled(4, 1.0f));
}

TEST_CASE("graph: a gradient summed into the one Add passed on is summed in place only where nobody holds it") {
  // Add gives its first input the output gradient itself; the executor then adds that
  // input's other gradients into it in place only where no other tensor holds its memory.
  Tensor in = iota({1, 4});  // sum 10
  SECTION("the caller's gradient: out of place, the caller's tensor untouched") {
    // y = add(h, s3(h)), h = s1(x): y = w1 (1 + w3) x = 8x
    auto s1 = std::make_shared<Scale>("s1", 2.0f);
    auto s3 = std::make_shared<Scale>("s3", 3.0f);
    SymTensor x = Input({4});
    SymTensor h = call(s1, x);
    Network net({x}, {call(std::make_shared<Add>("add"), {h, call(s3, h)})}, "caller");
    CHECK(net.forward({in}, training())[0].to_vector() == std::vector<float>{8, 16, 24, 32});
    net.zero_grad();
    const Tensor grad_out = Tensor::full({1, 4}, 1.0);
    const std::vector<Tensor> gin = net.backward({grad_out}, training());
    CHECK(gin.at(0).to_vector() == filled(4, 8.0f));
    CHECK(grad_out.to_vector() == filled(4, 1.0f));
    CHECK(s1->dw() == 40.0f);  // sum(x (1 + w3))
    CHECK(s3->dw() == 20.0f);  // sum(h)
  }
  SECTION("a layer's gradient: in place, the same sums") {
    // y = s4(add(a, s3(a))), a = s2(x): y = w4 (1 + w3) w2 x = 40x
    auto s2 = std::make_shared<Scale>("s2", 2.0f);
    auto s3 = std::make_shared<Scale>("s3", 3.0f);
    auto s4 = std::make_shared<Scale>("s4", 5.0f);
    SymTensor x = Input({4});
    SymTensor a = call(s2, x);
    Network net({x}, {call(s4, call(std::make_shared<Add>("add"), {a, call(s3, a)}))}, "layer");
    CHECK(net.forward({in}, training())[0].to_vector() == std::vector<float>{40, 80, 120, 160});
    net.zero_grad();
    const std::vector<Tensor> gin = net.backward({Tensor::full({1, 4}, 1.0)}, training());
    CHECK(gin.at(0).to_vector() == filled(4, 40.0f));
    CHECK(s2->dw() == 200.0f);  // sum(x w4 (1 + w3))
    CHECK(s3->dw() == 100.0f);  // sum(a w4)
    CHECK(s4->dw() == 80.0f);   // sum(a (1 + w3))
  }
}

TEST_CASE("graph: the hook's index is the position among trainable parameters, frozen ones skipped") {
  // a -> frozen -> c: c's weight is named_parameters()[2] but trainable_parameters()[1],
  // the slot the Model's Reducer registered it under.
  auto a = std::make_shared<Scale>("a", 2.0f);
  auto frozen = std::make_shared<Scale>("frozen", 3.0f);
  auto c = std::make_shared<Scale>("c", 5.0f);
  SymTensor x = Input({2});
  Network net({x}, {call(c, call(frozen, call(a, x)))}, "partly_frozen");
  frozen->parameters().at(0)->trainable = false;
  const std::vector<NamedParameter> trainable = net.trainable_parameters();
  REQUIRE(trainable.size() == 2);
  REQUIRE(net.named_parameters().size() == 3);

  net.forward({iota({1, 2})}, training());
  net.zero_grad();
  std::vector<size_t> order;
  net.backward({Tensor::full({1, 2}, 1.0)}, training(), [&](size_t index, Parameter& p) {
    order.push_back(index);
    REQUIRE(index < trainable.size());
    CHECK(&p == trainable[index].param);
  });
  CHECK(order == std::vector<size_t>{1, 0});  // c, then a; never the frozen weight

  SECTION("unfreezing after the network was made renumbers the hooks as trainable_parameters()") {
    frozen->parameters().at(0)->trainable = true;
    net.forward({iota({1, 2})}, training());
    order.clear();
    net.backward({Tensor::full({1, 2}, 1.0)}, training(), [&](size_t index, Parameter& p) {
      order.push_back(index);
      CHECK(&p == net.trainable_parameters().at(index).param);
    });
    CHECK(order == std::vector<size_t>{2, 1, 0});
  }
}

TEST_CASE("graph: a fan-out into one layer (sum(x, x)) sums both gradients") {
  auto add = std::make_shared<Sum>("add");
  auto s = std::make_shared<Scale>("s", 5.0f);
  SymTensor x = Input({2});
  SymTensor y = call(s, call(add, {x, x}));
  Network net({x}, {y});
  Tensor in = iota({1, 2});
  CHECK(net.forward({in}, training())[0].to_vector() == std::vector<float>{10, 20});
  net.zero_grad();
  std::vector<Tensor> gin = net.backward({Tensor::full({1, 2}, 1.0)}, training());
  CHECK(gin[0].to_vector() == filled(2, 10.0f));
  CHECK(s->dw() == 6.0f);  // sum(2x) = 2 * 3
}

TEST_CASE("graph: several outputs, and an output without gradient counts as zeros") {
  auto fork = std::make_shared<Fork>("fork", 4.0f);
  auto s = std::make_shared<Scale>("s", 2.0f);
  SymTensor x = Input({2});
  std::vector<SymTensor> f = call(fork, std::vector<SymTensor>{x});
  REQUIRE(f.size() == 2);
  SymTensor a = call(s, f[0]);  // 8x
  SymTensor b = f[1];           // x
  Network net({x}, {a, b}, "two_outputs");
  Tensor in = iota({1, 2});
  std::vector<Tensor> out = net.forward({in}, training());
  REQUIRE(out.size() == 2);
  CHECK(out[0].to_vector() == std::vector<float>{8, 16});
  CHECK(out[1].to_vector() == std::vector<float>{1, 2});

  SECTION("both gradients") {
    net.zero_grad();
    std::vector<Tensor> gin = net.backward({Tensor::full({1, 2}, 1.0), Tensor::full({1, 2}, 1.0)}, training());
    CHECK(gin[0].to_vector() == filled(2, 9.0f));  // 8 + 1
    CHECK(fork->dw() == 2.0f * 3);                  // sum(x * w_s * 1)
  }
  SECTION("second output without gradient") {
    net.zero_grad();
    std::vector<Tensor> gin = net.backward({Tensor::full({1, 2}, 1.0), Tensor()}, training());
    CHECK(gin[0].to_vector() == filled(2, 8.0f));
  }
  SECTION("no gradient at all: layers are skipped, hooks still fire") {
    net.zero_grad();
    int hooks = 0;
    net.backward({Tensor(), Tensor()}, training(), [&](size_t, Parameter&) { ++hooks; });
    CHECK(hooks == 2);
    CHECK(fork->dw() == 0.0f);
  }
}

TEST_CASE("graph: an unused output of a multi-output layer gets a zero gradient") {
  auto fork = std::make_shared<Fork>("fork", 3.0f);
  SymTensor x = Input({3});
  SymTensor y = call(fork, std::vector<SymTensor>{x}).at(0);
  Network net({x}, {y});
  net.forward({iota({1, 3})}, training());
  net.zero_grad();
  CHECK(net.backward({Tensor::full({1, 3}, 2.0)}, training())[0].to_vector() == filled(3, 6.0f));
  CHECK(fork->dw() == 12.0f);  // sum(x * 2) = 2 * 6
}

TEST_CASE("graph: two networks share a layer and therefore its weights") {
  auto shared = std::make_shared<Scale>("embed", 2.0f);
  auto head = std::make_shared<Scale>("head", 3.0f);
  SymTensor x1 = Input({2});
  Network train({x1}, {call(head, call(shared, x1))}, "train");
  SymTensor x2 = Input({2});
  Network infer({x2}, {call(shared, x2)}, "infer");

  CHECK(train.named_parameters().at(0).param == infer.named_parameters().at(0).param);
  CHECK(infer.named_parameters().at(0).name == "embed.w");
  shared->parameters()[0]->value.fill_(5.0);
  RunContext eval;
  CHECK(infer.forward({iota({1, 2})}, eval)[0].to_vector() == std::vector<float>{5, 10});
  CHECK(train.forward({iota({1, 2})}, eval)[0].to_vector() == std::vector<float>{15, 30});
  CHECK(train.parameter_count() == 2);
  CHECK(infer.parameter_count() == 1);
}

TEST_CASE("graph: a network keeps layers it was given by shared_ptr alive") {
  SymTensor x = Input({2});
  std::unique_ptr<Network> net;
  {
    auto s = std::make_shared<Scale>("s", 3.0f);
    net = std::make_unique<Network>(std::vector<SymTensor>{x}, std::vector<SymTensor>{(*s)(x)});
  }
  CHECK(net->forward({iota({1, 2})}, RunContext{})[0].to_vector() == std::vector<float>{3, 6});
}

TEST_CASE("graph: names") {
  SECTION("Sequential names unnamed layers by position, as PyTorch") {
    Sequential seq({std::make_shared<Scale>(), std::make_shared<Scale>("named"), std::make_shared<Scale>()});
    seq.build({3});
    std::vector<NamedParameter> p = seq.named_parameters();
    REQUIRE(p.size() == 3);
    CHECK(p[0].name == "0.w");
    CHECK(p[1].name == "named.w");
    CHECK(p[2].name == "2.w");
  }
  SECTION("functional networks name unnamed layers by type, skipping names in use") {
    auto a = std::make_shared<Scale>();
    auto b = std::make_shared<Scale>("scale");
    auto c = std::make_shared<Scale>();
    SymTensor x = Input({1});
    Network net({x}, {call(c, call(b, call(a, x)))});
    std::vector<NamedParameter> p = net.named_parameters();
    CHECK(p[0].name == "scale_1.w");
    CHECK(p[1].name == "scale.w");
    CHECK(p[2].name == "scale_2.w");
  }
  SECTION("two layers with one name are an error that names it") {
    auto a = std::make_shared<Scale>("layer1.0.conv1");
    auto b = std::make_shared<Scale>("layer1.0.conv1");
    SymTensor x = Input({1});
    SymTensor y = call(b, call(a, x));
    CHECK_THROWS_WITH(Network({x}, {y}), Catch::Contains("named 'layer1.0.conv1'"));
    CHECK_THROWS_AS(Network({x}, {y}), InputError);
  }
}

TEST_CASE("graph: bad inputs are reported by name") {
  auto s = std::make_shared<Scale>("s");
  SymTensor x = Input({3}, DType::f32, "pixels");
  SymTensor other = Input({3}, DType::f32, "labels");
  Network net({x}, {call(s, x)}, "net");
  CHECK_THROWS_WITH(net.forward({Tensor::zeros({2, 4})}, RunContext{}),
                    Catch::Contains("'pixels'") && Catch::Contains("(2, 4)"));
  CHECK_THROWS_AS(net.forward({Tensor::zeros({2, 3}), Tensor::zeros({2, 3})}, RunContext{}), InputError);
  CHECK_THROWS_WITH(Network({x}, {call(s, other)}), Catch::Contains("'labels'"));
  // backward without a training forward
  net.forward({Tensor::zeros({2, 3})}, RunContext{});
  CHECK_THROWS_WITH(net.backward({Tensor::zeros({2, 3})}, RunContext{}), Catch::Contains("forward"));
  Sequential empty("empty");
  CHECK_THROWS_WITH(empty.named_parameters(), Catch::Contains("not built"));
}

TEST_CASE("graph: Sequential builds from its first input, and summary() lists every call") {
  Sequential seq("stack");
  seq.add(std::make_shared<Scale>("first", 2.0f)).add(std::make_shared<Scale>("second", 0.5f));
  CHECK_FALSE(seq.is_built());
  CHECK(seq.forward({iota({2, 2})}, RunContext{})[0].to_vector() == std::vector<float>{1, 2, 3, 4});
  CHECK(seq.is_built());
  CHECK_THROWS(seq.add(std::make_shared<Scale>()));
  const std::string text = seq.summary();
  CHECK_THAT(text, Catch::Contains("Model: \"stack\""));
  CHECK_THAT(text, Catch::Contains("first (Scale)"));
  CHECK_THAT(text, Catch::Contains("(None, 2)"));
  CHECK_THAT(text, Catch::Contains("Total params: 2"));
  CHECK_THAT(text, !Catch::Contains("Connected to"));  // a chain needs no wiring column

  auto s1 = std::make_shared<Scale>("s1");
  auto add = std::make_shared<Sum>("add");
  SymTensor x = Input({2}, DType::f32, "x");
  Network res({x}, {call(add, {call(s1, x), x})}, "res");
  const std::string wired = res.summary();
  CHECK_THAT(wired, Catch::Contains("Connected to"));
  CHECK_THAT(wired, Catch::Contains("s1, x"));
}

TEST_CASE("graph: the device of a network is the device of its layers") {
  auto s = std::make_shared<Scale>("s");
  SymTensor x = Input({2});
  Network net({x}, {call(s, x)});
  CHECK(net.device() == Device::cpu());
  net.to(Device::cpu());
  CHECK(net.device() == Device::cpu());
  CHECK(s->device() == Device::cpu());
}

namespace {

// A custom layer with a mistake: its forward returns one column more than output_shapes()
// says (Widen), or its backward a gradient of one column more than its input (BadGrad).
class Widen : public Layer {
 public:
  explicit Widen(bool bad_forward, std::string name = "") : Layer(std::move(name)), bad_forward_(bad_forward) {
    default_name("widen");
  }
  std::string type() const override { return "Widen"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& in) const override { return {in.at(0)}; }
  std::vector<Tensor> forward(const std::vector<Tensor>& in, const RunContext&, SavedState&) override {
    Shape s = in[0].shape();
    if (bad_forward_) s.back() += 1;
    return {Tensor::full(s, 1.0)};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g, const RunContext&, SavedState&) override {
    Shape s = g[0].shape();
    s.back() += 1;
    return {Tensor::full(s, 1.0)};
  }

 private:
  bool bad_forward_;
};

}  // namespace

TEST_CASE("graph: a layer whose forward disagrees with its output_shapes is named, not the layer after it") {
  auto widen = std::make_shared<Widen>(true, "my_layer");
  auto after = std::make_shared<Sum>("after");
  SymTensor x = Input({3}, DType::f32, "x");
  Network net({x}, {call(after, {call(widen, x), x})}, "custom");
  // Without the check, Sum would read past the end of its second input.
  CHECK_THROWS_WITH(net.forward({iota({2, 3})}, training()),
                    Catch::Contains("layer 'my_layer' (Widen) in network 'custom': its forward returned output 0 of "
                                    "shape (2, 4), but its output_shapes() gave (None, 3)"));
}

TEST_CASE("graph: a layer whose backward returns a gradient of the wrong shape is named") {
  auto widen = std::make_shared<Widen>(false, "my_layer");
  auto s = std::make_shared<Scale>("s");
  SymTensor x = Input({3}, DType::f32, "x");
  Network net({x}, {call(widen, call(s, x))}, "custom");
  net.forward({iota({2, 3})}, training());
  CHECK_THROWS_WITH(net.backward({Tensor::full({2, 3}, 1.0)}, training()),
                    Catch::Contains("layer 'my_layer' (Widen) in network 'custom': its backward returned a gradient of "
                                    "shape (2, 4) for input 0, which has shape (2, 3)"));
}

namespace {

// A layer whose engine fails: a library error (as a cuBLAS status or a kernel's fault would
// be) in forward or backward, or an InputError in forward.
class Failing : public Layer {
 public:
  enum class Where { forward, backward, input };
  explicit Failing(Where where, std::string name) : Layer(std::move(name)), where_(where) {}
  std::string type() const override { return "Failing"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& in) const override { return {in.at(0)}; }
  std::vector<Tensor> forward(const std::vector<Tensor>& in, const RunContext&, SavedState&) override {
    if (where_ == Where::forward) TNT_CHECK(false, "engine status 7 in gemm");
    if (where_ == Where::input) TNT_INPUT_ERROR("file 'x.csv' is bad");
    return {in[0]};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g, const RunContext&, SavedState&) override {
    TNT_CHECK(false, "engine status 8 in gemm");
    return {g[0]};
  }

 private:
  Where where_;
};

}  // namespace

TEST_CASE("graph: an engine's error names the layer, the pass and its operands; an input error stays as it is") {
  SymTensor x = Input({3}, DType::f32, "x");
  auto f = std::make_shared<Failing>(Failing::Where::forward, "gemm_layer");
  Network fwd({x}, {call(f, x)});
  CHECK_THROWS_WITH(fwd.forward({iota({2, 3})}, training()),
                    Catch::Contains("engine status 7 in gemm") &&
                        Catch::Contains("; in layer 'gemm_layer' (Failing), forward on f32(2, 3) on cpu"));
  auto b = std::make_shared<Failing>(Failing::Where::backward, "gemm_back");
  Network bwd({x}, {call(b, x)});
  bwd.forward({iota({2, 3})}, training());
  CHECK_THROWS_WITH(bwd.backward({Tensor::full({2, 3}, 1.0)}, training()),
                    Catch::Contains("engine status 8 in gemm") &&
                        Catch::Contains("; in layer 'gemm_back' (Failing), backward on f32(2, 3) on cpu"));
  auto in = std::make_shared<Failing>(Failing::Where::input, "reader");
  Network inp({x}, {call(in, x)});
  CHECK_THROWS_MATCHES(inp.forward({iota({2, 3})}, training()), InputError,
                       Catch::Message("file 'x.csv' is bad"));
}
