#include "comm/comm_impl.hpp"

#include "comm/agreement.hpp"
#include "tarantella/check.hpp"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <thread>

namespace tnt::detail {

namespace {
bool mpi_finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, static_cast<size_t>(len));
}
}  // namespace

// ---- Arrivals -------------------------------------------------------------------------

Arrivals::Arrivals(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_size(comm, &size_);
  void* base = nullptr;
  // The communicator returns errors instead of aborting (tnt::init sets MPI_ERRORS_RETURN),
  // so a library without a usable one-sided component just leaves the channel off.
  int rc = MPI_Win_allocate(static_cast<MPI_Aint>(kSlots * sizeof(int64_t)), sizeof(int64_t), MPI_INFO_NULL,
                            comm, &base, &win_);
  if (rc != MPI_SUCCESS) {
    win_ = MPI_WIN_NULL;
    return;
  }
  base_ = static_cast<int64_t*>(base);
  std::fill(base_, base_ + kSlots, int64_t{0});
  // In the unified memory model a plain store reaches remote readers eventually, which is
  // all a report read seconds later needs; MPI_Win_sync would add ~0.1 us to every small
  // collective. The separate model needs it.
  int* model = nullptr;
  int found = 0;
  MPI_Win_get_attr(win_, MPI_WIN_MODEL, &model, &found);
  needs_sync_ = !(found && model && *model == MPI_WIN_UNIFIED);
  MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN);
  if (MPI_Win_lock_all(MPI_MODE_NOCHECK, win_) != MPI_SUCCESS) {
    MPI_Win_free(&win_);
    win_ = MPI_WIN_NULL;
    base_ = nullptr;
  }
  // Every rank must have zeroed its entries before anyone may read them.
  MPI_Barrier(comm);
}

Arrivals::~Arrivals() {
  if (win_ == MPI_WIN_NULL || mpi_finalized()) return;
  MPI_Win_unlock_all(win_);
  MPI_Win_free(&win_);
}

int Arrivals::next_slot() {
  int s = next_slot_;
  next_slot_ = next_slot_ + 1 < kSlots ? next_slot_ + 1 : 1;
  return s;
}

void Arrivals::publish(int slot, int64_t seq) {
  if (!enabled()) return;
  std::atomic_ref<int64_t>(base_[slot]).store(seq, std::memory_order_release);
  if (needs_sync_) MPI_Win_sync(win_);
}

std::vector<int64_t> Arrivals::query(int slot, double budget_s) const {
  std::vector<int64_t> out(static_cast<size_t>(size_), -1);
  if (!enabled()) return out;
  // The answers land in heap memory that is deliberately leaked when a rank does not
  // answer in time: its MPI_Rget may still complete later.
  auto* values = new int64_t[static_cast<size_t>(size_)];
  std::vector<MPI_Request> requests(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  for (int q = 0; q < size_; ++q) {
    values[q] = -1;
    if (MPI_Rget(&values[q], 1, MPI_INT64_T, q, slot, 1, MPI_INT64_T, win_, &requests[static_cast<size_t>(q)]) !=
        MPI_SUCCESS) {
      requests[static_cast<size_t>(q)] = MPI_REQUEST_NULL;
    }
  }
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(budget_s));
  std::vector<bool> done(static_cast<size_t>(size_), false);
  int pending = size_;
  while (pending > 0 && Clock::now() < deadline) {
    pending = 0;
    for (int q = 0; q < size_; ++q) {
      auto i = static_cast<size_t>(q);
      if (done[i]) continue;
      int flag = 0;
      if (requests[i] == MPI_REQUEST_NULL || MPI_Test(&requests[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        done[i] = true;  // no answer possible
        continue;
      }
      if (flag) {
        done[i] = true;
        out[i] = values[q];
      } else {
        ++pending;
      }
    }
    if (pending > 0) sched_yield();
  }
  if (pending == 0) delete[] values;
  return out;
}

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
  data_ = nullptr;
  bytes_ = 0;
}

// ---- CommImpl -------------------------------------------------------------------------

CommImpl::CommImpl() = default;

CommImpl::~CommImpl() {
  nccl.reset();
  if (comm != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm);
}

std::string OpDesc::str() const {
  std::string args;
  auto add = [&](const std::string& part) { args += (args.empty() ? "" : ", ") + part; };
  if (algo) add(algo);
  if (root >= 0) add(fmt::format("root {}", root));
  if (count >= 0) add(unit ? fmt::format("{} {}", count, unit) : fmt::format("{} x {}", count, dtype_name(dtype)));
  if (show_device) add(device.str());
  return args.empty() ? std::string(name) : fmt::format("{}({})", name, args);
}

int64_t CommImpl::enter(const OpDesc& op) {
  if (broken) {
    throw CommError(fmt::format("{} on rank {}: this communicator is unusable after an earlier communication error",
                                op.str(), rank));
  }
  ++seq;
  if (arrivals) arrivals->publish(slot, seq);
  return seq;
}

Clock::time_point CommImpl::deadline() const {
  // 0 means no timeout; capped so that a huge value does not overflow the clock.
  double s = timeout_s > 0 ? std::min(timeout_s, 1.0e9) : 1.0e9;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string comm_error_prefix(const CommImpl& comm, const std::string& op) {
  return fmt::format("{} (collective #{} of this communicator) on rank {} of {}", op, comm.seq, comm.rank, comm.size);
}

// ---- Waiter ---------------------------------------------------------------------------

Waiter::Waiter(CommImpl& comm, const OpDesc& op)
    : comm_(comm), op_(op), seq_(comm.seq) {}

Clock::time_point Waiter::deadline() const {
  if (deadline_ == Clock::time_point{}) deadline_ = comm_.deadline();
  return deadline_;
}

void Waiter::check(int rc, const char* call) const {
  if (rc == MPI_SUCCESS) return;
  comm_.broken = true;
  throw CommError(fmt::format("{}: MPI error in {}: {}", comm_error_prefix(comm_, op_.str()), call, mpi_error_string(rc)));
}

void Waiter::wait(MPI_Request& request, int peer, const char* role) {
  // Spin first: a peer that is running answers within microseconds, and giving the core
  // away (sched_yield) on a busy machine can cost a whole scheduler time slice. After
  // spin_us, yield on every round, so that oversubscribed ranks (tests) and this rank's
  // compute threads get the core.
  int spins = 0;
  Clock::time_point spin_until{};
  while (request != MPI_REQUEST_NULL) {
    int flag = 0;
    check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) return;
    if ((++spins & 63) != 0) continue;
    Clock::time_point now = Clock::now();
    if (spins == 64) spin_until = now + std::chrono::microseconds(comm_.spin_us);
    if (now > deadline()) timed_out(peer, role);
    if (comm_.cancel && comm_.cancel->load(std::memory_order_relaxed)) {
      comm_.broken = true;
      throw CommError(fmt::format("{}: cancelled", comm_error_prefix(comm_, op_.str())));
    }
    if (now > spin_until) sched_yield();
  }
}

void Waiter::wait_all(std::span<MPI_Request> requests, int peer, const char* role) {
  for (MPI_Request& r : requests) wait(r, peer, role);
}

void Waiter::timed_out(int peer, const char* role) const {
  comm_.broken = true;
  std::string msg = fmt::format("{} did not complete within {} s", comm_error_prefix(comm_, op_.str()), comm_.timeout_s);
  if (peer >= 0) msg += fmt::format("; waiting on rank {}{}{}", peer, role ? " " : "", role ? role : "");
  if (comm_.arrivals && comm_.arrivals->enabled()) {
    std::vector<int64_t> entered = comm_.arrivals->query(comm_.slot, 2.0);
    std::vector<int> missing, silent;
    for (int q = 0; q < comm_.size; ++q) {
      int64_t e = entered[static_cast<size_t>(q)];
      if (e < 0) {
        silent.push_back(q);
      } else if (e < seq_) {
        missing.push_back(q);
      }
    }
    if (!missing.empty()) {
      msg += fmt::format("; rank(s) {} never joined it", rank_list(missing));
    } else if (silent.empty()) {
      msg += "; every rank entered it (one may be stuck inside, or ranks disagree on its arguments)";
    }
    if (!silent.empty()) msg += fmt::format("; rank(s) {} did not answer the arrival query", rank_list(silent));
  } else {
    msg += "; which ranks never joined is unknown (no MPI one-sided support for the arrival channel)";
  }
  msg += " (TNT_COLLECTIVE_TIMEOUT)";
  throw CommError(msg);
}

void abandon_requests(CommImpl& comm, std::span<MPI_Request> requests, bool point_to_point) {
  comm.broken = true;
  bool leaked = false;
  for (MPI_Request& r : requests) {
    if (r == MPI_REQUEST_NULL) continue;
    if (point_to_point) {
      MPI_Cancel(&r);
      int flag = 0;
      MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
      if (!flag) {
        MPI_Request_free(&r);
        leaked = true;
      }
    } else {
      // A nonblocking collective may be neither cancelled nor freed: leave it.
      leaked = true;
    }
    r = MPI_REQUEST_NULL;
  }
  if (leaked) comm.scratch.abandon();
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
