// Throughput of the ImageNet input pipeline on this machine (not a CTest test): writes
// ImageNet-sized JPEGs (500x375 by default, ImageNet's most common size, q90, noisy content
// so the entropy decoder has real work) into a temporary image folder, then times decode +
// preprocess through distribute().map(workers).prefetch() for training and evaluation.
//
//   build/bin/tnt_imagenet_bench [images=256] [image_size=224] [workers=2]
// Prints: mode, workers, image_size, images, seconds, images_per_s; then the preprocessing
// alone on one thread, in milliseconds an image.
#include "tarantella/imagenet.hpp"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  return tnt::run_main(argc, argv, [&] {
    const int64_t images = argc > 1 ? std::atoll(argv[1]) : 256;
    const int64_t size = argc > 2 ? std::atoll(argv[2]) : 224;
    const int workers = argc > 3 ? std::atoi(argv[3]) : 2;
    TNT_CHECK(images > 0 && size > 0 && workers > 0, "usage: tnt_imagenet_bench [images] [image_size] [workers]");
    const int64_t h = 375, w = 500;
    std::string tmpl = (fs::temp_directory_path() / "tnt-imagenet-bench-XXXXXX").string();
    TNT_CHECK(::mkdtemp(tmpl.data()) != nullptr, "cannot create a temporary directory");
    struct Cleanup {
      fs::path root;
      ~Cleanup() {
        std::error_code ec;
        fs::remove_all(root, ec);
      }
    } cleanup{tmpl};
    const fs::path& root = cleanup.root;
    for (int64_t i = 0; i < images; ++i) {
      fs::path dir = root / "train" / fmt::format("n{:08d}", i % 10);
      fs::create_directories(dir);
      tnt::Tensor rgb = tnt::Tensor::empty({h, w, 3}, tnt::DType::u8);  // (H, W, 3)
      uint8_t* p = rgb.data<uint8_t>();
      uint64_t s = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + 1;
      for (int64_t k = 0; k < h * w * 3; ++k) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        p[k] = static_cast<uint8_t>((k / 3 % w) / 2 + (s & 31));
      }
      std::vector<uint8_t> jpeg = tnt::encode_jpeg(rgb, 90);
      std::ofstream(dir / fmt::format("{}.JPEG", i), std::ios::binary)
          .write(reinterpret_cast<const char*>(jpeg.data()), static_cast<std::streamsize>(jpeg.size()));
    }
    tnt::print("mode,workers,image_size,images,seconds,images_per_s");
    for (bool training : {true, false}) {
      auto data = tnt::imagenet_dataset(root.string(), "train", {.shuffle = true, .seed = 1})
                      .distribute(32, 0, 1, tnt::Remainder::pad)
                      .map(tnt::imagenet_preprocess(size, training, 1), workers)
                      .prefetch(2);
      auto start = std::chrono::steady_clock::now();
      int64_t n = 0;
      auto it = data.iterate(0);
      while (auto b = it.next()) n += b->real_samples;
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      tnt::print("{},{},{},{},{:.3f},{:.1f}", training ? "train" : "eval", workers, size, n, sec, n / sec);
    }
    // The map function alone on one thread, the fastest of 5 passes over (up to) 64 images:
    // the CPU time an image costs, steadier than the pipeline's rate on a busy machine. A
    // file's first read goes to its end (a damaged file is refused), later reads stop below
    // the rows they need: first read, a new map function each pass; later, one for all.
    std::vector<tnt::Element> raw;
    {
      auto it = tnt::imagenet_dataset(root.string(), "train").iterate(0);
      while (raw.size() < 64)
        if (auto e = it.next()) raw.push_back(std::move(*e)); else break;
    }
    tnt::print("mode,image_size,images,ms_per_image_first_read,ms_per_image_later");
    for (bool training : {true, false}) {
      auto fastest = [&](bool fresh) {
        tnt::MapFn f = tnt::imagenet_preprocess(size, training, 1);
        for (const tnt::Element& e : raw) f(e);  // every file read once
        double best = 1e30;
        for (int pass = 0; pass < 5; ++pass) {
          if (fresh) f = tnt::imagenet_preprocess(size, training, 1);
          auto start = std::chrono::steady_clock::now();
          for (const tnt::Element& e : raw) f(e);
          best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
        return 1e3 * best / static_cast<double>(raw.size());
      };
      tnt::print("{},{},{},{:.3f},{:.3f}", training ? "train" : "eval", size, raw.size(), fastest(true), fastest(false));
    }
  });
}
