// CPU-only builds (the _stub.cpp rule in runtime/CMakeLists.txt): the NCCL side of comm/
// exists so that the rest links unchanged, and every use of it fails with a clear message.
// CUDA builds compile device_collectives_cuda.cpp and transport_nccl_cuda.cpp instead.
#include "comm/waiter.hpp"
#include "comm/device_collectives.hpp"
#include "comm/transport.hpp"
#include "tarantella/check.hpp"

namespace tnt {

namespace detail {

void NcclDeleter::operator()(backend::NcclComm*) const {}  // never created without CUDA

backend::NcclComm& ensure_nccl(Waiter& w) {
  throw Error(fmt::format("{}: device buffers need a libtarantella built with CUDA and NCCL; this one is CPU-only",
                          w.op()));
}

}  // namespace detail

namespace comm {

void device_allreduce(detail::Waiter& w, void*, int64_t, DType, Device, bool) { detail::ensure_nccl(w); }
void device_broadcast(detail::Waiter& w, void*, int64_t, Device, int) { detail::ensure_nccl(w); }
void device_allgather(detail::Waiter& w, const void*, void*, int64_t, Device) { detail::ensure_nccl(w); }

std::unique_ptr<Transport> make_nccl_transport(const TransportSetup&) {
  TNT_THROW("Reducer: device gradients need a libtarantella built with CUDA; this one is CPU-only");
}

}  // namespace comm

}  // namespace tnt
