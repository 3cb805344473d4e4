#include "cli.hpp"

#include "env_names.hpp"
#include "error.hpp"
#include "foreign_options.hpp"
#include "lifeline.hpp"
#include "option_values.hpp"
#include "ps_flags.hpp"
#include "shell_words.hpp"
#include "text.hpp"

// cxxopts' hand-written parser: the same behaviour without compiling std::regex objects at
// every start, which matters for a launcher whose overhead is measured in milliseconds.
#define CXXOPTS_NO_REGEX true
#include <cxxopts.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>

namespace tnt::launcher {

namespace {

constexpr const char* usage_line = "tarantella [options] -- PROGRAM [ARGS...]";

cxxopts::Options make_parser() {
  cxxopts::Options o("tarantella",
                     "Runs PROGRAM data-parallel on every host: by default a rank per slot, SLURM task or GPU, else "
                     "1 CPU rank; -n N for N a host (one per CPU socket, say, with --pin-to-socket).");
  o.custom_help("[options] -- PROGRAM [ARGS...]");
  o.positional_help("");
  o.set_width(100);
  // Values are taken as strings and checked here, so that every message names the option
  // and says what a valid value looks like.
  o.add_options("Hosts")
      ("hostfile", "Hosts, one per line: 'host', 'host slots=N' or 'host:N'; '#' starts a comment",
       cxxopts::value<std::string>(), "FILE")
      ("H,hosts", "The same inline, comma-separated: -H node1,node2:4", cxxopts::value<std::string>(), "LIST");
  o.add_options("Ranks and devices")
      ("n,n-per-node", "Ranks per node, on every host; not in all as mpirun's -n (that is -np here) (default: the host's "
       "slots, else the SLURM allocation's tasks on the node, else the GPUs of this node, else 1 CPU rank)",
       cxxopts::value<std::string>(), "N")
      ("devices-per-node", "Alias of -n (the original Tarantella's name)", cxxopts::value<std::string>(), "N")
      ("npernode", "Alias of -n (the original Tarantella's other name, and Open MPI's; -npernode too)",
       cxxopts::value<std::string>(), "N")
      ("np", "Ranks in all, as mpirun's and horovodrun's -np N (also -np N, -npN, -np=N): they fill the first "
       "host's slots, then the next host's; without --hostfile, -H or SLURM, N ranks on this machine. Not with -n",
       cxxopts::value<std::string>(), "N")
      ("oversubscribe", "With -np: allow more ranks than the hosts' slots, the extra ones spread evenly over the "
       "hosts (as Open MPI does)")
      ("no-gpu", "Run CPU ranks even where GPUs exist")
      ("parameter-servers", "K of the ranks serve the variables for a program that trains with --strategy="
       "parameter_server (TNT_PS_SERVERS); the others are workers (default: none, every rank trains). A worker "
       "that dies or is silent for --heartbeat-timeout is dropped and the others go on (one stopped for twice that "
       "is ended by its rank's step, so that the job can end); a lost server ends the job, and so does a lost worker "
       "with --heartbeat-timeout 0 (nothing would tell the servers)",
       cxxopts::value<std::string>(), "K")
      ("ps-hosts", "With --parameter-servers: place the servers on these hosts of the job, taken in turn "
       "(default: the first K ranks)", cxxopts::value<std::string>(), "LIST");
  o.add_options("Runtime")
      ("fusion-threshold", "Gradient fusion bucket size in KB, exported as TNT_FUSION_THRESHOLD (0 disables fusion; "
       "auto: timed over the first steps, then the size the scaling model predicts fastest)",
       cxxopts::value<std::string>(), "KB")
      ("log-level", "DEBUG, INFO, WARNING or ERROR, exported as TNT_LOG_LEVEL", cxxopts::value<std::string>(), "LEVEL")
      ("output-on-all-devices", "Progress output from every rank, not only rank 0, each line tagged \"[rank R] \" (TNT_OUTPUT_ON_ALL_DEVICES=1)")
      ("log-on-all-devices", "Log lines from every rank (TNT_LOG_ON_ALL_DEVICES=1)")
      ("timeline", "Write a Chrome trace of training steps TNT_TIMELINE_STEPS (default: the first 10 steps the run "
       "trains) to FILE, exported as "
       "TNT_TIMELINE", cxxopts::value<std::string>(), "FILE")
      ("profile-scaling", "Write a scaling profile to FILE after 5 warm-up steps, 5 with one bucket (several ranks) and "
       "TNT_PROFILE_SCALING_STEPS (default 30) more, for `tarantella predict` (docs/scaling.md); exported as "
       "TNT_PROFILE_SCALING",
       cxxopts::value<std::string>(), "FILE")
      ("x", "Export KEY=VALUE to every rank (repeatable); every TNT_* variable of this environment is exported as well",
       cxxopts::value<std::string>(), "KEY=VALUE");
  o.add_options("Pinning")
      ("pin-to-socket", "Bind local rank i to NUMA node i mod K, memory preferred on that node")
      ("pin-memory-to-socket", "As --pin-to-socket, with memory allocated only on that node")
      ("topology", "Plan for this hwloc XML file or synthetic topology (\"pack:2 numa:1 core:8 pu:2\") "
       "instead of this machine; --dry-run only", cxxopts::value<std::string>(), "SPEC");
  const std::string start_help = fmt::format(
      "End the job when its ranks have not all started this long after the launch, or one is stopped then "
      "or stopped this long while others wait for it in MPI_Init, naming them (default: {}, else {:g}; 0: no "
      "limit)", env::start_timeout, default_start_timeout_s);
  const std::string exit_help = fmt::format(
      "End the job when it is still running this long after a rank's program ended, naming the ranks that did "
      "not end (default: {}, else {:g}; 0: no limit)", env::exit_timeout, default_exit_timeout_s);
  const std::string heartbeat_help = fmt::format(
      "End the job when a rank's host has not been heard from this long (down or cut off), naming it; each rank "
      "ends its program when it has not heard from the launcher this long (default: {}, else {:g}; 0: off; else at "
      "least 1)",
      env::heartbeat_timeout, default_heartbeat_timeout_s);
  o.add_options("Watching the job")
      ("start-timeout", start_help, cxxopts::value<std::string>(), "SECONDS")
      ("exit-timeout", exit_help, cxxopts::value<std::string>(), "SECONDS")
      ("heartbeat-timeout", heartbeat_help, cxxopts::value<std::string>(), "SECONDS")
      ("max-restarts", "After a failure (a rank that fails, a lost host), start the whole job again, at most K "
       "times; each rank gets TNT_RESTART (0, 1, ...) and programs continue from their checkpoint. Not after a "
       "failure that a restart would repeat: a usage error (exit code 2) or a program that could not start "
       "(default 0)",
       cxxopts::value<std::string>(), "K")
      ("requeue", "In a SLURM batch job: when SLURM's warning signal (sbatch --signal=B:USR1@SECONDS) stopped the "
       "programs after a step with its checkpoint, put the job back in the queue (scontrol requeue), so that it runs "
       "again and the program continues from there; needs --resume (or --resume=auto) among the program's arguments");
  o.add_options("MPI")
      ("launch-agent", "How mpirun reaches other hosts instead of plain ssh, e.g. \"ssh -p 2222 -i ~/.ssh/cluster\" "
       "or a wrapper script (Open MPI's plm_rsh_agent)", cxxopts::value<std::string>(), "CMD")
      ("skip-host-lookup", "Do not look up the hosts' names before the launch (names that only the launch agent "
       "knows: an ssh alias, containers)")
      ("mpirun", "The MPI launcher to use (default: the mpirun tarantella was built with, else mpirun on PATH)",
       cxxopts::value<std::string>(), "PATH")
      ("mpi-args", "Extra arguments for mpirun, split like a shell would", cxxopts::value<std::string>(), "\"ARGS\"");
  o.add_options("Information")
      ("dry-run", "Print the plan (rank, host, local rank, device, NUMA node, cores) and the exact command; run "
       "nothing. PROGRAM need not exist here, nor the plan fit this machine's limits: only warnings")
      ("version", "Version and build configuration")
      ("h,help", "This help");
  return o;
}

// mpirun's and horovodrun's -np N, in the spellings they take: -np N, -np=N, -npN, and
// --np N, --np=N. cxxopts would read "-np" as -n with the value "p", so these words are
// taken out before it sees them. Open MPI's -npernode becomes --npernode for the same reason.
struct TotalRanksWord {
  std::string flag;   // "-np" or "--np", as written
  std::string value;  // unchecked
};

// Every option name, short and long, without dashes: whether it takes a value.
std::map<std::string, bool> option_kinds(const cxxopts::Options& parser) {
  std::map<std::string, bool> takes_value;
  for (const auto& group : parser.groups()) {
    for (const auto& o : parser.group_help(group).options) {
      if (!o.s.empty()) takes_value[o.s] = !o.is_boolean;
      for (const auto& l : o.l) takes_value[l] = !o.is_boolean;
    }
  }
  return takes_value;
}

// Whether `word` is an option of ours whose value is the next word (-H h1, --mpi-args "-x
// A=1"): that word is the value as written, never read as an option (-x..., -np...).
bool value_follows(const std::map<std::string, bool>& takes_value, const std::string& word) {
  if (word.size() < 2 || word[0] != '-') return false;
  std::string name;
  if (word[1] == '-') {
    if (word.find('=') != std::string::npos) return false;
    name = word.substr(2);
  } else {
    if (word.size() != 2) return false;
    name = word.substr(1, 1);
  }
  if (name == "np") return false;  // take_total_ranks reads its value
  const auto it = takes_value.find(name);
  return it != takes_value.end() && it->second;
}

std::vector<TotalRanksWord> take_total_ranks(std::vector<std::string>& words,
                                             const std::map<std::string, bool>& takes_value) {
  std::vector<TotalRanksWord> found;
  std::vector<std::string> rest;
  auto digits = [](std::string_view t) {
    return !t.empty() && std::all_of(t.begin(), t.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  };
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    if (value_follows(takes_value, word) && i + 1 < words.size()) {
      rest.push_back(word);
      rest.push_back(words[++i]);
      continue;
    }
    if (word == "-npernode" || word.rfind("-npernode=", 0) == 0) {
      rest.push_back("-" + word);
      continue;
    }
    const size_t dashes = word.compare(0, 2, "--") == 0 ? 2 : 1;
    if (word.size() < dashes + 2 || word[0] != '-' || word.compare(dashes, 2, "np") != 0) {
      rest.push_back(word);
      continue;
    }
    const std::string flag = word.substr(0, dashes + 2);
    const std::string tail = word.substr(dashes + 2);
    if (tail.empty()) {
      if (i + 1 == words.size()) throw InputError(fmt::format("{}: missing its value (the number of ranks in all)", flag));
      found.push_back({flag, words[++i]});
    } else if (tail.front() == '=') {
      found.push_back({flag, tail.substr(1)});
    } else if (dashes == 1 && digits(tail)) {
      found.push_back({flag, tail});
    } else {
      rest.push_back(word);  // -npx: -n's value, to be judged there; --npx: no such option
    }
  }
  words = std::move(rest);
  return found;
}

// cxxopts' own messages name no option when a value does not parse ("Argument 'maybe'
// failed to parse"), and quote with typographic quotes: the words are checked here first,
// as cxxopts reads them, so that every message names the option as the user wrote it.
void check_words(const cxxopts::Options& parser, const std::vector<std::string>& words) {
  const std::map<std::string, bool> takes_value = option_kinds(parser);
  std::string program;  // the first stray word: mostly the program, written without '--' before it
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    if (word.size() < 2 || word[0] != '-') {  // a stray word: refused after parsing
      if (program.empty()) program = word;
      continue;
    }
    const bool long_form = word[1] == '-';
    const size_t eq = long_form ? word.find('=') : std::string::npos;
    const std::string name = long_form ? word.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)
                                       : word.substr(1, 1);
    const std::string shown = (long_form ? "--" : "-") + name;
    // A word of one dash and several letters that is not a short option with its value
    // (-n2, -Hnode1): mpirun's one-dash long options (-host, -hostfile, -map-by), which the
    // parser would read as letters (-h, -o, ...); after a program, the program's own flag.
    if (!long_form && word.size() > 2) {
      // -n takes a number: -n2 is -n 2, but -no-gpu, -nolocal, -npersocket are words.
      const auto letter = takes_value.find(name);
      const bool number_follows = std::all_of(word.begin() + 2, word.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      });
      if (letter == takes_value.end() || !letter->second || (name == "n" && !number_follows)) {
        const std::string whole = word.substr(1, word.find('=') == std::string::npos ? std::string::npos
                                                                                    : word.find('=') - 1);
        if (!program.empty()) {
          throw InputError(fmt::format("{}: no such option of tarantella; it comes after '{}': to pass options to "
                                       "the program, put '--' before it (tarantella [options] -- {} {} ...)",
                                       excerpt(word, 80), excerpt(program, 80), excerpt(program, 80),
                                       excerpt(word, 80)));
        }
        if (whole.size() > 1 && takes_value.count(whole)) {
          throw InputError(fmt::format("{}: tarantella's long options take two dashes: --{}", excerpt(word, 80),
                                       whole));
        }
        if (auto hint = foreign_option_hint(word)) {
          throw InputError(fmt::format("-{}: no such option; {} (see tarantella --help)", excerpt(whole, 80), *hint));
        }
        throw InputError(fmt::format("{}: no such option (see tarantella --help)", excerpt(word, 80)));
      }
    }
    const auto option = takes_value.find(name);
    if (option == takes_value.end()) {
      // After the program (horovodrun's and mpirun's spelling): the program's own flag.
      if (!program.empty()) {
        throw InputError(fmt::format("{}: no such option of tarantella; it comes after '{}': to pass options to the "
                                     "program, put '--' before it (tarantella [options] -- {} {} ...)",
                                     excerpt(shown, 80), excerpt(program, 80), excerpt(program, 80),
                                     excerpt(word, 80)));
      }
      if (auto hint = foreign_option_hint(word)) {
        throw InputError(fmt::format("{}: no such option; {} (see tarantella --help)", excerpt(word.substr(0, eq), 80),
                                     *hint));
      }
      throw InputError(fmt::format("{}: no such option (see tarantella --help)", excerpt(shown, 80)));
    }
    // horovodrun's `-np 2 train.py -h`: the program's help was meant, or tarantella's.
    if (!program.empty() && (long_form ? name == "help" || name == "version" : word == "-h")) {
      throw InputError(fmt::format("{} comes after '{}': for tarantella's {}, write tarantella {}; to pass it to the "
                                   "program, put '--' before the program (tarantella [options] -- {} {})",
                                   shown, excerpt(program, 80), name == "version" ? "version" : "help", shown,
                                   excerpt(program, 80), shown));
    }
    if (!option->second) {
      const std::string value = eq == std::string::npos ? "true" : word.substr(eq + 1);
      if (value != "true" && value != "false") {
        throw InputError(fmt::format("{}: takes no value (or true or false), got '{}'", shown, excerpt(value, 80)));
      }
      continue;
    }
    if (eq != std::string::npos || (!long_form && word.size() > 2)) continue;  // --name=value, -n2
    if (i + 1 == words.size()) throw InputError(fmt::format("{}: missing its value", shown));
    ++i;
  }
}

}  // namespace

Options parse_command_line(const std::vector<std::string>& args) {
  // Split at the first "--" ourselves: everything after it belongs to the program, even
  // words that look like our own options.
  auto sep = std::find(args.begin(), args.end(), std::string("--"));
  std::vector<std::string> ours(args.begin(), sep);

  // mpirun users write -xKEY=VALUE as often as -x KEY=VALUE; cxxopts' parser only takes
  // the latter when the value contains '='.
  auto parser = make_parser();
  const std::map<std::string, bool> takes_value = option_kinds(parser);
  std::vector<std::string> words;
  for (size_t i = 0; i < ours.size(); ++i) {
    const std::string& a = ours[i];
    if (value_follows(takes_value, a) && i + 1 < ours.size()) {
      words.push_back(a);
      words.push_back(ours[++i]);
    } else if (a.size() > 2 && (a.compare(0, 2, "-x") == 0 || a.compare(0, 2, "-H") == 0)) {
      words.push_back(a.substr(0, 2));  // -Hnode1,node2:4 too: the parser refuses its ',' and ':'
      words.push_back(a.substr(2));
    } else {
      words.push_back(a);
    }
  }
  const std::vector<TotalRanksWord> total_words = take_total_ranks(words, takes_value);
  std::vector<const char*> argv{"tarantella"};
  for (const auto& a : words) argv.push_back(a.c_str());
  check_words(parser, words);
  cxxopts::ParseResult result;
  try {
    result = parser.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const cxxopts::exceptions::exception& e) {
    throw InputError(fmt::format("{} (see tarantella --help)", e.what()));
  }

  Options o;
  o.help = result.count("help") > 0;
  o.version = result.count("version") > 0;
  if (o.help || o.version) return o;

  if (!result.unmatched().empty()) {
    throw InputError(fmt::format("unexpected argument '{}': put '--' before the program, as in: {}",
                                 result.unmatched().front(), usage_line));
  }

  int rank_flags = 0;
  std::string rank_flag_names;
  for (const auto& kv : result.arguments()) {
    const std::string& key = kv.key();
    const std::string& value = kv.value();
    if (key == "n-per-node" || key == "devices-per-node" || key == "npernode") {
      ++rank_flags;
      const std::string flag = key == "n-per-node" ? "-n/--n-per-node" : "--" + key;
      rank_flag_names += (rank_flag_names.empty() ? "" : " and ") + flag;
      o.ranks_per_node = parse_ranks_per_node(flag, value);
      o.ranks_flag = key == "n-per-node" ? "-n" : "--" + key;
      // cxxopts names -n by its long name: the words say which one the user wrote.
      if (key == "n-per-node" && std::any_of(words.begin(), words.end(), [](const std::string& w) {
            return w == "--n-per-node" || w.rfind("--n-per-node=", 0) == 0;
          })) {
        o.ranks_flag = "--n-per-node";
      }
    } else if (key == "x") {
      auto kvp = parse_export(value);
      auto same = std::find_if(o.exports.begin(), o.exports.end(), [&](auto& e) { return e.first == kvp.first; });
      if (same != o.exports.end()) {
        same->second = kvp.second;
      } else {
        o.exports.push_back(std::move(kvp));
      }
    }
  }
  if (rank_flags > 1) {
    throw InputError(fmt::format("ranks per node given {} times ({}); -n, --n-per-node, --devices-per-node and "
                                 "--npernode are the same option, give one", rank_flags, rank_flag_names));
  }
  if (total_words.size() > 1) {
    std::vector<std::string> given;
    for (const auto& w : total_words) given.push_back(fmt::format("{} {}", w.flag, excerpt(w.value, 20)));
    throw InputError(fmt::format("the number of ranks in all given {} times ({}); give it once", total_words.size(),
                                 fmt::join(given, ", ")));
  }
  if (!total_words.empty()) {
    const TotalRanksWord& w = total_words.front();
    o.total_ranks_flag = w.flag;
    if (auto n = parse_count(w.value)) {
      o.total_ranks = *n;
    } else {
      throw InputError(fmt::format("{} {}: the number of ranks in all must be a positive integer (at most 1000000)", w.flag,
                                   excerpt(w.value, 40)));
    }
    if (o.ranks_per_node) {
      throw InputError(fmt::format("{} {} and {} {} both set the number of ranks: {} counts them in all (placed "
                                   "over the hosts by their slots), {} on every host; give one",
                                   w.flag, *o.total_ranks, o.ranks_flag, *o.ranks_per_node, w.flag, o.ranks_flag));
    }
  }
  o.oversubscribe = result["oversubscribe"].as<bool>();
  if (o.oversubscribe && !o.total_ranks) {
    throw InputError("--oversubscribe only applies to -np (ranks in all); ranks per node (-n) are placed as given");
  }

  // cxxopts keeps the last of an option given twice: a user who wrote two hostfiles (or two
  // --mpirun) meant one of them, and the launcher cannot know which.
  for (const char* key : {"hostfile", "hosts", "fusion-threshold", "log-level", "timeline", "profile-scaling", "topology",
                          "start-timeout", "exit-timeout", "heartbeat-timeout", "max-restarts", "launch-agent",
                          "mpirun", "mpi-args"}) {
    std::vector<std::string> values;
    for (const auto& kv : result.arguments()) {
      if (kv.key() == key) values.push_back(fmt::format("'{}'", excerpt(kv.value(), 80)));
    }
    if (values.size() > 1) {
      throw InputError(fmt::format("{}{} given {} times ({}); give it once", std::string(key) == "hosts" ? "-H/" : "",
                                   std::string("--") + key, values.size(), fmt::join(values, ", ")));
    }
  }

  if (result.count("hostfile")) o.hostfile = result["hostfile"].as<std::string>();
  if (result.count("hosts")) o.hosts = result["hosts"].as<std::string>();
  if (o.hostfile && o.hosts) throw InputError("--hostfile and -H/--hosts both name the hosts; give one");
  if (o.hosts && trim(*o.hosts).empty()) throw InputError("-H/--hosts: the host list is empty");

  o.no_gpu = result["no-gpu"].as<bool>();
  if (result.count("parameter-servers")) o.parameter_servers = parse_parameter_servers(result["parameter-servers"].as<std::string>());
  if (result.count("ps-hosts")) o.ps_hosts = parse_ps_hosts(result["ps-hosts"].as<std::string>());
  if (result.count("fusion-threshold")) {
    const auto text = result["fusion-threshold"].as<std::string>();
    auto kb = parse_unsigned(text);
    if (text == "auto") {
      o.fusion_threshold_auto = true;
    } else if (!kb) {
      throw InputError(fmt::format("--fusion-threshold {}: must be a non-negative integer number of KB "
                                   "(0 disables fusion) or auto", text));
    } else if (*kb > static_cast<std::uint64_t>(kMaxFusionThresholdKb)) {
      throw InputError(fmt::format("--fusion-threshold {}: at most {} KB (16 GiB); the value is in KB, not bytes as "
                                   "Horovod's (64 MB is --fusion-threshold 65536)", text, kMaxFusionThresholdKb));
    } else {
      o.fusion_threshold_kb = *kb;
      if (*kb >= 1024 * 1024) {
        o.warnings.push_back(fmt::format("--fusion-threshold {} is {} GiB (the value is in KB): all the gradients of "
                                         "most models in one bucket; if bytes were meant, {} MB is --fusion-threshold {}",
                                         text, *kb / (1024 * 1024), *kb / (1024 * 1024), *kb / 1024));
      }
    }
  }
  if (result["pin-to-socket"].as<bool>()) o.pin = PinMode::socket;
  if (result["pin-memory-to-socket"].as<bool>()) o.pin = PinMode::socket_strict;
  if (result.count("log-level")) o.log_level = normalize_log_level(result["log-level"].as<std::string>());
  o.output_on_all_devices = result["output-on-all-devices"].as<bool>();
  o.log_on_all_devices = result["log-on-all-devices"].as<bool>();
  for (const auto& exported : o.exports) {
    const std::string& key = exported.first;  // not a structured binding: clang 14's lambdas cannot capture one
    auto clash = [&](const char* name, bool given, const char* option) {
      if (key == name && given) {
        throw InputError(fmt::format("-x {}=... and {} set the same variable; give one", key, option));
      }
    };
    clash(env::fusion_threshold, o.fusion_threshold_kb.has_value() || o.fusion_threshold_auto, "--fusion-threshold");
    clash(env::log_level, o.log_level.has_value(), "--log-level");
    clash(env::output_on_all_devices, o.output_on_all_devices, "--output-on-all-devices");
    clash(env::log_on_all_devices, o.log_on_all_devices, "--log-on-all-devices");
  }

  if (result.count("timeline")) {
    const auto path = result["timeline"].as<std::string>();
    if (path.empty()) throw InputError("--timeline: the path is empty");
    for (const auto& e : o.exports) {
      if (e.first == env::timeline) throw InputError("-x TNT_TIMELINE=... and --timeline set the same variable; give one");
    }
    o.exports.emplace_back(env::timeline, std::filesystem::absolute(path).string());
  }
  if (result.count("profile-scaling")) {
    const auto path = result["profile-scaling"].as<std::string>();
    if (path.empty()) throw InputError("--profile-scaling: the path is empty");
    for (const auto& e : o.exports) {
      if (e.first == env::profile_scaling) {
        throw InputError("-x TNT_PROFILE_SCALING=... and --profile-scaling set the same variable; give one");
      }
    }
    o.exports.emplace_back(env::profile_scaling, std::filesystem::absolute(path).string());
  }

  auto seconds = [&](const char* flag) -> std::optional<double> {
    if (!result.count(flag)) return std::nullopt;
    const auto text = result[flag].as<std::string>();
    if (auto v = parse_seconds(text)) return v;
    throw InputError(fmt::format("--{} {}: must be a number of seconds from 0 (no limit) to a year (31622400)", flag,
                                 text));
  };
  o.start_timeout_s = seconds("start-timeout");
  o.exit_timeout_s = seconds("exit-timeout");
  o.heartbeat_timeout_s = seconds("heartbeat-timeout");
  if (result.count("max-restarts")) {
    const auto text = result["max-restarts"].as<std::string>();
    auto k = parse_unsigned(text);
    if (!k || *k > 1000) throw InputError(fmt::format("--max-restarts {}: must be an integer from 0 to 1000", text));
    o.max_restarts = static_cast<int>(*k);
  }
  o.requeue = result.count("requeue") > 0;
  if (result.count("launch-agent")) {
    o.launch_agent = std::string(trim(result["launch-agent"].as<std::string>()));
    if (o.launch_agent->empty()) throw InputError("--launch-agent: the command is empty");
  }

  if (result.count("mpirun")) {
    o.mpirun = result["mpirun"].as<std::string>();
    if (o.mpirun->empty()) throw InputError("--mpirun: the path is empty");
  }
  if (result.count("mpi-args")) {
    try {
      o.mpi_args = split_shell_words(result["mpi-args"].as<std::string>());
    } catch (const InputError& e) {
      throw InputError(fmt::format("--mpi-args: {}", e.what()));
    }
  }
  o.dry_run = result["dry-run"].as<bool>();
  o.skip_host_lookup = result["skip-host-lookup"].as<bool>();
  if (result.count("topology")) {
    o.topology = result["topology"].as<std::string>();
    if (!o.dry_run) {
      throw InputError("--topology describes a machine for planning only; use it with --dry-run");
    }
    if (trim(*o.topology).empty()) throw InputError("--topology: empty (an hwloc XML file or \"pack:2 core:8 pu:2\")");
    if (o.pin == PinMode::none) {  // it is read only to plan the pinning
      o.warnings.push_back("--topology plans where pinned ranks go: without --pin-to-socket or "
                           "--pin-memory-to-socket it is not read");
    }
  }

  if (sep == args.end()) {
    throw InputError(fmt::format("no program to run: put '--' and the program after the options, as in: {}",
                                 usage_line));
  }
  o.program.assign(sep + 1, args.end());
  if (o.program.empty() || o.program.front().empty()) {
    throw InputError(fmt::format("no program after '--': {}", usage_line));
  }
  return o;
}

std::string help_text() {
  std::string text = make_parser().help(
      {"Hosts", "Ranks and devices", "Runtime", "Pinning", "Watching the job", "MPI", "Information"});
  text += R"(
Every rank runs PROGRAM with TNT_RANK, TNT_SIZE, TNT_LOCAL_RANK, TNT_LOCAL_SIZE, TNT_DEVICE
(cpu or cuda:K, K = local rank mod GPUs), TNT_LAUNCHER=1, and when pinned TNT_NUMA_NODE and
TNT_NUM_THREADS. Ranks fill a host's slots before the next host; rank 0 is on the first host.
Hosts: --hostfile, else -H, else the SLURM allocation (SLURM_JOB_ID, SLURM_JOB_NODELIST), else
this machine. Ranks per host: -n, else the host's slots, else the allocation's tasks on the
node (SLURM_TASKS_PER_NODE, else SLURM_NTASKS_PER_NODE), else the GPUs of this node, else 1.
With -np N those counts are the hosts' slots: N ranks fill the first host's, then the next
host's; hosts left over get no rank; more than all the slots is an error unless
--oversubscribe. Without --hostfile, -H or SLURM, -np N is N ranks on this machine.

Examples:
  tarantella -- ./train                                one rank per GPU here (1 CPU rank without GPUs)
  tarantella -n 2 -- ./train --batch_size=64           two ranks on this machine
  tarantella -n 4 --no-gpu --pin-to-socket -- ./train  four CPU ranks, each on its own cores
  tarantella --hostfile hosts --devices-per-node 4 -- ./train   hosts: a line "node1 slots=4" per host
  tarantella --hostfile hostfile --npernode 2 --pin-to-socket -- ./train   2 ranks a host, a socket each
  tarantella -np 4 -- ./train                         4 ranks on this machine, as mpirun -np 4
  tarantella -np 6 -H node1:4,node2:4 -- ./train       6 ranks in all: 4 on node1, 2 on node2
  tarantella -H node1,node2:2 -- ./train               node1 with the default, node2 with 2 ranks
  sbatch -N 4 --wrap 'tarantella -- ./train'           inside SLURM: the allocation's nodes
  tarantella --fusion-threshold 64 --log-level INFO -x OMP_NUM_THREADS=8 -- ./train
  tarantella -n 2 --profile-scaling profile.json -- ./train   then: tarantella predict profile.json --help
  tarantella --fusion-threshold auto --hostfile hosts -- ./train   the threshold chosen from the first steps
  tarantella --mpi-args "--mca btl_tcp_if_include eth0" --hostfile hosts -- ./train
  tarantella --launch-agent "ssh -p 2222" -H node1,node2 -- ./train   ssh on another port
  tarantella --max-restarts 3 --hostfile hosts -- ./train --model_dir=run1   restart from checkpoints
  tarantella -np 4 --parameter-servers 1 -- ./train --strategy=parameter_server   1 server, 3 workers
  tarantella --hostfile hosts --parameter-servers 2 --ps-hosts node1 -- ./train --strategy=parameter_server
  tarantella --dry-run -n 4 --pin-to-socket --topology "pack:2 numa:1 core:8 pu:2" -- ./train

Exit status: 0 when every rank exited 0; otherwise the first failing rank's exit code (128+N
for signal N) and a line naming that rank, its host and how it failed; 130 or 143 after
SIGINT or SIGTERM (the whole job is stopped first); 124 when the launcher ended the job
because ranks did not start, or did not end after another rank exited 0, in time (a line
names them); 1 when the first failure is a rank lost (its host, daemon or step died without
a report) or unreachable (no heartbeat: host down or cut off), with lines naming the ranks
and hosts, and when mpirun could not start its daemon on a host (a line names the host and
what the launch agent said); 2 for bad input (also a host name that does not resolve, a
--launch-agent that cannot be run, a plan this machine's open-file or process limits cannot
hold), reported before anything starts; 1 also when mpirun exited 0 but some ranks never
started (a line names them), when a rank exited 0 without joining the job while others
waited for it in MPI_Init (named at once, no timeout), and when this launcher itself was
stopped (SIGSTOP, Ctrl-Z) past the heartbeat timeout, so that the ranks ended; 141 (as for
SIGPIPE) when the standard output is a pipe whose reader ended (| head): the job is stopped
at its next output; 1 when it is a file or device that a write failed on (a full disk). A rank's program is ended with anything it started and left running,
even what ignores SIGTERM (SIGKILL 2 s after the SIGTERM). With --max-restarts, a failed job
is started again, and the status is the last attempt's; not after SIGINT or SIGTERM, a
closed output or a stopped launcher, nor when a restart would fail the same way: the first
failing rank exited 2 (a usage error) or its program could not start.
)";
  return text;
}

}  // namespace tnt::launcher
