// Fashion-MNIST, data parallel: the default demo of tarantella.
//
//   tarantella -n 2 -- build/bin/fashion_mnist --train_epochs=5 --batch_size=128
//
// The model is the CNN of the PyTorch tutorial (conv1, conv2, fc1, fc2) or an MLP (fc1, fc2,
// fc3); parameter names match the same PyTorch module, so the checkpoint loads there.
#include "common/flags.hpp"
#include "common/schedule_resume.hpp"
#include "common/signals.hpp"
#include "common/wording.hpp"

#include <tarantella/tarantella.hpp>

#include <cmath>
#include <filesystem>
#include <optional>

namespace {

constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

// PyTorch's default initialisation of Conv2d and Linear (weight and bias uniform in
// +-1/sqrt(fan_in)), so that this program starts like the PyTorch module it mirrors.
tnt::Initializer torch_default(int64_t fan_in) {
  double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return tnt::Initializer::uniform(-bound, bound);
}

std::shared_ptr<tnt::Conv2D> conv(int64_t in, int64_t out, const std::string& name) {
  tnt::Conv2DOptions o;
  o.padding = 1;
  o.kernel_initializer = o.bias_initializer = torch_default(in * 3 * 3);
  return std::make_shared<tnt::Conv2D>(out, 3, o, name);
}

std::shared_ptr<tnt::Dense> dense(int64_t in, int64_t out, const std::string& name) {
  tnt::DenseOptions o;
  o.kernel_initializer = o.bias_initializer = torch_default(in);
  return std::make_shared<tnt::Dense>(out, o, name);
}

std::shared_ptr<tnt::Sequential> make_cnn() {
  auto net = std::make_shared<tnt::Sequential>("fashion_mnist_cnn");
  net->add(conv(1, 32, "conv1"));
  net->add(std::make_shared<tnt::ReLU>("relu1"));
  net->add(std::make_shared<tnt::MaxPool2D>(2, "pool1"));
  net->add(conv(32, 64, "conv2"));
  net->add(std::make_shared<tnt::ReLU>("relu2"));
  net->add(std::make_shared<tnt::MaxPool2D>(2, "pool2"));
  net->add(std::make_shared<tnt::Flatten>("flatten"));
  net->add(dense(3136, 128, "fc1"));
  net->add(std::make_shared<tnt::ReLU>("relu3"));
  net->add(dense(128, 10, "fc2"));
  return net;
}

std::shared_ptr<tnt::Sequential> make_mlp() {
  auto net = std::make_shared<tnt::Sequential>("fashion_mnist_mlp");
  net->add(std::make_shared<tnt::Flatten>("flatten"));
  net->add(dense(784, 256, "fc1"));
  net->add(std::make_shared<tnt::ReLU>("relu1"));
  net->add(dense(256, 128, "fc2"));
  net->add(std::make_shared<tnt::ReLU>("relu2"));
  net->add(dense(128, 10, "fc3"));
  return net;
}

// The logs of the last epoch that ended (the same on every rank: they are allreduced, so
// every rank decides alike whether to evaluate again).
class LastEpochLogs : public tnt::Callback {
 public:
  LastEpochLogs() : tnt::Callback(Ranks::all) {}
  void on_epoch_end(int e, const tnt::Logs& l) override {
    epoch = e;
    logs = l;
  }
  int epoch = -1;  // 0-based; -1: none ended
  tnt::Logs logs;
};

}  // namespace

int main(int argc, char** argv) {
  tnt_models::hold_warning_signals();  // first: a warning while the program starts is kept
  tnt_models::ProgramFlags flags(
      "fashion_mnist", "Trains a CNN or MLP on Fashion-MNIST, data parallel over the ranks that tarantella starts.",
      {"tarantella -n 2 -- build/bin/fashion_mnist",
       "tarantella -n 2 -- build/bin/fashion_mnist --train_epochs=10 --batch_size=256",
       "build/bin/fashion_mnist --model=mlp --num_train_samples=6000 --train_epochs=1",
       "tarantella -n 2 -- build/bin/fashion_mnist --resume   (continue the newest run)",
       "tarantella -np 3 --parameter-servers 1 -- build/bin/fashion_mnist --strategy=parameter_server   (1 server, 2 workers)",
       "tarantella -n 2 -- build/bin/fashion_mnist --model_dir=runs/a --overwrite   (start again in runs/a, replacing its run)"},
      {.data_dir = kDefaultDataDir,
       .data_dir_help = "directory with the four Fashion-MNIST IDX files (plain or .gz)",
       .model_dir = "./fashion_mnist_model",
       .model_dir_help = "where history.csv and checkpoint.safetensors go",
       .batch_size = 128,
       .train_epochs = 5,
       .epochs_between_evals_help = "evaluate on the test set every this many epochs",
       .seed_help = "seed of weights and shuffling",
       .verbose = 1,
       .micro_batch_size_help =
           "samples per rank and step: the global batch is then micro_batch_size x ranks, in place of "
           "--batch_size (with --scale_learning_rate the learning rate follows it), for runs on 1, 2, 4 ... ranks "
           "at one per-rank batch; not with --strategy=parameter_server"});
  // clang-format off
  flags.add_options()
    ("model", "cnn or mlp", cxxopts::value<std::string>()->default_value("cnn"))
    ("optimizer", "adam or sgd", cxxopts::value<std::string>()->default_value("adam"))
    ("learning_rate", "learning rate (default: 0.001 for adam, 0.01 for sgd)", cxxopts::value<double>())
    ("scale_learning_rate", "scale the learning rate linearly with the global batch: lr * batch_size / 128", cxxopts::value<bool>()->default_value("false"))
    ("warmup_epochs", "raise the learning rate linearly from 0 over this many epochs (0: none)", cxxopts::value<double>()->default_value("0"))
    ("resume", std::string("continue from <model_dir>/checkpoint.safetensors (without --model_dir: the newest run's)") + tnt_models::kResumeAutoHelp, tnt_models::resume_flag_value())
    ("num_train_samples", "use only the first N training samples (0 = all; more than the training set holds is refused)", cxxopts::value<int64_t>()->default_value("0"))
    ("strategy", "synchronous (every rank trains; gradients allreduced each step) or parameter_server (the ranks of tarantella --parameter-servers K hold the variables, the others train on --batch_size split among them without waiting for each other)", cxxopts::value<std::string>()->default_value("synchronous"))
    ("max_staleness", "with --strategy=parameter_server: how many updates a worker may run ahead of the slowest (-1: no bound, fully asynchronous; 0: synchronous, the same losses as --strategy=synchronous)", cxxopts::value<int64_t>()->default_value("-1"));
  // clang-format on
  if (std::optional<int> status = flags.parse(argc, argv)) return *status;

  return tnt::run_main(argc, argv, [&] {
    const cxxopts::ParseResult& args = flags.args();
    const std::string model_kind = args["model"].as<std::string>();
    const std::string opt_kind = args["optimizer"].as<std::string>();
    TNT_INPUT_CHECK(model_kind == "cnn" || model_kind == "mlp", "--model={}: expected cnn or mlp", model_kind);
    TNT_INPUT_CHECK(opt_kind == "adam" || opt_kind == "sgd", "--optimizer={}: expected adam or sgd", opt_kind);
    const tnt_models::CommonFlags common = flags.common();
    const tnt_models::ResumeFlag resume_flag = tnt_models::parse_resume_flag(args);
    const std::string strategy_text = args["strategy"].as<std::string>();
    TNT_INPUT_CHECK(strategy_text == "synchronous" || strategy_text == "parameter_server",
                    "--strategy={}: expected synchronous or parameter_server", strategy_text);
    const tnt::Strategy strategy = tnt::parse_strategy(strategy_text);
    const bool ps = strategy == tnt::Strategy::parameter_server;
    // Parameter-server workers do not meet at every step: they train on to the epoch's end.
    tnt_models::take_warning_signals("fashion_mnist", !ps);
    const int64_t max_staleness = args["max_staleness"].as<int64_t>();
    TNT_INPUT_CHECK(max_staleness >= -1, "--max_staleness={}: must be -1 (no bound), 0 or a positive number of updates",
                    max_staleness);
    TNT_INPUT_CHECK(ps || args.count("max_staleness") == 0,
                    "--max_staleness={}: applies to --strategy=parameter_server only", max_staleness);
    // The common flag made the global batch micro x ranks (flags.cpp), as in resnet50 and the
    // transformer; parameter-server workers split --batch_size among themselves instead.
    const int64_t micro_batch = common.micro_batch_size;
    TNT_INPUT_CHECK(!ps || micro_batch == 0,
                    "--micro_batch_size={}: not with --strategy=parameter_server (the workers split --batch_size)",
                    micro_batch);
    const int64_t num_train = args["num_train_samples"].as<int64_t>();
    TNT_INPUT_CHECK(num_train >= 0, "--num_train_samples={}: must be at least 0", num_train);
    // Before the data is read, as the other flags. A million epochs is beyond any run; beyond
    // it the step count would not fit (1e30 had wrapped to a negative count: no warmup at all).
    const double warmup_epochs = args["warmup_epochs"].as<double>();
    TNT_INPUT_CHECK(warmup_epochs >= 0 && warmup_epochs <= 1e6, "--warmup_epochs={}: must be from 0 to 1e6",
                    warmup_epochs);
    tnt_models::check_directory_flag(
        "data_dir", common.data_dir, "(install Debian's dataset-fashion-mnist, or point it at the IDX files)");

    // Labels outside the 10 classes and images of another size are named with their file.
    // Of the training set only the samples trained on are kept (all 60,000 as f32 take
    // 188 MB a rank).
    tnt::MnistExpect expect{.num_classes = 10, .height = 28, .width = 28, .max_samples = num_train};
    tnt::MnistSplit train = tnt::load_mnist_dir(common.data_dir, "train", expect);
    expect.max_samples = 0;
    tnt::MnistSplit test = tnt::load_mnist_dir(common.data_dir, "t10k", expect);
    // An accuracy over no samples would read as 0, a model that learnt nothing.
    TNT_INPUT_CHECK(test.images.dim(0) > 0,
                    "--data_dir={}: the test set (t10k-images-idx3-ubyte[.gz]) holds no samples", common.data_dir);
    // More samples than there are would silently train on fewer than asked for.
    TNT_INPUT_CHECK(num_train <= train.file_samples,
                    "--num_train_samples={}: the training set in --data_dir={} holds only {} samples (0 = all)",
                    num_train, common.data_dir, train.file_samples);
    const int64_t n_train = train.images.dim(0);
    TNT_INPUT_CHECK(common.batch_size <= n_train, "{} is larger than the {} training samples", common.batch_text(),
                    n_train);

    auto net = model_kind == "cnn" ? make_cnn() : make_mlp();
    net->build({1, 28, 28});
    tnt::Model model(net, common.seed);
    double lr = args.count("learning_rate") ? args["learning_rate"].as<double>() : (opt_kind == "adam" ? 1e-3 : 1e-2);
    TNT_INPUT_CHECK(lr > 0, "--learning_rate={}: must be positive", lr);
    // What a resume compares: the network and the optimizer's state must be the same; the
    // rest a resumed run may change, and is told it did.
    using tnt_models::flag_text;
    const tnt_models::RunFlags run_flags{
        .same = {{"model", model_kind}, {"optimizer", opt_kind}},
        .noted = {{"learning_rate", flag_text(lr)},
                  {"scale_learning_rate", flag_text(args["scale_learning_rate"].as<bool>())},
                  {"warmup_epochs", flag_text(args["warmup_epochs"].as<double>())},
                  {"batch_size", flag_text(common.batch_size)},
                  {"num_train_samples", flag_text(num_train)}},
        .same_inside_epoch = {"batch_size", "num_train_samples"},
        .micro_batch_size = common.micro_batch_size};
    // The linear scaling rule (Goyal et al.): the rate grows with the global batch, from
    // the rate given for a batch of 128.
    if (args["scale_learning_rate"].as<bool>()) lr *= static_cast<double>(common.batch_size) / 128.0;
    // Steps a rank takes per epoch: the last partial batch is padded, so it is a step too.
    const int64_t steps_per_epoch = (n_train + common.batch_size - 1) / common.batch_size;
    // Rounded up: a fraction of an epoch shorter than a step is still one step of warmup.
    const auto warmup_steps = static_cast<int64_t>(std::ceil(warmup_epochs * static_cast<double>(steps_per_epoch)));
    tnt::SchedulePtr schedule = warmup_steps > 0
        ? tnt::SchedulePtr(std::make_shared<tnt::PiecewiseConstantWithWarmup>(std::vector<int64_t>{}, std::vector<double>{lr}, warmup_steps))
        : tnt::SchedulePtr(std::make_shared<tnt::ConstantSchedule>(lr));
    std::shared_ptr<tnt::Optimizer> optimizer;
    if (opt_kind == "adam") {
      optimizer = std::make_shared<tnt::Adam>(schedule);
    } else {
      tnt::SgdOptions o;
      o.momentum = 0.9;
      optimizer = std::make_shared<tnt::SGD>(schedule, o);
    }
    model.compile(optimizer, std::make_shared<tnt::SoftmaxCrossEntropy>(), {std::make_shared<tnt::Accuracy>()});

    // An earlier run's checkpoint and history are continued (--resume, or a restart of
    // tarantella --max-restarts) or replaced (--overwrite), never silently overwritten.
    const tnt_models::RunDir run = tnt_models::prepare_model_dir({.path = common.model_dir,
                                                                  .given = common.model_dir_given,
                                                                  .outputs = {"checkpoint.safetensors", "history.csv"},
                                                                  .can_resume = true,
                                                                  .resume = resume_flag.resume,
                                                                  .resume_auto = resume_flag.automatic,
                                                                  .overwrite = common.overwrite,
                                                                  .checkpoint = "checkpoint.safetensors",
                                                                  .checkpoint_flag = ""});
    const bool resume = run.resume;
    const std::string& model_dir = run.path;
    const std::string checkpoint = model_dir + "/checkpoint.safetensors";

    int initial_epoch = 0;
    if (resume) {
      initial_epoch = tnt_models::resume_from_checkpoint(model, checkpoint, common.seed, run_flags, common.seed_given);
      // The warmup is in epochs: at another global batch it goes on from the epoch reached.
      tnt_models::align_schedule_to_epochs(model, schedule, initial_epoch, steps_per_epoch);
    }
    tnt_models::record_run_flags(model, run_flags);

    if (tnt::is_master_rank() && common.verbose > 0) {
      tnt::print("{}", net->summary());
      tnt::print("{}, global batch {}, {} training samples, {} test samples",
                 tnt_models::count_of(tnt::size(), "rank"), common.batch_size,
                 n_train, test.images.dim(0));
    }

    auto train_data = tnt::Dataset::from_tensors({train.images, train.labels}).shuffle(n_train, common.seed);
    auto test_data = tnt::Dataset::from_tensors({test.images, test.labels});

    tnt::FitOptions fit;
    fit.batch_size = common.batch_size;
    fit.epochs = common.train_epochs;
    fit.initial_epoch = initial_epoch;
    fit.initial_step = model.checkpoint_epoch_step();  // a checkpoint written inside an epoch (a warning signal)
    fit.verbose = common.verbose;
    fit.micro_batch_size = micro_batch;
    fit.validation_data = test_data;
    fit.validation_freq = common.epochs_between_evals;
    fit.strategy = strategy;
    if (ps && max_staleness >= 0) fit.max_staleness = max_staleness;
    auto csv = std::make_shared<tnt::CSVLogger>(model_dir + "/history.csv", initial_epoch > 0 || fit.initial_step > 0);
    csv->set_columns({"loss", "accuracy", "val_loss", "val_accuracy", "learning_rate", "seconds"});
    // A diverged run (NaN or infinite loss) ends here with an error naming the step, before
    // the epoch's history row and checkpoint: exit status 1, the last good checkpoint kept.
    auto nan_guard = std::make_shared<tnt::TerminateOnNaN>(tnt::TerminateOnNaN::Action::raise);
    auto last_epoch = std::make_shared<LastEpochLogs>();
    fit.callbacks = {nan_guard, csv, std::make_shared<tnt::ModelCheckpoint>(checkpoint, "loss"), last_epoch};
    if (common.enable_tensorboard) fit.callbacks.push_back(std::make_shared<tnt::TensorBoard>(model_dir));
    // A checkpoint at or beyond --train_epochs has nothing left to train: its weights are
    // evaluated (as the transformer does), rather than fit() refusing epochs < initial_epoch.
    if (initial_epoch >= common.train_epochs) {
      tnt_models::print_nothing_to_train(resume, initial_epoch, common.train_epochs);
    } else {
      model.fit(train_data, fit);
      if (tnt_models::stopped_on_warning_signal(model, "fashion_mnist", checkpoint)) return;
    }

    // The last epoch validated on the test set with the final weights (fit validates after
    // the last epoch whatever --epochs_between_evals says): its numbers are the test result.
    // Only when no epoch ran here (a --resume at or beyond --train_epochs) is the test set
    // evaluated.
    tnt::Logs result;
    const tnt::Logs& last = last_epoch->logs;
    // With parameter servers the epoch's callbacks ran on the workers only: every rank evaluates.
    if (!ps && last_epoch->epoch + 1 == common.train_epochs && last.count("val_loss") && last.count("val_accuracy")) {
      result = {{"loss", last.at("val_loss")}, {"accuracy", last.at("val_accuracy")}};
    } else {
      tnt::EvaluateOptions ev;
      // Every rank, servers included, takes part: at least a sample each (the result does
      // not depend on the batch).
      ev.batch_size = std::max<int64_t>(common.batch_size, tnt::size());
      ev.verbose = common.verbose;  // announced, like fit's validation passes
      result = model.evaluate(test_data, ev);
    }
    const int epochs_trained = std::max(common.train_epochs, initial_epoch);
    // The checkpoint is written once: ModelCheckpoint wrote the last epoch's on every rank
    // (not with parameter servers, where the epoch's callbacks run on the workers only), and
    // a resume with nothing to train holds it already. A second write failed a finished run
    // on a nearly full disk, and every restart after it.
    const bool written = (resume && initial_epoch >= common.train_epochs) ||
                         (!ps && model.last_checkpoint_step() == model.global_step());
    if (!written) model.save_checkpoint(checkpoint, epochs_trained);
    tnt::print("Test loss: {:.4f}  test accuracy: {:.4f}  ({}, {})", result["loss"], result["accuracy"],
               tnt_models::count_of(epochs_trained, "epoch"), tnt_models::count_of(tnt::size(), "rank"));
  });
}
