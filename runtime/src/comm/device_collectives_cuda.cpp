// CUDA builds only (the _cuda.cpp rule in runtime/CMakeLists.txt).
#include "comm/device_collectives.hpp"

#include "backend/cuda/nccl_comm.hpp"
#include "core/device_api.hpp"
#include "tarantella/check.hpp"

namespace tnt {

namespace detail {

void NcclDeleter::operator()(backend::NcclComm* nccl) const { delete nccl; }

backend::NcclComm& ensure_nccl(Waiter& w) {
  CommImpl& c = w.comm();
  if (!c.nccl) {
    TNT_CHECK(c.device.is_cuda(), "{}: a device buffer, but this rank's device is {} (set TNT_DEVICE)", w.op(),
              c.device.str());
    char id[backend::NcclComm::kIdBytes] = {0};
    if (c.rank == 0) backend::NcclComm::make_unique_id(id);
    MPI_Request req = MPI_REQUEST_NULL;
    w.check(MPI_Ibcast(id, sizeof(id), MPI_BYTE, 0, c.comm, &req), "MPI_Ibcast");
    w.wait(req, 0, "(NCCL unique id from rank 0)");
    const auto close_timeout = c.deadline() - Clock::now();  // the collective timeout, capped like every deadline
    c.nccl.reset(new backend::NcclComm(id, c.rank, c.size, c.device.index, w.op(), comm::nccl_watch(w), close_timeout));
  }
  return *c.nccl;
}

}  // namespace detail

namespace comm {

backend::NcclComm::Watch nccl_watch(detail::Waiter& w) {
  return {w.deadline(), [&w](backend::NcclComm::Clock::time_point now) { w.poll(now); }};
}

namespace {

// What every device collective shares around its one NCCL call.
template <typename Enqueue>
void on_nccl(detail::Waiter& w, Device device, Enqueue enqueue) {
  detail::CommImpl& c = w.comm();
  TNT_CHECK(device == c.device, "{}: the buffer is on {} but this rank's device is {}", w.op(), device.str(),
            c.device.str());
  backend::NcclComm& nccl = detail::ensure_nccl(w);
  // The compute stream, not the legacy default stream: ordering must not depend on how
  // the compute stream was created.
  nccl.wait_stream(backend::cuda_compute_stream(device.index));
  enqueue(nccl);
  nccl.synchronize(nullptr, w.op(), nccl_watch(w));
}

}  // namespace

void device_allreduce(detail::Waiter& w, void* data, int64_t count, DType dtype, Device device, bool average) {
  on_nccl(w, device, [&](backend::NcclComm& nccl) {
    nccl.allreduce(data, static_cast<size_t>(count), dtype, average, w.op(), nccl_watch(w));
  });
}

void device_broadcast(detail::Waiter& w, void* data, int64_t bytes, Device device, int root) {
  on_nccl(w, device,
          [&](backend::NcclComm& nccl) { nccl.broadcast(data, static_cast<size_t>(bytes), root, w.op(), nccl_watch(w)); });
}

void device_allgather(detail::Waiter& w, const void* in, void* out, int64_t bytes_per_rank, Device device) {
  on_nccl(w, device, [&](backend::NcclComm& nccl) {
    nccl.allgather(in, out, static_cast<size_t>(bytes_per_rank), w.op(), nccl_watch(w));
  });
}

}  // namespace comm

}  // namespace tnt
