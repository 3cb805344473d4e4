// The multi-tensor plan (optim/multi_tensor.hpp), on the host: chunk boundaries, empty
// tensors, tensors larger than a chunk, rule classes, when a table must be made again, and
// a walk of the table as the CUDA kernels walk it (one "block" per row), which must update
// every element exactly once and give the per-parameter loop's bits.
#include <catch2/catch.hpp>

#include "optim/multi_tensor.hpp"
#include "optim/update_rules.hpp"
#include "tarantella/check.hpp"

#include <cstdint>
#include <cstring>
#include <vector>

using namespace tnt;
using namespace tnt::optim;

namespace {

// Host storage for one tensor of a plan: param, grad, and two slots.
struct Buffers {
  std::vector<float> param, grad, slot0, slot1;
  explicit Buffers(int64_t n, float seed = 0.0f) {
    for (int64_t i = 0; i < n; ++i) {
      // Distinct values that an update changes: a missed or doubled element shows.
      param.push_back(seed + 0.001f * static_cast<float>(i % 977) - 0.3f);
      grad.push_back(0.01f * static_cast<float>(i % 131) - 0.5f);
    }
    slot0.assign(static_cast<size_t>(n), 0.0f);
    slot1.assign(static_cast<size_t>(n), 0.0f);
  }
  MtTensor row(int32_t rule = 0) {
    return {param.data(), grad.data(), slot0.data(), slot1.data(), static_cast<int64_t>(param.size()), rule};
  }
};

}  // namespace

TEST_CASE("multi-tensor plan: chunks cut each tensor at multiples of the chunk size") {
  // Sizes around the chunk edge (chunk 8 here, to keep the numbers small): 1, 3, 8, 9, 0, 25.
  std::vector<Buffers> bufs;
  for (int64_t n : {1, 3, 8, 9, 0, 25}) bufs.emplace_back(n);
  std::vector<MtTensor> rows;
  for (Buffers& b : bufs) rows.push_back(b.row());
  const MtPlan plan = make_plan(rows, 8);
  // 1 + 1 + 1 + 2 + 0 + 4 chunks.
  REQUIRE(plan.chunks.size() == 9);
  REQUIRE(plan.first_chunk == std::vector<int32_t>({0, 1, 2, 3, 5, 5, 9}));
  const std::vector<int64_t> counts = {1, 3, 8, 8, 1, 8, 8, 8, 1};
  const std::vector<int32_t> owners = {0, 1, 2, 3, 3, 5, 5, 5, 5};
  for (size_t c = 0; c < plan.chunks.size(); ++c) {
    INFO("chunk " << c);
    CHECK(plan.chunks[c].count == counts[c]);
    CHECK(plan.chunks[c].tensor == owners[c]);
  }
  // The 25-element tensor: rows start at 0, 8, 16, 24 of each of its four arrays.
  Buffers& big = bufs[5];
  for (int k = 0; k < 4; ++k) {
    const MtChunk& c = plan.chunks[5 + k];
    CHECK(c.param == big.param.data() + 8 * k);
    CHECK(c.grad == big.grad.data() + 8 * k);
    CHECK(c.slot0 == big.slot0.data() + 8 * k);
    CHECK(c.slot1 == big.slot1.data() + 8 * k);
  }
}

TEST_CASE("multi-tensor plan: the default chunk size around 65536, null slots stay null") {
  Buffers a(65536), b(65537), c(200000), d(1);
  MtTensor rb = b.row(), rd = d.row();
  rb.slot0 = rb.slot1 = nullptr;  // SGD without momentum has no slot
  rd.slot1 = nullptr;             // SGD with momentum has one
  const MtPlan plan = make_plan({a.row(), rb, c.row(), rd});
  REQUIRE(plan.chunk_elements == kChunkElements);
  REQUIRE(kChunkElements == 65536);
  // 1 + 2 + 4 (200000 = 3 * 65536 + 3392) + 1 chunks.
  REQUIRE(plan.first_chunk == std::vector<int32_t>({0, 1, 3, 7, 8}));
  CHECK(plan.chunks[0].count == 65536);
  CHECK(plan.chunks[1].count == 65536);
  CHECK(plan.chunks[2].count == 1);
  CHECK(plan.chunks[2].param == b.param.data() + 65536);
  CHECK(plan.chunks[2].slot0 == nullptr);
  CHECK(plan.chunks[2].slot1 == nullptr);
  CHECK(plan.chunks[6].count == 200000 - 3 * 65536);
  CHECK(plan.chunks[7].slot0 == d.slot0.data());
  CHECK(plan.chunks[7].slot1 == nullptr);
}

TEST_CASE("multi-tensor plan: no tensors, or only empty ones, give no chunks") {
  const MtPlan none = make_plan({});
  CHECK(none.chunks.empty());
  CHECK(none.first_chunk == std::vector<int32_t>({0}));
  MtTensor empty;  // numel 0, null storage: allowed
  const MtPlan empties = make_plan({empty, empty});
  CHECK(empties.chunks.empty());
  CHECK(empties.first_chunk == std::vector<int32_t>({0, 0, 0}));
}

TEST_CASE("multi-tensor plan: bad rows are refused with what is wrong") {
  Buffers a(4);
  MtTensor bad_rule = a.row(kMaxRules);
  CHECK_THROWS_WITH(make_plan({bad_rule}), Catch::Contains("rule 8"));
  MtTensor no_grad = a.row();
  no_grad.grad = nullptr;
  CHECK_THROWS_WITH(make_plan({a.row(), no_grad}), Catch::Contains("tensor 1"));
  MtTensor negative = a.row();
  negative.numel = -1;
  CHECK_THROWS_WITH(make_plan({negative}), Catch::Contains("-1 elements"));
  CHECK_THROWS_WITH(make_plan({a.row()}, 0), Catch::Contains("chunk size"));
}

TEST_CASE("multi-tensor plan: the table bytes are the chunks, then first_chunk") {
  Buffers a(20), b(3);
  const MtPlan plan = make_plan({a.row(), b.row(1)}, 16);
  const std::vector<uint8_t> bytes = table_bytes(plan);
  REQUIRE(bytes.size() == 3 * sizeof(MtChunk) + 3 * sizeof(int32_t));
  REQUIRE(first_chunk_offset(plan) == 3 * sizeof(MtChunk));
  MtChunk c2;
  std::memcpy(&c2, bytes.data() + 2 * sizeof(MtChunk), sizeof(MtChunk));
  CHECK(c2.param == b.param.data());
  CHECK(c2.count == 3);
  CHECK(c2.tensor == 1);
  CHECK(c2.rule == 1);
  int32_t index[3];
  std::memcpy(index, bytes.data() + first_chunk_offset(plan), sizeof(index));
  CHECK(index[0] == 0);
  CHECK(index[1] == 2);
  CHECK(index[2] == 3);
}

TEST_CASE("multi-tensor plan: rule classes in order of first appearance") {
  std::vector<int32_t> rule_of;
  const std::vector<RuleClass> per_tensor = {{true, 5}, {false, 5}, {true, 5}, {true, 2}, {false, 5}};
  const std::vector<RuleClass> classes = rule_classes(per_tensor, rule_of);
  REQUIRE(classes == std::vector<RuleClass>({{true, 5}, {false, 5}, {true, 2}}));
  CHECK(rule_of == std::vector<int32_t>({0, 1, 0, 2, 1}));
  CHECK(rule_classes({}, rule_of).empty());
  CHECK(rule_of.empty());
}

TEST_CASE("multi-tensor plan: a changed pointer, count, rule or set of tensors needs a new table") {
  Buffers a(10), b(70000), c(5);
  const std::vector<MtTensor> rows = {a.row(), b.row(), c.row()};
  const MtPlan plan = make_plan(rows);
  CHECK(plan_matches(plan, rows, kChunkElements));
  CHECK_FALSE(plan_matches(plan, rows, 1024));  // another chunk size

  std::vector<MtTensor> frozen = {a.row(), c.row()};  // b frozen (Parameter::trainable)
  CHECK_FALSE(plan_matches(plan, frozen, kChunkElements));
  std::vector<MtTensor> moved = rows;
  moved[1].grad += 1;  // storage reallocated
  CHECK_FALSE(plan_matches(plan, moved, kChunkElements));
  std::vector<MtTensor> slot = rows;
  slot[2].slot1 = nullptr;
  CHECK_FALSE(plan_matches(plan, slot, kChunkElements));
  std::vector<MtTensor> count = rows;
  count[0].numel = 9;
  CHECK_FALSE(plan_matches(plan, count, kChunkElements));
  std::vector<MtTensor> rule = rows;
  rule[0].rule = 1;
  CHECK_FALSE(plan_matches(plan, rule, kChunkElements));
  std::vector<MtTensor> order = {b.row(), a.row(), c.row()};
  CHECK_FALSE(plan_matches(plan, order, kChunkElements));
}

// The cache on the host device: the same bookkeeping as on a GPU, with a table one can read.
TEST_CASE("multi-tensor cache: uploads a table only when the tensors change") {
  Buffers a(10), b(70000), c(5);
  const std::vector<MtTensor> rows = {a.row(), b.row(), c.row()};
  MultiTensorCache cache;
  const MtLaunch first = cache.launch_for(rows, Device::cpu());
  CHECK(cache.uploads() == 1);
  CHECK(first.n_chunks == 4);
  CHECK(first.n_tensors == 3);
  CHECK(first.chunks[1].param == b.param.data());
  CHECK(first.chunks[2].param == b.param.data() + kChunkElements);
  CHECK(first.first_chunk[3] == 4);

  const MtLaunch again = cache.launch_for(rows, Device::cpu());
  CHECK(cache.uploads() == 1);
  CHECK(again.chunks == first.chunks);  // the same table, not a copy

  cache.launch_for({a.row(), c.row()}, Device::cpu());  // b frozen
  CHECK(cache.uploads() == 2);
  CHECK(cache.plan().chunks.size() == 2);
  const MtLaunch back = cache.launch_for(rows, Device::cpu());  // b trainable again
  CHECK(cache.uploads() == 3);
  CHECK(back.n_chunks == 4);
  CHECK(back.chunks[3].param == c.param.data());
}

// The kernels' walk on the host: rows in any order (blocks run in any order), each row a
// loop over its chunk with its rule. Against the per-parameter loop on copies of the same
// data, bit for bit, after three steps with the momentum buffer carried over.
TEST_CASE("multi-tensor plan: walking the table updates each element once, as per parameter") {
  const std::vector<int64_t> sizes = {1, 3, 65536, 65537, 0, 200000};
  std::vector<Buffers> table_bufs, loop_bufs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    table_bufs.emplace_back(sizes[i], static_cast<float>(i));
    loop_bufs.emplace_back(sizes[i], static_cast<float>(i));
  }
  // Every second tensor without weight decay: two rules.
  std::vector<RuleClass> per_tensor;
  for (size_t i = 0; i < sizes.size(); ++i) per_tensor.push_back({i % 2 == 0, 1});
  std::vector<int32_t> rule_of;
  REQUIRE(rule_classes(per_tensor, rule_of).size() == 2);
  std::vector<MtTensor> rows;
  for (size_t i = 0; i < sizes.size(); ++i) {
    rows.push_back(table_bufs[i].row(rule_of[i]));
    rows.back().slot1 = nullptr;
  }
  const MtPlan plan = make_plan(rows);
  for (int64_t t = 1; t <= 3; ++t) {
    const SgdRule rules[2] = {sgd_rule(0.1, 0.9, 0.0, 1e-2, true, t == 1), sgd_rule(0.1, 0.9, 0.0, 0.0, true, t == 1)};
    for (size_t r = plan.chunks.size(); r-- > 0;) {  // last row first
      const MtChunk& c = plan.chunks[r];
      for (int64_t i = 0; i < c.count; ++i) apply(rules[c.rule], c.param[i], c.grad[i], c.slot0 + i);
    }
    for (size_t k = 0; k < sizes.size(); ++k) {
      Buffers& b = loop_bufs[k];
      const SgdRule& rule = rules[rule_of[k]];
      for (size_t i = 0; i < b.param.size(); ++i) apply(rule, b.param[i], b.grad[i], &b.slot0[i]);
    }
  }
  for (size_t k = 0; k < sizes.size(); ++k) {
    INFO("tensor " << k << " of " << sizes[k] << " elements");
    if (sizes[k] == 0) continue;
    CHECK(std::memcmp(table_bufs[k].param.data(), loop_bufs[k].param.data(), sizes[k] * sizeof(float)) == 0);
    CHECK(std::memcmp(table_bufs[k].slot0.data(), loop_bufs[k].slot0.data(), sizes[k] * sizeof(float)) == 0);
  }
  // And the walk did change them (a table that skipped everything would also agree above
  // if the loop were broken alike).
  CHECK(table_bufs[5].param[199999] != Buffers(200000, 5.0f).param[199999]);
}
