// The command line that every training program shares: the flags of the original
// tutorials (TF Model Garden style: --data_dir, --batch_size as the GLOBAL batch,
// --train_epochs, ...), their checks, --help with examples, and the exit statuses.
//
// A program gives the defaults and words that differ between programs, adds its own flags,
// parses before tnt::run_main (a bad command line is found on every rank alike, before MPI
// starts), and reads the shared values inside run_main, where a bad value becomes an
// InputError: "error: --flag=value: problem" and a non-zero exit on every rank.
#pragma once

// GCC 12 reports a false -Wrestrict inside cxxopts' integer parsing (GCC bug 105329),
// depending on how a program's code gets inlined: silenced for this header alone.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include <cxxopts.hpp>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "common/model_dir.hpp"
#include "tarantella/device.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tnt {
class Model;
}

namespace tnt_models {

// What the shared flags look like in one program. --epochs_between_evals defaults to 1 and
// --seed to 42 in every program, so only their words are the program's.
struct CommonFlagDefaults {
  std::string data_dir;
  std::string data_dir_help;
  std::string model_dir;
  std::string model_dir_help;
  int64_t batch_size = 0;
  int train_epochs = 0;
  std::string epochs_between_evals_help;
  std::string seed_help;
  int verbose = 1;
  // Non-empty: the program takes --micro_batch_size (per rank, in --batch_size's unit; the
  // global batch is then micro_batch_size x ranks), with this help text.
  std::string micro_batch_size_help;
};

// --resume (= true), --resume=false, or --resume=auto: continue the run if it has a
// checkpoint, else start one there (a command that can be run again as it is, such as a
// batch job that is requeued). The flag's value type, for the programs' option lists.
struct ResumeFlag {
  bool resume = false;     // continue a run (auto included)
  bool automatic = false;  // =auto: nothing to continue is no error
};
std::shared_ptr<const cxxopts::Value> resume_flag_value();
// InputError for anything but true, false (also 1/0, yes/no) and auto.
ResumeFlag parse_resume_flag(const cxxopts::ParseResult& args);
inline constexpr const char* kResumeAutoHelp =
    "; --resume=auto continues the run if it has a checkpoint and starts one there otherwise (a command to run "
    "again as it is, e.g. a requeued batch job)";

struct CommonFlags {
  std::string data_dir;
  std::string model_dir;         // --model_dir, or its default
  bool model_dir_given = false;  // on the command line; else model_dir is the base of a new run directory (model_dir.hpp)
  bool overwrite = false;  // replace what an earlier run left in model_dir
  int64_t batch_size = 0;  // GLOBAL: split across the ranks (micro_batch_size x ranks when that is given)
  int64_t micro_batch_size = 0;  // --micro_batch_size as given; 0: not given (or not the program's)
  int train_epochs = 0;
  int epochs_between_evals = 1;
  uint64_t seed = 0;
  bool seed_given = false;  // --seed on the command line (else seed is its default)
  int verbose = 1;
  bool enable_tensorboard = false;  // TensorBoard event files under model_dir/{train,validation}
  // The global batch as the user gave it, for messages: "--batch_size=256", or
  // "the global batch 256 (--micro_batch_size=64 x 4 ranks)".
  std::string batch_text() const;
};

// What a flag's value must look like, taken from its cxxopts value type, so that a value
// that does not parse is reported as "--flag=value: expected ..." rather than cxxopts' own
// "Argument 'value' failed to parse", which names no flag.
// optional_text: a text flag with an implicit value (--resume alone, or --resume=auto).
enum class FlagKind { text, optional_text, boolean, int32, int64, uint64, real };

// cxxopts' OptionAdder, recording the kind of each flag it adds.
class FlagAdder {
 public:
  FlagAdder(cxxopts::OptionAdder adder, std::map<std::string, FlagKind>& kinds) : adder_(adder), kinds_(kinds) {}
  FlagAdder& operator()(const std::string& name, const std::string& help,
                        const std::shared_ptr<const cxxopts::Value>& value = cxxopts::value<bool>());

 private:
  cxxopts::OptionAdder adder_;
  std::map<std::string, FlagKind>& kinds_;
};

// Why `text` is no value of a flag of `kind` ("expected a finite number"), or "" when it
// is one. Stricter than cxxopts, which reads "1.5abc" as 1.5 and "0x10" as 16: a number is
// written in decimal, whole; a real number is finite (nan and inf make no sense for any
// flag here).
std::string flag_value_problem(FlagKind kind, const std::string& text);

// What is wrong with the first flag on the command line that cxxopts would refuse without
// naming it well: an unknown flag, a missing value, a value not of its kind ("--flag=value:
// expected ..."), one dash where two belong; "" when there is none. `kinds`: what each flag
// (as FlagAdder records them) takes.
std::string first_flag_problem(const std::map<std::string, FlagKind>& kinds, int argc, char** argv);

class ProgramFlags {
 public:
  // Each example is one command line; a '\n' in it continues it on an indented line.
  ProgramFlags(const std::string& program, const std::string& summary, const std::vector<std::string>& examples,
               const CommonFlagDefaults& defaults);
  ProgramFlags(const ProgramFlags&) = delete;  // cxxopts' adders refer to cli_
  ProgramFlags& operator=(const ProgramFlags&) = delete;

  // The program's own flags; --help lists them after the shared ones.
  FlagAdder add_options() { return FlagAdder(cli_.add_options(), kinds_); }

  // An exit status when the program should end here: 0 after printing --help, 2 after a
  // command line that does not parse ("<program>: <why> (see --help)" on stderr): a value
  // that is not one of its flag's ("--batch_size=abc: expected a whole number"), an unknown
  // flag ("-batch_size=64: flags take two dashes: --batch_size=64" for one written with absl's
  // single dash), a flag without its value, a stray word (every flag is --name=value). Every rank ends so; only the
  // first prints it (TNT_RANK, else Open MPI's rank, unset or 0), once for the whole job.
  std::optional<int> parse(int argc, char** argv);

  const cxxopts::ParseResult& args() const { return args_; }

  // The shared values, checked in this order: --micro_batch_size (where the program takes
  // it), --batch_size, --train_epochs, --epochs_between_evals, --verbose. Throws
  // tnt::InputError naming the first bad one. --micro_batch_size=m sets batch_size to m x
  // ranks; given together with --batch_size, the two must agree.
  CommonFlags common() const;

 private:
  // What is wrong with the first flag on the command line that cxxopts would refuse
  // without naming it well: an unknown flag, a missing value, a value not of its kind
  // ("--flag=value: expected ..."); "" when there is none.
  std::string first_problem(int argc, char** argv) const;

  std::string program_;
  bool micro_batch_flag_ = false;  // the program takes --micro_batch_size
  cxxopts::Options cli_;
  cxxopts::ParseResult args_;
  std::map<std::string, FlagKind> kinds_;
};

// The tutorials' callbacks, in the programs that offer them (resnet50, transformer):
// --profile_steps, Keras' TensorBoard(profile_batch=2) as the ResNet-50 tutorial passes it,
// and --enable_time_history, the Model Garden's TimeHistory as the Transformer tutorial
// enables it. A program that adds them also has --log_steps (TimeHistory's interval).
struct CallbackFlags {
  std::string profile_steps;  // TensorBoard's profile_batch: "N" or "N,M"; "" = none
  bool time_history = false;
  int64_t log_steps = 0;      // --log_steps
};

// Adds --profile_steps and --enable_time_history to --help; `unit` is what TimeHistory
// counts ("images", "tokens"), `unit_note` what a program says about it ("" = nothing).
void add_callback_flags(ProgramFlags& flags, const std::string& unit, const std::string& unit_note = "");

// The values, checked (throws tnt::InputError naming the flag): --profile_steps is a step
// N >= 1 or a range N,M with N <= M (also N-M), or 0 for none; unset, it is 2 with
// --enable_tensorboard (the trace goes into TensorBoard's directory, so without it only 0 is
// accepted); --enable_time_history needs --log_steps >= 1.
CallbackFlags callback_flags(const ProgramFlags& flags, const CommonFlags& common);


// A flag naming a file (a directory) that must exist: throws tnt::InputError
// "--flag=path: no such file" (followed by `hint`), or, where the path is the other kind,
// "is a directory, expected a file" ("is a file, expected a directory").
void check_file_flag(const std::string& flag, const std::string& path, const std::string& hint = "");
void check_directory_flag(const std::string& flag, const std::string& path, const std::string& hint = "");

// Before a run continues from `checkpoint`: the seed that the run which wrote it was given
// (its metadata "seed") must be this run's --seed, or the continued run would shuffle and
// initialise unlike the one it claims to continue. Throws tnt::InputError naming both
// seeds and the file. Reads only the file's header; a file without a seed, or one that
// cannot be read, is left to Model::load_checkpoint to accept or refuse. `seed_given`: the
// flag was on the command line (else the message says the default was taken).
void check_resume_seed(const std::string& checkpoint, uint64_t seed, bool seed_given = true);

// A program's flags as its checkpoints record them (metadata "flags": a JSON object of flag
// name -> value text), so that --resume compares them with the flags it is given.
// same: what decides what the weights compute or which state the checkpoint holds (a model's
// shape, its optimizer); a resume with another value is refused, naming the flag.
// noted: training settings a resumed run may change (a learning rate, dropout); a change is
// said, and the run goes on with the value given.
// Values are compared as text: give each in one spelling (flag_text).
struct RunFlags {
  std::vector<std::pair<std::string, std::string>> same;
  std::vector<std::pair<std::string, std::string>> noted;
  // Files whose contents must be the same, wherever they lie now: flag name and a
  // fingerprint of the contents (file_fingerprint). Recorded as "<flag>#contents".
  std::vector<std::pair<std::string, std::string>> same_contents = {};
  // Names of `noted` flags that decide the batches of an epoch (their size, the samples):
  // a checkpoint written inside an epoch is resumed only with the same values, since the
  // resume skips the steps of that epoch already taken.
  std::vector<std::string> same_inside_epoch = {};
  // --micro_batch_size as given (0: not given): the global batch is then micro x ranks, and a
  // refusal about "batch_size" says so and names the micro-batch that gives the batch needed.
  int64_t micro_batch_size = 0;
};
// A fingerprint of a text file's bytes (64-bit FNV-1a, in hex, with the size; carriage
// returns and the newlines at its end left out): tells apart two vocabularies of the same
// size, not two line-ending conventions. Throws InputError naming `flag` when it cannot be read.
std::string file_fingerprint(const std::string& flag, const std::string& path);
std::string flag_text(double v);  // shortest text that reads back as v
std::string flag_text(int64_t v);
inline std::string flag_text(int v) { return flag_text(static_cast<int64_t>(v)); }
inline std::string flag_text(bool v) { return v ? "true" : "false"; }
inline std::string flag_text(const std::string& v) { return v; }
// Every checkpoint `model` writes records `flags`.
void record_run_flags(tnt::Model& model, const RunFlags& flags);
// The refusal or the notes for resuming `checkpoint`, recorded with `stored` flags (its
// "flags" metadata), with `given`: throws InputError for a changed `same` flag (all of them
// in one message), returns one line per changed `noted` flag. Flags one side lacks are
// not compared (checkpoints of older versions record none).
std::vector<std::string> compare_run_flags(const std::string& checkpoint, const std::string& stored,
                                           const RunFlags& given);

// --resume: the checkpoint must exist, carry this run's --seed (check_resume_seed) and
// precision, and have been trained with the same `flags.same` (compare_run_flags); loads it
// into `model` (weights, optimizer state and step, so the learning-rate schedule goes on) and
// says so, with a line for each `flags.noted` that changed. Returns the epoch the run
// continues from.
int resume_from_checkpoint(tnt::Model& model, const std::string& checkpoint, uint64_t seed,
                           const RunFlags& flags = {}, bool seed_given = true);

// "Nothing to train (the checkpoint is at epoch 3, --train_epochs=2): evaluating its weights"
// when a run starts at or beyond --train_epochs (`evaluates`: whether weights are evaluated
// then; the line ends after the parenthesis otherwise).
void print_nothing_to_train(bool resumed, int initial_epoch, int train_epochs, bool evaluates = true);

// What one rank may use, for the programs' memory checks before training: the default
// device's memory (a GPU's, or the host's shared by this host's ranks; capacity 0 when
// unknown), and how a message names it.
struct RankMemory {
  tnt::Device device;
  double capacity = 0;  // bytes
  std::string what;     // "this host's memory shared by its 2 rank(s)", "cuda:0's memory"
};
RankMemory rank_memory();

}  // namespace tnt_models
