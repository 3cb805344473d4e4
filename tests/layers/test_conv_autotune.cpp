// Host logic of the CUDA Conv2D's autotuning (layers/conv2d_autotune.hpp), testable without
// a GPU: the TNT_CUDNN_AUTOTUNE knob, the key of the process-wide cache of timed algorithm
// choices, channel padding's choice, and when a cuDNN graph candidate may be taken or run.
#include <catch2/catch.hpp>

#include "layers/conv2d_autotune.hpp"
#include "tarantella/config.hpp"

#include <cstdlib>
#include <limits>
#include <set>
#include <string>
#include <vector>

using tnt::conv_autotune::Direction;
using tnt::conv_autotune::Problem;

namespace {
// Sets one variable for the scope, restoring what was there.
struct ScopedEnv {
  std::string name, old;
  bool had = false;
  ScopedEnv(const char* n, const char* v) : name(n) {
    if (const char* o = std::getenv(n)) {
      had = true;
      old = o;
    }
    ::setenv(n, v, 1);
  }
  ~ScopedEnv() {
    if (had) {
      ::setenv(name.c_str(), old.c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
};
}  // namespace

TEST_CASE("TNT_CUDNN_AUTOTUNE: on by default, 0 takes the heuristics, shown in the configuration",
          "[layers][autotune]") {
  ::unsetenv("TNT_CUDNN_AUTOTUNE");
  CHECK(tnt::Config::from_env().cudnn_autotune);
  for (const char* off : {"0", "false", "off"}) {
    ScopedEnv e("TNT_CUDNN_AUTOTUNE", off);
    CHECK_FALSE(tnt::Config::from_env().cudnn_autotune);
  }
  ScopedEnv e("TNT_CUDNN_AUTOTUNE", "1");
  CHECK(tnt::Config::from_env().cudnn_autotune);
  CHECK(tnt::Config{}.table().find("TNT_CUDNN_AUTOTUNE") != std::string::npos);
}

TEST_CASE("TNT_CUDNN_AUTOTUNE: any other value is refused at start with a message naming it",
          "[layers][autotune]") {
  for (const char* bad : {"2", "maybe", " 1", "1 ", "01", "-1"}) {
    INFO("value '" << bad << "'");
    ScopedEnv e("TNT_CUDNN_AUTOTUNE", bad);
    try {
      (void)tnt::Config::from_env();
      FAIL("accepted");
    } catch (const tnt::InputError& err) {
      const std::string msg = err.what();
      INFO(msg);
      CHECK(msg.find(std::string("TNT_CUDNN_AUTOTUNE='") + bad + "' is not a boolean") != std::string::npos);
    }
  }
}

TEST_CASE("Autotune problems: equal problems share a key, any difference separates them", "[layers][autotune]") {
  Problem base;
  base.device = 0;
  base.n = 256;
  base.c = 64;
  base.h = 56;
  base.w = 56;
  base.filters = 64;
  base.kernel = 3;
  base.stride = 1;
  base.padding = 1;
  base.dtype = 1;
  base.format = 1;
  base.math = 0;
  base.deterministic = false;
  base.direction = Direction::forward;
  Problem same = base;
  CHECK(same.key() == base.key());
  CHECK(same.str() == base.str());

  // Each field changed alone gives a key of its own.
  std::vector<Problem> variants;
  auto vary = [&](auto change) {
    Problem p = base;
    change(p);
    variants.push_back(p);
  };
  vary([](Problem& p) { p.device = 1; });
  vary([](Problem& p) { p.n = 128; });
  vary([](Problem& p) { p.c = 128; });
  vary([](Problem& p) { p.h = 28; });
  vary([](Problem& p) { p.w = 28; });
  vary([](Problem& p) { p.filters = 256; });
  vary([](Problem& p) { p.kernel = 1; });
  vary([](Problem& p) { p.stride = 2; });
  vary([](Problem& p) { p.padding = 0; });
  vary([](Problem& p) { p.dtype = 3; });
  vary([](Problem& p) { p.format = 0; });
  vary([](Problem& p) { p.math = 1; });
  vary([](Problem& p) { p.deterministic = true; });
  vary([](Problem& p) { p.direction = Direction::backward_data; });
  vary([](Problem& p) { p.direction = Direction::backward_filter; });
  std::set<Problem::Key> keys{base.key()};
  for (const Problem& p : variants) {
    INFO(p.str());
    CHECK(p.key() != base.key());
    keys.insert(p.key());
  }
  CHECK(keys.size() == variants.size() + 1);  // all distinct
  // The description names the direction and the geometry (for the debug log).
  CHECK(base.str().find("forward") != std::string::npos);
  CHECK(variants.back().str().find("backward-filter") != std::string::npos);
  CHECK(base.str().find("(256, 64, 56, 56)") != std::string::npos);
}

TEST_CASE("TNT_CONV_PAD_CHANNELS: auto by default; 0, 4 and 8 taken; anything else refused naming it",
          "[layers][autotune]") {
  ::unsetenv("TNT_CONV_PAD_CHANNELS");
  CHECK(tnt::Config::from_env().conv_pad_channels == "auto");
  for (const char* ok : {"auto", "0", "4", "8"}) {
    ScopedEnv e("TNT_CONV_PAD_CHANNELS", ok);
    CHECK(tnt::Config::from_env().conv_pad_channels == ok);
  }
  for (const char* bad : {"3", "16", "on", "", " 4", "AUTO"}) {
    INFO("value '" << bad << "'");
    ScopedEnv e("TNT_CONV_PAD_CHANNELS", bad);
    try {
      (void)tnt::Config::from_env();
      FAIL("accepted");
    } catch (const tnt::InputError& err) {
      const std::string msg = err.what();
      INFO(msg);
      CHECK(msg.find(std::string("TNT_CONV_PAD_CHANNELS='") + bad + "' is not auto, 0, 4 or 8") != std::string::npos);
    }
  }
  CHECK(tnt::Config{}.table().find("TNT_CONV_PAD_CHANNELS") != std::string::npos);
}

TEST_CASE("Channel padding: which channel counts are tried", "[layers][autotune]") {
  using tnt::conv_autotune::pad_candidates;
  using V = std::vector<int64_t>;
  // Only channels_last inputs of 1-3 channels: images.
  CHECK(pad_candidates(3, "auto", true, true) == V{3, 4, 8});
  CHECK(pad_candidates(1, "auto", true, true) == V{1, 4, 8});
  CHECK(pad_candidates(4, "auto", true, true) == V{4});
  CHECK(pad_candidates(64, "auto", true, true) == V{64});
  CHECK(pad_candidates(3, "auto", true, false) == V{3});  // contiguous (NCHW): never
  // Autotuning off: nothing is timed, so auto keeps the input as it is.
  CHECK(pad_candidates(3, "auto", false, true) == V{3});
  // Forced, with or without autotuning; 0 never.
  CHECK(pad_candidates(3, "4", false, true) == V{4});
  CHECK(pad_candidates(2, "8", true, true) == V{8});
  CHECK(pad_candidates(3, "0", true, true) == V{3});
  CHECK(pad_candidates(5, "8", true, true) == V{5});  // 4 channels and more stay
}

TEST_CASE("Channel padding: the fastest count, a padded one only if 2% faster, none without timings",
          "[layers][autotune]") {
  using tnt::conv_autotune::choose_padding;
  CHECK(choose_padding({3, 4, 8}, {3.0, 1.0, 1.5}) == 4);
  CHECK(choose_padding({3, 4, 8}, {3.0, 1.5, 1.0}) == 8);
  CHECK(choose_padding({3, 4, 8}, {1.0, 2.0, 3.0}) == 3);
  // 1.5% faster is within the run-to-run spread: not worth a larger saved input.
  CHECK(choose_padding({3, 4, 8}, {1.0, 0.985, 2.0}) == 3);
  CHECK(choose_padding({3, 4, 8}, {1.0, 0.975, 2.0}) == 4);
  // Equal times: the first (lowest) count.
  CHECK(choose_padding({3, 4, 8}, {2.0, 1.0, 1.0}) == 4);
  // Any candidate not timed (the heuristics chose): no padding.
  CHECK(choose_padding({3, 4, 8}, {3.0, -1.0, 1.0}) == 3);
  CHECK(choose_padding({3, 4, 8}, {-1.0, 1.0, 1.0}) == 3);
  // One candidate (forced, or a padded one that could not run was dropped): itself.
  CHECK(choose_padding({4}, {-1.0}) == 4);
  CHECK(choose_padding({3, 8}, {2.0, 1.0}) == 8);
  CHECK_THROWS(choose_padding({3, 4}, {1.0}));
}

TEST_CASE("cuDNN graph check: agreement within 2^-5 of the largest value, only against a usable reference",
          "[layers][autotune]") {
  using tnt::conv_autotune::graph_output_agrees;
  using tnt::conv_autotune::kGraphTolerance;
  const float inf = std::numeric_limits<float>::infinity();
  // Rounding differences pass; a difference of the values' own size does not.
  CHECK(graph_output_agrees(0.0f, 4.0f));
  CHECK(graph_output_agrees(4.0f / 256, 4.0f));
  CHECK(graph_output_agrees(kGraphTolerance * 4.0f, 4.0f));
  CHECK_FALSE(graph_output_agrees(0.25f, 4.0f));
  // A graph output with a NaN or infinity (the check kernel gives +inf): refused.
  CHECK_FALSE(graph_output_agrees(inf, 4.0f));
  // A reference with a NaN or infinity (largest +inf) would let any difference pass; an
  // all-zero one is what a wrong layout gives too: neither decides, no graph is taken.
  CHECK_FALSE(graph_output_agrees(inf, inf));
  CHECK_FALSE(graph_output_agrees(1.0f, inf));
  CHECK_FALSE(graph_output_agrees(0.0f, 0.0f));
  CHECK_FALSE(tnt::conv_autotune::graph_reference_judges(inf));
  CHECK_FALSE(tnt::conv_autotune::graph_reference_judges(0.0f));
  CHECK(tnt::conv_autotune::graph_reference_judges(1e-30f));
}

TEST_CASE("cuDNN graph operands: 16-byte aligned or the algorithm runs", "[layers][autotune]") {
  using tnt::conv_autotune::graph_aligned;
  alignas(64) unsigned char block[128] = {};
  CHECK(graph_aligned({block, block + 16, block + 64}));
  CHECK(graph_aligned({block, nullptr}));  // no workspace
  // A view at a byte offset (slice_rows of a bf16 (N, 3, 5, 5) tensor: 150 bytes a row).
  CHECK_FALSE(graph_aligned({block, block + 8, block + 16}));
  CHECK_FALSE(graph_aligned({block + 2}));
}
