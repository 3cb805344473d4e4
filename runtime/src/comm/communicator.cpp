// Communicator: argument checks, algorithm choice, and the MPI (host) paths. Host
// collectives are nonblocking MPI calls completed by a Waiter, so every one of them keeps
// TNT_COLLECTIVE_TIMEOUT. A device buffer goes to comm/device_collectives.hpp (NCCL, or
// the CPU-only build's error) as soon as its arguments are checked and the collective is
// numbered: this file has no CUDA branch.
#include "tarantella/comm.hpp"

#include "comm/waiter.hpp"
#include "comm/device_collectives.hpp"
#include "comm/host_reduce.hpp"
#include "comm/ring_allreduce.hpp"
#include "tarantella/check.hpp"

#include <algorithm>
#include <climits>
#include <cstring>

namespace tnt {

using detail::CommImpl;
using detail::Waiter;

// ---- algorithms ------------------------------------------------------------------------

AllreduceAlgo parse_allreduce_algo(const std::string& text) {
  if (text.empty() || text == "auto") return AllreduceAlgo::automatic;
  if (text == "ring") return AllreduceAlgo::ring;
  if (text == "mpi") return AllreduceAlgo::mpi;
  if (text == "nccl") return AllreduceAlgo::nccl;
  TNT_INPUT_ERROR("allreduce algorithm '{}' is not ring, mpi or nccl", text);
}

const char* allreduce_algo_name(AllreduceAlgo algo) {
  switch (algo) {
    case AllreduceAlgo::automatic: return "auto";
    case AllreduceAlgo::ring: return "ring";
    case AllreduceAlgo::mpi: return "mpi";
    case AllreduceAlgo::nccl: return "nccl";
  }
  return "?";
}

// ---- construction ----------------------------------------------------------------------

namespace {

// A communicator made from another (dup, split) keeps its device and its tunables.
void inherit_settings(const CommImpl& from, CommImpl& to) {
  to.device = from.device;
  to.timeout_s = from.timeout_s;
  to.config_algo = from.config_algo;
  to.configured = from.configured;
  to.ring_segment_bytes = from.ring_segment_bytes;
  to.small_bytes = from.small_bytes;
  to.min_segment_bytes = from.min_segment_bytes;
  to.spin_us = from.spin_us;
  to.mismatch_grace_s = from.mismatch_grace_s;
}

void fill_ranks(CommImpl& c) {
  TNT_MPI_CHECK(MPI_Comm_rank(c.comm, &c.rank));
  TNT_MPI_CHECK(MPI_Comm_size(c.comm, &c.size));
  MPI_Comm node;
  TNT_MPI_CHECK(MPI_Comm_split_type(c.comm, MPI_COMM_TYPE_SHARED, c.rank, MPI_INFO_NULL, &node));
  MPI_Comm_rank(node, &c.local_rank);
  MPI_Comm_size(node, &c.local_size);
  MPI_Comm_free(&node);
  void* ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(c.comm, MPI_TAG_UB, &ub, &found);
  if (found && ub) c.tag_ub = *static_cast<int*>(ub);
}

// Completes one nonblocking MPI collective. On failure the request is left to MPI (a
// collective request can be neither cancelled nor freed) and the communicator is broken.
void complete(Waiter& w, MPI_Request& req, int peer = -1, const char* role = nullptr) {
  try {
    w.wait(req, peer, role);
  } catch (...) {
    detail::abandon_requests(w.comm(), std::span<MPI_Request>(&req, 1), false);
    throw;
  }
}

}  // namespace

Communicator::Communicator(std::unique_ptr<CommImpl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

std::unique_ptr<Communicator> Communicator::create_world(const Config& config, Device device) {
  auto c = std::make_unique<CommImpl>();
  TNT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &c->comm));
  MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
  fill_ranks(*c);
  c->device = device;
  c->timeout_s = config.collective_timeout_s;
  c->config_algo = config.allreduce_algo;
  c->configured = parse_allreduce_algo(c->config_algo);
  c->ring_segment_bytes = static_cast<size_t>(std::max<int64_t>(1, config.ring_segment_kb)) * 1024;
  c->arrivals = std::make_shared<detail::Arrivals>(c->comm);
  c->slot = 0;
  return std::unique_ptr<Communicator>(new Communicator(std::move(c)));
}

std::unique_ptr<Communicator> Communicator::duplicate() const {
  const CommImpl& p = *impl_;
  TNT_CHECK(!p.broken, "duplicate on rank {}: this communicator is unusable after an earlier communication error",
            p.rank);
  auto c = std::make_unique<CommImpl>();
  TNT_MPI_CHECK(MPI_Comm_dup(p.comm, &c->comm));
  MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
  fill_ranks(*c);
  inherit_settings(p, *c);
  c->arrivals = p.arrivals;
  if (c->arrivals) {
    c->slot = c->arrivals->next_slot();
    c->arrivals->reset(c->slot);
  }
  return std::unique_ptr<Communicator>(new Communicator(std::move(c)));
}

std::unique_ptr<Communicator> Communicator::split(int color) const {
  const CommImpl& p = *impl_;
  auto c = std::make_unique<CommImpl>();
  TNT_MPI_CHECK(MPI_Comm_split(p.comm, color, p.rank, &c->comm));
  MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
  fill_ranks(*c);
  inherit_settings(p, *c);
  return std::unique_ptr<Communicator>(new Communicator(std::move(c)));
}

std::unique_ptr<Communicator> Communicator::subset(const std::vector<int>& ranks, int tag) const {
  const CommImpl& p = *impl_;
  MPI_Group all, some;
  TNT_MPI_CHECK(MPI_Comm_group(p.comm, &all));
  TNT_MPI_CHECK(MPI_Group_incl(all, static_cast<int>(ranks.size()), ranks.data(), &some));
  auto c = std::make_unique<CommImpl>();
  TNT_MPI_CHECK(MPI_Comm_create_group(p.comm, some, tag, &c->comm));
  MPI_Group_free(&some);
  MPI_Group_free(&all);
  MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
  fill_ranks(*c);
  inherit_settings(p, *c);
  return std::unique_ptr<Communicator>(new Communicator(std::move(c)));
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return impl_->size; }
int Communicator::local_rank() const { return impl_->local_rank; }
int Communicator::local_size() const { return impl_->local_size; }
Device Communicator::device() const { return impl_->device; }
double Communicator::timeout() const { return impl_->timeout_s; }
int64_t Communicator::collectives_entered() const { return impl_->seq; }

void Communicator::set_timeout(double seconds) {
  TNT_INPUT_CHECK(seconds >= 0, "collective timeout must be 0 (none) or positive, got {} s", seconds);
  impl_->timeout_s = seconds;
}

std::shared_ptr<void> Communicator::announce_finished() {
  if (impl_->arrivals) impl_->arrivals->mark_finished();
  return impl_->arrivals;
}

AllreduceAlgo Communicator::resolve(AllreduceAlgo algo, Device where) const {
  if (algo == AllreduceAlgo::automatic) {
    AllreduceAlgo configured = impl_->configured;
    bool fits = where.is_cpu() ? (configured == AllreduceAlgo::ring || configured == AllreduceAlgo::mpi)
                               : configured == AllreduceAlgo::nccl;
    if (fits) return configured;
    return where.is_cpu() ? AllreduceAlgo::ring : AllreduceAlgo::nccl;
  }
  if (where.is_cpu()) {
    TNT_CHECK(algo != AllreduceAlgo::nccl, "allreduce algorithm nccl needs a device buffer; this one is on the host");
  } else {
    TNT_CHECK(algo == AllreduceAlgo::nccl, "allreduce algorithm {} works on host buffers; a {} buffer needs nccl",
              allreduce_algo_name(algo), where.str());
  }
  return algo;
}

// ---- allreduce -------------------------------------------------------------------------

void Communicator::allreduce(Tensor& tensor, ReduceOp op, AllreduceAlgo algo) {
  TNT_CHECK(tensor.defined(), "allreduce of an undefined tensor");
  allreduce(tensor.raw(), tensor.numel(), tensor.dtype(), tensor.device(), op, algo);
}

void Communicator::allreduce(void* data, int64_t count, DType dtype, Device device, ReduceOp op, AllreduceAlgo algo) {
  CommImpl& c = *impl_;
  AllreduceAlgo a = resolve(algo, device);
  const detail::OpDesc desc{.name = "allreduce", .algo = allreduce_algo_name(a), .count = count, .dtype = dtype};
  TNT_CHECK(count >= 0, "{}: negative element count", desc.str());
  TNT_CHECK(count == 0 || data != nullptr, "{}: null buffer", desc.str());
  bool average = op == ReduceOp::average;
  TNT_CHECK(!average || is_floating(dtype), "{}: an average needs a floating-point dtype, got {}", desc.str(),
            dtype_name(dtype));
  c.enter(desc);
  Waiter w(c, desc);
  switch (a) {
    case AllreduceAlgo::ring: comm::ring_allreduce(w, data, count, dtype, average); return;
    case AllreduceAlgo::mpi: {
      TNT_CHECK(comm::host_reducible(dtype), "{}: host allreduce takes f32, f64, i32, i64, not {}", desc.str(),
                dtype_name(dtype));
      if (c.size == 1 || count == 0) return;
      // MPI counts are int: large buffers go in pieces.
      const int64_t piece = INT_MAX / 2;
      char* p = static_cast<char*>(data);
      const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
      for (int64_t done = 0; done < count; done += piece) {
        int n = static_cast<int>(std::min(piece, count - done));
        MPI_Request req = MPI_REQUEST_NULL;
        w.check(MPI_Iallreduce(MPI_IN_PLACE, p + done * elem, n, detail::mpi_type(dtype), MPI_SUM, c.comm, &req),
                "MPI_Iallreduce");
        complete(w, req);
      }
      if (average) comm::host_div(data, count, dtype, static_cast<double>(c.size));
      return;
    }
    case AllreduceAlgo::nccl:
      if (count > 0) comm::device_allreduce(w, data, count, dtype, device, average);
      return;
    case AllreduceAlgo::automatic: break;
  }
  TNT_THROW("{}: no algorithm", desc.str());
}

// ---- broadcast -------------------------------------------------------------------------

void Communicator::broadcast(Tensor& tensor, int root) {
  TNT_CHECK(tensor.defined(), "broadcast of an undefined tensor");
  broadcast(tensor.raw(), tensor.numel(), tensor.dtype(), tensor.device(), root);
}

void Communicator::broadcast(void* data, int64_t count, DType dtype, Device device, int root) {
  CommImpl& c = *impl_;
  const detail::OpDesc desc{
      .name = "broadcast", .root = root, .count = count, .dtype = dtype, .show_device = true, .device = device};
  TNT_CHECK(count >= 0, "{}: negative element count", desc.str());
  TNT_CHECK(root >= 0 && root < c.size, "{}: root {} is not a rank (0..{})", desc.str(), root, c.size - 1);
  c.enter(desc);
  Waiter w(c, desc);
  if (c.size == 1 || count == 0) return;
  const int64_t bytes = count * static_cast<int64_t>(dtype_size(dtype));
  if (!device.is_cpu()) return comm::device_broadcast(w, data, bytes, device, root);
  const int64_t piece = int64_t{1} << 30;  // MPI counts are int
  for (int64_t done = 0; done < bytes; done += piece) {
    MPI_Request req = MPI_REQUEST_NULL;
    w.check(MPI_Ibcast(static_cast<char*>(data) + done, static_cast<int>(std::min(piece, bytes - done)), MPI_BYTE, root,
                       c.comm, &req),
            "MPI_Ibcast");
    // The root waits on the others, never on itself: its message names them (arrivals).
    // Beyond 2 ranks Open MPI relays a broadcast through other ranks (a tree): a rank may wait
    // on one of those, which the arrivals then name, not on the root.
    complete(w, req, c.rank == root ? -1 : root,
             c.size > 2 ? "(root; the broadcast is relayed through other ranks: see those that did not answer)"
                        : "(root)");
  }
}

void Communicator::broadcast(std::string& text, int root) {
  int64_t length = static_cast<int64_t>(text.size());
  broadcast(&length, 1, DType::i64, Device::cpu(), root);
  text.resize(static_cast<size_t>(length));
  broadcast(text.data(), length, DType::u8, Device::cpu(), root);
}

// ---- allgather -------------------------------------------------------------------------

Tensor Communicator::allgather(const Tensor& in_any) {
  TNT_CHECK(in_any.defined(), "allgather of an undefined tensor");
  const Tensor in = in_any.contiguous();  // rows of the result are in logical order
  Shape shape = in.shape();
  shape.insert(shape.begin(), impl_->size);
  Tensor out = Tensor::empty(shape, in.dtype(), in.device());
  allgather(in.raw(), out.raw(), in.numel(), in.dtype(), in.device());
  return out;
}

void Communicator::allgather(const void* in, void* out, int64_t count, DType dtype, Device device) {
  CommImpl& c = *impl_;
  const detail::OpDesc desc{.name = "allgather", .count = count, .dtype = dtype, .show_device = true, .device = device};
  TNT_CHECK(count >= 0, "{}: negative element count", desc.str());
  c.enter(desc);
  Waiter w(c, desc);
  const int64_t bytes = count * static_cast<int64_t>(dtype_size(dtype));
  if (bytes == 0) return;
  if (!device.is_cpu()) return comm::device_allgather(w, in, out, bytes, device);
  TNT_CHECK(bytes <= INT_MAX, "{}: {} bytes per rank is more than one MPI call takes", desc.str(), bytes);
  MPI_Request req = MPI_REQUEST_NULL;
  w.check(MPI_Iallgather(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes), MPI_BYTE, c.comm, &req),
          "MPI_Iallgather");
  complete(w, req);
}

std::vector<int64_t> Communicator::allgather(int64_t value) {
  std::vector<int64_t> out(static_cast<size_t>(impl_->size));
  allgather(&value, out.data(), 1, DType::i64, Device::cpu());
  return out;
}

// ---- barrier and scalars ----------------------------------------------------------------

void Communicator::barrier() {
  CommImpl& c = *impl_;
  const detail::OpDesc desc{.name = "barrier"};
  c.enter(desc);
  Waiter w(c, desc);
  MPI_Request req = MPI_REQUEST_NULL;
  w.check(MPI_Ibarrier(c.comm, &req), "MPI_Ibarrier");
  complete(w, req);
}

namespace {
template <typename T>
std::vector<T> small_allreduce(CommImpl& c, std::vector<T> values, MPI_Op mpi_op, const char* what) {
  const detail::OpDesc desc{.name = what, .count = static_cast<int64_t>(values.size()), .unit = "value(s)"};
  c.enter(desc);
  Waiter w(c, desc);
  if (c.size == 1 || values.empty()) return values;
  MPI_Request req = MPI_REQUEST_NULL;
  w.check(MPI_Iallreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), detail::mpi_type(dtype_of<T>()),
                         mpi_op, c.comm, &req),
          "MPI_Iallreduce");
  try {
    complete(w, req);
  } catch (...) {
    // values' memory may still be written by the abandoned request: keep it alive.
    detail::give_up_to_mpi(new std::vector<T>(std::move(values)));
    throw;
  }
  return values;
}
}  // namespace

std::vector<double> Communicator::allreduce_sum(std::vector<double> values) {
  return small_allreduce(*impl_, std::move(values), MPI_SUM, "allreduce_sum");
}
std::vector<int64_t> Communicator::allreduce_sum(std::vector<int64_t> values) {
  return small_allreduce(*impl_, std::move(values), MPI_SUM, "allreduce_sum");
}
std::vector<double> Communicator::allreduce_max(std::vector<double> values) {
  return small_allreduce(*impl_, std::move(values), MPI_MAX, "allreduce_max");
}
std::vector<double> Communicator::allreduce_min(std::vector<double> values) {
  return small_allreduce(*impl_, std::move(values), MPI_MIN, "allreduce_min");
}

}  // namespace tnt
