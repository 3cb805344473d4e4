#include "backend/dispatch.hpp"

#include "tarantella/check.hpp"

namespace tnt::detail {

void no_cuda_engine(const char* what) {
  throw Error(fmt::format("{}: the input is on a CUDA device, but this libtarantella was built without CUDA "
                          "(configure with -DTNT_CUDA=ON on a machine with the CUDA toolkit, cuDNN and NCCL)",
                          what));
}

}  // namespace tnt::detail
