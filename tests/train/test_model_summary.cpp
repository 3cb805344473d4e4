// Model::summary(): the text of a small model, its parameter counts worked out here from the
// layer sizes (a Dense layer from n to m features has n*m weights and m biases).
#include <catch2/catch.hpp>

#include "tarantella/tarantella.hpp"

#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// The table row that starts with `label`, split on runs of spaces into its columns (a
// column of two words, such as "hidden (Dense)", comes back as two).
std::vector<std::string> row_of(const std::vector<std::string>& lines, const std::string& label) {
  for (const std::string& l : lines) {
    if (l.rfind(label, 0) != 0) continue;
    std::vector<std::string> words;
    std::istringstream in(l);
    for (std::string w; in >> w;) words.push_back(w);
    return words;
  }
  FAIL("no row starting with '" << label << "'");
  return {};
}

int64_t dense_params(int64_t in, int64_t out) { return in * out + out; }

}  // namespace

TEST_CASE("Model::summary lists each layer with its type, output shape and parameters, and the totals") {
  auto net = std::make_shared<tnt::Sequential>("tiny");
  net->add(std::make_shared<tnt::Dense>(5, "hidden"));
  net->add(std::make_shared<tnt::ReLU>("act"));
  net->add(std::make_shared<tnt::Dense>(2, "head"));
  net->build({3});
  tnt::Model model(net, 1);
  const int64_t hidden = dense_params(3, 5), head = dense_params(5, 2);  // 20 and 12

  SECTION("before compile: the table and the totals") {
    const std::string text = model.summary();
    INFO(text);
    const auto lines = lines_of(text);
    REQUIRE(lines.at(0) == "Model: \"tiny\"");
    CHECK(row_of(lines, "hidden (Dense)") ==
          std::vector<std::string>{"hidden", "(Dense)", "(None,", "5)", std::to_string(hidden)});
    CHECK(row_of(lines, "act (ReLU)") == std::vector<std::string>{"act", "(ReLU)", "(None,", "5)", "0"});
    CHECK(row_of(lines, "head (Dense)") ==
          std::vector<std::string>{"head", "(Dense)", "(None,", "2)", std::to_string(head)});
    CHECK(row_of(lines, "Total params:").back() == std::to_string(hidden + head));
    CHECK(row_of(lines, "Trainable params:").back() == std::to_string(hidden + head));
    CHECK(row_of(lines, "Non-trainable params:").back() == "0");
    CHECK(lines.back() == "Not compiled");
  }
  SECTION("a frozen layer counts as non-trainable; after compile, what it chose") {
    for (auto& p : net->named_parameters()) {
      if (p.name.rfind("head.", 0) == 0) p.param->trainable = false;
    }
    model.compile(std::make_shared<tnt::SGD>(0.1, tnt::SgdOptions{.clipping = {.global_norm = 1.0}}),
                  std::make_shared<tnt::SoftmaxCrossEntropy>(), {std::make_shared<tnt::Accuracy>()});
    const std::string text = model.summary();
    INFO(text);
    const auto lines = lines_of(text);
    CHECK(row_of(lines, "Total params:").back() == std::to_string(hidden + head));
    CHECK(row_of(lines, "Trainable params:").back() == std::to_string(hidden));
    CHECK(row_of(lines, "Non-trainable params:").back() == std::to_string(head));
    CHECK_THAT(text, Catch::Contains("Optimizer: SGD(lr=") && Catch::Contains("clip_global_norm=1)"));
    CHECK_THAT(text, Catch::Contains("Loss: softmax_cross_entropy\nMetrics: accuracy\nPrecision: fp32\n"));
    CHECK_THAT(text, Catch::Contains("Ranks: 1 (data parallel)"));
  }
}
