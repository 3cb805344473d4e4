// Dataset pipelines on one process: sources, transformations, threads, and distribute()
// with every rank simulated in this process (the MPI version is test_dataset_distributed).
// Samples carry their index as an i64 column, so every check is exact.
#include <catch2/catch.hpp>

#include "tarantella/dataset.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

using namespace tnt;

namespace {

// N samples: id i64 () = i, feature f32 (2,) = (i, -i).
Dataset id_dataset(int64_t n) {
  std::vector<int64_t> ids(static_cast<size_t>(n));
  std::vector<float> feats;
  for (int64_t i = 0; i < n; ++i) {
    ids[i] = i;
    feats.push_back(static_cast<float>(i));
    feats.push_back(static_cast<float>(-i));
  }
  return Dataset::from_tensors({Tensor::from_data(ids.data(), {n}), Tensor::from_vector(feats, {n, 2})});
}

int64_t id_of(const Element& e) { return e.at(0).data<int64_t>()[0]; }

std::vector<int64_t> ids_of(const Dataset& d, int64_t epoch = 0) {
  std::vector<int64_t> out;
  auto it = d.iterate(epoch);
  while (auto e = it.next()) out.push_back(id_of(*e));
  return out;
}

std::vector<int64_t> range(int64_t begin, int64_t end, int64_t step = 1) {
  std::vector<int64_t> v;
  for (int64_t i = begin; i < end; i += step) v.push_back(i);
  return v;
}

}  // namespace

TEST_CASE("from_tensors yields rows as elements", "[dataset]") {
  Dataset d = id_dataset(5);
  CHECK(d.cardinality() == 5);
  auto it = d.iterate();
  for (int64_t i = 0; i < 5; ++i) {
    auto e = it.next();
    REQUIRE(e);
    REQUIRE(e->size() == 2);
    CHECK((*e)[0].shape() == Shape{});
    CHECK((*e)[1].shape() == Shape{2});
    CHECK(id_of(*e) == i);
    CHECK((*e)[1].to_vector() == std::vector<float>{float(i), float(-i)});
  }
  CHECK_FALSE(it.next());
  CHECK_FALSE(it.next());  // stays at the end
  CHECK(Dataset().cardinality() == 0);
  CHECK_FALSE(Dataset().iterate().next());
  CHECK_THROWS_AS(Dataset::from_tensors({Tensor::zeros({3}), Tensor::zeros({4, 2})}), Error);
}

TEST_CASE("batch stacks elements and handles the remainder", "[dataset]") {
  Dataset d = id_dataset(7);
  SECTION("keep the partial batch") {
    Dataset b = d.batch(3);
    CHECK(b.cardinality() == 3);
    auto it = b.iterate();
    auto b0 = it.next();
    REQUIRE(b0);
    CHECK((*b0)[0].shape() == Shape{3});
    CHECK((*b0)[1].shape() == Shape{3, 2});
    CHECK((*b0)[0].to_vector() == std::vector<float>{0, 1, 2});
    CHECK((*b0)[1].to_vector() == std::vector<float>{0, 0, 1, -1, 2, -2});
    REQUIRE(it.next());
    auto b2 = it.next();
    REQUIRE(b2);
    CHECK((*b2)[0].to_vector() == std::vector<float>{6});
    CHECK_FALSE(it.next());
  }
  SECTION("drop the partial batch") {
    Dataset b = d.batch(3, true);
    CHECK(b.cardinality() == 2);
    auto it = b.iterate();
    CHECK(it.next());
    CHECK(it.next());
    CHECK_FALSE(it.next());
  }
  SECTION("mismatched shapes are an error") {
    Dataset bad = Dataset::generator([](int64_t) {
      auto k = std::make_shared<int>(0);
      return ElementFn([k]() -> std::optional<Element> {
        if (*k >= 2) return std::nullopt;
        return Element{Tensor::zeros({++*k})};
      });
    });
    auto it = bad.batch(2).iterate();
    CHECK_THROWS_WITH(it.next(), Catch::Contains("Dataset::batch") && Catch::Contains("column 0"));
  }
  CHECK_THROWS_AS(d.batch(0), InputError);
}

TEST_CASE("shuffle is a reproducible permutation that changes with the epoch", "[dataset]") {
  Dataset d = id_dataset(100);
  Dataset s = d.shuffle(100, 42);
  CHECK(s.cardinality() == 100);
  std::vector<int64_t> e0 = ids_of(s, 0);
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == range(0, 100));
  CHECK(e0 != range(0, 100));
  CHECK(ids_of(s, 0) == e0);                        // same (seed, epoch): same order
  CHECK(ids_of(d.shuffle(100, 42), 0) == e0);       // ... also from a dataset built again
  CHECK(ids_of(s, 1) != e0);                        // new epoch: new order
  CHECK(ids_of(d.shuffle(100, 43), 0) != e0);       // new seed: new order
  CHECK(ids_of(d.shuffle(1, 42), 0) == range(0, 100));  // a buffer of one cannot reorder
  // A small buffer only moves an element forward by less than the buffer size... and
  // never emits an element before it was read: element at position k is <= k + buffer - 1.
  std::vector<int64_t> w = ids_of(d.shuffle(4, 7), 0);
  for (size_t k = 0; k < w.size(); ++k) CHECK(w[k] <= static_cast<int64_t>(k) + 3);
  CHECK_THROWS_AS(d.shuffle(0, 1), InputError);
}

TEST_CASE("map keeps order on one or many workers and rethrows errors in order", "[dataset]") {
  Dataset d = id_dataset(50);
  auto square = [](Element e) {
    int64_t i = id_of(e);
    // Uneven work so that workers finish out of order.
    std::this_thread::sleep_for(std::chrono::microseconds((i * 37) % 11 * 100));
    return Element{Tensor::full({}, static_cast<double>(i * i), DType::i64)};
  };
  std::vector<int64_t> want;
  for (int64_t i = 0; i < 50; ++i) want.push_back(i * i);
  CHECK(ids_of(d.map(square)) == want);
  CHECK(ids_of(d.map(square, 4)) == want);
  // The first row of each batch of 8: the squares of 0, 8, 16, ...
  CHECK(ids_of(d.map(square, 4).batch(8).map([](Element e) { return Element{e[0].slice_rows(0, 1).reshape({})}; })) ==
        std::vector<int64_t>{0, 64, 256, 576, 1024, 1600, 2304});
  CHECK(d.map(square, 3).cardinality() == 50);

  auto fail_at_7 = [](Element e) {
    if (id_of(e) == 7) throw InputError("sample 7 is broken");
    return e;
  };
  for (int workers : {1, 3}) {
    auto it = d.map(fail_at_7, workers).iterate();
    for (int64_t i = 0; i < 7; ++i) {
      auto e = it.next();
      REQUIRE(e);
      CHECK(id_of(*e) == i);
    }
    CHECK_THROWS_WITH(it.next(), "sample 7 is broken");
  }
  CHECK_THROWS_AS(d.map(square, 0), InputError);
}

TEST_CASE("a parallel map iterator destroyed mid-stream stops its workers", "[dataset]") {
  std::atomic<int> calls{0};
  Dataset endless = Dataset::generator([](int64_t) {
    auto k = std::make_shared<int64_t>(0);
    return ElementFn([k]() -> std::optional<Element> { return Element{Tensor::full({}, double((*k)++), DType::i64)}; });
  });
  {
    auto it = endless.map([&](Element e) { ++calls; return e; }, 4).iterate();
    for (int64_t i = 0; i < 10; ++i) CHECK(id_of(*it.next()) == i);
  }  // joins here; a hang would time the test out
  int after = calls.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(calls.load() == after);
  CHECK(after <= 10 + 2 * 4 + 4);  // bounded by the in-flight window (2 x workers) plus running calls
}

TEST_CASE("a parallel map ends once when its workers race for the end of the stream", "[dataset]") {
  // Regression: a worker that pulled the end used to release the pull lock before it
  // recorded the end, so a second worker could pull past it and move the recorded end one
  // further; next() then waited forever for a result nobody would file (seen as a timeout
  // of this test binary under load). Many short streams on many workers make the workers
  // meet at the end often; with the race the loop hangs, and ctest's timeout fails it.
  for (int64_t n : {0, 1, 2, 5}) {
    // A slow source, so that the other workers queue for the pull lock behind the one that
    // pulls the end.
    Dataset d = Dataset::from_function(n, [](int64_t i) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      return Element{Tensor::full({}, double(i), DType::i64)};
    });
    std::vector<int64_t> want;
    for (int64_t i = 0; i < n; ++i) want.push_back(i);
    for (int round = 0; round < 300; ++round) {
      std::vector<int64_t> got = ids_of(d.map([](Element e) { return e; }, 8));
      if (got != want) {
        CAPTURE(n, round);
        CHECK(got == want);
        break;
      }
    }
  }
}

TEST_CASE("a parallel map skips like a single-worker map", "[dataset]") {
  // Counts the calls of the map function and of the source.
  struct Counted {
    std::mutex mu;
    std::set<int64_t> built, mapped;
  };
  auto make = [](Counted& c, int64_t n, int64_t fail_at = -1) {
    return Dataset::from_function(n, [&c](int64_t i) {
             std::lock_guard<std::mutex> lock(c.mu);
             c.built.insert(i);
             return Element{Tensor::full({}, double(i), DType::i64)};
           })
        .map(
            [&c, fail_at](Element e) {
              int64_t i = id_of(e);
              {
                std::lock_guard<std::mutex> lock(c.mu);
                c.mapped.insert(i);
              }
              if (i == fail_at) throw InputError(fmt::format("sample {} is broken", i));
              return e;
            },
            4);
  };
  SECTION("skip before the first element maps nothing it skips") {
    Counted c;
    CHECK(ids_of(make(c, 50).skip(15)) == range(15, 50));
    CHECK(*c.mapped.begin() == 15);
    CHECK(*c.built.begin() == 15);
  }
  SECTION("skips mid-stream map at most the read-ahead window (2 x 4 workers) beyond what is kept") {
    Counted c;
    // shard(3, 0) keeps 0, 3, 6, ... by skipping 2 after each element it keeps (the
    // window covers those 2, so here nearly everything is mapped: only the order counts).
    CHECK(ids_of(make(c, 60).shard(3, 0)) == range(0, 60, 3));
    // Distribute: 5 global batches of 24, 8 samples each for rank 1 of 3; per batch at most
    // 8 read-ahead samples of other ranks are mapped (without skip(): all 120).
    Counted d;
    DistributedDataset dist = make(d, 120).distribute(24, 1, 3, Remainder::drop);
    auto it = dist.iterate();
    std::vector<int64_t> mine;
    while (auto b = it.next())
      for (float id : b->columns[0].to_vector()) mine.push_back(static_cast<int64_t>(id));
    std::vector<int64_t> want;
    for (int64_t g = 0; g < 120; g += 24)
      for (int64_t i = 8; i < 16; ++i) want.push_back(g + i);
    CHECK(mine == want);
    CAPTURE(d.mapped.size());
    CHECK(d.mapped.size() <= 5u * (8 + 8));
    CHECK(d.built.size() <= 5u * (8 + 8));
  }
  SECTION("skipping to the end, and past it") {
    Counted c;
    auto it = make(c, 10).iterate();
    CHECK(id_of(*it.next()) == 0);
    CHECK(ids_of(make(c, 10).skip(10)).empty());
    CHECK(ids_of(make(c, 10).skip(25)).empty());
    CHECK(ids_of(make(c, 10).shard(4, 3)) == std::vector<int64_t>{3, 7});
  }
  SECTION("fn's error on a skipped element is not seen; on a kept one it is") {
    Counted c;
    CHECK(ids_of(make(c, 30, 7).shard(3, 0)) == range(0, 30, 3));  // 7 belongs to shard 1
    Counted e;
    CHECK_THROWS_WITH(ids_of(make(e, 30, 7).shard(3, 1)), "sample 7 is broken");
  }
  SECTION("an upstream error inside a skipped range is rethrown") {
    // A generator cannot skip without producing, so element 8 is always produced (by a
    // worker reading ahead or by the upstream skip) and its error must come out.
    Dataset bad = Dataset::generator([](int64_t) {
                    auto k = std::make_shared<int64_t>(0);
                    return ElementFn([k]() -> std::optional<Element> {
                      if (*k >= 30) return std::nullopt;
                      int64_t i = (*k)++;  // asked again after its error, it goes on with 9
                      if (i == 8) throw InputError("source broke at 8");
                      return Element{Tensor::full({}, double(i), DType::i64)};
                    });
                  }).map([](Element e) { return e; }, 4);
    CHECK_THROWS_WITH(ids_of(bad.shard(5, 0)), "source broke at 8");
    CHECK_THROWS_WITH(ids_of(bad.skip(20)), "source broke at 8");
    // And the stream ends there, whether skip() met the error in the source (skip(12) as
    // the first call) or a worker read it ahead (after shard's first next()).
    for (const Dataset& d : {bad.skip(12), bad.shard(12, 0)}) {
      auto it = d.iterate();
      std::vector<int64_t> got;
      bool threw = false;
      for (int calls = 0; calls < 5; ++calls) {
        try {
          auto e = it.next();
          if (!e) break;
          got.push_back(id_of(*e));
        } catch (const InputError& err) {
          CHECK_THAT(err.what(), Catch::Contains("source broke at 8"));
          threw = true;
        }
      }
      CHECK(threw);
      CHECK(got.size() <= 1u);  // element 0 for the shard; nothing from beyond the error
    }
  }
}

TEST_CASE("prefetch gives the same elements and passes on errors", "[dataset]") {
  Dataset d = id_dataset(30);
  CHECK(ids_of(d.prefetch(3)) == range(0, 30));
  CHECK(ids_of(d.shuffle(30, 5).map([](Element e) { return e; }, 2).prefetch(2), 3) ==
        ids_of(d.shuffle(30, 5), 3));
  Dataset failing = Dataset::generator([](int64_t) {
    auto k = std::make_shared<int64_t>(0);
    return ElementFn([k]() -> std::optional<Element> {
      if (*k == 4) throw InputError("source failed at 4");
      return Element{Tensor::full({}, double((*k)++), DType::i64)};
    });
  });
  auto it = failing.prefetch(8).iterate();
  for (int64_t i = 0; i < 4; ++i) CHECK(id_of(*it.next()) == i);
  CHECK_THROWS_WITH(it.next(), "source failed at 4");
  CHECK_FALSE(it.next());

  // Destroying a prefetching iterator over an endless stream returns promptly.
  Dataset endless = Dataset::synthetic({{{}, DType::i64, 0, 10}}, 1).repeat();
  {
    auto it2 = endless.prefetch(2).iterate();
    CHECK(it2.next());
  }
  CHECK_THROWS_AS(d.prefetch(0), InputError);
}

TEST_CASE("shard, take, skip and repeat", "[dataset]") {
  Dataset d = id_dataset(10);
  CHECK(ids_of(d.shard(3, 0)) == std::vector<int64_t>{0, 3, 6, 9});
  CHECK(ids_of(d.shard(3, 2)) == std::vector<int64_t>{2, 5, 8});
  CHECK(d.shard(3, 0).cardinality() == 4);
  CHECK(d.shard(3, 2).cardinality() == 3);
  CHECK(d.shard(20, 15).cardinality() == 0);
  CHECK(ids_of(d.shard(20, 15)).empty());
  CHECK_THROWS_AS(d.shard(3, 3), InputError);

  CHECK(ids_of(d.take(4)) == range(0, 4));
  CHECK(ids_of(d.take(40)) == range(0, 10));
  CHECK(d.take(40).cardinality() == 10);
  CHECK(ids_of(d.skip(7)) == range(7, 10));
  CHECK(d.skip(70).cardinality() == 0);
  CHECK(ids_of(d.skip(2).take(3)) == range(2, 5));

  std::vector<int64_t> twice = range(0, 10);
  twice.insert(twice.end(), twice.begin(), twice.end());
  CHECK(ids_of(d.repeat(2)) == twice);
  CHECK(d.repeat(2).cardinality() == 20);
  CHECK(d.repeat().cardinality() == -1);
  CHECK(d.repeat().take(25).cardinality() == 25);
  CHECK(ids_of(d.repeat().take(25)).size() == 25);
  CHECK(Dataset().repeat().cardinality() == 0);
  CHECK(ids_of(Dataset().repeat()).empty());  // an empty pass ends a forever-repeat

  // A shuffle before repeat gives each pass its own order, reproducibly.
  std::vector<int64_t> r = ids_of(d.shuffle(10, 9).repeat(2));
  std::vector<int64_t> first(r.begin(), r.begin() + 10), second(r.begin() + 10, r.end());
  CHECK(first != second);
  CHECK(ids_of(d.shuffle(10, 9).repeat(2)) == r);
  CHECK(ids_of(d.shuffle(10, 9).repeat(2), 1) != r);
}

TEST_CASE("synthetic data is deterministic and in range", "[dataset]") {
  Dataset d = Dataset::synthetic({{{3, 4, 4}, DType::f32, -1.0, 1.0}, {{}, DType::i64, 0, 10}}, 64, 11);
  CHECK(d.cardinality() == 64);
  auto collect = [](const Dataset& ds) {
    std::vector<std::vector<float>> v;
    auto it = ds.iterate();
    while (auto e = it.next()) {
      CHECK((*e)[0].shape() == Shape{3, 4, 4});
      std::vector<float> x = (*e)[0].to_vector();
      float label = (*e)[1].to_vector()[0];
      x.push_back(label);
      v.push_back(x);
    }
    return v;
  };
  auto a = collect(d);
  REQUIRE(a.size() == 64);
  std::set<float> labels;
  for (const auto& x : a) {
    for (size_t j = 0; j + 1 < x.size(); ++j) {
      CHECK(x[j] >= -1.0f);
      CHECK(x[j] < 1.0f);
    }
    CHECK(x.back() == std::floor(x.back()));
    CHECK(x.back() >= 0);
    CHECK(x.back() < 10);
    labels.insert(x.back());
  }
  CHECK(labels.size() >= 5);  // 64 draws from 10 classes: fewer than 5 distinct is ~1e-20 likely
  CHECK(collect(d) == a);
  // Element i does not depend on what was read before it.
  auto tail = collect(d.skip(60));
  CHECK(tail == std::vector<std::vector<float>>(a.begin() + 60, a.end()));
  CHECK(collect(Dataset::synthetic({{{3, 4, 4}, DType::f32, -1.0, 1.0}, {{}, DType::i64, 0, 10}}, 64, 12)) != a);
  CHECK_THROWS_AS(Dataset::synthetic({{{2}, DType::f32, 1.0, 1.0}}, 4), InputError);
}

TEST_CASE("generator and from_function sources", "[dataset]") {
  Dataset g = Dataset::generator([](int64_t epoch) {
    auto k = std::make_shared<int64_t>(0);
    return ElementFn([k, epoch]() -> std::optional<Element> {
      if (*k >= 3) return std::nullopt;
      return Element{Tensor::full({}, double(100 * epoch + (*k)++), DType::i64)};
    });
  });
  CHECK(g.cardinality() == -1);
  CHECK(ids_of(g, 0) == std::vector<int64_t>{0, 1, 2});
  CHECK(ids_of(g, 2) == std::vector<int64_t>{200, 201, 202});

  std::vector<int64_t> built;
  std::mutex mu;
  Dataset f = Dataset::from_function(20, [&](int64_t i) {
    std::lock_guard<std::mutex> lock(mu);
    built.push_back(i);
    return Element{Tensor::full({}, double(i), DType::i64)};
  });
  CHECK(ids_of(f.skip(15).shard(2, 1)) == std::vector<int64_t>{16, 18});
  CHECK(built == std::vector<int64_t>{16, 18});  // skipped elements were never built
}

// ---- distribute, all ranks simulated here

namespace {

struct RankStep {
  std::vector<int64_t> ids;  // every slot, padding included
  std::vector<float> weights;
  int64_t global_real = 0;
  int64_t sample_offset = 0;
};

std::vector<RankStep> run_rank(const DistributedDataset& d, int64_t epoch) {
  std::vector<RankStep> steps;
  auto it = d.iterate(epoch);
  while (auto b = it.next()) {
    RankStep s;
    for (float v : b->columns[0].to_vector()) s.ids.push_back(static_cast<int64_t>(v));
    // the feature column travels with its id
    std::vector<float> f = b->columns[1].to_vector();
    for (size_t i = 0; i < s.ids.size(); ++i) CHECK(f[2 * i] == float(s.ids[i]));
    // Rows [0, real_samples) are real, the rest padding: 1 and 0 as per-row weights.
    CHECK(b->real_samples >= 0);
    CHECK(b->real_samples <= b->micro_batch_size);
    s.weights.assign(static_cast<size_t>(b->micro_batch_size), 0.0f);
    std::fill_n(s.weights.begin(), b->real_samples, 1.0f);
    s.global_real = b->global_real_samples;
    CHECK(b->micro_batch_size == static_cast<int64_t>(s.ids.size()));
    CHECK(b->step == static_cast<int64_t>(steps.size()));
    CHECK(b->global_batch_size == d.global_batch_size());
    s.sample_offset = b->sample_offset;
    steps.push_back(s);
  }
  return steps;
}

}  // namespace

TEST_CASE("distribute splits every global batch across simulated ranks", "[dataset][distribute]") {
  for (int p : {1, 2, 3, 4, 5}) {
    for (int64_t B : {int64_t(p), int64_t(p) + 1, int64_t(2 * p - 1), int64_t(7), int64_t(12)}) {
      if (B < p) continue;
      for (int64_t N : {int64_t(0), int64_t(1), B - 1, B, B + 1, 3 * B, 3 * B + 2}) {
        if (N < 0) continue;
        for (Remainder rem : {Remainder::drop, Remainder::pad}) {
          CAPTURE(p, B, N, rem == Remainder::pad);
          Dataset base = id_dataset(N).shuffle(std::max<int64_t>(N, 1), 3);
          std::vector<int64_t> order = ids_of(base, 1);  // the global sequence of epoch 1
          int64_t full = N / B;
          int64_t steps = rem == Remainder::drop ? full : (N + B - 1) / B;
          std::vector<std::vector<RankStep>> ranks;
          for (int r = 0; r < p; ++r) {
            DistributedDataset d = base.distribute(B, r, p, rem);
            CHECK(d.steps() == steps);
            CHECK(d.micro_batch_size() == B / p + (r < B % p ? 1 : 0));
            ranks.push_back(run_rank(d, 1));
            REQUIRE(static_cast<int64_t>(ranks.back().size()) == steps);
          }
          for (int64_t s = 0; s < steps; ++s) {
            int64_t real = std::min(B, N - s * B);
            std::vector<int64_t> got;  // real ids in rank order
            size_t min_size = SIZE_MAX, max_size = 0;
            for (int r = 0; r < p; ++r) {
              const RankStep& st = ranks[r][s];
              CHECK(st.global_real == real);
              CHECK(st.sample_offset == micro_batch_offset(B, r, p));
              min_size = std::min(min_size, st.ids.size());
              max_size = std::max(max_size, st.ids.size());
              for (size_t i = 0; i < st.ids.size(); ++i) {
                if (st.weights[i] == 1.0f) {
                  got.push_back(st.ids[i]);
                } else {
                  // padding is a copy of a real sample of this epoch
                  CHECK(std::find(order.begin(), order.end(), st.ids[i]) != order.end());
                }
              }
            }
            CHECK(max_size - min_size <= 1);
            // The ranks' real samples, in rank order, are exactly this global batch.
            std::vector<int64_t> want(order.begin() + s * B, order.begin() + s * B + real);
            CHECK(got == want);
          }
        }
      }
    }
  }
}

TEST_CASE("distribute rejects a global batch smaller than the ranks", "[dataset][distribute]") {
  Dataset d = id_dataset(10);
  CHECK_THROWS_AS(d.distribute(3, 0, 4), InputError);
  CHECK_THROWS_WITH(d.distribute(3, 1, 4),
                    Catch::Contains("global batch size 3") && Catch::Contains("number of ranks 4"));
  CHECK_THROWS_AS(d.distribute(0, 0, 1), InputError);
  CHECK_THROWS_AS(d.distribute(4, 4, 4), InputError);
  CHECK_THROWS_AS(micro_batch_size(2, 0, 3), InputError);
  CHECK(micro_batch_size(10, 0, 4) == 3);
  CHECK(micro_batch_size(10, 1, 4) == 3);
  CHECK(micro_batch_size(10, 2, 4) == 2);
  CHECK(micro_batch_offset(10, 2, 4) == 6);
  CHECK(micro_batch_offset(10, 3, 4) == 8);
}

TEST_CASE("a map after distribute sees only this rank's samples", "[dataset][distribute]") {
  const int p = 3;
  const int64_t B = 7, N = 30;  // 4 full batches and a partial one of 2
  for (Remainder rem : {Remainder::drop, Remainder::pad}) {
    for (int workers : {1, 3}) {
      std::set<int64_t> seen_all;
      for (int r = 0; r < p; ++r) {
        std::mutex mu;
        std::vector<int64_t> built, mapped;
        Dataset src = Dataset::from_function(N, [&](int64_t i) {
          std::lock_guard<std::mutex> lock(mu);
          built.push_back(i);
          return Element{Tensor::full({}, double(i), DType::i64)};
        });
        DistributedDataset d = src.distribute(B, r, p, rem).map(
            [&](Element e) {
              std::lock_guard<std::mutex> lock(mu);
              mapped.push_back(id_of(e));
              return Element{e[0], Tensor::full({}, double(10 * id_of(e)), DType::i64)};
            },
            workers);
        auto it = d.iterate();
        std::vector<int64_t> mine;
        while (auto b = it.next()) {
          std::vector<float> ids = b->columns[0].to_vector(), tens = b->columns[1].to_vector();
          for (size_t i = 0; i < ids.size(); ++i) {
            CHECK(tens[i] == 10 * ids[i]);
            if (static_cast<int64_t>(i) < b->real_samples) mine.push_back(static_cast<int64_t>(ids[i]));
          }
        }
        int64_t off = micro_batch_offset(B, r, p), b = micro_batch_size(B, r, p);
        std::set<int64_t> expected, own_slots;
        for (int64_t s = 0; s * B < N; ++s) {
          for (int64_t i = s * B + off; i < std::min(s * B + off + b, N); ++i) {
            own_slots.insert(i);
            if (rem == Remainder::drop && (s + 1) * B > N) continue;
            expected.insert(i);
          }
        }
        CHECK(std::set<int64_t>(mine.begin(), mine.end()) == expected);
        for (int64_t i : mine) CHECK(seen_all.insert(i).second);  // no sample on two ranks
        std::set<int64_t> built_set(built.begin(), built.end()), mapped_set(mapped.begin(), mapped.end());
        // Built: this rank's own slots only (with drop, also its slots of the partial last
        // batch, read before the batch turns out to be partial); in pad mode a rank other
        // than 0 also builds the first sample of the first batch (a possible padding
        // source). Mapped: exactly the samples it keeps (padding copies its own samples).
        std::set<int64_t> allowed = own_slots;
        if (rem == Remainder::pad) allowed.insert(0);
        for (int64_t i : built_set) {
          CAPTURE(r, i, workers);
          CHECK(allowed.count(i));
        }
        CHECK(mapped_set == expected);
      }
    }
  }
}

TEST_CASE("distribute with padding when the whole dataset is smaller than one batch", "[dataset][distribute]") {
  // N = 2, B = 5, p = 3: ranks 1 and 2 have no real sample in the only (partial) batch and
  // pad with the batch's first sample.
  Dataset d = id_dataset(2);
  for (int r = 0; r < 3; ++r) {
    auto steps = run_rank(d.distribute(5, r, 3, Remainder::pad), 0);
    REQUIRE(steps.size() == 1);
    CHECK(steps[0].global_real == 2);
    if (r == 0) {
      CHECK(steps[0].ids == std::vector<int64_t>{0, 1});
      CHECK(steps[0].weights == std::vector<float>{1, 1});
    } else {
      CHECK(steps[0].ids == std::vector<int64_t>(steps[0].ids.size(), 0));
      CHECK(steps[0].weights == std::vector<float>(steps[0].ids.size(), 0.0f));
    }
    CHECK(run_rank(d.distribute(5, r, 3, Remainder::drop), 0).empty());
  }
}

TEST_CASE("distribute of an already batched dataset", "[dataset][distribute]") {
  const int p = 3;
  const int64_t B = 8, N = 21;  // batches of 8, 8, 5
  Dataset batched = id_dataset(N).batch(B);
  for (Remainder rem : {Remainder::drop, Remainder::pad}) {
    std::vector<std::vector<RankStep>> ranks;
    for (int r = 0; r < p; ++r) {
      auto d = DistributedDataset::from_batched(batched, B, r, p, rem).prefetch(2);
      ranks.push_back(run_rank(d, 0));
      CHECK(ranks.back().size() == (rem == Remainder::pad ? 3u : 2u));
      CHECK_THROWS_AS(d.map([](Element e) { return e; }), Error);
    }
    for (size_t s = 0; s < ranks[0].size(); ++s) {
      std::vector<int64_t> got;
      for (int r = 0; r < p; ++r) {
        for (size_t i = 0; i < ranks[r][s].ids.size(); ++i) {
          if (ranks[r][s].weights[i] == 1.0f) got.push_back(ranks[r][s].ids[i]);
        }
        CHECK(ranks[r][s].global_real == std::min<int64_t>(B, N - int64_t(s) * B));
      }
      CHECK(got == range(int64_t(s) * B, std::min<int64_t>(N, int64_t(s + 1) * B)));
    }
  }
  CHECK_THROWS_AS(run_rank(DistributedDataset::from_batched(id_dataset(N).batch(9), B, 0, p), 0), InputError);
  // Batches of another size than declared (3 rows for B = 8): the first short one before the
  // end is refused (before: every step passed for a padded last batch).
  for (Remainder rem : {Remainder::drop, Remainder::pad}) {
    CHECK_THROWS_WITH(run_rank(DistributedDataset::from_batched(id_dataset(N).batch(3), B, 0, p, rem), 0),
                      Catch::Contains("a batch of 3 rows before its last one"));
  }
}

TEST_CASE("batch, repeat, take and skip at the ends of their ranges", "[dataset]") {
  // batch(INT64_MAX) is one batch of everything (tf.data), not an allocation of INT64_MAX
  // slots, and its cardinality is 1 (before: 0 from an overflow, then std::length_error).
  Dataset all = id_dataset(5).batch(INT64_MAX);
  CHECK(all.cardinality() == 1);
  auto it = all.iterate(0);
  auto b = it.next();
  REQUIRE(b);
  CHECK((*b)[0].dim(0) == 5);
  CHECK(Dataset::synthetic({SyntheticColumn{{1}, DType::f32, 0.0, 1.0}}, INT64_MAX, 1).batch(INT64_MAX - 1).cardinality() == 2);
  // A repeated count beyond 2^63 is no count (before: 0, an empty dataset).
  CHECK(id_dataset(1 << 20).repeat(int64_t{1} << 50).cardinality() < 0);
  CHECK(id_dataset(3).repeat(4).cardinality() == 12);
  // tf.data's -1: take all, skip all.
  CHECK(id_dataset(7).take(-1).cardinality() == 7);
  CHECK(id_dataset(7).skip(-1).cardinality() == 0);
  CHECK_FALSE(id_dataset(7).skip(-1).iterate(0).next());
  CHECK_THROWS_WITH(id_dataset(7).take(-2), Catch::Contains("-1 takes all"));
}

TEST_CASE("a user's mistakes building datasets are input errors", "[dataset]") {
  // Before: tnt::Error with a source location (exit status 1, as for a bug of ours).
  CHECK_THROWS_AS(Dataset::from_tensors({}), InputError);
  CHECK_THROWS_AS(Dataset::from_tensors({Tensor::full({}, 1.0)}), InputError);
  // Integer values beyond the dtype (before: u8 over [0, 1000) wrapped around).
  CHECK_THROWS_WITH(Dataset::synthetic({SyntheticColumn{{2}, DType::u8, 0.0, 1000.0}}, 4),
                    Catch::Contains("draws from [0, 1000), beyond what u8 holds"));
  CHECK_THROWS_AS(Dataset::synthetic({SyntheticColumn{{}, DType::i64, -1e19, 1e19}}, 4), InputError);
  CHECK_NOTHROW(Dataset::synthetic({SyntheticColumn{{2}, DType::u8, 0.0, 256.0}}, 4));
}

TEST_CASE("distribute with prefetch and map is reproducible per epoch", "[dataset][distribute]") {
  Dataset base = Dataset::synthetic({{{4}, DType::f32, 0, 1}, {{}, DType::i64, 0, 1000}}, 50, 5).shuffle(50, 8);
  auto run = [&](int64_t epoch) {
    std::vector<float> all;
    auto d = base.distribute(6, 1, 4, Remainder::pad).map([](Element e) { return e; }, 2).prefetch(3);
    auto it = d.iterate(epoch);
    while (auto b = it.next()) {
      auto v = b->columns[1].to_vector();
      all.insert(all.end(), v.begin(), v.end());
      // which rows are real: 1 for each of the first real_samples rows, 0 for padding
      for (int64_t i = 0; i < b->micro_batch_size; ++i) all.push_back(i < b->real_samples ? 1.0f : 0.0f);
    }
    return all;
  };
  auto a = run(0);
  CHECK(a.size() == 9 * 2 * 2);  // ceil(50/6) = 9 steps of 2 samples (+ 2 weights)
  CHECK(run(0) == a);
  CHECK(run(1) != a);
}

// A run resumed inside an epoch (FitOptions::initial_step) starts the pass at a global
// batch: the batches from there must be those of the whole pass, and the ones before it
// are neither built (a random-access source) nor mapped, except the last two of them, read
// (not mapped) to keep the padding rule's sample (see RankSliceIterator::skip).
TEST_CASE("iterate from a step gives the rest of the pass and builds none of the batches before it",
          "[dataset][distribute]") {
  const int p = 3;
  const int64_t B = 7, N = 30;  // 4 full batches and a partial one of 2
  struct Seen {
    std::vector<int64_t> ids;
    int64_t real = 0, global_real = 0, step = 0;
    bool operator==(const Seen& o) const {
      return ids == o.ids && real == o.real && global_real == o.global_real && step == o.step;
    }
  };
  for (Remainder rem : {Remainder::drop, Remainder::pad}) {
    for (bool shuffled : {false, true}) {
      for (int r = 0; r < p; ++r) {
        std::mutex mu;
        std::vector<int64_t> built, mapped;
        Dataset src = Dataset::from_function(N, [&](int64_t i) {
          std::lock_guard<std::mutex> lock(mu);
          built.push_back(i);
          return Element{Tensor::full({}, double(i), DType::i64)};
        });
        if (shuffled) src = src.shuffle(N, 11);
        DistributedDataset d = src.distribute(B, r, p, rem)
                                   .map(
                                       [&](Element e) {
                                         std::lock_guard<std::mutex> lock(mu);
                                         mapped.push_back(id_of(e));
                                         return e;
                                       },
                                       2)
                                   .prefetch(2);
        auto pass = [&](int64_t first) {
          std::vector<Seen> out;
          auto it = d.iterate(3, first);
          while (auto b = it.next()) {
            Seen s;
            for (float v : b->columns[0].to_vector()) s.ids.push_back(static_cast<int64_t>(v));
            s.real = b->real_samples;
            s.global_real = b->global_real_samples;
            s.step = b->step;
            out.push_back(s);
          }
          return out;
        };
        const std::vector<Seen> whole = pass(0);
        REQUIRE(static_cast<int64_t>(whole.size()) == (rem == Remainder::pad ? 5 : 4));
        for (int64_t first = 1; first <= static_cast<int64_t>(whole.size()); ++first) {
          CAPTURE(rem == Remainder::pad, shuffled, r, first);
          built.clear();
          mapped.clear();
          const std::vector<Seen> rest = pass(first);
          CHECK(rest == std::vector<Seen>(whole.begin() + first, whole.end()));
          if (shuffled) continue;  // a shuffle reads its whole buffer: nothing to count
          // Of the batches before `first`, only the last two are built, and none is mapped:
          // what is mapped is what the pass yields (padding copies one of its samples).
          for (int64_t i : built) CHECK(i >= (first - 2) * B);
          std::set<int64_t> yielded;
          for (const Seen& s : rest) yielded.insert(s.ids.begin(), s.ids.end());
          for (int64_t i : mapped) CHECK(yielded.count(i) == 1);
        }
      }
    }
  }
  CHECK_THROWS_AS(id_dataset(4).distribute(2, 0, 1).iterate(0, -1), InputError);
}
