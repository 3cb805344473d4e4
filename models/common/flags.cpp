#include "common/flags.hpp"
#include "common/resume_checks.hpp"

#include "common/wording.hpp"

#include <tarantella/tarantella.hpp>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <system_error>
#include <type_traits>

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

// Whole decimal numbers only ("-3", "42"), in T's range.
template <typename T>
std::string whole_number_problem(const std::string& text) {
  // Unsigned: the type's range is the flag's. Signed: the flag's own check says what range
  // makes sense (most take no negative number), so only the bound that was passed is named.
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (!text.empty() && ec == std::errc() && ptr == end) return "";
  if constexpr (std::is_unsigned_v<T>) {
    return fmt::format("expected a whole number from 0 to {}", std::numeric_limits<T>::max());
  } else {
    if (ec == std::errc::result_out_of_range && ptr == end) {
      return text.front() == '-' ? fmt::format("expected a whole number, at least {}", std::numeric_limits<T>::min())
                                 : fmt::format("expected a whole number, at most {}", std::numeric_limits<T>::max());
    }
    return "expected a whole number";
  }
}

// Whether this process is the first rank of a job, or runs alone. Before MPI starts, the
// rank is only known from the environment: the launcher's TNT_RANK, else Open MPI's.
bool first_rank() {
  for (const char* name : {tnt::env::rank, "OMPI_COMM_WORLD_RANK"}) {
    if (const char* text = std::getenv(name)) return std::string(text) == "0";
  }
  return true;
}

}  // namespace

FlagAdder& FlagAdder::operator()(const std::string& name, const std::string& help,
                                 const std::shared_ptr<const cxxopts::Value>& value) {
  namespace v = cxxopts::values;
  FlagKind kind = FlagKind::text;
  if (std::dynamic_pointer_cast<const v::standard_value<bool>>(value)) {
    kind = FlagKind::boolean;
  } else if (std::dynamic_pointer_cast<const v::standard_value<int>>(value)) {
    kind = FlagKind::int32;
  } else if (std::dynamic_pointer_cast<const v::standard_value<int64_t>>(value)) {
    kind = FlagKind::int64;
  } else if (std::dynamic_pointer_cast<const v::standard_value<uint64_t>>(value)) {
    kind = FlagKind::uint64;
  } else if (std::dynamic_pointer_cast<const v::standard_value<double>>(value)) {
    kind = FlagKind::real;
  } else if (value->has_implicit()) {
    kind = FlagKind::optional_text;
  }
  // "h,help": a short and a long name of one flag.
  std::istringstream names(name);
  for (std::string n; std::getline(names, n, ',');) kinds_[n] = kind;
  adder_(name, help, value);
  return *this;
}

std::string flag_value_problem(FlagKind kind, const std::string& text) {
  switch (kind) {
    case FlagKind::text: return "";
    case FlagKind::optional_text: return "";  // its program reads and checks it
    case FlagKind::boolean: {
      bool b = false;
      try {
        cxxopts::values::parse_value(text, b);
      } catch (const std::exception&) {
        return "expected true or false";
      }
      return "";
    }
    case FlagKind::int32: return whole_number_problem<int>(text);
    case FlagKind::int64: return whole_number_problem<int64_t>(text);
    case FlagKind::uint64: return whole_number_problem<uint64_t>(text);
    case FlagKind::real: {
      // strtod, not from_chars: it reads what a user writes ("1e-3", ".5", "+2"); the
      // whole text must be the number, and it must be finite.
      const char* begin = text.c_str();
      char* end = nullptr;
      errno = 0;
      const double value = std::strtod(begin, &end);
      const bool whole =
          !text.empty() && end == begin + text.size() && !std::isspace(static_cast<unsigned char>(text[0]));
      // Hexadecimal ("0x1p-3") too: strtod reads it, but the flag's value is read as decimal,
      // which stops at the 'x' (0).
      const bool hex = text.find_first_of("xX") != std::string::npos;
      if (!whole || hex || errno == ERANGE || !std::isfinite(value)) {
        return "expected a finite decimal number (such as 0.5 or 1e-3)";
      }
      return "";
    }
  }
  return "";
}

ProgramFlags::ProgramFlags(const std::string& program, const std::string& summary,
                           const std::vector<std::string>& examples, const CommonFlagDefaults& defaults)
    : program_(program), cli_(program, help_text(summary, examples)) {
  // clang-format off
  add_options()
    ("data_dir", defaults.data_dir_help, cxxopts::value<std::string>()->default_value(defaults.data_dir))
    ("model_dir", fmt::format("{}; not given: a new directory {}/run-YYYYmmdd-HHMMSS for each run ({}/latest links "
                              "to the newest), and --resume continues the newest run there that has a checkpoint. "
                              "Example: --model_dir=runs/a",
                              defaults.model_dir_help, defaults.model_dir, defaults.model_dir),
     cxxopts::value<std::string>()->default_value(defaults.model_dir))
    ("batch_size", "GLOBAL batch size (split across the ranks)", cxxopts::value<int64_t>()->default_value(std::to_string(defaults.batch_size)))
    ("train_epochs", "epochs to train", cxxopts::value<int>()->default_value(std::to_string(defaults.train_epochs)))
    ("epochs_between_evals", defaults.epochs_between_evals_help, cxxopts::value<int>()->default_value("1"))
    ("seed", defaults.seed_help, cxxopts::value<uint64_t>()->default_value("42"))
    ("verbose", "0 silent, 1 progress bar, 2 a line per epoch", cxxopts::value<int>()->default_value(std::to_string(defaults.verbose)))
    ("overwrite", "replace the output of an earlier run in --model_dir (without it, such a directory is refused)", cxxopts::value<bool>()->default_value("false"))
    ("enable_tensorboard", "write TensorBoard event files to <model_dir>/train and <model_dir>/validation", cxxopts::value<bool>()->default_value("false"));
  // clang-format on
  if (!defaults.micro_batch_size_help.empty()) {
    micro_batch_flag_ = true;
    add_options()("micro_batch_size", defaults.micro_batch_size_help, cxxopts::value<int64_t>()->default_value("0"));
  }
}

std::string ProgramFlags::first_problem(int argc, char** argv) const { return first_flag_problem(kinds_, argc, argv); }

std::string first_flag_problem(const std::map<std::string, FlagKind>& kinds_, int argc, char** argv) {
  // The command line as cxxopts reads it: --name=value, or --name value for a flag that
  // is not true/false; everything after "--" is positional (and refused after parsing).
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") break;
    if (word.size() < 2 || word[0] != '-') continue;
    const bool long_form = word[1] == '-';
    const size_t eq = word.find('=');
    // absl and the original tutorials take -batch_size=64 as well: name the fix.
    if (!long_form && word.size() > 2) {
      const std::string single = word.substr(1, eq == std::string::npos ? std::string::npos : eq - 1);
      if (single.size() > 1 && kinds_.count(single)) {
        return fmt::format("{}: flags take two dashes: -{}", word, word);
      }
    }
    const std::string name =
        long_form ? word.substr(2, eq == std::string::npos ? std::string::npos : eq - 2) : word.substr(1, 1);
    const std::string shown = (long_form ? "--" : "-") + name;
    const auto kind = kinds_.find(name);
    if (kind == kinds_.end()) return fmt::format("{}: no such flag", shown);
    if (!long_form) continue;  // -h
    std::string value;
    if (eq != std::string::npos) {
      value = word.substr(eq + 1);
    } else if (kind->second == FlagKind::boolean || kind->second == FlagKind::optional_text) {
      continue;  // alone it means its implicit value; a word after it is not its value
    } else if (i + 1 == argc) {
      return fmt::format("{}: missing its value (write {}=VALUE)", shown, shown);
    } else {
      value = argv[++i];
    }
    if (std::string problem = flag_value_problem(kind->second, value); !problem.empty()) {
      return fmt::format("{}={}: {}", shown, value, problem);
    }
  }
  return "";
}

std::optional<int> ProgramFlags::parse(int argc, char** argv) {
  // Added here rather than with the shared flags so that --help lists it last.
  add_options()("h,help", "this help");
  std::string error = first_problem(argc, argv);
  if (error.empty()) {
    try {
      args_ = cli_.parse(argc, argv);
      if (!args_.unmatched().empty()) {
        error = fmt::format("unexpected argument '{}': flags are written --name=value", args_.unmatched().front());
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!error.empty()) {
    // One write: mpirun's own lines about the ending job must not land inside this one.
    if (first_rank()) std::cerr << (program_ + ": " + error + " (see --help)\n") << std::flush;
    return kExitBadCommandLine;
  }
  if (args_.count("help")) {
    if (first_rank()) std::cout << cli_.help() << "\n";  // once, not once a rank
    return 0;
  }
  return std::nullopt;
}

std::string CommonFlags::batch_text() const {
  if (micro_batch_size <= 0) return fmt::format("--batch_size={}", batch_size);
  return fmt::format("the global batch {} (--micro_batch_size={} x {})", batch_size, micro_batch_size,
                     count_of(tnt::size(), "rank"));
}

CommonFlags ProgramFlags::common() const {
  CommonFlags f;
  f.data_dir = args_["data_dir"].as<std::string>();
  f.model_dir = args_["model_dir"].as<std::string>();
  f.model_dir_given = args_.count("model_dir") > 0;
  f.overwrite = args_["overwrite"].as<bool>();
  f.batch_size = args_["batch_size"].as<int64_t>();
  f.train_epochs = args_["train_epochs"].as<int>();
  f.epochs_between_evals = args_["epochs_between_evals"].as<int>();
  f.seed = args_["seed"].as<uint64_t>();
  f.seed_given = args_.count("seed") > 0;
  if (tnt::size() > 1) {
    // The data's order and the initial weights are drawn from the seed alike on every rank,
    // each taking its part of one global batch: a seed of its own (Horovod's seed + rank)
    // would give a rank its part of other batches, training some samples twice and others
    // never, without an error.
    const std::vector<int64_t> seeds = tnt::communicator().allgather(static_cast<int64_t>(f.seed));
    std::vector<std::string> differ;
    for (size_t r = 0; r < seeds.size(); ++r) {
      if (seeds[r] != seeds[0] && differ.size() < 4) {
        differ.push_back(fmt::format("rank {} has {}", r, static_cast<uint64_t>(seeds[r])));
      }
    }
    TNT_INPUT_CHECK(differ.empty(),
                    "--seed: the ranks were given different seeds (rank 0 has {}, {}); give every rank the same "
                    "--seed: each rank takes its part of the same shuffled global batches, so a seed per rank "
                    "would train some samples twice and others never",
                    static_cast<uint64_t>(seeds[0]), fmt::join(differ, ", "));
  }
  f.verbose = args_["verbose"].as<int>();
  f.enable_tensorboard = args_["enable_tensorboard"].as<bool>();
  if (micro_batch_flag_) {
    // Weak scaling without arithmetic: the per-rank batch stays, the global one grows with
    // the ranks, and what the program derives from the global batch (the learning rate)
    // follows it.
    const int64_t micro = args_["micro_batch_size"].as<int64_t>();
    const int p = tnt::size();
    TNT_INPUT_CHECK(micro >= 0, "--micro_batch_size={}: must be positive (or 0: --batch_size alone)", micro);
    TNT_INPUT_CHECK(micro <= std::numeric_limits<int64_t>::max() / p,
                    "--micro_batch_size={}: too large ({} ranks times it overflows)", micro, p);
    if (micro > 0) {
      TNT_INPUT_CHECK(args_.count("batch_size") == 0 || f.batch_size == micro * p,
                      "--batch_size={} and --micro_batch_size={} disagree: on {} the global batch is "
                      "--micro_batch_size x ranks = {}; give one of the two",
                      f.batch_size, micro, count_of(p, "rank"), micro * p);
      f.batch_size = micro * p;
      f.micro_batch_size = micro;
    }
  }
  TNT_INPUT_CHECK(f.batch_size > 0, "--batch_size={}: must be positive", f.batch_size);
  // With parameter servers (tarantella --parameter-servers K) the workers alone split the
  // global batch.
  // Only a program that trains with them (--strategy=parameter_server): the others train on
  // every rank, servers' included.
  const std::string& servers = tnt::config().ps_servers;
  const bool ps = args_.count("strategy") > 0 && args_["strategy"].as<std::string>() == "parameter_server";
  const int server_count =
      !ps || servers.empty() ? 0 : 1 + static_cast<int>(std::count(servers.begin(), servers.end(), ','));
  const int trainers = std::max(1, tnt::size() - server_count);
  TNT_INPUT_CHECK(f.batch_size >= trainers,
                  "--batch_size={}: smaller than the {} {} (the global batch gives each {} at least one sample)",
                  f.batch_size, trainers, server_count > 0 ? "workers" : "ranks", server_count > 0 ? "worker" : "rank");
  TNT_INPUT_CHECK(f.train_epochs >= 0, "--train_epochs={}: must be at least 0", f.train_epochs);
  TNT_INPUT_CHECK(f.epochs_between_evals > 0, "--epochs_between_evals={}: must be positive", f.epochs_between_evals);
  TNT_INPUT_CHECK(f.verbose >= 0 && f.verbose <= 2,
                  "--verbose={}: expected 0 (silent), 1 (progress bar) or 2 (a line per epoch)", f.verbose);
  return f;
}

void add_callback_flags(ProgramFlags& flags, const std::string& unit, const std::string& unit_note) {
  // clang-format off
  flags.add_options()
    ("profile_steps", "with --enable_tensorboard: record a timeline (Chrome's trace format) of these training "
                      "steps, counted from this run's first step, into <model_dir>/train/plugins/profile/<time>/ "
                      "as timeline.trace.json, as TensorBoard's profile_batch: a step N or a range N,M; 0 = none. "
                      "Default with --enable_tensorboard: 2 (the second step; the first one warms up). Open the file in "
                      "https://ui.perfetto.dev or chrome://tracing. A timeline asked for with TNT_TIMELINE (tarantella "
                      "--timeline) takes its place. Example: --enable_tensorboard --profile_steps=5,8",
     cxxopts::value<std::string>())
    ("enable_time_history", fmt::format("print the {} per second of all ranks together every --log_steps training "
                                        "steps, and at the end their average without the first --log_steps steps "
                                        "(warm-up), as the Model Garden's TimeHistory{}. Example: "
                                        "--enable_time_history --log_steps=50",
                                        unit, unit_note.empty() ? "" : "; " + unit_note),
     cxxopts::value<bool>()->default_value("false"));
  // clang-format on
}

namespace {

// "N", "N,M" or "N-M" with 1 <= N <= M, or "0": whether `text` is one.
bool valid_step_window(const std::string& text) {
  if (text == "0") return true;
  const size_t sep = text.find_first_of(",-");
  auto number = [](std::string_view s, int64_t& out) {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return !s.empty() && ec == std::errc() && p == s.data() + s.size() && out >= 1;
  };
  int64_t a = 0, b = 0;
  if (sep == std::string::npos) return number(text, a);
  return number(std::string_view(text).substr(0, sep), a) && number(std::string_view(text).substr(sep + 1), b) &&
         a <= b;
}

}  // namespace

CallbackFlags callback_flags(const ProgramFlags& flags, const CommonFlags& common) {
  const cxxopts::ParseResult& args = flags.args();
  CallbackFlags f;
  f.time_history = args["enable_time_history"].as<bool>();
  f.log_steps = args["log_steps"].as<int64_t>();
  if (args.count("profile_steps")) {
    const std::string text = args["profile_steps"].as<std::string>();
    TNT_INPUT_CHECK(valid_step_window(text),
                    "--profile_steps={}: expected a step N or a range of steps N,M with 1 <= N <= M (steps count "
                    "from 1), or 0 for none",
                    text);
    TNT_INPUT_CHECK(text == "0" || common.enable_tensorboard,
                    "--profile_steps={}: needs --enable_tensorboard (the timeline goes into its directory, "
                    "<model_dir>/train/plugins/profile/)",
                    text);
    if (text != "0") f.profile_steps = text;
  } else if (common.enable_tensorboard) {
    f.profile_steps = "2";
  }
  // Checked without --enable_time_history too: the value would be refused once it is added.
  TNT_INPUT_CHECK(f.log_steps >= 0, "--log_steps={}: must be at least 0", f.log_steps);
  TNT_INPUT_CHECK(!f.time_history || f.log_steps >= 1,
                  "--log_steps={}: --enable_time_history prints every --log_steps steps; give at least 1",
                  f.log_steps);
  return f;
}

namespace {

// What `path` is not, for a flag that needs a `want` ("file" or "directory"); "" when it is one.
std::string path_kind_problem(const std::string& path, bool want_directory) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return want_directory ? "no such directory" : "no such file";
  if (want_directory) {
    if (fs::is_directory(st)) return "";
    return fs::is_regular_file(st) ? "is a file, expected a directory" : "is not a directory";
  }
  if (fs::is_regular_file(st)) return "";
  return fs::is_directory(st) ? "is a directory, expected a file" : "is not a regular file";
}

}  // namespace

void check_file_flag(const std::string& flag, const std::string& path, const std::string& hint) {
  const std::string problem = path_kind_problem(path, false);
  TNT_INPUT_CHECK(problem.empty(), "--{}={}: {}{}", flag, path, problem,
                  problem == "no such file" && !hint.empty() ? " " + hint : "");
}

void check_directory_flag(const std::string& flag, const std::string& path, const std::string& hint) {
  const std::string problem = path_kind_problem(path, true);
  TNT_INPUT_CHECK(problem.empty(), "--{}={}: {}{}", flag, path, problem,
                  problem == "no such directory" && !hint.empty() ? " " + hint : "");
}

namespace {

// A run resumed in another precision would go on with other arithmetic than it was trained
// with, and a history whose rows no longer compare; the flag is named, as for the seed.
void check_resume_precision(const std::string& checkpoint, const std::string& precision) {
  const nlohmann::json metadata = checkpoint_metadata(checkpoint);
  if (!metadata.contains("precision") || !metadata["precision"].is_string()) return;
  const std::string stored = metadata["precision"].get<std::string>();
  if (stored == precision) return;
  const bool known = stored == "fp32" || stored == "bf16" || stored == "fp16";
  TNT_INPUT_CHECK(known,
                  "checkpoint '{}': its metadata give the precision '{}', which is none of fp32, bf16 and fp16: the "
                  "checkpoint is damaged or was not written by this program; --overwrite starts a new run",
                  checkpoint, stored.substr(0, 40));
  TNT_INPUT_ERROR("--dtype={}: the run being resumed ({}) was trained with --dtype={}; give --dtype={} to continue "
                  "it, or --overwrite to start a new run",
                  precision, checkpoint, stored, stored);
}

}  // namespace

std::shared_ptr<const cxxopts::Value> resume_flag_value() {
  return cxxopts::value<std::string>()->default_value("false")->implicit_value("true");
}

ResumeFlag parse_resume_flag(const cxxopts::ParseResult& args) {
  const std::string v = args["resume"].as<std::string>();
  if (v == "true" || v == "1" || v == "yes") return {true, false};
  if (v == "false" || v == "0" || v == "no") return {false, false};
  if (v == "auto") return {true, true};
  TNT_INPUT_ERROR("--resume={}: expected true or false (--resume alone is true), or auto (continue if there is a "
                  "checkpoint, else start)",
                  v);
}

std::string flag_text(double v) { return fmt::format("{}", v); }

std::string flag_text(int64_t v) { return std::to_string(v); }

namespace {

constexpr const char* kFlagsKey = "flags";

}  // namespace

void record_run_flags(tnt::Model& model, const RunFlags& flags) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto* list : {&flags.same, &flags.noted}) {
    for (const auto& [name, value] : *list) j[name] = value;
  }
  for (const auto& [name, value] : flags.same_contents) j[name + "#contents"] = value;
  model.set_checkpoint_metadata(kFlagsKey, j.dump());
}

std::vector<std::string> compare_run_flags(const std::string& checkpoint, const std::string& stored,
                                           const RunFlags& given) {
  if (stored.empty()) return {};
  const nlohmann::json j = nlohmann::json::parse(stored, nullptr, false);
  TNT_INPUT_CHECK(j.is_object(),
                  "checkpoint '{}': its metadata 'flags' are not a JSON object of flags: the checkpoint is damaged or "
                  "was not written by this program; --overwrite starts a new run",
                  checkpoint);
  auto was = [&](const std::string& name) -> std::optional<std::string> {
    if (!j.contains(name) || !j[name].is_string()) return std::nullopt;
    return j[name].get<std::string>();
  };
  std::vector<std::string> given_text, stored_text;
  for (const auto& [name, value] : given.same) {
    const std::optional<std::string> old = was(name);
    if (!old || *old == value) continue;
    given_text.push_back(fmt::format("--{}={}", name, value));
    stored_text.push_back(fmt::format("--{}={}", name, *old));
  }
  if (!given_text.empty()) {
    TNT_INPUT_ERROR("{}: the run being resumed ({}) was trained with {}, and {} what its weights compute or what the "
                    "checkpoint holds; give {} to continue it, or --overwrite to start a new run",
                    fmt::join(given_text, " "), checkpoint, fmt::join(stored_text, " "),
                    given_text.size() == 1 ? "that flag decides" : "those flags decide", fmt::join(stored_text, " "));
  }
  for (const auto& [name, value] : given.same_contents) {
    const std::optional<std::string> old = was(name + "#contents");
    if (!old || *old == value) continue;
    TNT_INPUT_ERROR("--{}: its contents are not those the run being resumed ({}) was trained with (fingerprint {}, "
                    "was {}), so the ids its weights learnt would mean other things; give the file it was trained "
                    "with, or --overwrite to start a new run",
                    name, checkpoint, value, *old);
  }
  std::vector<std::string> notes;
  for (const auto& [name, value] : given.noted) {
    const std::optional<std::string> old = was(name);
    if (!old || *old == value) continue;
    notes.push_back(fmt::format("--{}={}: the run being resumed was trained with --{}={}; it goes on with {}", name,
                                value, name, *old, value));
  }
  return notes;
}

int resume_from_checkpoint(tnt::Model& model, const std::string& checkpoint, uint64_t seed, const RunFlags& flags,
                           bool seed_given) {
  // The run directory may be on the master's host alone (a --model_dir on its own disk): the
  // master checks the file, and every rank gets the checkpoint from it.
  std::string problem;
  std::vector<std::string> notes;
  if (tnt::is_master_rank()) {
    try {
      TNT_INPUT_CHECK(std::filesystem::exists(checkpoint), "--resume: no checkpoint at {}", checkpoint);
      {
        // A newer release's file is named as such before its flags are compared.
        const nlohmann::json md = checkpoint_metadata(checkpoint);
        const char* key = tnt::checkpoint_key::version;
        if (md.contains(key) && md[key].is_string()) tnt::check_checkpoint_version(checkpoint, {{key, md[key]}});
      }
      check_resume_seed(checkpoint, seed, seed_given);
      check_resume_precision(checkpoint, model.precision().name());
      const nlohmann::json metadata = checkpoint_metadata(checkpoint);
      const bool has_flags = metadata.contains(kFlagsKey) && metadata[kFlagsKey].is_string();
      notes = compare_run_flags(checkpoint, has_flags ? metadata[kFlagsKey].get<std::string>() : "", flags);
      if (has_flags) check_inside_epoch(checkpoint, metadata, metadata[kFlagsKey].get<std::string>(), flags);
    } catch (const tnt::InputError& e) {
      problem = e.what();
    }
  }
  tnt::communicator().broadcast(problem, tnt::master_rank());
  if (!problem.empty()) throw tnt::InputError(problem);
  const int epoch = model.load_checkpoint_from_master(checkpoint);
  for (const std::string& note : notes) tnt::print("{}", note);
  if (const int64_t step = model.checkpoint_epoch_step(); step > 0) {
    tnt::print("Resuming from {} inside epoch {}, after {} of its steps", checkpoint, epoch + 1, step);
  } else {
    tnt::print("Resuming from {} at epoch {}", checkpoint, epoch);
  }
  return epoch;
}

void print_nothing_to_train(bool resumed, int initial_epoch, int train_epochs, bool evaluates) {
  if (resumed) {
    tnt::print("Nothing to train (the checkpoint is at epoch {}, --train_epochs={}){}", initial_epoch, train_epochs,
               evaluates ? ": evaluating its weights" : "");
  } else {
    tnt::print("Nothing to train (--train_epochs={}){}", train_epochs,
               evaluates ? ": evaluating the initial weights" : "");
  }
}

RankMemory rank_memory() {
  RankMemory r;
  r.device = tnt::default_device();
  const tnt::MemoryStats memory = tnt::memory_stats(r.device);
  const int ranks_here = r.device.is_cpu() ? std::max(1, tnt::local_size()) : 1;
  r.capacity = static_cast<double>(memory.total_bytes) / ranks_here;
  r.what = r.device.is_cpu() ? fmt::format("this host's memory shared by its {} rank(s)", ranks_here)
                             : fmt::format("{}'s memory", r.device.str());
  if (!r.device.is_cpu()) return r;
  // Under a batch system's or a container's limit, or ulimit -v, the run ends by the kernel's
  // out-of-memory killer (SIGKILL) or inside a library long before the host's memory is used.
  const tnt::HostMemoryLimits limits = tnt::host_memory_limits();
  const double cgroup_share = static_cast<double>(limits.cgroup_bytes) / ranks_here;
  if (limits.cgroup_bytes > 0 && cgroup_share < r.capacity) {
    r.capacity = cgroup_share;
    r.what = fmt::format("this rank's cgroup's memory limit ({:.1f} GiB, {}: a batch system's --mem or a container's) "
                         "shared by its {} rank(s) here",
                         static_cast<double>(limits.cgroup_bytes) / (1 << 30), limits.cgroup_file, ranks_here);
  }
  if (limits.address_space_limit > 0 && static_cast<double>(limits.address_space_left) < r.capacity) {
    r.capacity = static_cast<double>(limits.address_space_left);
    r.what = fmt::format("what this process's address-space limit (ulimit -v: {} MB) leaves", limits.address_space_limit >> 20);
  }
  return r;
}

}  // namespace tnt_models
