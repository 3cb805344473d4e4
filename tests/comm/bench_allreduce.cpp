// tnt_allreduce_bench: allreduce timings in the style of nccl-tests, and the Reducer alone
// on ResNet-50's gradients. Run under `tarantella -n P` or `mpirun -np P`.
//
//   tnt_allreduce_bench -b 8 -e 128M -f 2 -w 5 -n 20 -c 1 --algo ring,mpi --dtype f32 --device cpu
//   tnt_allreduce_bench --mode reducer -w 3 -n 10
//   tnt_allreduce_bench --mode reducer --algo nccl --device gpu -w 3 -n 20   (the GPU kit)
//
// allreduce mode: one row per size and algorithm,
//   size count type algo time_us algbw_GBps busbw_GBps wrong
// time_us: the mean over -n iterations of the slowest rank, median over -r rounds (the
// algorithms take turns round by round, so load bursts on a shared machine hit each
// alike); algbw = size / time;
// busbw = algbw * 2(p-1)/p (what each rank's link carries in a ring, so numbers compare
// across rank counts); wrong = elements that differ from the closed-form result in a
// separate checked run (-c 1). Rows whose algo reads "ring(rd)" ran the ring's
// small-message path (recursive doubling, below kRingSmallBytes). "mpi-blocking" is plain
// MPI_Allreduce (Open MPI's own choice of algorithm, no timeout), the reference;
// "mpi" is the library's mpi path (MPI_Iallreduce polled against the timeout).
// A memcpy row set follows: the machine's own copy bandwidth at each size, every rank
// copying at once, for scale.
//
// reducer mode: ResNet-50's 161 parameter tensors (torchvision resnet50 shapes, f32)
// as host gradients; every step marks them ready in reverse registration order (as
// backward would) and finalizes. One row per fusion threshold: time per step.
#include "comm/waiter.hpp"
#include "comm/ring_allreduce.hpp"
#include "core/half.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/log.hpp"
#include "tarantella/reducer.hpp"
#include "tarantella/runtime.hpp"

#include <cxxopts.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

using namespace tnt;

namespace {

using Clock = std::chrono::steady_clock;

int64_t parse_size(const std::string& text) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (...) {
    throw InputError(fmt::format("size '{}' is not a number with an optional K, M or G suffix", text));
  }
  std::string suffix = text.substr(pos);
  double mult = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB") {
    mult = 1024;
  } else if (suffix == "M" || suffix == "m" || suffix == "MiB") {
    mult = 1024.0 * 1024;
  } else if (suffix == "G" || suffix == "g" || suffix == "GiB") {
    mult = 1024.0 * 1024 * 1024;
  } else if (!(suffix.empty() || suffix == "B")) {
    throw InputError(fmt::format("size '{}': unknown suffix '{}' (K, M or G)", text, suffix));
  }
  if (v < 0) throw InputError(fmt::format("size '{}' is negative", text));
  return static_cast<int64_t>(v * mult);
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Rank r's value at element i: small integers, so every sum is exact (also in f16/bf16).
double value(int64_t i, int r) { return static_cast<double>((i * 7 + r * 13) % 31 - 15); }

void fill_host(void* data, int64_t count, DType dtype, int r) {
  for (int64_t i = 0; i < count; ++i) {
    double v = value(i, r);
    switch (dtype) {
      case DType::f32: static_cast<float*>(data)[i] = static_cast<float>(v); break;
      case DType::f64: static_cast<double*>(data)[i] = v; break;
      case DType::i32: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v); break;
      case DType::i64: static_cast<int64_t*>(data)[i] = static_cast<int64_t>(v); break;
      case DType::f16: static_cast<uint16_t*>(data)[i] = float_to_f16(static_cast<float>(v)); break;
      case DType::bf16: static_cast<uint16_t*>(data)[i] = float_to_bf16(static_cast<float>(v)); break;
      default: throw InputError(fmt::format("--dtype {} is not supported", dtype_name(dtype)));
    }
  }
}

struct Row {
  double time_us = 0;
  int64_t wrong = 0;
};

class AllreduceRunner {
 public:
  AllreduceRunner(Communicator& comm, const std::string& algo, DType dtype, Device device)
      : comm_(comm), algo_(algo), dtype_(dtype), device_(device) {}

  void run_once(Tensor& t) {
    if (algo_ == "mpi-blocking") {
      TNT_CHECK(device_.is_cpu(), "mpi-blocking works on host buffers");
      TNT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, t.raw(), static_cast<int>(t.numel()), mpi_type(), MPI_SUM,
                                  detail::impl_of(comm_).comm));
    } else {
      comm_.allreduce(t, ReduceOp::sum, parse_allreduce_algo(algo_));
    }
  }

  // Allocates and fills the buffer and runs the warmup iterations.
  void prepare(int64_t count, int warmup) {
    t_ = Tensor::empty({count}, dtype_, device_);  // (count,)
    host_ = Tensor::empty({count}, dtype_, Device::cpu());
    fill_host(host_.raw(), count, dtype_, comm_.rank());
    t_.copy_from(host_);
    for (int i = 0; i < warmup; ++i) run_once(t_);
  }

  // Mean time per iteration over iters iterations, of the slowest rank.
  double time_us(int iters) {
    comm_.barrier();
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) run_once(t_);
    double mine = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / std::max(1, iters);
    return comm_.allreduce_max(mine);
  }

  // Elements that differ from the closed form after one allreduce of fresh data, all ranks.
  int64_t wrong() {
    t_.copy_from(host_);
    run_once(t_);
    std::vector<double> got = t_.to_double_vector();
    int64_t bad = 0;
    for (int64_t i = 0; i < t_.numel(); ++i) {
      double expect = 0;
      for (int q = 0; q < comm_.size(); ++q) expect += value(i, q);
      bad += got[static_cast<size_t>(i)] != expect;
    }
    return comm_.allreduce_sum(bad);
  }

  void release() {
    t_ = Tensor();
    host_ = Tensor();
  }

 private:
  MPI_Datatype mpi_type() const {
    switch (dtype_) {
      case DType::f32: return MPI_FLOAT;
      case DType::f64: return MPI_DOUBLE;
      case DType::i32: return MPI_INT32_T;
      case DType::i64: return MPI_INT64_T;
      default: throw InputError(fmt::format("mpi-blocking: no MPI type for {}", dtype_name(dtype_)));
    }
  }

  Communicator& comm_;
  std::string algo_;
  DType dtype_;
  Device device_;
  Tensor t_, host_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double memcpy_us(int64_t bytes, int warmup, int iters, Communicator& comm) {
  std::vector<char> src(static_cast<size_t>(std::max<int64_t>(bytes, 1)), 1), dst(src.size(), 0);
  for (int i = 0; i < warmup; ++i) std::memcpy(dst.data(), src.data(), static_cast<size_t>(bytes));
  comm.barrier();
  // Enough repetitions that tiny copies are measurable.
  int reps = std::max<int>(iters, static_cast<int>((int64_t{16} << 20) / std::max<int64_t>(bytes, 4096)));
  auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) {
    std::memcpy(dst.data(), src.data(), static_cast<size_t>(bytes));
    asm volatile("" : : "r"(dst.data()) : "memory");  // keep the copy
  }
  double mine = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / reps;
  return comm.allreduce_max(mine);
}

void allreduce_mode(const cxxopts::ParseResult& args) {
  Communicator& comm = communicator();
  const int p = comm.size();
  int64_t min_bytes = parse_size(args["minbytes"].as<std::string>());
  int64_t max_bytes = parse_size(args["maxbytes"].as<std::string>());
  double factor = args["stepfactor"].as<double>();
  int warmup = args["warmup_iters"].as<int>();
  int iters = args["iters"].as<int>();
  int rounds = std::max(1, args["rounds"].as<int>());
  bool check = args["check"].as<int>() != 0;
  DType dtype = dtype_from_name(args["dtype"].as<std::string>());
  std::string dev = args["device"].as<std::string>();
  if (dev != "cpu" && dev != "gpu") throw InputError(fmt::format("--device {}: use cpu or gpu", dev));
  Device device = dev == "cpu" ? Device::cpu() : Device::cuda(default_device().is_cuda() ? default_device().index : 0);
  std::vector<std::string> algos = split(args["algo"].as<std::string>());
  if (factor <= 1.0) throw InputError(fmt::format("-f {}: the step factor must be greater than 1", factor));
  if (min_bytes > max_bytes) throw InputError(fmt::format("-b {} is larger than -e {}", min_bytes, max_bytes));
  for (const std::string& a : algos) {
    if (a != "ring" && a != "mpi" && a != "nccl" && a != "mpi-blocking") {
      throw InputError(fmt::format("--algo {}: use ring, mpi, mpi-blocking or nccl (comma-separated)", a));
    }
  }
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));

  tnt::print("# tnt_allreduce_bench: {} rank(s), dtype {}, device {}, warmup {}, iters {}, rounds {}, check {}", p,
             dtype_name(dtype), device.str(), warmup, iters, rounds, check ? 1 : 0);
  tnt::print("# busbw = algbw * 2(p-1)/p; time: median over rounds of the mean per iteration of the slowest rank;");
  tnt::print("# ring(rd): the ring's small-message path (recursive doubling below {} B); mpi-blocking: plain "
             "MPI_Allreduce; mpi: MPI_Iallreduce polled against the timeout",
             detail::impl_of(comm).small_bytes);
  tnt::print("# {:>12} {:>12} {:>5} {:>12} {:>11} {:>11} {:>11} {:>6}", "size", "count", "type", "algo", "time_us",
             "algbw_GBps", "busbw_GBps", "wrong");
  std::vector<int64_t> sizes;
  for (double b = static_cast<double>(std::max<int64_t>(min_bytes, elem)); b <= static_cast<double>(max_bytes) * 1.0000001;
       b *= factor) {
    int64_t count = static_cast<int64_t>(b) / elem;
    if (sizes.empty() || count * elem != sizes.back()) sizes.push_back(count * elem);
  }
  std::vector<AllreduceRunner> runners;
  for (const std::string& a : algos) runners.emplace_back(comm, a, dtype, device);
  // Warm the communication paths (and the CPU clock) before the first row: 2000 calls of a
  // small first size, but no more than about 256 MB moved (2000 calls of 16 MB took 7
  // minutes on a 1 Gbit/s link).
  for (auto& r : runners) {
    const int64_t first = sizes.empty() ? elem : std::max<int64_t>(elem, sizes[0]);
    r.prepare(first / elem, static_cast<int>(std::clamp<int64_t>((int64_t{256} << 20) / first, 2, 2000)));
    r.release();
  }
  const double bus = p > 1 ? 2.0 * (p - 1) / p : 0.0;
  for (int64_t bytes : sizes) {
    int64_t count = bytes / elem;
    // Fewer iterations for huge sizes keep a sweep to a few minutes on a small machine.
    int n = bytes >= (int64_t{32} << 20) ? std::max(2, iters / 4) : iters;
    std::vector<std::vector<double>> times(algos.size());
    for (auto& r : runners) r.prepare(count, warmup);
    // Rounds interleave the algorithms, so a burst of load on a shared machine hits them
    // alike; the median over rounds is reported.
    for (int round = 0; round < rounds; ++round) {
      for (size_t k = 0; k < algos.size(); ++k) times[k].push_back(runners[k].time_us(n));
    }
    for (size_t k = 0; k < algos.size(); ++k) {
      double us = median(times[k]);
      int64_t bad = check ? runners[k].wrong() : 0;
      runners[k].release();
      std::string label = algos[k];
      if (label == "ring" && device.is_cpu() && comm::ring_uses_recursive_doubling(detail::impl_of(comm), count, dtype)) {
        label = "ring(rd)";
      }
      double algbw = us > 0 ? static_cast<double>(bytes) / us / 1e3 : 0;
      tnt::print("  {:>12} {:>12} {:>5} {:>12} {:>11.2f} {:>11.3f} {:>11.3f} {:>6}", bytes, count, dtype_name(dtype), label,
                 us, algbw, algbw * bus, check ? std::to_string(bad) : "-");
    }
  }
  tnt::print("# memcpy on every rank at once (the machine's copy bandwidth, for scale)");
  for (int64_t bytes : sizes) {
    double us = memcpy_us(bytes, warmup, iters, comm);
    double bw = us > 0 ? static_cast<double>(bytes) / us / 1e3 : 0;
    tnt::print("  {:>12} {:>12} {:>5} {:>12} {:>11.2f} {:>11.3f} {:>11.3f} {:>6}", bytes, bytes / elem, dtype_name(dtype),
          "memcpy", us, bw, bw, 0);
  }
}

// torchvision resnet50, named_parameters() order.
std::vector<std::pair<std::string, Shape>> resnet50_parameters() {
  std::vector<std::pair<std::string, Shape>> out;
  auto conv = [&](const std::string& name, int64_t o, int64_t i, int64_t k) { out.push_back({name + ".weight", {o, i, k, k}}); };
  auto bn = [&](const std::string& name, int64_t c) {
    out.push_back({name + ".weight", {c}});
    out.push_back({name + ".bias", {c}});
  };
  conv("conv1", 64, 3, 7);
  bn("bn1", 64);
  const int blocks[4] = {3, 4, 6, 3};
  int64_t in = 64;
  for (int layer = 0; layer < 4; ++layer) {
    int64_t width = int64_t{64} << layer, out_ch = width * 4;
    for (int b = 0; b < blocks[layer]; ++b) {
      std::string base = fmt::format("layer{}.{}", layer + 1, b);
      conv(base + ".conv1", width, in, 1);
      bn(base + ".bn1", width);
      conv(base + ".conv2", width, width, 3);
      bn(base + ".bn2", width);
      conv(base + ".conv3", out_ch, width, 1);
      bn(base + ".bn3", out_ch);
      if (b == 0) {
        conv(base + ".downsample.0", out_ch, in, 1);
        bn(base + ".downsample.1", out_ch);
      }
      in = out_ch;
    }
  }
  out.push_back({"fc.weight", {1000, 2048}});
  out.push_back({"fc.bias", {1000}});
  return out;
}

void reducer_mode(const cxxopts::ParseResult& args) {
  Communicator& comm = communicator();
  const int p = comm.size();
  int warmup = args["warmup_iters"].as<int>();
  int iters = args["iters"].as<int>();
  std::string algo = args["algo"].as<std::string>();
  if (algo.find(',') != std::string::npos || algo == "mpi-blocking") {
    throw InputError("--mode reducer takes one --algo: ring, mpi or nccl");
  }
  std::string dev = args["device"].as<std::string>();
  Device device = dev == "gpu" ? Device::cuda(default_device().is_cuda() ? default_device().index : 0) : Device::cpu();
  auto params = resnet50_parameters();
  std::vector<std::pair<std::string, Tensor>> grads;
  int64_t numel = 0;
  for (auto& [name, shape] : params) {
    grads.emplace_back(name, Tensor::full(shape, 1.0, DType::f32, device));
    numel += shape_numel(shape);
  }
  const double bytes = static_cast<double>(numel) * 4;
  tnt::print("# tnt_allreduce_bench --mode reducer: ResNet-50, {} gradient tensors, {} parameters ({:.1f} MB f32), {} "
        "rank(s), {}, algo {}, warmup {}, iters {}",
        grads.size(), numel, bytes / 1e6, p, device.str(), algo, warmup, iters);
  tnt::print("# step: mark all ready in reverse order, then finalize; time: mean per step of the slowest rank");
  tnt::print("# {:>12} {:>8} {:>10} {:>11} {:>11}", "threshold_B", "buckets", "step_ms", "algbw_GBps", "busbw_GBps");
  const double bus = p > 1 ? 2.0 * (p - 1) / p : 0.0;
  for (int64_t threshold : {int64_t{0}, int64_t{32} << 10, int64_t{256} << 10, int64_t{1} << 20, int64_t{4} << 20,
                            int64_t{25} << 20, int64_t{128} << 20}) {
    Reducer reducer(comm, grads, {.threshold_bytes = threshold, .algo = parse_allreduce_algo(algo)});
    auto step = [&] {
      for (size_t i = grads.size(); i-- > 0;) reducer.mark_ready(i);
      reducer.finalize();
    };
    for (int i = 0; i < warmup; ++i) step();
    comm.barrier();
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) step();
    double mine = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / std::max(1, iters);
    double ms = comm.allreduce_max(mine);
    double algbw = ms > 0 ? bytes / ms / 1e6 : 0;
    tnt::print("  {:>12} {:>8} {:>10.2f} {:>11.3f} {:>11.3f}", threshold, reducer.buckets().size(), ms, algbw, algbw * bus);
  }
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("tnt_allreduce_bench", "allreduce and Reducer timings (nccl-tests style)");
  options.add_options()
      ("b,minbytes", "smallest size (bytes; K, M, G suffixes)", cxxopts::value<std::string>()->default_value("8"))
      ("e,maxbytes", "largest size", cxxopts::value<std::string>()->default_value("128M"))
      ("f,stepfactor", "size multiplier between rows", cxxopts::value<double>()->default_value("2"))
      ("w,warmup_iters", "untimed iterations per size", cxxopts::value<int>()->default_value("5"))
      ("n,iters", "timed iterations per size", cxxopts::value<int>()->default_value("20"))
      ("c,check", "1: check results in a separate run", cxxopts::value<int>()->default_value("1"))
      ("r,rounds", "rounds of -n iterations per size, algorithms interleaved; the median is shown",
       cxxopts::value<int>()->default_value("5"))
      ("algo", "ring, mpi, mpi-blocking or nccl; comma-separated for several", cxxopts::value<std::string>()->default_value("ring"))
      ("dtype", "f32, f64, i32, i64 (host); f32, f16, bf16 (gpu)", cxxopts::value<std::string>()->default_value("f32"))
      ("device", "cpu or gpu", cxxopts::value<std::string>()->default_value("cpu"))
      ("mode", "allreduce or reducer", cxxopts::value<std::string>()->default_value("allreduce"))
      ("ring-small", "tuning: bytes below which ring runs recursive doubling (default: the library's)",
       cxxopts::value<int64_t>()->default_value("-1"))
      ("ring-segment", "tuning: ring segment bytes (default: TNT_RING_SEGMENT)", cxxopts::value<int64_t>()->default_value("-1"))
      ("min-segment", "tuning: smallest ring segment bytes", cxxopts::value<int64_t>()->default_value("-1"))
      ("spin-us", "tuning: microseconds a wait polls before yielding", cxxopts::value<int64_t>()->default_value("-1"))
      ("h,help", "this text");
  cxxopts::ParseResult args;
  try {
    args = options.parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tnt_allreduce_bench: %s\n%s", e.what(), options.help().c_str());
    return 2;
  }
  if (args.count("help")) {
    std::printf("%s", options.help().c_str());
    return 0;
  }
  return run_main(argc, argv, [&] {
    detail::CommImpl& impl = detail::impl_of(communicator());
    if (args["ring-small"].as<int64_t>() >= 0) impl.small_bytes = args["ring-small"].as<int64_t>();
    if (args["ring-segment"].as<int64_t>() > 0) {
      impl.ring_segment_bytes = static_cast<size_t>(args["ring-segment"].as<int64_t>());
    }
    if (args["min-segment"].as<int64_t>() > 0) impl.min_segment_bytes = args["min-segment"].as<int64_t>();
    if (args["spin-us"].as<int64_t>() >= 0) impl.spin_us = args["spin-us"].as<int64_t>();
    std::string mode = args["mode"].as<std::string>();
    if (mode == "allreduce") {
      allreduce_mode(args);
    } else if (mode == "reducer") {
      reducer_mode(args);
    } else {
      throw InputError(fmt::format("--mode {}: use allreduce or reducer", mode));
    }
  });
}
