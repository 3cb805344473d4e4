#include "comm/comm_state.hpp"

#include "tarantella/check.hpp"

#include <cstdlib>
#include <exception>

namespace tnt::detail {

namespace {
bool mpi_finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}
}  // namespace

// ---- Scratch --------------------------------------------------------------------------

Scratch::~Scratch() { std::free(data_); }

void* Scratch::get(size_t bytes) {
  if (bytes <= bytes_) return data_;
  std::free(data_);
  size_t rounded = (bytes + 63) / 64 * 64;
  data_ = std::aligned_alloc(64, rounded);
  TNT_CHECK(data_ != nullptr, "cannot allocate {} bytes of communication scratch memory", rounded);
  bytes_ = rounded;
  return data_;
}

void Scratch::abandon() {
  // A request that timed out may still write into the buffer, so it is given up, not
  // freed; LeakSanitizer is told that this one is on purpose.
  give_up_to_mpi(data_);
  data_ = nullptr;
  bytes_ = 0;
}

// ---- CommImpl -------------------------------------------------------------------------

CommImpl::CommImpl() = default;

CommImpl::~CommImpl() {
  nccl.reset();
  if (comm != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm);
}

int64_t CommImpl::enter(const OpDesc& op) {
  if (broken) {
    throw CommError(fmt::format("{} on rank {}: this communicator is unusable after an earlier communication error",
                                op.str(), rank));
  }
  // (The text is made only inside a region: a collective pays one thread-local read.)
  if (inside_some_ranks_region()) refuse_collective_here(op.str());
  ++seq;
  if (arrivals) arrivals->enter(slot, seq, op);
  return seq;
}

Clock::time_point CommImpl::deadline() const {
  // 0 means no timeout; capped so that a huge value does not overflow the clock.
  double s = timeout_s > 0 ? std::min(timeout_s, 1.0e9) : 1.0e9;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string comm_error_prefix(const CommImpl& comm, const std::string& op, int64_t seq) {
  return fmt::format("{} (collective #{} of this communicator) on rank {} of {}", op, seq >= 0 ? seq : comm.seq,
                     comm.rank, comm.size);
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    default: TNT_THROW("MPI has no type for {} here (host collectives take f32, f64, i32, i64)", dtype_name(dtype));
  }
}

}  // namespace tnt::detail
