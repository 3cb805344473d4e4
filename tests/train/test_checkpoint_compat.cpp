// Checkpoints of older releases: before BatchNorm kept PyTorch's num_batches_tracked, its
// checkpoints had running_mean and running_var only. They must still load (weights, buffers
// and training position), the counters keeping their values; any other missing tensor is
// still an error naming it.
#include <catch2/catch.hpp>

#include "small_nets.hpp"
#include "temp_dir.hpp"
#include "tarantella/tarantella.hpp"

#include <limits>
#include <memory>
#include <string>

namespace {

std::shared_ptr<tnt::Sequential> bn_net() {
  return tnt::test::small_cnn("compat", false, std::make_shared<tnt::BatchNorm>("bn1"));
}

tnt::Dataset images() {
  std::vector<float> x(16 * 64);
  std::vector<int32_t> y(16);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 11) / 11.0f;
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int32_t>(i % 3);
  return tnt::Dataset::from_tensors({tnt::Tensor::from_vector(x, {16, 1, 8, 8}), tnt::Tensor::from_data(y.data(), {16})});
}

// bn_net trained for one epoch with `sgd` (whose momentum, if any, is optimizer state), its
// checkpoint written to `path` on every rank.
std::unique_ptr<tnt::Model> trained_and_saved(const std::string& path, tnt::SgdOptions sgd = {}) {
  auto model = std::make_unique<tnt::Model>(bn_net(), 3);
  model->compile(std::make_shared<tnt::SGD>(0.1, sgd), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fo;
  fo.batch_size = 8;
  fo.epochs = 1;
  fo.verbose = 0;
  model->fit(images(), fo);
  model->save_checkpoint(path, 1);
  tnt::communicator().barrier();
  return model;
}

}  // namespace

TEST_CASE("a checkpoint without BatchNorm's num_batches_tracked loads; other missing tensors do not") {
  tnt::test::TempDir dir("tnt-ckpt-compat");
  const std::string now = (dir.path / "now.safetensors").string(), old = (dir.path / "old.safetensors").string();
  const std::unique_ptr<tnt::Model> model = trained_and_saved(now);
  tnt::Model& trained = *model;

  // The same file as an older release wrote it.
  tnt::Checkpoint full = tnt::Checkpoint::read(now);
  REQUIRE(full.tensors().size() > 1);
  tnt::Checkpoint older;
  bool dropped = false;
  for (const auto& [name, t] : full.tensors()) {
    if (name == "bn1.num_batches_tracked") {
      CHECK(t.data<int64_t>()[0] == 2);  // two training batches of 8 in the epoch
      dropped = true;
      continue;
    }
    older.add(name, t);
  }
  REQUIRE(dropped);
  for (const auto& [k, v] : full.metadata()) older.set_metadata(k, v);
  if (tnt::is_master_rank()) older.write(old);
  tnt::communicator().barrier();

  tnt::Model resumed(bn_net(), 4);
  resumed.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  CHECK(resumed.load_checkpoint(old) == 1);
  auto a = trained.network().named_parameters(), b = resumed.network().named_parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].param->value.to_vector() == b[i].param->value.to_vector());
  auto find = [](tnt::Network& n, const std::string& name) {
    for (auto& p : n.named_buffers())
      if (p.name == name) return p.param;
    FAIL("no buffer " << name);
    return static_cast<tnt::Parameter*>(nullptr);
  };
  CHECK(find(resumed.network(), "bn1.running_mean")->value.to_vector() ==
        find(trained.network(), "bn1.running_mean")->value.to_vector());
  CHECK(find(resumed.network(), "bn1.num_batches_tracked")->value.data<int64_t>()[0] == 0);  // kept its value

  // Any other tensor missing is still an error that names it.
  tnt::Checkpoint broken;
  for (const auto& [name, t] : full.tensors())
    if (name != "bn1.running_var") broken.add(name, t);
  for (const auto& [k, v] : full.metadata()) broken.set_metadata(k, v);
  const std::string bad = (dir.path / "broken.safetensors").string();
  if (tnt::is_master_rank()) broken.write(bad);
  tnt::communicator().barrier();
  CHECK_THROWS_WITH(resumed.load_checkpoint(bad), Catch::Contains("bn1.running_var"));
}

// A checkpoint holding a NaN or an infinity (a damaged file: the savers never write one) is
// refused when it loads, naming file and tensor, instead of training on and failing at the
// next save. Weights and optimizer state alike; every rank reads the file and throws alike.
TEST_CASE("a checkpoint holding a NaN or an infinity does not load") {
  tnt::test::TempDir dir("tnt-ckpt-nan");
  const std::string good = (dir.path / "good.safetensors").string();
  tnt::SgdOptions momentum;
  momentum.momentum = 0.9;  // optimizer state to spoil
  trained_and_saved(good, momentum);
  tnt::Checkpoint full = tnt::Checkpoint::read(good);

  // The first parameter, then the first optimizer state tensor, with one value spoiled.
  std::string weight, state;
  for (const auto& [name, t] : full.tensors()) {
    if (t.dtype() != tnt::DType::f32) continue;
    if (weight.empty() && name.rfind("optimizer.", 0) != 0) weight = name;
    if (state.empty() && name.rfind("optimizer.", 0) == 0) state = name;
  }
  REQUIRE(!weight.empty());
  REQUIRE(!state.empty());
  for (const std::string& spoiled : {weight, state}) {
    INFO("spoiled: " << spoiled);
    tnt::Checkpoint bad_ck;
    for (const auto& [name, t] : full.tensors()) {
      tnt::Tensor copy = t.clone();
      if (name == spoiled) copy.data<float>()[copy.numel() / 2] = std::numeric_limits<float>::quiet_NaN();
      bad_ck.add(name, copy);
    }
    for (const auto& [k, v] : full.metadata()) bad_ck.set_metadata(k, v);
    const std::string bad = (dir.path / "bad.safetensors").string();
    if (tnt::is_master_rank()) bad_ck.write(bad);
    tnt::communicator().barrier();

    tnt::Model resumed(bn_net(), 4);
    resumed.compile(std::make_shared<tnt::SGD>(0.1, momentum), std::make_shared<tnt::SoftmaxCrossEntropy>());
    try {
      resumed.load_checkpoint(bad);
      FAIL("load_checkpoint accepted a NaN");
    } catch (const tnt::InputError& e) {
      CHECK_THAT(e.what(), Catch::Contains(bad) && Catch::Contains("'" + spoiled + "'") &&
                               Catch::Contains("NaN or an infinity"));
    }
    // load_weights skips the optimizer state: a spoiled state does not stop it.
    if (spoiled == weight) {
      CHECK_THROWS_AS(resumed.load_weights(bad), tnt::InputError);
    } else {
      resumed.load_weights(bad);
    }
    tnt::communicator().barrier();
  }
}

// The training position in a checkpoint's metadata is a count: a damaged or hand-edited file
// whose step, optimizer step or epoch is negative or beyond any real run is refused when it
// loads as an input error naming the file and the key (the programs then exit 2, and the
// launcher does not restart a job that would read the same file again), not an internal
// check deep in the optimizer, nor a run that counts on from step -1.
TEST_CASE("checkpoint metadata out of range is an input error naming the file") {
  tnt::test::TempDir dir("tnt-ckpt-position");
  const std::string good = (dir.path / "good.safetensors").string();
  trained_and_saved(good);
  const tnt::Checkpoint full = tnt::Checkpoint::read(good);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"step", "-1"},           {"step", "9223372036854775807"}, {"optimizer_step", "-1"},
      {"optimizer_step", "99999999999999999"}, {"epoch", "-3"},   {"epoch", "2147483647"},
      {"epoch", "1000000001"}, {"tnt_checkpoint_version", "0"}};
  for (const auto& [key, value] : cases) {
    INFO(key << "=" << value);
    tnt::Checkpoint bad_ck;
    for (const auto& [name, t] : full.tensors()) bad_ck.add(name, t);
    for (const auto& [k, v] : full.metadata()) bad_ck.set_metadata(k, v);
    bad_ck.set_metadata(key, value);
    const std::string bad = (dir.path / "bad.safetensors").string();
    if (tnt::is_master_rank()) bad_ck.write(bad);
    tnt::communicator().barrier();
    tnt::Model resumed(bn_net(), 4);
    resumed.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
    try {
      resumed.load_checkpoint(bad);
      FAIL("loaded");
    } catch (const tnt::InputError& e) {
      const std::string what = e.what();
      CHECK_THAT(what, Catch::Contains(bad) && Catch::Contains(key + "=" + value));
    } catch (const std::exception& e) {
      FAIL("not an input error: " << e.what());
    }
    tnt::communicator().barrier();
  }
}

// The format version: a file of a later version is refused by name before anything loads
// (its keys may mean something else); a file without one (written before versions) loads.
TEST_CASE("a checkpoint of a later format version is refused; one without a version loads") {
  tnt::test::TempDir dir("tnt-ckpt-version");
  const std::string good = (dir.path / "good.safetensors").string();
  trained_and_saved(good);
  const tnt::Checkpoint full = tnt::Checkpoint::read(good);
  REQUIRE(full.metadata("tnt_checkpoint_version") == std::to_string(tnt::kCheckpointVersion));
  auto rewritten = [&](const std::string& name, const char* version) {
    tnt::Checkpoint ck;
    for (const auto& [n, t] : full.tensors()) ck.add(n, t);
    for (const auto& [k, v] : full.metadata()) {
      if (k != "tnt_checkpoint_version") ck.set_metadata(k, v);
    }
    if (version != nullptr) ck.set_metadata("tnt_checkpoint_version", version);
    const std::string path = (dir.path / name).string();
    if (tnt::is_master_rank()) ck.write(path);
    tnt::communicator().barrier();
    return path;
  };
  const std::string newer = rewritten("newer.safetensors", "2");
  tnt::Model resumed(bn_net(), 4);
  resumed.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  CHECK_THROWS_MATCHES(resumed.load_checkpoint(newer), tnt::InputError,
                       Catch::Matchers::Predicate<tnt::InputError>([&](const tnt::InputError& e) {
                         const std::string w = e.what();
                         return w.find(newer) != std::string::npos && w.find("newer Tarantella") != std::string::npos &&
                                w.find("format 2; this one reads up to 1") != std::string::npos;
                       }));
  CHECK(resumed.global_step() == 0);  // nothing was taken from it
  const std::string older = rewritten("older.safetensors", nullptr);
  CHECK(resumed.load_checkpoint(older) == 1);
  tnt::communicator().barrier();
}

TEST_CASE("a weights-only file given to load_checkpoint says what it is and what loads it") {
  tnt::test::TempDir dir("tnt-ckpt-weights-only");
  const std::string weights = (dir.path / "model.safetensors").string();
  tnt::Model model(bn_net(), 4);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  model.save_weights(weights);
  tnt::communicator().barrier();
  // Before: "checkpoint '...' has no metadata 'epoch'".
  CHECK_THROWS_WITH(model.load_checkpoint(weights),
                    Catch::Contains(weights) && Catch::Contains("a weights file (save_weights)") &&
                        Catch::Contains("load_weights or load_model"));
  CHECK_NOTHROW(model.load_weights(weights));
  tnt::communicator().barrier();
}

TEST_CASE("optimizer state no optimizer writes is an input error naming the file and the tensor") {
  // Before, a negative Adam step or mean of squares loaded, trained a whole epoch into NaN,
  // and the divergence check then blamed the input data.
  tnt::test::TempDir dir("tnt-ckpt-state");
  const std::string good = (dir.path / "good.safetensors").string();
  {
    tnt::Model model(bn_net(), 3);
    model.compile(std::make_shared<tnt::Adam>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
    tnt::FitOptions fo;
    fo.batch_size = 8;
    fo.verbose = 0;
    model.fit(images(), fo);
    model.save_checkpoint(good, 1);
    tnt::communicator().barrier();
  }
  const tnt::Checkpoint full = tnt::Checkpoint::read(good);
  for (const std::string suffix : {".step", ".exp_avg_sq"}) {
    INFO(suffix);
    tnt::Checkpoint bad_ck;
    std::string damaged;
    for (const auto& [name, t] : full.tensors()) {
      tnt::Tensor copy = t.clone();
      if (damaged.empty() && name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        damaged = name;
        if (copy.dtype() == tnt::DType::i64) copy.data<int64_t>()[0] = -5;
        else copy.data<float>()[0] = -1.0f;
      }
      bad_ck.add(name, copy);
    }
    REQUIRE_FALSE(damaged.empty());
    for (const auto& [k, v] : full.metadata()) bad_ck.set_metadata(k, v);
    const std::string bad = (dir.path / "bad.safetensors").string();
    if (tnt::is_master_rank()) bad_ck.write(bad);
    tnt::communicator().barrier();
    tnt::Model resumed(bn_net(), 4);
    resumed.compile(std::make_shared<tnt::Adam>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
    CHECK_THROWS_MATCHES(resumed.load_checkpoint(bad), tnt::InputError,
                         Catch::Matchers::Predicate<tnt::InputError>([&](const tnt::InputError& e) {
                           const std::string w = e.what();
                           return w.find("checkpoint '" + bad + "': optimizer state '") != std::string::npos &&
                                  w.find("which Adam never writes") != std::string::npos &&
                                  w.find("the file is damaged") != std::string::npos;
                         }));
    tnt::communicator().barrier();
  }
  // The good file loads.
  tnt::Model resumed(bn_net(), 4);
  resumed.compile(std::make_shared<tnt::Adam>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
  CHECK(resumed.load_checkpoint(good) == 1);
}

TEST_CASE("set_checkpoint_metadata: the program's own keys go into every checkpoint; the checkpoint's own are refused") {
  tnt::test::TempDir dir("tnt-ckpt-own-metadata");
  const std::string path = (dir.path / "checkpoint.safetensors").string();
  tnt::Model model(bn_net(), 4);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  model.set_checkpoint_metadata("flags", R"({"model":"cnn"})");
  model.set_checkpoint_metadata("note", "first");
  model.set_checkpoint_metadata("note", "");  // removed again
  // A key the checkpoint writes itself would be overwritten, or would overwrite the
  // training position: refused, naming it.
  for (const char* own : {"epoch", "step", "seed", "precision", "epoch_batch", "format", "tnt_checkpoint_version"}) {
    CHECK_THROWS_AS(model.set_checkpoint_metadata(own, "1"), tnt::InputError);
    CHECK_THROWS_WITH(model.set_checkpoint_metadata(own, "1"), Catch::Contains(std::string("'") + own + "'"));
  }
  CHECK_THROWS_AS(model.set_checkpoint_metadata("", "1"), tnt::InputError);
  model.save_checkpoint(path, 2);
  tnt::communicator().barrier();
  const tnt::SafetensorsFile file = tnt::read_safetensors(path);
  REQUIRE(file.metadata.count("flags") == 1);
  CHECK(file.metadata.at("flags") == R"({"model":"cnn"})");
  CHECK(file.metadata.count("note") == 0);
  CHECK(file.metadata.at("epoch") == "2");
  CHECK(file.metadata.at("tnt_checkpoint_version") == std::to_string(tnt::kCheckpointVersion));
  // Weights alone (save_weights) are no training run: they carry none of it.
  const std::string weights = (dir.path / "model.safetensors").string();
  model.save_weights(weights);
  tnt::communicator().barrier();
  CHECK(tnt::read_safetensors(weights).metadata.count("flags") == 0);
}
