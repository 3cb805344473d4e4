// IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed.
//
// Layout: two zero bytes, a type code, the number of dimensions d, then d big-endian
// uint32 sizes, then the values in row-major order, big-endian. Type codes: 0x08 u8,
// 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64. A gzip file is recognised by its first
// two bytes (1f 8b), whatever its name.
#pragma once

#include "tarantella/tensor.hpp"

#include <cstdint>
#include <string>

namespace tnt {

// The file as a host tensor with the stored dimensions: u8 stays u8, i8 and i16 widen to
// i32, i32/f32/f64 keep their type. Throws InputError naming the file when it is missing
// or unreadable, is corrupt gzip, has a wrong magic number or type code, or holds fewer or
// more data bytes than its dimensions say.
Tensor read_idx(const std::string& path);

// Writes t (host or device; u8, i32, f32 or f64) as an IDX file, gzip-compressed if asked.
void write_idx(const std::string& path, const Tensor& t, bool gzip = false);

struct MnistSplit {
  Tensor images;  // f32 (N, 1, H, W), values in [0, 1] (bytes / 255)
  Tensor labels;  // i64 (N,)
  int64_t file_samples = 0;  // the samples the files hold (N is fewer under max_samples)
};

// What a program expects of the files: a label outside [0, num_classes) or images of
// another size end the load with an error naming the file (and the sample, for a label),
// instead of failing at a training step. 0: not checked.
struct MnistExpect {
  int64_t num_classes = 10;  // MNIST and Fashion-MNIST have 10
  int64_t height = 0;        // image rows (28 in both)
  int64_t width = 0;
  // Only the first max_samples samples are converted and kept (0: all), so that a program
  // training on a slice does not hold the whole set as f32. Labels are checked over those.
  int64_t max_samples = 0;
};

// Loads "<split>-images-idx3-ubyte" and "<split>-labels-idx1-ubyte" from dir, each either
// plain or with ".gz" appended (split: "train" or "t10k"; "test" means "t10k"). Checks
// that images are (N, H, W) u8, labels (N,) u8, the counts agree, and what `expect` says.
// N is the files' count, or expect.max_samples where that is fewer.
MnistSplit load_mnist_dir(const std::string& dir, const std::string& split, const MnistExpect& expect = {});

}  // namespace tnt
