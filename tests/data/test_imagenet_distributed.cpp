// The ImageNet pipeline on real ranks (run with 2 and 3): every rank writes the same small
// TFRecord dataset into its own temporary directory (no shared file system assumed), reads
// it shuffled through distribute() + map(), and the per-sample counts summed over the ranks
// show that the rank shares are disjoint and cover the epoch. Labels are checked against
// the pixels, which encode them.
#include "temp_dir.hpp"
#include <catch2/catch.hpp>

#include "tarantella/comm.hpp"
#include "tarantella/imagenet.hpp"
#include "tarantella/runtime.hpp"

#include <cmath>
#include <filesystem>
#include <unistd.h>

using namespace tnt;
namespace fs = std::filesystem;

namespace {

constexpr int kSamples = 23;  // prime: global batches of 4 or 5 leave a partial last one
constexpr int kClasses = 5;

using TempDir = tnt::test::TempDir;

int red_of(int label) { return 20 + 50 * label; }

// Sample i has label i % kClasses and is 16x24, solid red_of(label); 3 shards.
void write_dataset(const fs::path& root) {
  for (int s = 0; s < 3; ++s) {
    TFRecordWriter w((root / fmt::format("train-{:05d}-of-00003", s)).string());
    for (int i = s * kSamples / 3; i < (s + 1) * kSamples / 3; ++i) {
      Tensor rgb = Tensor::full({16, 24, 3}, 0, DType::u8);  // (H, W, 3)
      uint8_t* p = rgb.data<uint8_t>();
      for (int64_t k = 0; k < 16 * 24; ++k) p[3 * k] = static_cast<uint8_t>(red_of(i % kClasses));
      w.write(encode_example({encode_jpeg(rgb), i % kClasses + 1}));
    }
    w.close();
  }
}

}  // namespace

TEST_CASE("imagenet TFRecords on ranks: disjoint shares that cover the epoch") {
  TempDir tmp("tnt-imagenet-mpi");
  write_dataset(tmp.path);
  const int p = tnt::size();
  for (Remainder remainder : {Remainder::drop, Remainder::pad}) {
    for (int64_t global : {int64_t{4}, int64_t{5}}) {
      if (global < p) continue;
      Dataset raw = imagenet_dataset(tmp.path.string(), "train", {.shuffle = true, .seed = 3});
      const MapFn preprocess = imagenet_preprocess(8, true, 3);
      // The preprocessed sample plus its index, to count who saw what.
      MapFn with_index = [preprocess](Element e) {
        Tensor index = e[2];
        Element out = preprocess(std::move(e));
        out.push_back(index);
        return out;
      };
      const int64_t epoch = 1;
      auto data = raw.distribute(global, remainder).map(with_index, 2).prefetch(2);
      std::vector<float> seen(kSamples, 0.0f);  // (kSamples,)
      int64_t steps = 0;
      auto it = data.iterate(epoch);
      while (auto b = it.next()) {
        ++steps;
        const Tensor& images = b->columns[0];  // (b, 3, 8, 8)
        REQUIRE(images.shape() == Shape{b->micro_batch_size, 3, 8, 8});
        std::vector<double> labels = b->columns[1].to_double_vector();
        std::vector<double> ids = b->columns[2].to_double_vector();
        for (int64_t k = 0; k < b->micro_batch_size; ++k) {
          int64_t id = static_cast<int64_t>(ids[k]);
          REQUIRE(static_cast<int64_t>(labels[k]) == id % kClasses);
          // Red of the image centre, back on the 0..255 scale; the tolerance covers JPEG's
          // rounding of a solid colour (a few levels), far below the spacing of 50.
          float v = images.data<float>()[((k * 3 + 0) * 8 + 4) * 8 + 4];
          CHECK(std::abs((v * kImagenetStd[0] + kImagenetMean[0]) * 255.0 - red_of(static_cast<int>(labels[k]))) < 12.0);
          if (k < b->real_samples) seen[static_cast<size_t>(id)] += 1.0f;  // padding rows come last
        }
      }
      Tensor counts = Tensor::from_vector(seen, {kSamples});
      communicator().allreduce(counts);
      std::vector<float> total = counts.to_vector();
      const int64_t covered = remainder == Remainder::drop ? kSamples / global * global : kSamples;
      int64_t ones = 0;
      for (float c : total) {
        CHECK((c == 0.0f || c == 1.0f));
        ones += c == 1.0f;
      }
      CHECK(ones == covered);
      CHECK(steps == (remainder == Remainder::drop ? kSamples / global : (kSamples + global - 1) / global));
    }
  }
}
