#include "common/flags.hpp"

#include <tarantella/tarantella.hpp>

#include <fmt/ranges.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <system_error>

namespace tnt_models {
namespace {

constexpr int kExitBadCommandLine = 2;

std::string help_text(const std::string& summary, const std::vector<std::string>& examples) {
  std::string text = summary + "\n\nExamples:\n";
  for (const std::string& example : examples) {
    std::istringstream lines(example);
    std::string line;
    bool first = true;
    while (std::getline(lines, line)) {
      text += (first ? "  " : "      ") + line + "\n";
      first = false;
    }
  }
  return text;
}

}  // namespace

ProgramFlags::ProgramFlags(const std::string& program, const std::string& summary,
                           const std::vector<std::string>& examples, const CommonFlagDefaults& defaults)
    : program_(program), cli_(program, help_text(summary, examples)) {
  // clang-format off
  cli_.add_options()
    ("data_dir", defaults.data_dir_help, cxxopts::value<std::string>()->default_value(defaults.data_dir))
    ("model_dir", defaults.model_dir_help, cxxopts::value<std::string>()->default_value(defaults.model_dir))
    ("batch_size", "GLOBAL batch size (split across the ranks)", cxxopts::value<int64_t>()->default_value(std::to_string(defaults.batch_size)))
    ("train_epochs", "epochs to train", cxxopts::value<int>()->default_value(std::to_string(defaults.train_epochs)))
    ("epochs_between_evals", defaults.epochs_between_evals_help, cxxopts::value<int>()->default_value("1"))
    ("seed", defaults.seed_help, cxxopts::value<uint64_t>()->default_value("42"))
    ("verbose", "0 silent, 1 progress bar, 2 a line per epoch", cxxopts::value<int>()->default_value(std::to_string(defaults.verbose)))
    ("overwrite", "replace the output of an earlier run in --model_dir (without it, such a directory is refused)", cxxopts::value<bool>()->default_value("false"))
    ("enable_tensorboard", "write TensorBoard event files to <model_dir>/train and <model_dir>/validation", cxxopts::value<bool>()->default_value("false"));
  // clang-format on
}

std::optional<int> ProgramFlags::parse(int argc, char** argv) {
  // Added here rather than with the shared flags so that --help lists it last.
  cli_.add_options()("h,help", "this help");
  try {
    args_ = cli_.parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << program_ << ": " << e.what() << " (see --help)\n";
    return kExitBadCommandLine;
  }
  if (args_.count("help")) {
    std::cout << cli_.help() << "\n";
    return 0;
  }
  return std::nullopt;
}

CommonFlags ProgramFlags::common() const {
  CommonFlags f;
  f.data_dir = args_["data_dir"].as<std::string>();
  f.model_dir = args_["model_dir"].as<std::string>();
  f.overwrite = args_["overwrite"].as<bool>();
  f.batch_size = args_["batch_size"].as<int64_t>();
  f.train_epochs = args_["train_epochs"].as<int>();
  f.epochs_between_evals = args_["epochs_between_evals"].as<int>();
  f.seed = args_["seed"].as<uint64_t>();
  f.verbose = args_["verbose"].as<int>();
  f.enable_tensorboard = args_["enable_tensorboard"].as<bool>();
  TNT_INPUT_CHECK(f.batch_size > 0, "--batch_size={}: must be positive", f.batch_size);
  TNT_INPUT_CHECK(f.train_epochs >= 0, "--train_epochs={}: must be at least 0", f.train_epochs);
  TNT_INPUT_CHECK(f.epochs_between_evals > 0, "--epochs_between_evals={}: must be positive", f.epochs_between_evals);
  return f;
}

namespace {

constexpr const char* kRunMarker = ".tarantella-run";

// TNT_RESTART and TNT_RUN_ID, as the launcher set them (0 and "" outside a launch with
// --max-restarts).
int restart_number() {
  const char* text = std::getenv("TNT_RESTART");
  return text != nullptr ? std::atoi(text) : 0;
}

std::string run_id() {
  const char* text = std::getenv("TNT_RUN_ID");
  return text != nullptr ? text : "";
}

std::string read_marker(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / kRunMarker);
  std::string id;
  std::getline(in, id);
  return id;
}

// Written as a temporary file and renamed, so a crash leaves the old marker or the new one.
std::string write_marker(const std::string& dir, const std::string& id) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(dir) / kRunMarker;
  const fs::path tmp = fs::path(dir) / (std::string(kRunMarker) + ".new");
  {
    std::ofstream out(tmp);
    out << id << "\n";
    if (!out.flush()) return fmt::format("--model_dir={}: cannot write {}", dir, tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return fmt::format("--model_dir={}: cannot write {}: {}", dir, path.string(), ec.message());
  return "";
}

struct Verdict {
  std::string error;  // "" when training may go ahead
  bool resume = false;
};

std::string remove_outputs(const ModelDir& dir, const std::vector<std::string>& found, const char* why) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const std::string& name : found) {
    fs::remove(fs::path(dir.path) / name, ec);
    if (ec) return fmt::format("{}: cannot remove {}/{}: {}", why, dir.path, name, ec.message());
  }
  return "";
}

// The master's verdict on --model_dir.
Verdict check_model_dir_on_master(const ModelDir& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir.path, ec);
  if (ec) return {fmt::format("--model_dir={}: cannot create it: {}", dir.path, ec.message())};
  std::vector<std::string> found;
  for (const std::string& name : dir.outputs) {
    if (fs::exists(fs::path(dir.path) / name, ec)) found.push_back(name);
  }
  const std::string id = run_id();
  if (restart_number() > 0 && !id.empty() && read_marker(dir.path) == id) {
    // A restart of this launch, in the directory its first attempt took.
    if (!dir.checkpoint.empty() && fs::exists(fs::path(dir.path) / dir.checkpoint, ec)) return {"", true};
    return {remove_outputs(dir, found, "restart")};
  }
  if (!found.empty() && !dir.resume && !dir.overwrite) {
    return {fmt::format("--model_dir={} already holds the output of an earlier run ({}): give {}--overwrite to replace "
                        "it, or choose another --model_dir",
                        dir.path, fmt::join(found, ", "),
                        dir.can_resume ? "--resume to continue training from its checkpoint, " : "")};
  }
  if (!found.empty() && dir.overwrite) {
    if (std::string e = remove_outputs(dir, found, "--overwrite"); !e.empty()) return {e};
  }
  // This launch's from now on: its restarts continue here.
  if (!id.empty()) {
    if (std::string e = write_marker(dir.path, id); !e.empty()) return {e};
  }
  return {"", dir.resume};
}

}  // namespace

bool prepare_model_dir(const ModelDir& dir) {
  TNT_INPUT_CHECK(!(dir.resume && dir.overwrite),
                  "--resume and --overwrite: give one of them (--resume continues the run in --model_dir={}, "
                  "--overwrite replaces it)",
                  dir.path);
  // Only the master sees the directory for sure (other hosts may not share its file
  // system), so it decides and the ranks learn its verdict: all of them stop, or none.
  Verdict verdict = tnt::is_master_rank() ? check_model_dir_on_master(dir) : Verdict{};
  tnt::communicator().broadcast(verdict.error, tnt::master_rank());
  if (!verdict.error.empty()) throw tnt::InputError(verdict.error);
  int64_t resume = verdict.resume ? 1 : 0;
  tnt::communicator().broadcast(&resume, 1, tnt::DType::i64, tnt::Device::cpu(), tnt::master_rank());
  if (resume != 0 && !dir.resume) {
    tnt::print("Restart {} (TNT_RESTART): continuing from {}/{}", restart_number(), dir.path, dir.checkpoint);
  }
  return resume != 0;
}

}  // namespace tnt_models
