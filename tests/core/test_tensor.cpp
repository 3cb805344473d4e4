// Tensor core basics: shapes, views, fills, 16-bit conversions, configuration parsing.
#include <catch2/catch.hpp>

#include "core/half.hpp"
#include "tarantella/config.hpp"
#include "tarantella/tensor.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>

using namespace tnt;

TEST_CASE("shape, numel and str", "[tensor]") {
  Tensor t = Tensor::zeros({2, 3, 4});
  CHECK(t.numel() == 24);
  CHECK(t.ndim() == 3);
  CHECK(t.dim(-1) == 4);
  CHECK(t.nbytes() == 96);
  CHECK(t.str() == "f32(2, 3, 4) on cpu");
  CHECK(shape_str({5}) == "(5,)");
  CHECK_THROWS_WITH(t.dim(3), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(Tensor::empty({2, -1}), Catch::Contains("negative"));
  CHECK_FALSE(Tensor().defined());
  Tensor scalar = Tensor::full({}, 3.0);
  CHECK(scalar.numel() == 1);
  CHECK(Tensor::empty({0, 5}).numel() == 0);
}

TEST_CASE("reshape shares storage and infers -1", "[tensor]") {
  Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor r = t.reshape({3, -1});
  CHECK(r.shape() == Shape{3, 2});
  r.data<float>()[0] = 42;
  CHECK(t.data<float>()[0] == 42);
  CHECK_THROWS_WITH(t.reshape({4, -1}), Catch::Contains("do not match"));
  CHECK_THROWS_WITH(t.reshape({-1, -1}), Catch::Contains("more than one -1"));
  CHECK_THROWS_WITH(t.reshape({7}), Catch::Contains("element counts differ"));
}

TEST_CASE("slice_rows and view bounds", "[tensor]") {
  Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  Tensor s = t.slice_rows(1, 3);
  CHECK(s.shape() == Shape{2, 2});
  CHECK(s.to_vector() == std::vector<float>{2, 3, 4, 5});
  s.fill_(9);
  CHECK(t.to_vector() == std::vector<float>{0, 1, 9, 9, 9, 9, 6, 7});
  CHECK(t.slice_rows(4, 4).numel() == 0);
  CHECK_THROWS_WITH(t.slice_rows(3, 5), Catch::Contains("out of range"));
  CHECK_THROWS(t.slice_rows(2, 1));
  Tensor v = t.view({2}, DType::f32, 6 * sizeof(float));
  CHECK(v.to_vector() == std::vector<float>{6, 7});
  CHECK_THROWS_WITH(t.view({3}, DType::f32, 6 * sizeof(float)), Catch::Contains("exceeds"));
  // A view of a slice is bounded by the storage, counted from the slice's offset.
  CHECK_THROWS(s.view({8}, DType::f32, 0));
  CHECK_THROWS_WITH(t.data<int32_t>(), Catch::Contains("accessed as"));
}

TEST_CASE("fill, zero, clone, copy_from, to_vector of every dtype", "[tensor]") {
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    Tensor t = Tensor::full({3}, 2.0, d);
    CHECK(t.to_double_vector() == std::vector<double>{2, 2, 2});
    Tensor c = t.clone();
    t.zero_();
    CHECK(t.to_double_vector() == std::vector<double>{0, 0, 0});
    CHECK(c.to_double_vector() == std::vector<double>{2, 2, 2});
    t.copy_from(c);
    CHECK(t.to_double_vector() == std::vector<double>{2, 2, 2});
  }
  CHECK_THROWS_WITH(Tensor::zeros({3}).copy_from(Tensor::zeros({4})), Catch::Contains("copy_from"));
  CHECK_THROWS_WITH(Tensor::from_vector({1, 2}, {3}), Catch::Contains("2 values"));
}

TEST_CASE("bf16 and f16 conversions", "[tensor][half]") {
  // Exactly representable values round-trip.
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 1.0f / 1024, 384.0f}) {
    CHECK(f16_to_float(float_to_f16(f)) == f);
    CHECK(bf16_to_float(float_to_bf16(f)) == f);
  }
  CHECK(f16_to_float(float_to_f16(65504.0f)) == 65504.0f);  // f16's largest finite value
  // Known encodings.
  CHECK(float_to_f16(1.0f) == 0x3c00);
  CHECK(float_to_f16(-2.0f) == 0xc000);
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  // f16 subnormals: 2^-24 is the smallest.
  CHECK(f16_to_float(float_to_f16(std::ldexp(1.0f, -24))) == std::ldexp(1.0f, -24));
  CHECK(float_to_f16(std::ldexp(1.0f, -26)) == 0);  // below half the smallest: zero
  // Overflow, infinity and NaN.
  CHECK(std::isinf(f16_to_float(float_to_f16(70000.0f))));
  CHECK(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::infinity()))));
  CHECK(std::isnan(f16_to_float(float_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // Round to nearest even: 1 + 2^-11 lies halfway between two f16 values; it goes to 1.
  CHECK(f16_to_float(float_to_f16(1.0f + std::ldexp(1.0f, -11))) == 1.0f);
  CHECK(f16_to_float(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11))) == 1.0f + std::ldexp(1.0f, -9));
  CHECK(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8))) == 1.0f);
  // Relative error of the round trip is at most half an ulp: 2^-11 (f16), 2^-8 (bf16).
  for (float f = 0.001f; f < 60000.0f; f *= 1.37f) {
    CHECK(std::fabs(f16_to_float(float_to_f16(f)) - f) <= f * std::ldexp(1.0f, -11) + std::ldexp(1.0f, -25));
    CHECK(std::fabs(bf16_to_float(float_to_bf16(f)) - f) <= f * std::ldexp(1.0f, -8));
  }
  // Tensor fill/readback through 16-bit storage.
  CHECK(Tensor::full({2}, 0.5, DType::f16).to_vector() == std::vector<float>{0.5f, 0.5f});
}

namespace {
// Sets one variable for the scope of a test.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};
}  // namespace

TEST_CASE("Config::from_env reads and rejects values", "[config]") {
  {
    ScopedEnv a("TNT_FUSION_THRESHOLD", "64"), b("TNT_DETERMINISTIC", "1"), c("TNT_COLLECTIVE_TIMEOUT", "2.5");
    Config cfg = Config::from_env();
    CHECK(cfg.fusion_threshold_kb == 64);
    CHECK(cfg.deterministic);
    CHECK(cfg.collective_timeout_s == 2.5);
    CHECK(cfg.fused_attention);  // on since it measured 1.20x the Transformer-big step
  }
  {
    ScopedEnv a("TNT_FUSED_ATTENTION", "0");
    CHECK_FALSE(Config::from_env().fused_attention);
  }
  {
    // auto by default: each shape's first use checks cuDNN against the other engine and times both
    CHECK(Config::from_env().cudnn_attention.automatic());
    ScopedEnv a("TNT_CUDNN_ATTENTION", "1");
    CHECK(Config::from_env().cudnn_attention.on());
  }
  {
    ScopedEnv a("TNT_CUDNN_ATTENTION", "off");
    CHECK(Config::from_env().cudnn_attention.off());
  }
  {
    ScopedEnv a("TNT_CUDNN_ATTENTION", "auto");
    CHECK(Config::from_env().cudnn_attention.automatic());
  }
  {
    ScopedEnv a("TNT_CUDNN_ATTENTION", "");  // set but empty: the default, as scripts read it
    CHECK(Config::from_env().cudnn_attention.automatic());
  }
  {
    ScopedEnv a("TNT_CUDNN_ATTENTION", "flash");
    CHECK_THROWS_WITH(Config::from_env(),
                      Catch::Contains("TNT_CUDNN_ATTENTION='flash' is not auto or a boolean (1/true/yes/on or "
                                      "0/false/no/off)"));
  }
  {
    // auto by default: the output projection pads its vocabulary where a trial finds it faster
    CHECK(Config::from_env().gemm_pad.automatic());
    ScopedEnv a("TNT_GEMM_PAD", "0");
    CHECK(Config::from_env().gemm_pad.off());
  }
  {
    ScopedEnv a("TNT_GEMM_PAD", "yes");
    CHECK(Config::from_env().gemm_pad.on());
  }
  {
    ScopedEnv a("TNT_GEMM_PAD", "8");
    CHECK_THROWS_WITH(Config::from_env(), Catch::Contains("TNT_GEMM_PAD='8' is not auto or a boolean"));
  }
  {
    CHECK(Config::from_env().layer_fusion);
    ScopedEnv a("TNT_LAYER_FUSION", "0");
    CHECK_FALSE(Config::from_env().layer_fusion);
  }
  {
    // Set but empty: the default (on), as for the auto switches; before, empty meant off.
    ScopedEnv a("TNT_LAYER_FUSION", "");
    CHECK(Config::from_env().layer_fusion);
  }
  {
    // Python's and YAML's spellings too.
    for (const char* off : {"False", "NO", "Off"}) {
      ScopedEnv a("TNT_LAYER_FUSION", off);
      CHECK_FALSE(Config::from_env().layer_fusion);
    }
    ScopedEnv a("TNT_DETERMINISTIC", "True");
    CHECK(Config::from_env().deterministic);
  }
  {
    // Both asked for cannot be had: refused, not run non-deterministically.
    ScopedEnv a("TNT_DETERMINISTIC", "1");
    ScopedEnv b("TNT_CUDNN_ATTENTION", "1");
    CHECK_THROWS_WITH(Config::from_env(), Catch::Contains("TNT_CUDNN_ATTENTION=1 with TNT_DETERMINISTIC=1"));
  }
  {
    // Checked at the start, with or without a profile asked for.
    ScopedEnv a("TNT_PROFILE_SCALING_STEPS", "0");
    CHECK_THROWS_WITH(Config::from_env(), Catch::Contains("TNT_PROFILE_SCALING_STEPS=0 must be at least 1"));
  }
  {
    ScopedEnv a("TNT_NUM_THREADS", "20000");
    CHECK_THROWS_WITH(Config::from_env(), Catch::Contains("TNT_NUM_THREADS=20000 is more than 1024"));
  }
  {
    ScopedEnv a("TNT_NUM_THREADS", "1024");
    CHECK(Config::from_env().num_threads == 1024);
  }
  {
    ScopedEnv a("TNT_TIMELINE_STEPS", "10-1");  // no TNT_TIMELINE: still checked
    CHECK_THROWS_WITH(Config::from_env(), Catch::Contains("TNT_TIMELINE_STEPS='10-1'"));
  }
  {
    CHECK(Config::from_env().cuda_profile_steps.empty());
    ScopedEnv a("TNT_CUDA_PROFILE_STEPS", "20-22");
    CHECK(Config::from_env().cuda_profile_steps == "20-22");
  }
  {
    ScopedEnv a("TNT_CUDA_PROFILE_STEPS", "0-2");  // steps count from 1
    CHECK_THROWS_WITH(Config::from_env(), Catch::Contains("TNT_CUDA_PROFILE_STEPS='0-2'"));
  }
  {
    // Numbers: decimal, the whole text (strtod took ' 30' and 0x10 but refused '30 ').
    for (const char* bad : {" 30", "30 ", "0x10", "1,5"}) {
      ScopedEnv a("TNT_COLLECTIVE_TIMEOUT", bad);
      CHECK_THROWS_WITH(Config::from_env(), Catch::Contains("is not a non-negative number"));
    }
    ScopedEnv a("TNT_COLLECTIVE_TIMEOUT", "1.5e2");
    CHECK(Config::from_env().collective_timeout_s == 150.0);
  }
  {
    // A value is quoted at most 60 characters long (a variable may hold 100 KB).
    ScopedEnv a("TNT_LOG_LEVEL", std::string(100000, 'x').c_str());
    try {
      (void)Config::from_env();
      FAIL("no error");
    } catch (const InputError& e) {
      const std::string what = e.what();
      CHECK(what.size() < 300);
      CHECK_THAT(what, Catch::Contains("TNT_LOG_LEVEL='" + std::string(60, 'x') + "... (100000 bytes)'"));
    }
  }
  {
    ScopedEnv a("TNT_FUSED_ATTENTION", "fast");
    CHECK_THROWS_WITH(Config::from_env(), Catch::Contains("TNT_FUSED_ATTENTION='fast' is not a boolean"));
  }
  {
    ScopedEnv a("TNT_FUSION_THRESHOLD", "lots");
    CHECK_THROWS_AS(Config::from_env(), InputError);
    CHECK_THROWS_WITH(Config::from_env(), Catch::Contains("TNT_FUSION_THRESHOLD") && Catch::Contains("lots"));
  }
  {
    ScopedEnv a("TNT_FUSION_THRESHOLD", "-3");
    CHECK_THROWS_AS(Config::from_env(), InputError);
  }
  {
    // Horovod's bytes (HOROVOD_FUSION_THRESHOLD=67108864, 64 MB) read as KB would be 64 GiB.
    ScopedEnv a("TNT_FUSION_THRESHOLD", "67108864");
    CHECK_THROWS_WITH(Config::from_env(),
                      "TNT_FUSION_THRESHOLD='67108864': at most 16777216 KB (16 GiB); the value is in KB, not bytes "
                      "as Horovod's HOROVOD_FUSION_THRESHOLD (64 MB is TNT_FUSION_THRESHOLD=65536)");
  }
  {
    ScopedEnv a("TNT_FUSION_THRESHOLD", "16777216");
    CHECK(Config::from_env().fusion_threshold_kb == 16777216);
  }
  {
    // auto starts at the default and says so in the resolved table (docs/scaling.md).
    ScopedEnv a("TNT_FUSION_THRESHOLD", "auto");
    const Config cfg = Config::from_env();
    CHECK(cfg.fusion_threshold_kb.automatic);
    CHECK(cfg.fusion_threshold_kb == 32);
    CHECK_THAT(cfg.table(), Catch::Contains("TNT_FUSION_THRESHOLD") && Catch::Contains("auto"));
    CHECK_FALSE(Config{}.fusion_threshold_kb.automatic);
  }
  {
    ScopedEnv a("TNT_FUSION_THRESHOLD", "Auto");
    CHECK_THROWS_WITH(Config::from_env(), Catch::Contains("TNT_FUSION_THRESHOLD='Auto'") && Catch::Contains("or auto"));
  }
  {
    ScopedEnv a("TNT_DETERMINISTIC", "maybe");
    CHECK_THROWS_WITH(Config::from_env(), Catch::Contains("TNT_DETERMINISTIC") && Catch::Contains("maybe"));
  }
  {
    ScopedEnv a("TNT_LOG_LEVEL", "LOUD");
    CHECK_THROWS_WITH(Config::from_env(), Catch::Contains("LOUD"));
  }
  {
    ScopedEnv a("TNT_ALLREDUCE_ALGO", "tree");
    CHECK_THROWS_WITH(Config::from_env(), Catch::Contains("tree"));
  }
  {
    ScopedEnv a("TNT_RING_SEGMENT", "0");
    CHECK_THROWS_AS(Config::from_env(), InputError);
  }
  {
    ScopedEnv a("TNT_COLLECTIVE_TIMEOUT", "soon");
    CHECK_THROWS_AS(Config::from_env(), InputError);
  }
  {
    // Query rows per warp of the fused attention forward: 16 (the default) or 32 only.
    CHECK(Config{}.fused_attention_rows == 16);
    ScopedEnv a("TNT_FUSED_ATTENTION_ROWS", "32");
    CHECK(Config::from_env().fused_attention_rows == 32);
  }
  for (const char* bad : {"17", "0", "64", "rows"}) {
    ScopedEnv a("TNT_FUSED_ATTENTION_ROWS", bad);
    CHECK_THROWS_WITH(Config::from_env(), Catch::Contains("TNT_FUSED_ATTENTION_ROWS") && Catch::Contains(bad));
    CHECK_THROWS_AS(Config::from_env(), InputError);
  }
  CHECK(parse_log_level("info") == LogLevel::info);
  // Typos of knobs are named with the knob meant; the launcher's and scripts' own variables
  // and names far from any knob are not.
  const std::vector<std::string> typos =
      Config::misspelled({"TNT_FUSIO_THRESHOLD", "TNT_NUM_THREAD", "TNT_FUSION_THRESHOLD", "TNT_RANK", "TNT_ALPHA",
                          "PATH", "TNT_DETERMINSTIC", "TNT_GPU_KIT", "TNT_SEED"});
  REQUIRE(typos.size() == 4);
  CHECK(typos[0] == "TNT_FUSIO_THRESHOLD is not a tarantella variable (ignored); did you mean TNT_FUSION_THRESHOLD?");
  CHECK(typos[1] == "TNT_NUM_THREAD is not a tarantella variable (ignored); did you mean TNT_NUM_THREADS?");
  CHECK(typos[2] == "TNT_DETERMINSTIC is not a tarantella variable (ignored); did you mean TNT_DETERMINISTIC?");
  // A seed variable is what a user of other tools may set: it is named as not read.
  CHECK(typos[3] == "TNT_SEED is not read (ignored): the seed is the programs' --seed, or tnt::Model(network, seed) "
                    "in a program of your own");
  CHECK(Config{}.table().find("TNT_FUSION_THRESHOLD") != std::string::npos);
}

// The one table of names (tarantella/config_table.hpp): knobs and the launcher's variables
// are spelled there once; Config::is_set answers for knobs only.
TEST_CASE("the configuration table names every variable once; is_set knows knobs only", "[config]") {
  using namespace tnt;
  CHECK(std::string(env::timeline_steps) == "TNT_TIMELINE_STEPS");
  CHECK(std::string(env::join_fd) == "TNT_JOIN_FD");
  const char* old = std::getenv(env::timeline_steps);
  const std::string saved = old ? old : "";
  ::unsetenv(env::timeline_steps);
  CHECK_FALSE(Config::is_set(env::timeline_steps));
  ::setenv(env::timeline_steps, "2-3", 1);
  CHECK(Config::is_set(env::timeline_steps));
  if (old) ::setenv(env::timeline_steps, saved.c_str(), 1); else ::unsetenv(env::timeline_steps);
  CHECK_THROWS_WITH(Config::is_set(env::join_fd), Catch::Contains("TNT_JOIN_FD is not a knob"));
  // A launcher variable is no typo of a knob.
  CHECK(Config::misspelled({env::stdout_is_tty, env::run_id}).empty());
}
