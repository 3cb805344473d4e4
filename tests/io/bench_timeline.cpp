// What the timeline costs: the wall time of Model::fit per step without a timeline and with
// one recording every step (its part written every step, merged at the end of each fit),
// alternating, ROUNDS times; medians and the overhead. Prints events per step of the trace,
// and the cost of one event (recorded by a Span, then formatted and written to the part
// file), measured over 200000 events outside training, free of the step's noise.
//
//   mpirun -np 2 build/bin/tnt_timeline_bench [ROUNDS] [STEPS] [WIDTH]
//
// The network: an MLP 256 -> WIDTH -> WIDTH -> WIDTH -> 10 (default WIDTH 512), global batch
// 64, SGD; one fit of STEPS steps (default 40) per measurement.
#include "io/timeline.hpp"
#include "tarantella/tarantella.hpp"
#include "tarantella/timeline.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// This process's CPU time (all threads): less disturbed by other work on a shared machine
// than wall time, for one rank (with several, MPI's polling while waiting counts too).
double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 40;
  const int64_t width = argc > 3 ? std::atoll(argv[3]) : 512;
  return tnt::run_main(argc, argv, [&] {
    TNT_INPUT_CHECK(rounds > 0 && steps > 0 && width > 0, "usage: tnt_timeline_bench [ROUNDS>0] [STEPS>0] [WIDTH>0]");
    const int64_t batch = 64;
    auto net = std::make_shared<tnt::Sequential>("mlp");
    net->add(std::make_shared<tnt::Dense>(width, "fc1"));
    net->add(std::make_shared<tnt::ReLU>("relu1"));
    net->add(std::make_shared<tnt::Dense>(width, "fc2"));
    net->add(std::make_shared<tnt::ReLU>("relu2"));
    net->add(std::make_shared<tnt::Dense>(width, "fc3"));
    net->add(std::make_shared<tnt::ReLU>("relu3"));
    net->add(std::make_shared<tnt::Dense>(10, "fc4"));
    net->build({256});
    tnt::Model model(net, 1);
    model.compile(std::make_shared<tnt::SGD>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
    tnt::Tensor x = tnt::Tensor::empty({batch * steps, 256});
    tnt::Tensor y = tnt::Tensor::empty({batch * steps}, tnt::DType::i64);
    tnt::CounterRng rng(3, "bench");
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = rng.uniform(static_cast<uint64_t>(i));
    for (int64_t n = 0; n < y.numel(); ++n) y.data<int64_t>()[n] = n % 10;
    tnt::Dataset data = tnt::Dataset::from_tensors({x, y});
    tnt::FitOptions fit;
    fit.batch_size = batch;
    fit.epochs = 1;
    fit.verbose = 0;

    std::string dir;
    if (tnt::is_master_rank()) {
      char tmpl[] = "/tmp/tnt_timeline_bench_XXXXXX";
      TNT_CHECK(mkdtemp(tmpl) != nullptr, "mkdtemp failed");
      dir = tmpl;
    }
    tnt::communicator().broadcast(dir);
    const std::string path = dir + "/trace.json";

    model.fit(data, fit);  // warm up: primitives, buffers, the Reducer
    std::vector<double> off, on, cpu_off, cpu_on, step_off, step_on, merge;
    for (int r = 0; r < rounds; ++r) {
      tnt::communicator().barrier();
      double t0 = now(), c0 = cpu_now();
      model.fit(data, fit);
      cpu_off.push_back((cpu_now() - c0) / static_cast<double>(steps));
      step_off.push_back(model.last_epoch_timing().step_seconds);
      tnt::communicator().barrier();
      off.push_back((now() - t0) / static_cast<double>(steps));

      const int64_t first = model.global_step() + 1;
      tnt::start_timeline(path, first, first + steps - 1);
      tnt::communicator().barrier();
      t0 = now();
      c0 = cpu_now();
      model.fit(data, fit);  // merges at its end
      cpu_on.push_back((cpu_now() - c0) / static_cast<double>(steps));
      step_on.push_back(model.last_epoch_timing().step_seconds);
      tnt::communicator().barrier();
      on.push_back((now() - t0) / static_cast<double>(steps));
      const double m0 = now();
      tnt::stop_timeline();  // merges everything again: the cost of one merge
      merge.push_back(now() - m0);
    }
    // One event: a Span while recording, then its share of the flush to the part.
    const int kEvents = 200000;
    double per_event = 0;
    {
      tnt::timeline::Recorder recorder(tnt::communicator(), path + ".events", 1, 1);
      recorder.step_begin(1, 0, now());
      const double t0 = now();
      for (int i = 0; i < kEvents; ++i) recorder.add(tnt::timeline::Lane::compute, "forward", "tarantella", t0, t0);
      recorder.step_begin(2, 0, now());  // formats and writes them
      per_event = (now() - t0) / kEvents;
      std::remove((path + ".events.rank" + std::to_string(tnt::rank())).c_str());
    }
    if (tnt::is_master_rank()) {
      std::ifstream in(path);
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string text = ss.str();
      size_t events = 0;
      for (size_t at = text.find("\"ph\":\"X\""); at != std::string::npos; at = text.find("\"ph\":\"X\"", at + 1)) ++events;
      const double m_off = median(off), m_on = median(on);
      tnt::print("ranks {}, MLP width {}, global batch {}, {} steps per fit, {} rounds", tnt::size(), width, batch,
                 steps, rounds);
      tnt::print("timeline off: {:.3f} ms/step (median)", m_off * 1e3);
      tnt::print("timeline on:  {:.3f} ms/step (median), {:.1f} events per step over all ranks", m_on * 1e3,
                 static_cast<double>(events) / static_cast<double>(steps));
      tnt::print("overhead: {:+.2f}% ({:+.1f} us/step)", 100.0 * (m_on - m_off) / m_off, (m_on - m_off) * 1e6);
      tnt::print("training step alone (EpochTiming): off {:.3f} ms, on {:.3f} ms; one merge at the end of fit: {:.1f} ms",
                 median(step_off) * 1e3, median(step_on) * 1e3, median(merge) * 1e3);
      const double c_off = median(cpu_off), c_on = median(cpu_on);
      tnt::print("rank 0 CPU time: off {:.3f} ms/step, on {:.3f} ms/step, overhead {:+.2f}%", c_off * 1e3, c_on * 1e3,
                 100.0 * (c_on - c_off) / c_off);
      const double per_step = per_event * static_cast<double>(events) / static_cast<double>(steps * tnt::size());
      tnt::print("one event: {:.3f} us recorded and written; x {:.1f} events per step and rank = {:.1f} us/step "
                 "= {:.2f}% of the step without a timeline",
                 per_event * 1e6, static_cast<double>(events) / static_cast<double>(steps * tnt::size()),
                 per_step * 1e6, 100.0 * per_step / m_off);
      std::remove(path.c_str());
      rmdir(dir.c_str());
    }
  });
}
