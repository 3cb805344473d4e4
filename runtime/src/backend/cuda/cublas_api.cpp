#include "backend/cuda/cublas_api.hpp"

#include "tarantella/check.hpp"

#include <dlfcn.h>

#include <atomic>
#include <fstream>
#include <mutex>

#define TNT_STR2(x) #x
#define TNT_STR(x) TNT_STR2(x)

namespace tnt::cuda {

namespace {

std::atomic<const CublasApi*> g_api{nullptr};

template <typename F>
void resolve(void* lib, const char* name, const std::string& path, F& out) {
  dlerror();
  void* sym = dlsym(lib, name);
  if (sym == nullptr) {
    const char* why = dlerror();
    throw Error(fmt::format("cuBLAS ({}) has no function {}: {}; the runtime was built against cuBLAS {}.{}", path,
                            name, why ? why : "not found", CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR));
  }
  out = reinterpret_cast<F>(sym);
}

}  // namespace

CublasApi load_cublas(const std::string& soname, const std::string& fallback_dir) {
  CublasApi api;
  // RTLD_LOCAL: cuBLAS's symbols stay out of the global namespace.
  void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string path = soname, errors;
  if (lib == nullptr) {
    const char* e = dlerror();
    errors = e ? e : "not found";
    if (!fallback_dir.empty()) {
      const std::string built = fallback_dir + "/" + soname;
      lib = dlopen(built.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) {
        path = built;
      } else if (const char* e2 = dlerror()) {
        errors += fmt::format("; then {}", e2);
      }
    }
  }
  if (lib == nullptr) {
    throw Error(fmt::format(
        "cannot load cuBLAS ({}): {}; a CUDA device needs CUDA {}'s cuBLAS where the loader finds it (its folder in "
        "LD_LIBRARY_PATH, or registered with ldconfig)",
        soname, errors, CUBLAS_VER_MAJOR));
  }
  // Closed again when it is not the cuBLAS wanted (a function missing, another version).
  struct Closer {
    void* lib;
    ~Closer() {
      if (lib) dlclose(lib);
    }
  } closer{lib};
  api.path = path;
  resolve(lib, "cublasCreate_v2", path, api.create);
  resolve(lib, "cublasSetStream_v2", path, api.set_stream);
  resolve(lib, "cublasSetWorkspace_v2", path, api.set_workspace);
  resolve(lib, "cublasSetMathMode", path, api.set_math_mode);
  resolve(lib, "cublasGetStatusString", path, api.status_string);
  resolve(lib, "cublasGetProperty", path, api.get_property);
  resolve(lib, "cublasGemmEx", path, api.gemm_ex);
  resolve(lib, "cublasGemmStridedBatchedEx", path, api.gemm_strided_batched_ex);
  // Another major version has another soname; the fallback folder may still hold one.
  int major = 0;
  const cublasStatus_t st = api.get_property(MAJOR_VERSION, &major);
  if (st != CUBLAS_STATUS_SUCCESS) {
    throw Error(fmt::format("cuBLAS ({}) does not tell its version: {}", path, api.status_string(st)));
  }
  if (major != CUBLAS_VER_MAJOR) {
    throw Error(fmt::format("cuBLAS ({}) is version {}, the runtime was built against {}", path, major,
                            CUBLAS_VER_MAJOR));
  }
  closer.lib = nullptr;
  return api;  // the library stays open: handles and kernels live as long as the process
}

const char* cublas_soname() { return "libcublas.so." TNT_STR(CUBLAS_VER_MAJOR); }

const CublasApi& cublas_api() {
  if (const CublasApi* api = g_api.load(std::memory_order_acquire)) return *api;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (const CublasApi* api = g_api.load(std::memory_order_relaxed)) return *api;
#ifdef TNT_CUBLAS_DIR
  const std::string fallback_dir = TNT_CUBLAS_DIR;
#else
  const std::string fallback_dir;
#endif
  const CublasApi* api = new CublasApi(load_cublas(cublas_soname(), fallback_dir));
  g_api.store(api, std::memory_order_release);
  return *api;
}

bool cublas_loaded() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/libcublas.so") != std::string::npos || line.find("/libcublasLt.so") != std::string::npos) {
      return true;
    }
  }
  return false;
}

std::string cublas_status_text(cublasStatus_t status) {
  const CublasApi* api = g_api.load(std::memory_order_acquire);
  if (api == nullptr) return fmt::format("status {}", static_cast<int>(status));
  return api->status_string(status);
}

}  // namespace tnt::cuda
