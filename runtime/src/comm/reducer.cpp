// The Reducer: plan, fingerprint check, and the step protocol described in reducer.hpp.
//
// Threads. mark_ready() and finalize() run on the training loop's thread. Host buckets go
// to one communication thread through a queue, in bucket order; it packs (times the local
// factor), allreduces on the Reducer's own duplicate communicator and reports back.
// Device buckets never touch that thread: their pack kernel, event and NCCL call are
// only enqueued from mark_ready(). finalize() waits, then unpacks (times scale).
// With one rank nothing is sent: finalize() scales the gradients in place.
#include "tarantella/reducer.hpp"

#include "comm/comm_impl.hpp"
#include "comm/host_reduce.hpp"
#include "tarantella/check.hpp"
#include "tarantella/runtime.hpp"

#ifdef TNT_WITH_CUDA
#include "backend/cuda/nccl_comm.hpp"
#include "comm/reducer_cuda.hpp"
#endif

#include <algorithm>
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace tnt {

using Clock = std::chrono::steady_clock;

double StepTiming::comm_s() const {
  double total = 0;
  for (const BucketTiming& b : buckets) total += b.end_s - b.start_s;
  return total;
}

double StepTiming::hidden_s() const {
  double total = 0;
  for (const BucketTiming& b : buckets) {
    total += std::max(0.0, std::min(b.end_s, backward_end_s) - b.start_s);
  }
  return total;
}

double StepTiming::exposed_s() const { return finalize_end_s - backward_end_s; }

namespace {

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

std::string describe(size_t index, const std::string& name, const Tensor& grad) {
  if (!grad.defined()) return fmt::format("gradient #{} '{}': undefined tensor", index, name);
  return fmt::format("gradient #{} '{}': {} {} on {}", index, name, dtype_name(grad.dtype()), shape_str(grad.shape()),
                     grad.device().is_cpu() ? "cpu" : "cuda");
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

// Compares the ranks' descriptions (entry 0: settings; then one per gradient). All ranks
// see the same gathered data, so all take the same branch and throw the same message.
void check_fingerprint(Communicator& comm, const std::vector<std::string>& entries) {
  uint64_t all = 1469598103934665603ull;
  for (const std::string& e : entries) all = all * 31 + fnv1a(e);
  std::vector<int64_t> hashes = comm.allgather(static_cast<int64_t>(all));
  if (std::all_of(hashes.begin(), hashes.end(), [&](int64_t h) { return h == hashes[0]; })) return;

  const int p = comm.size();
  const int64_t most = comm.allreduce_max(static_cast<int64_t>(entries.size()));
  Tensor mine = Tensor::zeros({most}, DType::i64);  // 0: "no such entry"
  for (size_t i = 0; i < entries.size(); ++i) mine.data<int64_t>()[i] = static_cast<int64_t>(fnv1a(entries[i]) | 1);
  Tensor every = comm.allgather(mine);  // (p, most)
  const int64_t* h = every.data<int64_t>();
  int64_t first = 0;
  for (; first < most; ++first) {
    bool same = true;
    for (int q = 1; q < p; ++q) same = same && h[q * most + first] == h[first];
    if (!same) break;
  }
  TNT_CHECK(first < most, "Reducer fingerprint: hashes differ but no entry does");  // cannot happen

  std::string text = static_cast<size_t>(first) < entries.size()
                         ? entries[static_cast<size_t>(first)]
                         : fmt::format("no gradient #{} (this rank has {})", first - 1, entries.size() - 1);
  const int64_t width = comm.allreduce_max(static_cast<int64_t>(text.size()));
  Tensor padded = Tensor::zeros({width}, DType::u8);
  std::copy(text.begin(), text.end(), padded.data<uint8_t>());
  Tensor texts = comm.allgather(padded);  // (p, width)
  std::map<std::string, std::vector<int>> groups;
  std::vector<std::string> order;
  for (int q = 0; q < p; ++q) {
    const char* row = reinterpret_cast<const char*>(texts.data<uint8_t>() + q * width);
    std::string t(row, strnlen(row, static_cast<size_t>(width)));
    if (!groups.count(t)) order.push_back(t);
    groups[t].push_back(q);
  }
  std::string msg = fmt::format(
      "Reducer: the ranks disagree on the gradients to reduce (their fusion plans would differ and the "
      "allreduces would hang); first difference at {}:",
      first == 0 ? "the settings" : fmt::format("gradient #{}", first - 1));
  for (const std::string& t : order) msg += fmt::format(" rank(s) {}: {};", rank_list(groups[t]), t);
  msg.pop_back();
  throw CommError(msg);
}

}  // namespace

struct Reducer::Impl {
  Communicator& user_comm;
  std::unique_ptr<Communicator> comm;  // our duplicate: the communication thread's and NCCL's
  ReducerOptions options;
  int64_t threshold = 0;
  int size = 1;
  std::vector<std::string> names;
  std::vector<Tensor> grads;
  std::unordered_map<std::string, size_t> by_name;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;                // (gradients,)
  std::vector<std::vector<int64_t>> offsets;    // per bucket, per member: element offset in fused
  std::vector<Tensor> fused;                    // per bucket; undefined for one-gradient buckets
  std::vector<AllreduceAlgo> algos;             // per bucket
  double local_factor = 1.0;
  bool threaded = false;
  bool broken = false;

  // Step state, guarded by mu (the communication thread reads the queue and writes timing).
  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  std::vector<char> ready;    // (gradients,)
  std::vector<int> missing;   // (buckets,) gradients not yet ready
  size_t next_launch = 0;
  std::deque<size_t> queue;   // host buckets for the thread
  size_t host_launched = 0, host_done = 0;
  bool in_step = false;
  Clock::time_point t0;
  StepTiming current, last;
  std::exception_ptr error;
  bool stop = false;
  std::atomic<bool> cancel{false};
  std::thread worker;

  // Device side (events are cudaEvent_t, created only when a bucket is on a device).
  struct DeviceEvents {
    void* ready = nullptr;   // compute stream, when the bucket was complete
    void* packed = nullptr;  // compute stream, after the pack: the NCCL stream waits for it
    void* start = nullptr;   // NCCL stream, when it reached the bucket
    void* done = nullptr;    // NCCL stream, after the allreduce
  };
  std::vector<DeviceEvents> events;  // per bucket
  void* step_start_event = nullptr;
  void* backward_end_event = nullptr;
  bool any_device = false;

  Impl(Communicator& c, ReducerOptions o) : user_comm(c), options(o) {}

  double since_t0() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }
  bool is_device(size_t b) const { return buckets[b].device.is_cuda(); }

  void build_plan() {
    const int64_t n = static_cast<int64_t>(grads.size());
    bucket_of.assign(grads.size(), 0);
    for (int64_t i = n - 1; i >= 0;) {
      Bucket b;
      b.dtype = grads[static_cast<size_t>(i)].dtype();
      b.device = grads[static_cast<size_t>(i)].device();
      std::vector<int64_t> offs;
      int64_t elems = 0;
      // Greedy: take gradients while the bucket is below the threshold (and of one kind).
      do {
        const Tensor& g = grads[static_cast<size_t>(i)];
        if (!b.gradients.empty() && (g.dtype() != b.dtype || g.device() != b.device)) break;
        b.gradients.push_back(static_cast<size_t>(i));
        offs.push_back(elems);
        elems += g.numel();
        b.bytes += static_cast<int64_t>(g.nbytes());
        bucket_of[static_cast<size_t>(i)] = buckets.size();
        --i;
      } while (i >= 0 && b.bytes < threshold);
      buckets.push_back(std::move(b));
      offsets.push_back(std::move(offs));
    }
  }

  void launch_ready_locked() {
    while (next_launch < buckets.size() && missing[next_launch] == 0) {
      size_t b = next_launch++;
      if (size == 1) continue;  // nothing to send; finalize() scales
      if (is_device(b)) {
        launch_device(b);
      } else if (threaded) {
        queue.push_back(b);
        ++host_launched;
        work_cv.notify_one();
      }
    }
  }

  void mark_locked(size_t i) {
    ready[i] = 1;
    size_t b = bucket_of[i];
    if (--missing[b] == 0) current.buckets[b].ready_s = since_t0();
  }

  void begin_step_locked() {
    if (in_step) return;
    in_step = true;
    t0 = Clock::now();
#ifdef TNT_WITH_CUDA
    if (any_device) comm::cuda::event_record(step_start_event, options.cuda_stream);
#endif
  }

  // Packs bucket b (times factor) and sums it over the ranks; host memory, any thread.
  void reduce_host(size_t b, double factor) {
    const Bucket& bk = buckets[b];
    if (!fused[b].defined()) {
      Tensor& g = grads[bk.gradients[0]];
      comm::host_scale(g.raw(), g.numel(), g.dtype(), factor);
      comm->allreduce(g.raw(), g.numel(), g.dtype(), Device::cpu(), ReduceOp::sum, algos[b]);
      return;
    }
    char* base = static_cast<char*>(fused[b].raw());
    const size_t elem = dtype_size(bk.dtype);
    for (size_t k = 0; k < bk.gradients.size(); ++k) {
      const Tensor& g = grads[bk.gradients[k]];
      comm::host_scale_copy(base + static_cast<size_t>(offsets[b][k]) * elem, g.raw(), g.numel(), g.dtype(), factor);
    }
    comm->allreduce(fused[b].raw(), fused[b].numel(), bk.dtype, Device::cpu(), ReduceOp::sum, algos[b]);
  }

  void unpack_host(size_t b, double scale) {
    const Bucket& bk = buckets[b];
    if (!fused[b].defined()) {
      Tensor& g = grads[bk.gradients[0]];
      comm::host_scale(g.raw(), g.numel(), g.dtype(), scale);
      return;
    }
    const char* base = static_cast<const char*>(fused[b].raw());
    const size_t elem = dtype_size(bk.dtype);
    for (size_t k = 0; k < bk.gradients.size(); ++k) {
      Tensor& g = grads[bk.gradients[k]];
      comm::host_scale_copy(g.raw(), base + static_cast<size_t>(offsets[b][k]) * elem, g.numel(), g.dtype(), scale);
    }
  }

  void worker_loop() {
    for (;;) {
      std::unique_lock<std::mutex> lk(mu);
      work_cv.wait(lk, [&] { return stop || !queue.empty(); });
      if (stop) return;
      size_t b = queue.front();
      queue.pop_front();
      bool skip = error != nullptr;
      double factor = local_factor;
      current.buckets[b].start_s = since_t0();
      lk.unlock();
      std::exception_ptr failure;
      if (!skip) {
        try {
          reduce_host(b, factor);
        } catch (...) {
          failure = std::current_exception();
        }
      }
      lk.lock();
      current.buckets[b].end_s = since_t0();
      if (failure && !error) error = failure;
      ++host_done;
      done_cv.notify_all();
    }
  }

#ifdef TNT_WITH_CUDA
  std::vector<comm::cuda::PackItem> items(size_t b) {
    std::vector<comm::cuda::PackItem> out;
    for (size_t k = 0; k < buckets[b].gradients.size(); ++k) {
      const Tensor& g = grads[buckets[b].gradients[k]];
      out.push_back({g.raw(), offsets[b][k], g.numel()});
    }
    return out;
  }
#endif

  void launch_device(size_t b) {
#ifdef TNT_WITH_CUDA
    const Bucket& bk = buckets[b];
    comm::cuda::set_device(bk.device.index);
    void* stream = options.cuda_stream;
    comm::cuda::event_record(events[b].ready, stream);
    void* data;
    int64_t count;
    if (fused[b].defined()) {
      comm::cuda::pack(items(b), fused[b].raw(), bk.dtype, local_factor, stream);
      data = fused[b].raw();
      count = fused[b].numel();
    } else {
      Tensor& g = grads[bk.gradients[0]];
      comm::cuda::scale(g.raw(), g.numel(), g.dtype(), local_factor, stream);
      data = g.raw();
      count = g.numel();
    }
    // Hand-off: the NCCL stream waits for the pack (recorded after it), then reduces.
    detail::CommImpl& c = detail::impl_of(*comm);
    std::string op = fmt::format("Reducer bucket {} ({} B)", b, bk.bytes);
    c.enter(detail::OpDesc{.name = "Reducer bucket allreduce(nccl)", .count = count, .dtype = bk.dtype});
    backend::NcclComm& nccl = *c.nccl;
    comm::cuda::event_record(events[b].packed, stream);
    nccl.wait_event(events[b].packed);
    comm::cuda::event_record(events[b].start, nccl.stream());
    nccl.allreduce(data, static_cast<size_t>(count), bk.dtype, false, op, c.deadline());
    nccl.record(events[b].done);
#else
    TNT_THROW("Reducer bucket {} is on {}, but this libtarantella was built without CUDA", b, buckets[b].device.str());
#endif
  }
};

Reducer::Reducer(Communicator& comm, std::vector<std::pair<std::string, Tensor>> gradients, ReducerOptions options)
    : impl_(std::make_unique<Impl>(comm, options)) {
  Impl& m = *impl_;
  m.size = comm.size();
  m.threshold = options.threshold_bytes >= 0 ? options.threshold_bytes : config().fusion_threshold_kb * 1024;
  std::vector<std::string> entries;
  entries.push_back(fmt::format("fusion threshold {} B, {} gradients", m.threshold, gradients.size()));
  for (size_t i = 0; i < gradients.size(); ++i) entries.push_back(describe(i, gradients[i].first, gradients[i].second));
  check_fingerprint(comm, entries);

  // Every rank holds the same list now, so these checks fail on all ranks alike.
  for (size_t i = 0; i < gradients.size(); ++i) {
    auto& [name, grad] = gradients[i];
    TNT_CHECK(grad.defined(), "Reducer: gradient #{} '{}' is an undefined tensor", i, name);
    TNT_CHECK(m.by_name.emplace(name, i).second, "Reducer: the name '{}' is given twice (#{} and #{})", name,
              m.by_name[name], i);
    m.names.push_back(name);
    m.grads.push_back(grad);
  }
  m.build_plan();

  m.algos.resize(m.buckets.size());
  m.fused.resize(m.buckets.size());
  m.events.resize(m.buckets.size());
  int64_t host_buckets = 0;
  for (size_t b = 0; b < m.buckets.size(); ++b) {
    const Bucket& bk = m.buckets[b];
    // One kind of memory per Reducer: host buckets are reduced on the communication
    // thread, device buckets from the caller's thread, and both would share one
    // communicator.
    TNT_CHECK(bk.device.is_cuda() == m.buckets[0].device.is_cuda(),
              "Reducer: gradients on the host and on a device in one Reducer ('{}' on {}, '{}' on {}); use one "
              "Reducer per kind",
              m.names[m.buckets[0].gradients[0]], m.buckets[0].device.str(), m.names[bk.gradients[0]],
              bk.device.str());
    m.algos[b] = comm.resolve(options.algo, bk.device);
    if (bk.device.is_cuda()) {
      m.any_device = true;
    } else {
      ++host_buckets;
      TNT_CHECK(comm::host_reducible(bk.dtype), "Reducer: host gradients must be f32, f64, i32 or i64; '{}' is {}",
                m.names[bk.gradients[0]], dtype_name(bk.dtype));
    }
    if (bk.gradients.size() > 1) {
      int64_t elems = 0;
      for (size_t g : bk.gradients) elems += m.grads[g].numel();
      m.fused[b] = Tensor::empty({elems}, bk.dtype, bk.device);  // (bucket elements,)
    }
  }
  m.ready.assign(m.grads.size(), 0);
  m.missing.resize(m.buckets.size());
  for (size_t b = 0; b < m.buckets.size(); ++b) m.missing[b] = static_cast<int>(m.buckets[b].gradients.size());
  m.current.buckets.assign(m.buckets.size(), {});

  if (m.size > 1) {
    m.comm = comm.duplicate();
    detail::impl_of(*m.comm).cancel = &m.cancel;
    if (m.any_device) {
#ifdef TNT_WITH_CUDA
      detail::CommImpl& c = detail::impl_of(*m.comm);
      const detail::OpDesc desc{.name = "Reducer setup (NCCL communicator)"};
      c.enter(desc);
      detail::Waiter w(c, desc);
      detail::ensure_nccl(w);
#else
      TNT_THROW("Reducer: device gradients need a libtarantella built with CUDA; this one is CPU-only");
#endif
    }
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    m.threaded = options.overlap && host_buckets > 0 && level == MPI_THREAD_MULTIPLE;
    if (m.threaded) m.worker = std::thread([this] { impl_->worker_loop(); });
  }
#ifdef TNT_WITH_CUDA
  if (m.any_device) {
    for (auto& e : m.events) {
      e.ready = comm::cuda::event_create();
      e.packed = comm::cuda::event_create();
      e.start = comm::cuda::event_create();
      e.done = comm::cuda::event_create();
    }
    m.step_start_event = comm::cuda::event_create();
    m.backward_end_event = comm::cuda::event_create();
  }
#endif
}

Reducer::~Reducer() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lk(m.mu);
    m.stop = true;
    // A bucket still in flight (this rank left the step early, e.g. on an exception) must
    // not keep the destructor waiting for peers.
    if (m.in_step) m.cancel = true;
  }
  m.work_cv.notify_all();
  if (m.worker.joinable()) m.worker.join();
#ifdef TNT_WITH_CUDA
  if (m.any_device) {
    m.comm.reset();  // NCCL work first (aborted if unfinished), then the events it uses
    for (auto& e : m.events) {
      comm::cuda::event_destroy(e.ready);
      comm::cuda::event_destroy(e.packed);
      comm::cuda::event_destroy(e.start);
      comm::cuda::event_destroy(e.done);
    }
    comm::cuda::event_destroy(m.step_start_event);
    comm::cuda::event_destroy(m.backward_end_event);
  }
#endif
}

void Reducer::mark_ready(size_t index) {
  Impl& m = *impl_;
  TNT_CHECK(!m.broken, "Reducer: unusable after an earlier communication error");
  TNT_CHECK(index < m.grads.size(), "Reducer::mark_ready: index {} out of range ({} gradients)", index,
            m.grads.size());
  std::lock_guard<std::mutex> lk(m.mu);
  m.begin_step_locked();
  TNT_CHECK(!m.ready[index], "Reducer::mark_ready: gradient #{} '{}' marked ready twice in one step", index,
            m.names[index]);
  m.mark_locked(index);
  try {
    m.launch_ready_locked();
  } catch (...) {
    // A bucket counted as launched whose collective never started: finalize() would unpack
    // an unsummed buffer, and the peers would pair later collectives with the wrong bucket.
    m.broken = true;
    throw;
  }
}

void Reducer::mark_ready(const std::string& name) {
  auto it = impl_->by_name.find(name);
  TNT_CHECK(it != impl_->by_name.end(), "Reducer::mark_ready: no gradient named '{}'", name);
  mark_ready(it->second);
}

void Reducer::set_local_factor(double factor) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.mu);
  TNT_CHECK(!m.in_step, "Reducer::set_local_factor: call it before the step's first mark_ready");
  m.local_factor = factor;
}

double Reducer::local_factor() const { return impl_->local_factor; }

void Reducer::finalize(std::optional<double> scale) {
  Impl& m = *impl_;
  TNT_CHECK(!m.broken, "Reducer: unusable after an earlier communication error");
  const double s = scale.value_or(1.0 / static_cast<double>(m.size));
  {
    std::lock_guard<std::mutex> lk(m.mu);
    m.begin_step_locked();
    m.current.backward_end_s = m.since_t0();
#ifdef TNT_WITH_CUDA
    if (m.any_device) comm::cuda::event_record(m.backward_end_event, m.options.cuda_stream);
#endif
    for (size_t i = 0; i < m.grads.size(); ++i) {
      if (!m.ready[i]) m.mark_locked(i);
    }
    m.launch_ready_locked();
  }

  try {
    if (m.size == 1) {
      // Sum over one rank: the gradient itself, times both factors.
      for (size_t b = 0; b < m.buckets.size(); ++b) {
        const Bucket& bk = m.buckets[b];
        for (size_t g : bk.gradients) {
          Tensor& t = m.grads[g];
          if (bk.device.is_cpu()) {
            comm::host_scale(t.raw(), t.numel(), t.dtype(), m.local_factor * s);
          } else {
#ifdef TNT_WITH_CUDA
            comm::cuda::scale(t.raw(), t.numel(), t.dtype(), m.local_factor * s, m.options.cuda_stream);
#endif
          }
        }
        m.current.buckets[b].start_s = m.current.buckets[b].end_s = m.current.buckets[b].ready_s;
      }
    } else {
      // Host buckets the thread did not take (no overlap): reduce them now, in order.
      if (!m.threaded) {
        for (size_t b = 0; b < m.buckets.size(); ++b) {
          if (m.is_device(b)) continue;
          m.current.buckets[b].start_s = m.since_t0();
          m.reduce_host(b, m.local_factor);
          m.current.buckets[b].end_s = m.since_t0();
        }
      }
      {
        std::unique_lock<std::mutex> lk(m.mu);
        m.done_cv.wait(lk, [&] { return m.host_done == m.host_launched; });
        if (m.error) std::rethrow_exception(m.error);
      }
      for (size_t b = 0; b < m.buckets.size(); ++b) {
        if (!m.is_device(b)) m.unpack_host(b, s);
      }
#ifdef TNT_WITH_CUDA
      if (m.any_device) {
        detail::CommImpl& c = detail::impl_of(*m.comm);
        for (size_t b = 0; b < m.buckets.size(); ++b) {
          if (!m.is_device(b)) continue;
          const Bucket& bk = m.buckets[b];
          c.nccl->synchronize(m.events[b].done, fmt::format("Reducer bucket {} ({} B)", b, bk.bytes), c.deadline());
          if (m.fused[b].defined()) {
            comm::cuda::unpack(m.items(b), m.fused[b].raw(), bk.dtype, s, m.options.cuda_stream);
          } else {
            Tensor& g = m.grads[bk.gradients[0]];
            comm::cuda::scale(g.raw(), g.numel(), g.dtype(), s, m.options.cuda_stream);
          }
          auto ms = [&](void* e) { return comm::cuda::event_elapsed_ms(m.step_start_event, e) / 1000.0; };
          m.current.buckets[b] = {ms(m.events[b].ready), ms(m.events[b].start), ms(m.events[b].done)};
        }
        m.current.backward_end_s = comm::cuda::event_elapsed_ms(m.step_start_event, m.backward_end_event) / 1000.0;
      }
#endif
    }
  } catch (...) {
    m.broken = true;
    throw;
  }

  std::lock_guard<std::mutex> lk(m.mu);
  m.current.finalize_end_s = m.since_t0();
  m.last = m.current;
  m.current = StepTiming{};
  m.current.buckets.assign(m.buckets.size(), {});
  std::fill(m.ready.begin(), m.ready.end(), 0);
  for (size_t b = 0; b < m.buckets.size(); ++b) m.missing[b] = static_cast<int>(m.buckets[b].gradients.size());
  m.next_launch = 0;
  m.host_launched = m.host_done = 0;
  m.in_step = false;
}

size_t Reducer::num_gradients() const { return impl_->grads.size(); }
const std::vector<Reducer::Bucket>& Reducer::buckets() const { return impl_->buckets; }
int64_t Reducer::threshold_bytes() const { return impl_->threshold; }
const StepTiming& Reducer::last_step() const { return impl_->last; }

std::string Reducer::plan() const {
  const Impl& m = *impl_;
  std::string out;
  for (size_t b = 0; b < m.buckets.size(); ++b) {
    const Bucket& bk = m.buckets[b];
    out += fmt::format("bucket {}: {} B {} on {}, {} gradient(s):", b, bk.bytes, dtype_name(bk.dtype), bk.device.str(),
                       bk.gradients.size());
    for (size_t g : bk.gradients) out += " " + m.names[g];
    out += "\n";
  }
  return out;
}

}  // namespace tnt
