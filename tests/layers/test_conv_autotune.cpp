// Host logic of the CUDA Conv2D's autotuning (layers/conv2d_autotune.hpp), testable without
// a GPU: the TNT_CUDNN_AUTOTUNE knob and the key of the process-wide cache of timed
// algorithm choices.
#include <catch2/catch.hpp>

#include "layers/conv2d_autotune.hpp"
#include "tarantella/config.hpp"

#include <cstdlib>
#include <set>
#include <string>

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
