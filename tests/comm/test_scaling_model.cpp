// The scaling model alone (comm/scaling_model): allreduce costs, the overlap of buckets with
// backward, the threshold search and the profile file, on cases small enough to compute by
// hand (the arithmetic is in the comments). Times are compared with a relative tolerance of
// 1e-9: the model is a few additions and one division per bucket in double precision, so
// anything larger than rounding is a wrong formula.
#include "comm/scaling_model.hpp"

#include <catch2/catch.hpp>

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace tnt::comm::scaling;
using Catch::Matchers::Contains;

namespace {

Approx near(double v) { return Approx(v).epsilon(1e-9).margin(1e-15); }

Link link(double latency_s, double bytes_per_s) { return {latency_s, bytes_per_s}; }

// Backward of 20 ms; three 4000-byte gradients in registration order A, B, C, final at 20,
// 16 and 5 ms (backward runs the other way: C first).
Profile three_gradients() {
  Profile p;
  p.input_s = 0.001;
  p.forward_s = 0.010;
  p.backward_s = 0.020;
  p.optimizer_s = 0.002;
  p.samples_per_rank = 10;
  p.threshold_bytes = 32 * 1024;
  p.gradients = {{"A", 4000, 0.020}, {"B", 4000, 0.016}, {"C", 4000, 0.005}};
  return p;
}

// Two nodes, one rank each: an allreduce of n bytes costs 2 latency + n / bandwidth.
Network two_nodes(double latency_s, double bytes_per_s) {
  Network n;
  n.nodes = 2;
  n.ranks_per_node = 1;
  n.inter = link(latency_s, bytes_per_s);
  n.intra = link(1e-6, 1e10);
  return n;
}

}  // namespace

TEST_CASE("ring allreduce cost within a node, hierarchical and flat") {
  Network n;
  n.intra = link(1e-6, 1e9);
  n.inter = link(1e-5, 1e8);
  n.ranks_per_node = 4;
  n.nodes = 1;
  // 2*3*1 us + 2*3/4 * 1e6 B / 1e9 B/s = 6 us + 1.5 ms
  CHECK(allreduce_s(1000000, n) == near(1.506e-3));
  n.nodes = 2;
  // within: 1.506 ms; across 2 nodes: 2*1*10 us + 2*1/2 * 1e6 / 1e8 = 10.02 ms
  CHECK(allreduce_s(1000000, n) == near(1.506e-3 + 10.02e-3));
  n.hierarchical = false;
  // 8 ranks in one ring, each step bound by the inter-node link: 14 * (10 us + 125000 B / 1e8)
  CHECK(allreduce_s(1000000, n) == near(14 * (1e-5 + 1.25e-3)));
  // A flat ring whose edges within a node are the slower ones: they set the pace.
  n.intra = link(1e-4, 1e8);
  CHECK(allreduce_s(1000000, n) == near(14 * (1e-4 + 1.25e-3)));
  n.ranks_per_node = 1;
  n.nodes = 4;
  // one rank per node: 2*3*10 us + 2*3/4 * 1e6 / 1e8
  CHECK(allreduce_s(1000000, n) == near(6e-5 + 15e-3));
  n.nodes = 1;
  CHECK(allreduce_s(1000000, n) == 0);
}

TEST_CASE("a fitted allreduce line gives back the link it was made from") {
  // 4 ranks over latency 1 us and 1e9 B/s: a = 6 us, b = 1.5 / 1e9 s per byte.
  std::vector<int64_t> sizes{1024, 65536, 1 << 20, 4 << 20};
  std::vector<double> times;
  for (int64_t s : sizes) times.push_back(6e-6 + 1.5e-9 * static_cast<double>(s));
  const AllreduceFit fit = fit_allreduce(sizes, times, 4);
  CHECK(fit.a_s == Approx(6e-6).epsilon(1e-6));
  CHECK(fit.b_s_per_byte == Approx(1.5e-9).epsilon(1e-9));
  const Link l = link_from_fit(fit);
  CHECK(l.latency_s == Approx(1e-6).epsilon(1e-6));
  CHECK(l.bytes_per_s == Approx(1e9).epsilon(1e-6));
  CHECK_THROWS_AS(fit_allreduce({1024, 1024}, {1e-6, 2e-6}, 2), std::invalid_argument);
  CHECK_THROWS_AS(link_from_fit(AllreduceFit{1, 1e-6, 1e-9}), std::invalid_argument);
}

TEST_CASE("a fit of measured costs keeps both ends") {
  const std::vector<int64_t> sizes{4096, 32768, 262144, 1048576, 4194304};
  // Measured on the test bed at 200 Mbit/s (ms): one fast small allreduce, then the token
  // bucket's rate. The line must follow the large sizes: slope 63.4 ms/MB from the larger
  // three; the small ones' intercepts are below zero, so the smallest size's 10 us stands in
  // for the latency; 1.6 MB: 101.5 ms.
  AllreduceFit f = fit_allreduce(sizes, {0.010e-3, 0.524e-3, 10.733e-3, 43.676e-3, 254.421e-3}, 2);
  CHECK(f.a_s == Approx(0.010e-3));
  CHECK(f.a_s + f.b_s_per_byte * 1.6e6 == Approx(0.1015).epsilon(0.001));
  // Measured on two ranks of one host (ms): costs that curve, flat from 32 KB to 256 KB.
  // A least-squares line over them crosses zero below the origin; the latency must stay.
  f = fit_allreduce(sizes, {0.672e-3, 1.424e-3, 1.483e-3, 1.849e-3, 3.235e-3}, 2);
  CHECK(f.a_s > 0.5e-3);
  CHECK(f.a_s < 1.5e-3);
  CHECK(f.b_s_per_byte > 0);
  // A loaded machine swapped the larger sizes' medians (ms; two ranks sharing two cores):
  // the line from the smallest to the largest size still charges bytes.
  f = fit_allreduce({8192, 65536, 524288}, {0.30e-3, 1.20e-3, 1.10e-3}, 2);
  CHECK(f.b_s_per_byte == Approx((1.10e-3 - 0.30e-3) / (524288 - 8192)));
  CHECK(f.a_s > 0);
  // A loaded machine made the larger sizes' slope steep (ms; the shape of a CI run whose
  // latency came out 0): 26 KB's intercept under the slope of 209 KB -> 1.67 MB is below
  // zero, and the latency is 26 KB's own time, never 0.
  f = fit_allreduce({26112, 208896, 1671168}, {0.040e-3, 0.080e-3, 2.500e-3}, 2);
  CHECK(f.b_s_per_byte == Approx((2.500e-3 - 0.080e-3) / (1671168 - 208896)));
  CHECK(f.a_s == Approx(0.040e-3));
  // The smallest size slower than the largest (ms; a CI run beside other tests, fashion_mnist's
  // 1.7 MB of gradients): no line charges bytes, so the largest size's time per byte
  // stands in (an upper bound), never a slope of 0.
  f = fit_allreduce({26112, 208896, 1671168}, {0.900e-3, 0.700e-3, 0.600e-3}, 2);
  CHECK(f.b_s_per_byte == Approx(0.600e-3 / 1671168));
  CHECK(f.a_s > 0);
}

TEST_CASE("buckets overlap backward on one channel, in bucket order") {
  const Profile p = three_gradients();
  // Zero latency, 1e6 B/s: a 4000-byte bucket takes 4 ms, 8000 B 8 ms, 12000 B 12 ms.
  const Network net = two_nodes(0, 1e6);

  SECTION("one bucket per gradient: C 5-9, B 16-20, A 20-24; 4 ms exposed") {
    const Prediction pr = predict(p, net, 0);
    CHECK(pr.buckets == 3);
    CHECK(pr.comm_s == near(0.012));
    CHECK(pr.exposed_s == near(0.004));
    CHECK(pr.hidden_share == near(8.0 / 12.0));
    CHECK(pr.step_s == near(0.001 + 0.010 + 0.020 + 0.004 + 0.002));
    CHECK(pr.throughput == near(20 / 0.037));
  }
  SECTION("8000 bytes: [C, B] at 16 ms until 24, [A] waits for it, 24-28") {
    const Prediction pr = predict(p, net, 8000);
    CHECK(pr.buckets == 2);
    CHECK(pr.exposed_s == near(0.008));
    CHECK(pr.hidden_share == near(4.0 / 12.0));
  }
  SECTION("one bucket: all 12000 bytes after backward") {
    const Prediction pr = predict(p, net, 1 << 20);
    CHECK(pr.buckets == 1);
    CHECK(pr.exposed_s == near(0.012));
    CHECK(pr.hidden_share == near(0));
  }
  SECTION("the search takes the fastest, and the smaller threshold on a tie") {
    // 0, 1 KB and 2 KB all give one bucket per gradient (every gradient is 4000 B).
    const Prediction best = best_prediction(p, net);
    CHECK(best.threshold_bytes == 0);
    CHECK(best.step_s == near(0.037));
  }
}

TEST_CASE("a bucket starts its launch delay after it is ready; the wait ends finish_s after the last") {
  Profile p = three_gradients();
  p.launch_delay_s = 0.001;
  p.finish_s = 0.0005;
  const Network net = two_nodes(0, 1e6);  // 4000 B: 4 ms
  // One bucket per gradient: C ready at 5, starts 6, ends 10; B ready 16, starts 17, ends
  // 21; A ready 20, the channel free at 21, starts 22, ends 26: 6 ms after backward's 20,
  // plus 0.5 ms of finish.
  Prediction pr = predict(p, net, 0);
  CHECK(pr.comm_s == near(0.012));
  CHECK(pr.exposed_s == near(0.006 + 0.0005));
  CHECK(pr.hidden_share == near(7.0 / 12.0));  // C's 4 ms and 3 of B's
  CHECK(pr.step_s == near(0.001 + 0.010 + 0.020 + 0.0065 + 0.002));
  // More buckets, more delays: one bucket at 20 + 1 ms, ends 33: 13.5 ms exposed.
  pr = predict(p, net, 1 << 20);
  CHECK(pr.exposed_s == near(0.013 + 0.0005));
  // One rank: nothing to wait for.
  Network one = net;
  one.nodes = 1;
  CHECK(predict(p, one, 0).exposed_s == 0);
  CHECK(predict(p, one, 0).step_s == near(0.033));
}

TEST_CASE("with a high latency the search fuses the small gradients") {
  Profile p;
  p.backward_s = 0.010;
  p.samples_per_rank = 1;
  // Ten 100-byte gradients, one final every millisecond.
  for (int i = 0; i < 10; ++i) p.gradients.push_back({std::string("g").append(std::to_string(i)), 100, 0.001 * (10 - i)});
  const Network net = two_nodes(0.005, 1e9);  // 10 ms latency per allreduce
  const Prediction apart = predict(p, net, 0);
  const Prediction best = best_prediction(p, net);
  CHECK(apart.exposed_s > 0.09);  // ten allreduces back to back: about 100 ms
  CHECK(best.buckets == 1);
  CHECK(best.threshold_bytes == 1024);  // the first candidate that makes one bucket
  // One bucket ready at 10 ms: 10 ms of latency plus 1000 B at 1e9 B/s, all after backward.
  CHECK(best.exposed_s == near(0.010 + 1000 / 1e9));
}

TEST_CASE("one rank: no communication, efficiency 1") {
  const Profile p = three_gradients();
  Network net = two_nodes(1e-3, 1e6);
  const std::vector<SweepRow> rows = sweep(p, net, {1}, 32 * 1024);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].at_threshold.ranks == 1);
  CHECK(rows[0].at_threshold.comm_s == 0);
  CHECK(rows[0].at_threshold.hidden_share == 1);
  CHECK(rows[0].at_threshold.step_s == near(0.033));
  CHECK(rows[0].efficiency == near(1));
  CHECK(rows[0].best_efficiency == near(1));
}

TEST_CASE("more nodes never predict a shorter step; a faster link never a longer one") {
  const Profile p = three_gradients();
  for (bool hierarchical : {true, false}) {
    Network net = two_nodes(2e-5, 5e5);
    net.ranks_per_node = 4;
    net.hierarchical = hierarchical;
    const std::vector<SweepRow> rows = sweep(p, net, {1, 2, 3, 4, 8, 16, 64, 256}, 32 * 1024);
    for (size_t i = 1; i < rows.size(); ++i) {
      CAPTURE(hierarchical, rows[i].nodes);
      CHECK(rows[i].at_threshold.step_s >= rows[i - 1].at_threshold.step_s);
      CHECK(rows[i].efficiency <= rows[i - 1].efficiency + 1e-12);
      CHECK(rows[i].best.step_s <= rows[i].at_threshold.step_s);
      CHECK(rows[i].best_efficiency <= 1 + 1e-12);
    }
    Network faster = net;
    faster.nodes = 8;
    net.nodes = 8;
    for (double bw : {1e6, 1e7, 1e8, 1e9}) {
      faster.inter.bytes_per_s = bw;
      CHECK(predict(p, faster, 0).step_s <= predict(p, net, 0).step_s);
      net = faster;
    }
  }
}

TEST_CASE("the small collectives a step are priced on the network at every rank count") {
  Network n;
  n.intra = link(1e-6, 1e9);
  n.inter = link(1e-5, 1e8);
  n.ranks_per_node = 4;
  n.nodes = 5;
  // Recursive doubling: 2 rounds within the node (1 us + 80 ns), 3 between nodes (10 us + 800 ns).
  CHECK(small_allreduce_s(80, n) == near(2 * 1.08e-6 + 3 * 10.8e-6));
  n.nodes = n.ranks_per_node = 1;
  CHECK(small_allreduce_s(80, n) == 0);
  // One rank a node: no intra-node link measured (0 bytes/s), and none needed. Seen on the
  // test bed as a NaN prediction at every node count.
  n.intra = link(0.0, 0.0);
  n.nodes = 3;
  CHECK(small_allreduce_s(80, n) == near(2 * 10.8e-6));

  // Profiled on 2 nodes over a slow link: the probe's line a = 20 ms, b = 1 us/B over 2
  // ranks is a link of 10 ms and 1e6 B/s. One 40-byte collective a step (the metrics'
  // allreduce) took 20.5 ms: one round of 10.04 ms on that link, times 20.5 / 10.04.
  Profile p = three_gradients();
  p.ranks = p.nodes = 2;
  p.allreduce = AllreduceFit{2, 0.020, 1e-6};
  p.collectives = 1;
  p.collective_bytes = 40;
  p.collectives_s = 0.0205;
  // The same time as host overhead (a profile from before the field: inside other_s).
  Profile as_other = p;
  as_other.collectives = 0;
  as_other.collective_bytes = 0;
  as_other.collectives_s = 0;
  as_other.other_s = 0.0205;

  const Network net = *measured_network(p);
  const std::vector<int> nodes{1, 2, 4, 8};
  const std::vector<SweepRow> rows = sweep(p, net, nodes, p.threshold_bytes);
  const std::vector<SweepRow> flat = sweep(as_other, net, nodes, p.threshold_bytes);
  // 1 node: none; 2 (the profile's own): as measured; 4 and 8: 2 and 3 rounds.
  CHECK(rows[0].at_threshold.collectives_s == 0);
  CHECK(rows[1].at_threshold.collectives_s == near(0.0205));
  CHECK(rows[2].at_threshold.collectives_s == near(2 * 0.0205));
  CHECK(rows[3].at_threshold.collectives_s == near(3 * 0.0205));
  for (size_t i = 0; i < nodes.size(); ++i) {
    CAPTURE(nodes[i]);
    CHECK(flat[i].at_threshold.collectives_s == 0);
    // Everything else alike: the difference is the collectives' against the flat 20.5 ms.
    CHECK(rows[i].at_threshold.step_s - flat[i].at_threshold.step_s ==
          Approx(rows[i].at_threshold.collectives_s - 0.0205).margin(1e-12));
    if (i > 0) CHECK(rows[i].efficiency < rows[i - 1].efficiency);
    if (nodes[i] > 2) CHECK(rows[i].efficiency < flat[i].efficiency - 0.05);
  }
  // On a faster link (given, not measured), in proportion: 1 round of 10 us + 40 ns at 2 nodes.
  CHECK(collectives_s(p, two_nodes(1e-5, 1e9)) == near(0.0205 * 10.04e-6 / 10.04e-3));

  // A profile on one rank (no probe) measured only the host's part; the network's comes on top.
  Profile one = three_gradients();
  one.collectives = 2;
  one.collective_bytes = 80;
  one.collectives_s = 1e-5;
  CHECK(collectives_s(one, two_nodes(0.010, 1e6)) == near(1e-5 + 2 * (0.010 + 40 / 1e6)));
}

TEST_CASE("candidate thresholds: 0, doublings from 1 KB up to one bucket, and the profile's own") {
  Profile p = three_gradients();  // 12000 bytes in all
  p.threshold_bytes = 3000;
  CHECK(candidate_thresholds(p) == std::vector<int64_t>{0, 1024, 2048, 3000, 4096, 8192, 16384});
}

TEST_CASE("the profile file round-trips, and a bad one names the field") {
  Profile p = three_gradients();
  p.ranks = 2;
  p.nodes = 1;
  p.ranks_per_node = 2;
  p.steps = 20;
  p.allreduce = AllreduceFit{2, 3e-5, 2e-9};
  p.launch_delay_s = 7e-4;
  p.finish_s = 3e-4;
  p.collectives_s = 4e-4;
  p.collectives = 2;
  p.collective_bytes = 64;
  const Profile q = profile_from_json(profile_to_json(p), "p.json");
  CHECK(q.ranks == 2);
  CHECK(q.launch_delay_s == 7e-4);
  CHECK(q.finish_s == 3e-4);
  CHECK(q.collectives_s == 4e-4);
  CHECK(q.collectives == 2);
  CHECK(q.collective_bytes == 64);
  {
    // A profile from before the small collectives were kept apart still loads: none.
    std::string old, line;
    std::stringstream in(profile_to_json(p));
    while (std::getline(in, line)) {
      if (line.find("collective") == std::string::npos) old += line + "\n";
    }
    const Profile o = profile_from_json(old, "old.json");
    CHECK(o.collectives_s == 0);
    CHECK(o.collectives == 0);
    CHECK(o.collective_bytes == 0);
    CHECK(predict(o, two_nodes(1e-3, 1e6), 0).collectives_s == 0);
  }
  CHECK(q.backward_s == p.backward_s);
  REQUIRE(q.gradients.size() == 3);
  CHECK(q.gradients[1].name == "B");
  CHECK(q.gradients[1].ready_s == p.gradients[1].ready_s);
  REQUIRE(q.allreduce);
  CHECK(q.allreduce->b_s_per_byte == 2e-9);

  auto error_of = [](const std::string& text) {
    try {
      profile_from_json(text, "p.json");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string good = profile_to_json(p);
  CHECK_THAT(error_of("{"), Contains("p.json") && Contains("not JSON"));
  CHECK_THAT(error_of("[]"), Contains("not a JSON object"));
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
  };
  CHECK_THAT(error_of(replace("\"backward_s\": 0.02", "\"backward_s\": -1")),
             Contains("'backward_s'") && Contains("non-negative"));
  CHECK_THAT(error_of(replace("\"ready_s\": 0.016", "\"ready_s\": \"x\"")), Contains("'gradients[1].ready_s'"));
  CHECK_THAT(error_of(replace("\"ranks\": 2,", "\"ranks\": 3,")), Contains("nodes * ranks_per_node"));
  CHECK_THAT(error_of(replace("tarantella-scaling-profile", "other")), Contains("'format'"));
  CHECK_THAT(error_of(replace("\"a_s\"", "\"x_s\"")), Contains("'allreduce.a_s' is missing"));
}

TEST_CASE("the slowest of p ranks: expected maximum of the compute samples, less their median") {
  Profile p = three_gradients();
  CHECK(straggle_s(p, 4) == 0);  // no samples
  p.compute_samples_s = {0.001, 0.002, 0.003, 0.004};
  CHECK(straggle_s(p, 1) == 0);
  // E[max of 2] = (1*1 + 2*3 + 3*5 + 4*7) / 16 ms = 50/16 ms; median 2.5 ms
  CHECK(straggle_s(p, 2) == near((50.0 / 16 - 2.5) * 1e-3));
  // E[max of 4] = (1*1 + 2*15 + 3*65 + 4*175) / 256 ms = 926/256 ms
  CHECK(straggle_s(p, 4) == near((926.0 / 256 - 2.5) * 1e-3));
  CHECK(straggle_s(p, 64) > straggle_s(p, 4));
  CHECK(straggle_s(p, 64) < 1.5e-3 + 1e-12);  // never beyond the slowest sample

  SECTION("it delays every bucket: one 12000-byte bucket ready at 20 ms, 12 ms, ends 32 + lag") {
    const Prediction pr = predict(p, two_nodes(0, 1e6), 1 << 20);
    CHECK(pr.straggle_s == near((50.0 / 16 - 2.5) * 1e-3));
    CHECK(pr.exposed_s == near(0.012 + pr.straggle_s));
  }
  SECTION("a bucket hidden behind backward stays hidden when the lag fits") {
    // threshold 0, 1e7 B/s: C 5-5.4 ms, B 16-16.4, A 20-20.4 ms; + 0.625 ms lag: A ends 21.025
    const Prediction pr = predict(p, two_nodes(0, 1e7), 0);
    CHECK(pr.exposed_s == near(0.0004 + 0.000625));
  }
}

TEST_CASE("allreduces slower beside backward than the probe: comm_factor") {
  Profile p = three_gradients();
  p.ranks = 2;
  p.nodes = 2;
  p.steps = 20;
  p.threshold_bytes = 0;                   // buckets C (ready 5 ms), B (16), A (20)
  p.allreduce = AllreduceFit{2, 0, 1e-6};  // 2 ranks: 1e6 B/s; 4000 B in 4 ms
  CHECK(comm_factor(p) == 1);              // no comm_s recorded
  // Factor 2 while backward runs: C 5-13; B from 16, 2 ms of work by 20, the other 2 at
  // full speed: 22; A 22-26 after backward. 8 + 6 + 4 = 18 ms in training.
  p.comm_s = 0.018;
  CHECK(comm_factor(p) == Approx(2).epsilon(1e-9));
  Network net = two_nodes(0, 1e6);
  net.comm_factor = comm_factor(p);
  Prediction pr = predict(p, net, 0);
  CHECK(pr.comm_s == near(0.018));
  CHECK(pr.exposed_s == near(0.006));
  // One bucket after backward: no sharing, the probe's 12 ms
  CHECK(predict(p, net, 1 << 20).exposed_s == near(0.012));
  // Faster than the probe (12 ms): 1. No overlap at the profile (one bucket): 1.
  p.comm_s = 0.010;
  CHECK(comm_factor(p) == 1);
  p.comm_s = 0.018;
  p.threshold_bytes = 1 << 20;
  CHECK(comm_factor(p) == 1);
  p.threshold_bytes = 0;
  // 0.625 ms of the time was the wait for the slower rank (the lag at 2 ranks): the
  // channel with the lag and the factor takes the rest.
  p.compute_samples_s = {0.001, 0.002, 0.003, 0.004};
  net.comm_factor = comm_factor(p);
  CHECK(net.comm_factor > 1.5);
  CHECK(net.comm_factor < 2);
  pr = predict(p, net, 0);
  CHECK(pr.comm_s == Approx(0.018 - 0.000625).epsilon(1e-9));
  // Both new fields round-trip; a profile without them reads as before.
  const Profile q = profile_from_json(profile_to_json(p), "p.json");
  CHECK(q.comm_s == p.comm_s);
  CHECK(q.compute_samples_s == p.compute_samples_s);
  std::string text = profile_to_json(p);
  const size_t at = text.find("\"compute_samples_s\"");
  REQUIRE(at != std::string::npos);
  text.replace(at, std::string("\"compute_samples_s\"").size(), "\"unused_field\"");
  CHECK(profile_from_json(text, "p.json").compute_samples_s.empty());
}

TEST_CASE("backward beside allreduces: the profile's slowdown, as far as they overlap") {
  Profile p = three_gradients();  // backward 20 ms, 10 ms of it alone
  p.backward_alone_s = 0.010;
  p.ranks = 2;
  p.nodes = 2;
  p.steps = 20;
  p.allreduce = AllreduceFit{2, 0, 1e-6};  // 1e6 B/s
  // At the profile's 32 KB: one 12000-byte bucket, ready when backward ends: no overlap at
  // the profile, so nothing to scale by; any overlap then takes the whole slowdown.
  SECTION("one rank: backward alone") {
    Network one = two_nodes(0, 1e6);
    one.nodes = 1;
    const Prediction pr = predict(p, one, 0);
    CHECK(pr.backward_s == near(0.010));
    CHECK(pr.step_s == near(0.001 + 0.010 + 0.010 + 0.002));
  }
  SECTION("no overlap predicted (one bucket after backward): backward alone") {
    const Prediction pr = predict(p, two_nodes(0, 1e6), 1 << 20);
    CHECK(pr.backward_s == near(0.010));
    CHECK(pr.exposed_s == near(0.012));
  }
  SECTION("overlap where the profile had some: in proportion") {
    p.threshold_bytes = 0;  // at the profile: C 5-9, B 16-20, A 20-24: 8 ms hidden
    // Threshold 0 again: the same 8 ms hidden, so the whole measured backward
    Prediction pr = predict(p, two_nodes(0, 1e6), 0);
    CHECK(pr.backward_s == near(0.020));
    CHECK(pr.exposed_s == near(0.004));
    // 8000 B: [C, B] at 16 ms: 4 of the profile's 8 ms hidden at the profile's backward, so
    // half the slowdown: backward 15 ms; ready times scaled by 15/20: [C,B] at 12 until 20, A 20-24
    pr = predict(p, two_nodes(0, 1e6), 8000);
    CHECK(pr.backward_s == near(0.015));
    CHECK(pr.exposed_s == near(0.024 - 0.015));
  }
  const Profile q = profile_from_json(profile_to_json(p), "p.json");
  CHECK(q.backward_alone_s == p.backward_alone_s);
}
