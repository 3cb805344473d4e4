// What a CPU test needs to plan cuDNN graphs for the GPU they will run on, without it
// ("deviceless" planning, cuDNN 9.8 and later): that GPU's properties as cuDNN's JSON, and
// a libcuda.so.1 for cuDNN's runtime-compiled engines to load before they generate code.
// Header-only: included by each test that plans deviceless (label layers, CUDA builds).
#pragma once

#include <catch2/catch.hpp>
#include <dlfcn.h>

namespace tnt::test {

// An H200 (sm_90, 132 SMs, 227 KB of shared memory a block) as cuDNN's device-properties
// JSON: the values a cudaDeviceGetAttribute on the lent H200 gives (public specifications:
// compute capability 9.0, 132 SMs, 50 MB L2, 141 GB), driver CUDA 13.0 as on the lease.
inline constexpr const char* kH200 = R"({"maxGridSize": [2147483647, 65535, 65535], "maxBlockSize": [1024, 1024, 64],
 "regsPerBlock": 65536, "multiProcessorCount": 132, "warpSize": 32, "maxSharedMemoryPerBlock": 49152,
 "maxSharedMemoryPerBlockOptin": 232448, "reservedSharedMemoryPerBlock": 1024, "maxRegistersPerSM": 65536,
 "maxCtasPerSM": 32, "maxThreadsPerBlock": 1024, "maxThreadsPerSM": 2048, "pciDeviceId": 9013, "isTccDriver": 0,
 "supportCoopLaunch": 1, "totalGlobalMem": 150754820096, "smClockRateKHz": 1980000, "memClockRateKHz": 3201000,
 "l2CacheSize": 52428800, "deviceName": "NVIDIA H200", "cudaDeviceId": 0, "deviceVer": 900, "driverVer": 13000})";

// cuDNN's runtime-compiled engines need libcuda.so.1 to load before they generate code; on
// a machine without a CUDA driver the toolkit's stub library (same soname) stands in, and
// cuDNN then compiles the kernels and stops where it would load them (Plan::compiled_only).
// The test target passes the stub's path as TNT_LIBCUDA_STUB (tests/layers/CMakeLists.txt).
inline void load_libcuda_or_stub() {
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) != nullptr) return;
#ifdef TNT_LIBCUDA_STUB
  INFO("no libcuda.so.1 here; the toolkit's stub " << TNT_LIBCUDA_STUB << " does not load either: " << dlerror());
  REQUIRE(dlopen(TNT_LIBCUDA_STUB, RTLD_NOW | RTLD_GLOBAL) != nullptr);
#endif
}

}  // namespace tnt::test
