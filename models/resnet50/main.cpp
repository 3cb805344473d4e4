// ResNet-50 v1.5 on ImageNet, data parallel: the tutorial's headline program.
//
//   tarantella -n 4 -- build/bin/resnet50 --data_dir=/data/imagenet --batch_size=512
//       --train_epochs=90 --epochs_between_evals=10   (one command line)
//
// The recipe is the TF Model Garden's / the Tarantella tutorial's: SGD with momentum 0.9,
// weight decay 1e-4 on everything but BatchNorm, learning rate 0.1 per 256 samples scaled
// linearly to the global batch, linear warmup, x0.1 at epochs 30, 60, 80.
//
// Synthetic data (--use_synthetic_data) measures throughput without I/O: each rank makes
// its own micro-batch of random images once, on its device, and trains on it at every step
// of an epoch of --synthetic_samples samples (ImageNet's 1,281,167 by default, so the
// schedule is the real one); nothing is read, decoded or copied per step. Evaluation uses a
// small host pool. --train_steps ends the run early, on every rank.
//
// Real data (tarantella/imagenet.hpp): each rank lists the whole split, distribute() gives
// it its slice of every global batch, and only then are its own samples decoded and
// augmented, on --data_workers threads, so no rank reads another rank's files.
//
// --enable_checkpoint_and_export writes <model_dir>/checkpoint.safetensors after every epoch;
// --resume continues from it as fashion_mnist and the transformer do (epoch, optimizer step
// and so the learning-rate schedule; the data's order is a function of the seed and epoch).
//
// --data_format (the Model Garden's flag): channels_last keeps the activations NHWC between
// the convolutional layers (Network::set_memory_format), what tensor cores run without
// transposes, and what oneDNN's CPU convolutions run fastest here too (about 1.2x NCHW on
// one rank of 2 threads: docs/performance.md); it is the default on every device.
// channels_first keeps NCHW. Weights and checkpoints are the same.
#include "data_workers.hpp"
#include "resnet.hpp"
#include "throughput_logger.hpp"

#include "common/flags.hpp"
#include "common/schedule_resume.hpp"
#include "common/signals.hpp"
#include "common/wording.hpp"

#include <tarantella/imagenet.hpp>
#include <tarantella/tarantella.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

namespace {

constexpr int64_t kImageNetTrainSamples = 1281167;
constexpr int64_t kImageNetValSamples = 50000;
// Bounds the memory of the synthetic pool: 256 images of 3x224x224 f32 are 154 MB.
constexpr int64_t kMaxSyntheticPool = 256;
// Sane limits of the flags that size resources: a batch of 1024x1024 images already
// needs gigabytes per sample through the network (and data_workers.hpp bounds the decoding
// threads at 256). Beyond them a typo would end in an allocation or thread failure that
// names no flag.
constexpr int64_t kMaxImageSize = 1024;

// Random images in [-1, 1) (roughly what normalisation gives) and labels in
// [0, num_classes); `count` elements cycling through a pool generated once.
tnt::Dataset synthetic_imagenet(int64_t count, int64_t pool_size, int64_t image_size, int64_t num_classes,
                                uint64_t seed) {
  tnt::Dataset source = tnt::Dataset::synthetic(
      {tnt::SyntheticColumn{{3, image_size, image_size}, tnt::DType::f32, -1.0, 1.0},  // (3, S, S)
       tnt::SyntheticColumn{{}, tnt::DType::i64, 0.0, static_cast<double>(num_classes)}},  // ()
      pool_size, seed);
  auto pool = std::make_shared<std::vector<tnt::Element>>();
  auto it = source.iterate(0);
  while (auto e = it.next()) pool->push_back(std::move(*e));
  return tnt::Dataset::from_function(count, [pool](int64_t i) {
    return (*pool)[static_cast<size_t>(i % static_cast<int64_t>(pool->size()))];
  });
}

// Evaluation samples in ImageNet's proportion to the samples of an epoch that is trained
// (fewer with --train_steps), at least one global batch: a short throughput run does not
// spend minutes evaluating 50,000 images, and the full schedule evaluates ImageNet's number.
int64_t default_synthetic_eval_samples(int64_t epoch_samples, int64_t train_steps, int64_t global_batch) {
  int64_t trained = epoch_samples;
  if (train_steps > 0 && train_steps <= trained / global_batch) trained = train_steps * global_batch;
  const double share = static_cast<double>(kImageNetValSamples) / static_cast<double>(kImageNetTrainSamples);
  const auto samples = static_cast<int64_t>(std::ceil(static_cast<double>(trained) * share - 1e-9));
  return std::max(samples, global_batch);
}

// This rank's rows of one global batch of synthetic samples, made once on `device`; the
// epoch yields them at each of its `steps` steps (fit with distribute_dataset = false).
tnt::Dataset synthetic_device_batches(int64_t global_batch, int64_t steps, int64_t image_size, int64_t num_classes,
                                      uint64_t seed, tnt::Device device) {
  const int64_t micro = tnt::micro_batch_size(global_batch, tnt::rank(), tnt::size());
  const int64_t offset = tnt::micro_batch_offset(global_batch, tnt::rank(), tnt::size());
  tnt::Dataset source = tnt::Dataset::synthetic(
      {tnt::SyntheticColumn{{3, image_size, image_size}, tnt::DType::f32, -1.0, 1.0},  // (3, S, S)
       tnt::SyntheticColumn{{}, tnt::DType::i64, 0.0, static_cast<double>(num_classes)}},  // ()
      global_batch, seed);
  auto it = source.skip(offset).take(micro).batch(micro).iterate(0);
  std::optional<tnt::Element> host = it.next();
  TNT_CHECK(host && host->size() == 2, "synthetic data: no batch of {} samples", micro);
  auto batch = std::make_shared<tnt::Element>(tnt::Element{(*host)[0].to(device), (*host)[1].to(device)});
  return tnt::Dataset::generator(
      [batch, steps](int64_t) -> tnt::ElementFn {
        auto done = std::make_shared<int64_t>(0);
        return [batch, steps, done]() -> std::optional<tnt::Element> {
          if ((*done)++ >= steps) return std::nullopt;
          return *batch;
        };
      },
      steps);
}

// What one image leaves for backward at the least: the output of every convolution (each
// feeds a BatchNorm, whose backward needs it), counted over ResNet-50 v1.5's layers at the
// image size: the stem (64 channels at S/2), then per stage (S/4, S/8, S/16, S/32; widths 64
// to 512, 3/4/6/3 bottlenecks) each bottleneck's 1x1 (at the stage's input size in the first
// block: v1.5 strides on the 3x3), 3x3 and expanding 1x1, and the first block's projection.
// 11.1 million values at 224x224: about 44 MB in fp32, a third of what a framework keeps.
int64_t conv_output_values_per_image(int64_t image_size) {
  auto half = [](int64_t s) { return (s + 1) / 2; };  // a stride-2 convolution or pooling, padded
  int64_t s = half(image_size);
  int64_t values = 64 * s * s;  // conv1
  s = half(s);                  // max pool
  const int64_t widths[4] = {64, 128, 256, 512}, blocks[4] = {3, 4, 6, 3};
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t w = widths[stage], in = s;
    if (stage > 0) s = half(s);
    for (int64_t b = 0; b < blocks[stage]; ++b) {
      const int64_t first_in = b == 0 ? in : s;
      values += w * first_in * first_in + w * s * s + 4 * w * s * s;  // conv1, conv2, conv3
      if (b == 0) values += 4 * w * s * s;                              // downsample
    }
  }
  return values;
}

// Before anything big is allocated (the synthetic batch alone is micro-batch x 3 x S x S
// floats): whether the model and one training step can fit the rank's memory (the host's,
// shared by its local ranks; or the GPU's). A lower bound, so a run refused here could never
// have run, and the rest end in the kernel's out-of-memory killer without a word: the
// parameters with their gradients and SGD's momentum (the classifier grows with
// --num_classes), the convolution outputs of the largest micro-batch, its logits, its input
// images, and with synthetic data the batch made once and the evaluation pool.
void check_fits_memory(int64_t image_size, int64_t global_batch, int64_t num_classes, bool synthetic, bool half) {
  const tnt_models::RankMemory memory = tnt_models::rank_memory();
  const double capacity = memory.capacity;
  if (capacity == 0) return;  // unknown: nothing to compare with
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double micro = static_cast<double>((global_batch + tnt::size() - 1) / tnt::size());
  const double classes = static_cast<double>(num_classes), s2 = static_cast<double>(image_size * image_size);
  // ResNet-50's 23.5 million parameters without the classifier, and the classifier's.
  const double params = 23'508'032.0 + 2049.0 * classes;
  const double state = params * 12.0;  // f32 weights, gradients, momentum
  const double elt = half ? 2.0 : 4.0;
  const double step = micro * (elt * static_cast<double>(conv_output_values_per_image(image_size)) +
                               4.0 * (2.0 * classes + 3.0 * s2));
  const double data = synthetic ? 4.0 * 3.0 * s2 * (micro + static_cast<double>(std::min<int64_t>(global_batch, kMaxSyntheticPool)))
                                : 0.0;
  const double need = state + step + data;
  TNT_INPUT_CHECK(need <= capacity,
                  "--image_size={}, --batch_size={} over {} (a micro-batch of {}) and --num_classes={} need at least "
                  "{:.1f} GiB per rank, more than the {:.1f} GiB of {}: {:.1f} GiB for the parameters with their "
                  "gradients and momentum, {:.1f} GiB for one step's activations ({:.1f} MB an image at {}x{}){}; make "
                  "the batch, the images or the classes fewer",
                  image_size, global_batch, tnt_models::count_of(tnt::size(), "rank"), static_cast<int64_t>(micro),
                  num_classes, need / gib, capacity / gib,
                  memory.what,
                  state / gib, step / gib, step / micro / 1e6, image_size, image_size,
                  synthetic ? fmt::format(", {:.1f} GiB for the synthetic images", data / gib) : std::string());
}

}  // namespace

int main(int argc, char** argv) {
  tnt_models::hold_warning_signals();  // first: a warning while the program starts is kept
  tnt_models::ProgramFlags flags(
      "resnet50", "Trains ResNet-50 v1.5 on ImageNet, data parallel over the ranks that tarantella starts.",
      {"tarantella -n 4 -- build/bin/resnet50 --data_dir=/data/imagenet --batch_size=512 \\\n"
       "--train_epochs=90 --epochs_between_evals=10",
       "tarantella -n 2 -- build/bin/resnet50 --use_synthetic_data --batch_size=256 --train_steps=100",
       "build/bin/resnet50 --use_synthetic_data --image_size=64 --num_classes=10 --batch_size=32 \\\n"
       "--train_steps=20 --log_steps=5   (a quick CPU throughput check)",
       "tarantella -- build/bin/resnet50 --use_synthetic_data --dtype=bf16 --train_steps=100\n"
       "(mixed precision on a GPU: bf16 layers, fp32 master weights)",
       "build/bin/resnet50 --use_synthetic_data --image_size=64 --batch_size=32 --train_steps=20 \\\n"
       "--data_format=channels_first   (NCHW activations instead of the default NHWC)",
       "tarantella -n 4 -- build/bin/resnet50 --data_dir=/data/imagenet --enable_checkpoint_and_export \\\n"
       "--resume   (continue the run in --model_dir from its checkpoint)",
       "build/bin/resnet50 --use_synthetic_data --image_size=64 --batch_size=32 --train_steps=20 \\\n"
       "--enable_tensorboard --profile_steps=2,3 --enable_time_history --log_steps=5\n"
       "(TensorBoard, a timeline of steps 2-3, images/s every 5 steps)"},
      {.data_dir = "",
       .data_dir_help = "ImageNet directory: JPEG class folders (train/<wnid>/*.JPEG, val/<wnid>/*.JPEG), or "
                        "TFRecord shards (train-00000-of-01024 ..., validation-00000-of-00128 ...; labels 1-based, "
                        "as the Inception scripts write them), or what tensorflow_datasets' download_and_prepare "
                        "--datasets=imagenet2012 --data_dir=DIR writes (give DIR, DIR/imagenet2012 or a version "
                        "folder such as DIR/imagenet2012/5.1.0; the highest version is read; labels 0-based). "
                        "Tried in that order; the layout found is printed. Example: "
                        "--data_dir=$TNT_DATASETS_PATH",
       .model_dir = "./resnet50_model",
       .model_dir_help = "where history.csv, checkpoint.safetensors and model.safetensors go",
       .batch_size = 256,
       .train_epochs = 90,
       .epochs_between_evals_help = "evaluate (top-1, top-5) every this many epochs",
       .seed_help = "seed of weights and data",
       .verbose = 2,
       .micro_batch_size_help =
           "images per rank and step: the global batch is then micro_batch_size x ranks, and the learning rate "
           "(--base_learning_rate per 256) follows it, so a weak-scaling series keeps this flag and changes only "
           "the ranks; e.g. tarantella -n 4 -- build/bin/resnet50 --use_synthetic_data --micro_batch_size=64 "
           "trains on global batches of 256 at learning rate 0.1. 0: --batch_size alone; given with --batch_size, "
           "batch_size must be micro_batch_size x ranks"});
  // clang-format off
  flags.add_options()
    ("enable_checkpoint_and_export", "checkpoint after every epoch, export the weights at the end", cxxopts::value<bool>()->default_value("false"))
    ("resume", std::string("continue from <model_dir>/checkpoint.safetensors (with --enable_checkpoint_and_export)") + tnt_models::kResumeAutoHelp, tnt_models::resume_flag_value())
    ("use_synthetic_data", "random images instead of ImageNet (throughput measurements)", cxxopts::value<bool>()->default_value("false"))
    ("synthetic_samples", "with --use_synthetic_data: training samples per epoch (ImageNet's size by default)", cxxopts::value<int64_t>()->default_value(std::to_string(kImageNetTrainSamples)))
    ("synthetic_eval_samples", "with --use_synthetic_data: evaluation samples (default: ImageNet's 50,000 per 1,281,167 training samples, in proportion to an epoch's training samples: --synthetic_samples, or --train_steps x --batch_size when fewer; at least one global batch)", cxxopts::value<int64_t>())
    ("num_classes", "number of classes", cxxopts::value<int64_t>()->default_value("1000"))
    ("image_size", "image height and width (32 to 1024; small values for CPU tests)", cxxopts::value<int64_t>()->default_value("224"))
    ("base_learning_rate", "learning rate for a global batch of 256, scaled linearly to --batch_size", cxxopts::value<double>()->default_value("0.1"))
    ("warmup_epochs", "epochs of linear learning-rate warmup", cxxopts::value<int64_t>()->default_value("5"))
    ("label_smoothing", "label smoothing of the cross-entropy", cxxopts::value<double>()->default_value("0.0"))
    ("zero_init_residual", "start the last BatchNorm of each block at 0", cxxopts::value<bool>()->default_value("false"))
    ("data_format", "channels_first or channels_last (also nchw/contiguous, nhwc): the memory format of the activations between the convolutional layers (channels_last is faster on GPUs and CPUs)", cxxopts::value<std::string>()->default_value("channels_last"))
    ("dtype", "fp32, bf16 or fp16: the last two are mixed precision with fp32 master weights (fp16 with dynamic loss scaling); on a CPU rank only emulated", cxxopts::value<std::string>()->default_value("fp32"))
    ("train_steps", "stop after this many steps in total (0 = no limit)", cxxopts::value<int64_t>()->default_value("0"))
    ("log_steps", "print images/s every this many timed steps (an epoch's first step is not timed; 0 = only at the end, except with --enable_time_history, which needs at least 1)", cxxopts::value<int64_t>()->default_value("100"))
    ("data_workers", "threads decoding and augmenting images on each rank: 1 to 256, or auto (on a GPU rank its cores but one, on a CPU rank 4)", cxxopts::value<std::string>()->default_value("auto"));
  // clang-format on
  tnt_models::add_callback_flags(flags, "images");
  if (std::optional<int> status = flags.parse(argc, argv)) return *status;

  return tnt::run_main(argc, argv, [&] {
    const cxxopts::ParseResult& args = flags.args();
    const tnt_models::CommonFlags common = flags.common();
    const bool synthetic = args["use_synthetic_data"].as<bool>();
    const int64_t synthetic_samples = args["synthetic_samples"].as<int64_t>();
    const bool eval_samples_given = args.count("synthetic_eval_samples") > 0;
    const int64_t num_classes = args["num_classes"].as<int64_t>();
    const int64_t image_size = args["image_size"].as<int64_t>();
    const double base_lr = args["base_learning_rate"].as<double>();
    const int64_t warmup_epochs = args["warmup_epochs"].as<int64_t>();
    const double label_smoothing = args["label_smoothing"].as<double>();
    const std::string dtype = args["dtype"].as<std::string>();
    const std::string data_format = args["data_format"].as<std::string>();
    const int64_t train_steps = args["train_steps"].as<int64_t>();
    const int64_t log_steps = args["log_steps"].as<int64_t>();
    const std::string data_workers_flag = args["data_workers"].as<std::string>();
    const bool checkpoint_and_export = args["enable_checkpoint_and_export"].as<bool>();
    tnt_models::take_warning_signals("resnet50", checkpoint_and_export);
    const tnt_models::ResumeFlag resume_given = tnt_models::parse_resume_flag(args);
    const bool resume_flag = resume_given.resume;
    // Without checkpoints the continued run would leave the old one behind its history.
    TNT_INPUT_CHECK(!resume_flag || checkpoint_and_export,
                    "--resume: needs --enable_checkpoint_and_export (a run continues from its checkpoint and "
                    "writes the next ones)");

    TNT_INPUT_CHECK(num_classes >= 2, "--num_classes={}: must be at least 2", num_classes);
    TNT_INPUT_CHECK(image_size >= 32, "--image_size={}: must be at least 32 (ResNet-50 downsamples by 32)", image_size);
    TNT_INPUT_CHECK(image_size <= kMaxImageSize, "--image_size={}: must be at most {}", image_size, kMaxImageSize);
    {
      // BatchNorm normalises each rank's micro-batch by its own statistics, which need more
      // than one value per channel: in the last stage (layer4, maps of ceil(S / 32) pixels a
      // side) a micro-batch of one 1x1 map has one. The smallest micro-batch is B // p (the
      // ranks take B // p or B // p + 1 when p does not divide B); B < p is fit()'s error.
      const int64_t map = (image_size + 31) / 32;
      const int64_t smallest = common.batch_size / tnt::size();
      const int64_t largest = (common.batch_size + tnt::size() - 1) / tnt::size();
      TNT_INPUT_CHECK(smallest == 0 || smallest * map * map > 1,
                      "--batch_size={} over {} gives {} a micro-batch of {}, and --image_size={} gives the last "
                      "stage (layer4) feature maps of {}x{}: BatchNorm's training statistics need more than one value per "
                      "channel (micro-batch x feature map > 1); give --batch_size at least {} (2 images per rank) or "
                      "--image_size above 32",
                      common.batch_size, tnt_models::count_of(tnt::size(), "rank"),
                      smallest == largest ? "each rank" : "a rank", tnt_models::count_of(smallest, "image"), image_size,
                      map, map, 2 * tnt::size());
    }
    TNT_INPUT_CHECK(base_lr > 0, "--base_learning_rate={}: must be positive", base_lr);
    // At most a million, as fashion_mnist: times the steps of an epoch it must fit 64 bits.
    TNT_INPUT_CHECK(warmup_epochs >= 0 && warmup_epochs <= 1000000, "--warmup_epochs={}: must be from 0 to 1000000",
                    warmup_epochs);
    TNT_INPUT_CHECK(label_smoothing >= 0 && label_smoothing < 1, "--label_smoothing={}: must be in [0, 1)",
                    label_smoothing);
    TNT_INPUT_CHECK(train_steps >= 0, "--train_steps={}: must be at least 0", train_steps);
    const tnt_models::DataWorkers workers =
        tnt_models::resolve_data_workers(data_workers_flag, tnt::default_device().is_cuda(), tnt::rank_cores());
    const int data_workers = workers.count;
    TNT_INPUT_CHECK(log_steps >= 0, "--log_steps={}: must be at least 0", log_steps);
    const tnt_models::CallbackFlags callback_flags = tnt_models::callback_flags(flags, common);
    TNT_INPUT_CHECK(dtype == "fp32" || dtype == "bf16" || dtype == "fp16", "--dtype={}: expected fp32, bf16 or fp16",
                    dtype);
    // bf16/fp16: mixed precision with f32 master weights (and loss scaling for fp16). On a
    // CPU rank it is emulated (no faster than fp32); Model::compile says so.
    const tnt::Precision precision = tnt::Precision::from_name(dtype);
    tnt::MemoryFormat memory_format = tnt::MemoryFormat::channels_last;
    try {
      memory_format = tnt::parse_memory_format(data_format);
    } catch (const tnt::InputError&) {
      TNT_INPUT_ERROR("--data_format={}: expected channels_first or channels_last (also nchw, contiguous, nhwc)",
                      data_format);
    }
    if (synthetic) {
      TNT_INPUT_CHECK(synthetic_samples >= common.batch_size,
                      "--synthetic_samples={}: smaller than one global batch (--batch_size={})", synthetic_samples,
                      common.batch_size);
    }
    check_fits_memory(image_size, common.batch_size, num_classes, synthetic, precision.mixed());
    // What an earlier run left there is continued (--resume, or a restart of tarantella
    // --max-restarts) from the checkpoint, with --enable_checkpoint_and_export (without, a
    // restart starts over), or replaced (--overwrite), never silently overwritten. A refusal
    // comes now, before the data and the model are made (about 2 s on two cores).
    const tnt_models::ModelDir model_dir_use{
        .path = common.model_dir,
        .given = common.model_dir_given,
        .outputs = {"history.csv", "checkpoint.safetensors", "model.safetensors"},
        .can_resume = checkpoint_and_export,
        .resume = resume_flag,
        .resume_auto = resume_given.automatic,
        .overwrite = common.overwrite,
        .checkpoint = checkpoint_and_export ? "checkpoint.safetensors" : "",
        .checkpoint_flag = "--enable_checkpoint_and_export writes one"};
    tnt_models::check_model_dir_early(model_dir_use);

    // Data: either unbatched datasets that fit() distributes (synthetic), or datasets
    // already distributed and then decoded (ImageNet).
    tnt::Dataset train_data, eval_data;
    std::optional<tnt::DistributedDataset> train_dist, eval_dist;
    int64_t epoch_size = 0;
    int64_t eval_samples = 0;  // for the last line
    if (synthetic) {
      const int64_t synthetic_eval_samples =
          eval_samples_given ? args["synthetic_eval_samples"].as<int64_t>()
                             : default_synthetic_eval_samples(synthetic_samples, train_steps, common.batch_size);
      TNT_INPUT_CHECK(synthetic_eval_samples >= 1, "--synthetic_eval_samples={}: must be positive",
                      synthetic_eval_samples);
      const int64_t pool = std::min(common.batch_size, kMaxSyntheticPool);
      train_data = synthetic_device_batches(common.batch_size, synthetic_samples / common.batch_size, image_size,
                                            num_classes, common.seed, tnt::default_device());
      eval_data = synthetic_imagenet(synthetic_eval_samples, std::min(pool, synthetic_eval_samples), image_size,
                                     num_classes, common.seed + 1);
      epoch_size = synthetic_samples;
      eval_samples = synthetic_eval_samples;
    } else {
      TNT_INPUT_CHECK(!common.data_dir.empty(),
                      "--data_dir is missing: give the ImageNet directory, or --use_synthetic_data");
      tnt_models::check_directory_flag("data_dir", common.data_dir);
      tnt::ImagenetOptions train_opts;
      train_opts.shuffle = true;
      train_opts.seed = common.seed;
      // Labels beyond --num_classes are named with their folder or record when read.
      train_opts.num_classes = num_classes;
      tnt::ImagenetOptions val_opts;
      val_opts.num_classes = num_classes;
      const tnt::ImagenetLayout train_layout = tnt::find_imagenet_layout(common.data_dir, "train");
      const tnt::ImagenetLayout val_layout = tnt::find_imagenet_layout(common.data_dir, "val");
      // Class folders: val/ is labelled by the names of train/'s folders, so a val/ that
      // lacks a class does not shift the labels of the ones after it.
      if (train_layout.kind == "folders" && val_layout.kind == "folders") {
        val_opts.class_names = tnt::image_folder_classes(train_layout.dir);
      } else if (train_layout.kind == "folders" || val_layout.kind == "folders") {
        // One split in class folders, the other in record files: the records' labels are
        // indices into the whole sorted class list, the folders' their place among the
        // folders there are. Only a split with a folder for every class numbers them alike.
        const tnt::ImagenetLayout& folders = train_layout.kind == "folders" ? train_layout : val_layout;
        const tnt::ImagenetLayout& records = train_layout.kind == "folders" ? val_layout : train_layout;
        const auto classes = static_cast<int64_t>(tnt::image_folder_classes(folders.dir).size());
        TNT_INPUT_CHECK(classes == num_classes,
                        "--data_dir={}: the {} split is in class folders ({} of them) and the {} split in record "
                        "files, whose labels index all {} classes (--num_classes): the folders' labels would not "
                        "match the records' (a missing folder shifts every class after it); give {} a folder for "
                        "each of the {} classes, or both splits in one layout",
                        common.data_dir, folders.split, classes, records.split, num_classes, folders.dir, num_classes);
      }
      if (common.verbose > 0) tnt::print("{}\n{}", train_layout.describe(), val_layout.describe());
      // A small set of class folders under the default of 1000 classes trains a head whose
      // other outputs never see a label: say so (the tutorial's ImageNet has 1000).
      if (train_layout.kind == "folders" && args.count("num_classes") == 0) {
        const auto found = static_cast<int64_t>(tnt::image_folder_classes(train_layout.dir).size());
        if (found < num_classes) {
          tnt::print("note: {} class folders in {}, and the model has --num_classes={} outputs (the default); give "
                     "--num_classes={} for a head of those classes alone",
                     found, train_layout.dir, num_classes, found);
        }
      }
      tnt::Dataset train_files = tnt::imagenet_dataset(train_layout, train_opts);
      tnt::Dataset val_files = tnt::imagenet_dataset(val_layout, val_opts);
      epoch_size = train_files.cardinality();
      eval_samples = val_files.cardinality();
      // An accuracy over no images would read as 0, a model that learnt nothing.
      TNT_INPUT_CHECK(eval_samples > 0, "--data_dir={}: the validation split ({}) holds no images", common.data_dir,
                      val_layout.describe());
      TNT_INPUT_CHECK(epoch_size >= common.batch_size,
                      "--data_dir={}: {} training images, fewer than one global batch (--batch_size={})",
                      common.data_dir, epoch_size, common.batch_size);
      // Training drops the last partial batch (as the tutorial); evaluation pads it, so
      // every validation image counts exactly once.
      train_dist = train_files.distribute(common.batch_size, tnt::Remainder::drop)
                       .map(tnt::imagenet_preprocess(image_size, true, common.seed), data_workers)
                       .prefetch(4);
      eval_dist = val_files.distribute(common.batch_size, tnt::Remainder::pad)
                      .map(tnt::imagenet_preprocess(image_size, false, common.seed), data_workers)
                      .prefetch(4);
    }

    auto net = tnt_models::make_resnet50(num_classes, args["zero_init_residual"].as<bool>(), image_size);
    net->set_memory_format(memory_format);
    tnt::Model model(net, common.seed);
    tnt::SgdOptions sgd;
    sgd.momentum = 0.9;
    sgd.weight_decay = 1e-4;
    sgd.decay_filter = [](const std::string& name) { return !tnt_models::is_batch_norm_parameter(name); };
    auto schedule = tnt_models::make_lr_schedule(common.batch_size, epoch_size, warmup_epochs, base_lr);
    model.compile(std::make_shared<tnt::SGD>(schedule, sgd), std::make_shared<tnt::SoftmaxCrossEntropy>(label_smoothing),
                  {std::make_shared<tnt::Accuracy>(), std::make_shared<tnt::TopKAccuracy>(5)}, precision);

    const tnt_models::RunDir run = tnt_models::prepare_model_dir(model_dir_use);
    const bool resume = run.resume;
    const std::string& model_dir = run.path;
    const std::string checkpoint = model_dir + "/checkpoint.safetensors";
    int initial_epoch = 0;
    // What a resume compares: the head's size must be the same; the training settings a
    // resumed run may change, and is told it did.
    using tnt_models::flag_text;
    const tnt_models::RunFlags run_flags{.same = {{"num_classes", flag_text(num_classes)}},
                                         .noted = {{"base_learning_rate", flag_text(base_lr)},
                                                   {"warmup_epochs", flag_text(warmup_epochs)},
                                                   {"label_smoothing", flag_text(label_smoothing)},
                                                   {"batch_size", flag_text(common.batch_size)},
                                                   {"image_size", flag_text(image_size)}},
                                         .same_inside_epoch = {"batch_size"},
                                         .micro_batch_size = common.micro_batch_size};
    // The data's order is a function of the seed and the epoch: it continues too.
    if (resume) {
      initial_epoch = tnt_models::resume_from_checkpoint(model, checkpoint, common.seed, run_flags, common.seed_given);
      // The schedule is in epochs: at another global batch it goes on from the epoch reached.
      tnt_models::align_schedule_to_epochs(model, schedule, initial_epoch, epoch_size / common.batch_size);
    }
    tnt_models::record_run_flags(model, run_flags);

    if (common.verbose > 0) {
      tnt::print("ResNet-50 v1.5: {} parameters, {} classes, images {}x{}", net->parameter_count(), num_classes,
                 image_size, image_size);
      tnt::print("{}, global batch {}{}, {} training samples per epoch{}", tnt_models::count_of(tnt::size(), "rank"),
                 common.batch_size,
                 common.micro_batch_size > 0 ? fmt::format(" (--micro_batch_size={} x {})", common.micro_batch_size,
                                                           tnt_models::count_of(tnt::size(), "rank"))
                                             : std::string(),
                 epoch_size, synthetic ? " (synthetic)" : "");
      tnt::print("learning rate: {}",
                 tnt_models::describe_lr_schedule(common.batch_size, epoch_size, warmup_epochs, base_lr));
      tnt::print("data format: {}", memory_format == tnt::MemoryFormat::channels_last ? "channels_last"
                                                                                       : "channels_first");
      if (!synthetic) {
        if (workers.automatic) {
          tnt::print("data workers: {} on rank 0 ({}; each rank sizes its own)", data_workers, workers.why);
        } else {
          tnt::print("data workers: {} a rank", data_workers);
        }
      }
      if (precision.mixed()) {
        tnt::print("precision: {} compute, fp32 master weights{}", precision.name(),
                   precision.scales_loss() ? fmt::format(", dynamic loss scaling from {}", precision.initial_scale) : "");
      }
    }

    tnt::FitOptions fit;
    fit.batch_size = common.batch_size;
    if (synthetic) {  // the data are this rank's micro-batches already
      fit.distribute_dataset = false;
      fit.micro_batch_size = tnt::micro_batch_size(common.batch_size, tnt::rank(), tnt::size());
    }
    fit.epochs = common.train_epochs;
    fit.initial_epoch = initial_epoch;
    fit.initial_step = model.checkpoint_epoch_step();  // a checkpoint inside an epoch (--train_steps cut it)
    fit.verbose = common.verbose;
    if (train_dist) {
      fit.distributed_validation_data = eval_dist;
    } else {
      fit.validation_data = eval_data;
    }
    fit.validation_freq = common.epochs_between_evals;
    auto csv = std::make_shared<tnt::CSVLogger>(model_dir + "/history.csv", initial_epoch > 0 || fit.initial_step > 0);
    std::vector<std::string> columns{"loss", "accuracy", "top5_accuracy", "val_loss", "val_accuracy",
                                     "val_top5_accuracy", "learning_rate", "seconds"};
    if (precision.scales_loss()) columns.push_back("loss_scale");
    csv->set_columns(columns);
    // A diverged run (NaN or infinite loss) ends with an error naming the step and a non-zero
    // exit, before the epoch's history row and checkpoint.
    // --enable_time_history: TimeHistory's lines replace the logger's, which keeps its memory line.
    fit.callbacks = {std::make_shared<tnt::TerminateOnNaN>(tnt::TerminateOnNaN::Action::raise), csv,
                     std::make_shared<tnt_models::ThroughputLogger>(common.batch_size, callback_flags.time_history ? 0 : log_steps,
                                                        !callback_flags.time_history)};
    if (callback_flags.time_history) {
      tnt::TimeHistoryOptions time_options;
      time_options.unit = "images";
      fit.callbacks.push_back(std::make_shared<tnt::TimeHistory>(common.batch_size, log_steps, time_options));
    }
    fit.max_steps = train_steps;
    if (common.enable_tensorboard) {
      fit.callbacks.push_back(std::make_shared<tnt::TensorBoard>(model_dir, 0, callback_flags.profile_steps));
    }
    if (checkpoint_and_export) {
      fit.callbacks.push_back(std::make_shared<tnt::ModelCheckpoint>(checkpoint, "loss"));
    }
    tnt::History history;
    std::optional<tnt::Logs> evaluated;  // when nothing is trained: the checkpoint's weights evaluated
    // A resumed run whose checkpoint has reached --train_steps trains nothing either (fit
    // would stop at once, silently): its weights are evaluated, as past --train_epochs.
    const bool steps_reached = resume && train_steps > 0 && model.global_step() >= train_steps;
    if (initial_epoch >= common.train_epochs || steps_reached) {
      if (steps_reached && initial_epoch < common.train_epochs) {
        tnt::print("Nothing to train (the checkpoint is at step {}, --train_steps={}): evaluating its weights",
                   model.global_step(), train_steps);
      } else {
        tnt_models::print_nothing_to_train(resume, initial_epoch, common.train_epochs);
      }
      tnt::EvaluateOptions ev;
      ev.batch_size = common.batch_size;
      ev.verbose = common.verbose;
      evaluated = eval_dist ? model.evaluate(*eval_dist, ev) : model.evaluate(eval_data, ev);
    } else {
      history = train_dist ? model.fit(*train_dist, fit) : model.fit(train_data, fit);
      if (tnt_models::stopped_on_warning_signal(model, "resnet50", checkpoint)) return;
    }

    if (checkpoint_and_export) {
      // A model file (tnt::load_model, docs/model_files.md), as the tutorial's export is one:
      // the architecture in its metadata, and save_weights' tensors under torchvision's names,
      // so that it loads into torchvision.models.resnet50 as well.
      tnt::save_model(model, model_dir + "/model.safetensors");
    }
    if (!synthetic && !history.epochs.empty()) {
      // The rank that waited most for its images says so: one slow rank holds back all, and
      // the others see it as step time, not as a wait for their input.
      const tnt::EpochTiming& t = model.last_epoch_timing();
      const double mine = t.steps >= 10 ? t.input_fraction() : 0.0;
      const double worst = tnt::communicator().allreduce_max(mine);
      const int who = tnt::communicator().allreduce_min(mine == worst ? tnt::rank() : tnt::size());
      if (tnt::rank() == who) {
        if (std::string hint = tnt_models::input_bound_hint(t, workers, tnt::rank_cores()); !hint.empty()) {
          tnt::print("{}{}", tnt::size() > 1 ? fmt::format("rank {}: ", who) : std::string(), hint);
        }
      }
    }
    if (model.loss_scaler().enabled() && common.verbose > 0) {
      tnt::print("loss scaling: final scale {}, {} of {} skipped for overflow", model.loss_scaler().scale(),
                 model.loss_scaler().skipped_steps(), tnt_models::count_of(model.global_step(), "step"));
    }
    std::optional<std::array<double, 3>> result;  // top-1, top-5, loss
    if (evaluated) {
      result = {evaluated->at("accuracy"), evaluated->at("top5_accuracy"), evaluated->at("loss")};
    } else if (!history.epochs.empty() && history.history.count("val_accuracy")) {
      // The last validation, on the weights after the run's training steps.
      result = {history.last("val_accuracy"), history.last("val_top5_accuracy"), history.last("val_loss")};
    }
    if (result) {
      tnt::print("Evaluation: top-1 accuracy {:.4f}, top-5 accuracy {:.4f}, loss {:.4f} ({}, after {}, {})",
                 (*result)[0], (*result)[1], (*result)[2], tnt_models::count_of(eval_samples, "image"),
                 tnt_models::count_of(model.global_step(), "training step"), tnt_models::count_of(tnt::size(), "rank"));
    }
  });
}
