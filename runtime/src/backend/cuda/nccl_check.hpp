// TNT_NCCL_CHECK: reports file, line, the call, NCCL's error string and its last error
// message, and throws tnt::Error. ncclInProgress is not an error (nonblocking
// communicators return it while work is still being set up; the caller polls).
#pragma once

#include "tarantella/check.hpp"

#include <nccl.h>

namespace tnt::detail {
[[noreturn]] inline void throw_nccl_error(const char* file, int line, const char* call, ncclResult_t rc) {
  const char* last = ncclGetLastError(nullptr);
  throw_error(file, line,
              fmt::format("NCCL error in {}: {}{}{}", call, ncclGetErrorString(rc), last && *last ? ": " : "",
                          last ? last : ""));
}
}  // namespace tnt::detail

#define TNT_NCCL_CHECK(call)                                                              \
  do {                                                                                    \
    ncclResult_t tnt_nccl_rc_ = (call);                                                   \
    if (tnt_nccl_rc_ != ncclSuccess && tnt_nccl_rc_ != ncclInProgress)                    \
      ::tnt::detail::throw_nccl_error(__FILE__, __LINE__, #call, tnt_nccl_rc_);           \
  } while (0)
