// The Transformer of models/transformer/model.hpp against scripts/transformer_torch.py: a
// tiny model with random weights (LayerNorm and bias values included) writes its weights,
// padded source and decoder ids and its inference logits to a safetensors file; the
// PyTorch module of the same structure must load the weights by name (strictly) and give
// the same logits. Needs a Python with torch (PYTHON=, else python3, else
// /usr/bin/python3, Debian's python3-torch); without one the test fails.
#include <catch2/catch.hpp>

#include "../../models/transformer/model.hpp"
#include "temp_dir.hpp"
#include "tarantella/checkpoint.hpp"
#include "tarantella/tarantella.hpp"

#include <fmt/format.h>

#include <cstdlib>

#ifndef TNT_SOURCE_DIR
#error "TNT_SOURCE_DIR must name the repository root"
#endif

TEST_CASE("the Transformer's checkpoint loads into the PyTorch module and gives the same logits", "[nn][transformer]") {
  tnt_models::TransformerParams p;
  p.vocab_size = 23;
  p.hidden_size = 16;
  p.num_heads = 4;
  p.filter_size = 24;
  p.num_hidden_layers = 2;
  tnt_models::Transformer model(p);
  const int64_t s = 7, t = 5;
  auto net = model.training_network(s, t);
  net->initialize(3);
  // LayerNorm weights 1 and biases 0 would hide a norm left out or applied twice.
  for (auto& np : net->named_parameters()) {
    if (np.param->value.ndim() != 1) continue;
    tnt::CounterRng rng(4, np.name);
    float* v = np.param->value.data<float>();
    for (int64_t i = 0; i < np.param->value.numel(); ++i) v[i] = 0.5f + rng.uniform(static_cast<uint64_t>(i));
  }
  std::vector<int64_t> src{5, 9, 2, 1, 0, 0, 0, 7, 3, 3, 8, 12, 22, 1};
  std::vector<int64_t> dec{0, 4, 4, 6, 1, 0, 11, 0, 0, 0};  // second one: a 0 inside the target
  const tnt::Tensor src_ids = tnt::Tensor::from_data(src.data(), {2, s});
  const tnt::Tensor dec_ids = tnt::Tensor::from_data(dec.data(), {2, t});
  tnt::Tensor logits = net->forward({src_ids, dec_ids}, tnt::RunContext{}, false).at(0);
  REQUIRE(logits.shape() == tnt::Shape{2, t, 23});

  // The decoding networks over the same layers give the same logits.
  auto encoder = model.encoder_network(s);
  auto decoder = model.decoder_network(s, t);
  tnt::Tensor memory = encoder->forward({src_ids}, tnt::RunContext{}, false).at(0);
  tnt::Tensor split = decoder->forward({dec_ids, memory, src_ids}, tnt::RunContext{}, false).at(0);
  CHECK(split.to_vector() == logits.to_vector());

  tnt::Checkpoint ck;
  for (auto& np : net->named_parameters()) ck.add(np.name, np.param->value);
  ck.add("check.inputs", src_ids);
  ck.add("check.decoder_inputs", dec_ids);
  ck.add("check.logits", logits);
  ck.set_metadata_int("vocab_size", p.vocab_size);
  ck.set_metadata_int("hidden_size", p.hidden_size);
  ck.set_metadata_int("num_hidden_layers", p.num_hidden_layers);
  ck.set_metadata_int("num_heads", p.num_heads);
  ck.set_metadata_int("filter_size", p.filter_size);
  tnt::test::TempDir dir("tnt-transformer-torch");
  const std::string file = (dir.path / "check.safetensors").string();
  ck.write(file);

  const std::string script = std::string(TNT_SOURCE_DIR) + "/scripts/transformer_torch.py";
  const std::string cmd = fmt::format(
      "for p in ${{PYTHON:-}} python3 /usr/bin/python3; do "
      "if command -v \"$p\" >/dev/null && \"$p\" -c 'import torch' 2>/dev/null; then "
      "exec \"$p\" '{}' --check '{}'; fi; done; "
      "echo 'no Python with torch found (set PYTHON=, or apt install python3-torch)' >&2; exit 3",
      script, file);
  const int rc = std::system(cmd.c_str());
  INFO("command: " << cmd);
  REQUIRE(rc == 0);
}
