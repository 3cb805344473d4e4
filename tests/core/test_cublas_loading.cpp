// cuBLAS is opened at its first use on a GPU, never by a CPU run (backend/cuda/cublas_api):
// linked, it cost every process about 95 MB of private memory. Checked without a GPU.
#include <catch2/catch.hpp>

#include "backend/cuda/cublas_api.hpp"
#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"

#include <cuda_runtime_api.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const tnt::Error& e) {
    return e.what();
  }
  FAIL("no error thrown");
  return "";
}

}  // namespace

TEST_CASE("a CPU run does not load cuBLAS; the first use loads it once", "[cublas]") {
  // Training on the CPU: products, the optimizer, a checkpoint-free fit.
  tnt::Model model(tnt::test::small_mlp(), 3);
  model.compile(std::make_shared<tnt::Adam>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.epochs = 1;
  fit.verbose = 0;
  model.fit(tnt::test::threshold_data("cublas"), fit);
  CHECK_FALSE(tnt::cuda::cublas_loaded());
  // A status before loading is told by its number.
  CHECK(tnt::cuda::cublas_status_text(CUBLAS_STATUS_NOT_INITIALIZED) == "status 1");

  const tnt::cuda::CublasApi& api = tnt::cuda::cublas_api();
  CHECK(tnt::cuda::cublas_loaded());
  CHECK(&api == &tnt::cuda::cublas_api());  // once
  CHECK(std::string(tnt::cuda::cublas_soname()) == "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR));
  int major = -1, minor = -1;
  REQUIRE(api.get_property(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(api.get_property(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS);
  CHECK(major == CUBLAS_VER_MAJOR);
  INFO("cuBLAS " << major << "." << minor << " from " << api.path);
  CHECK(tnt::cuda::cublas_status_text(CUBLAS_STATUS_NOT_INITIALIZED) == "the library was not initialized");
  // Every function is there, and callable: without a GPU a handle is refused, with one it
  // is made (and then left: the runtime keeps its handles for the process's life too).
  int devices = 0;
  const bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  cublasHandle_t handle = nullptr;
  const cublasStatus_t made = api.create(&handle);
  CHECK((gpu ? made == CUBLAS_STATUS_SUCCESS : made != CUBLAS_STATUS_SUCCESS));
  CHECK(api.set_stream != nullptr);
  CHECK(api.set_workspace != nullptr);
  CHECK(api.set_math_mode != nullptr);
  CHECK(api.gemm_ex != nullptr);
  CHECK(api.gemm_strided_batched_ex != nullptr);
}

TEST_CASE("a cuBLAS that cannot be loaded, or is not cuBLAS, is named", "[cublas]") {
  const std::string missing = error_of([] { tnt::cuda::load_cublas("libcublas.so.999", "/nonexistent-tnt-dir"); });
  CHECK_THAT(missing, Catch::Contains("cannot load cuBLAS (libcublas.so.999)") &&
                          Catch::Contains("LD_LIBRARY_PATH"));
  // The fallback folder (the build's) is tried when the name is not found: a link there,
  // under a name no search path has, to the library this process loaded.
  tnt::cuda::cublas_api();
  std::string real;
  {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (real.empty() && std::getline(maps, line)) {
      const auto at = line.find('/');
      if (line.find("/libcublas.so") != std::string::npos && at != std::string::npos) real = line.substr(at);
    }
  }
  REQUIRE_FALSE(real.empty());
  char tmpl[] = "/tmp/tnt_cublas_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::filesystem::path dir = tmpl;
  std::filesystem::create_symlink(real, dir / "libtnt-test-blas.so");
  const tnt::cuda::CublasApi linked = tnt::cuda::load_cublas("libtnt-test-blas.so", dir.string());
  CHECK(linked.path == (dir / "libtnt-test-blas.so").string());
  CHECK(linked.gemm_strided_batched_ex != nullptr);
  std::filesystem::remove_all(dir);
  // A library that is no cuBLAS: the first missing function is named.
  const std::string other =
      error_of([] { tnt::cuda::load_cublas("libcudart.so." + std::to_string(CUDART_VERSION / 1000), ""); });
  CHECK_THAT(other, Catch::Contains("has no function cublasCreate_v2") &&
                        Catch::Contains("built against cuBLAS " + std::to_string(CUBLAS_VER_MAJOR)));
}
