// Checks of a resume beyond the flags' values: the contents of files the run was trained
// with (file_fingerprint, declared in flags.hpp) and the flags that decide an epoch's
// batches when the checkpoint lies inside an epoch.
#include "common/flags.hpp"
#include "common/resume_checks.hpp"
#include "common/wording.hpp"

#include <tarantella/tarantella.hpp>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>

namespace tnt_models {

std::string file_fingerprint(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TNT_INPUT_CHECK(in.good(), "--{}={}: cannot be read", flag, path);
  uint64_t h = 1469598103934665603ull;
  uint64_t size = 0;
  char buf[65536];
  // As text: carriage returns and the newlines at the end do not count (the same file
  // saved on Windows, or without its last newline, is the same vocabulary).
  uint64_t newlines = 0;  // held back until something follows them
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    for (std::streamsize i = 0; i < in.gcount(); ++i) {
      const auto c = static_cast<uint8_t>(buf[i]);
      if (c == '\r') continue;
      if (c == '\n') {
        ++newlines;
        continue;
      }
      for (; newlines > 0; --newlines, ++size) h = (h ^ uint8_t{'\n'}) * 1099511628211ull;
      h = (h ^ c) * 1099511628211ull;
      ++size;
    }
  }
  TNT_INPUT_CHECK(in.eof(), "--{}={}: reading it failed", flag, path);
  return fmt::format("{:016x}/{}", h, size);
}

// A checkpoint inside an epoch (a warning signal stopped the run there) with another value
// of a flag that decides the epoch's batches: the resume would skip steps of other batches,
// training some samples twice and others never.
void check_inside_epoch(const std::string& checkpoint, const nlohmann::json& metadata, const std::string& stored,
                        const RunFlags& given) {
  if (given.same_inside_epoch.empty() || !metadata.contains("epoch_step") || !metadata["epoch_step"].is_string()) {
    return;
  }
  const int64_t step = std::atoll(metadata["epoch_step"].get<std::string>().c_str());
  if (step <= 0) return;
  const nlohmann::json j = nlohmann::json::parse(stored, nullptr, false);
  if (!j.is_object()) return;  // compare_run_flags refused it
  std::vector<std::string> now, was, give;
  for (const std::string& name : given.same_inside_epoch) {
    const auto it = std::find_if(given.noted.begin(), given.noted.end(), [&](const auto& f) { return f.first == name; });
    if (it == given.noted.end() || !j.contains(name) || !j[name].is_string() || j[name] == it->second) continue;
    const std::string before = j[name].get<std::string>();
    was.push_back(fmt::format("--{}={}", name, before));
    if (name != "batch_size" || given.micro_batch_size <= 0) {
      now.push_back(fmt::format("--{}={}", name, it->second));
      give.push_back(was.back());
      continue;
    }
    // The global batch came from --micro_batch_size: --batch_size alone gives the one needed,
    // and so does a micro-batch where it splits evenly over the ranks.
    const int ranks = tnt::size();
    now.push_back(fmt::format("the global batch {} (--micro_batch_size={} x {})", it->second, given.micro_batch_size,
                              count_of(ranks, "rank")));
    const int64_t needed = std::atoll(before.c_str());
    give.push_back(needed > 0 && needed % ranks == 0
                       ? fmt::format("--batch_size={} (without --micro_batch_size), or --micro_batch_size={}", needed,
                                     needed / ranks)
                       : fmt::format("--batch_size={} (without --micro_batch_size)", needed));
  }
  if (now.empty()) return;
  const int epoch = metadata.contains("epoch") && metadata["epoch"].is_string()
                        ? std::atoi(metadata["epoch"].get<std::string>().c_str())
                        : 0;
  TNT_INPUT_ERROR("{}: the run being resumed ({}) stopped {} into epoch {} with {}, and a resume inside an epoch "
                  "skips the batches already taken, so {} must stay; give {} to finish the epoch (the next run may "
                  "change {}), or --overwrite to start a new run",
                  fmt::join(now, " "), checkpoint, count_of(step, "step"), epoch + 1, fmt::join(was, " "),
                  now.size() == 1 ? "it" : "they", fmt::join(give, "; "), now.size() == 1 ? "it" : "them");
}

// The "__metadata__" of a safetensors file's JSON header (checkpoint.hpp: an 8-byte
// little-endian length, then the JSON); empty when the header cannot be read.
nlohmann::json checkpoint_metadata(const std::string& path) {
  // Far beyond any header of ours; a larger length means a damaged file, for the loader.
  constexpr uint64_t kMaxHeader = 100 << 20;
  // Opened only as a regular file: a FIFO there would block this open until a writer came
  // (the loader refuses it, naming it, as this does).
  std::ifstream in = tnt::open_regular_file(path, "checkpoint");
  unsigned char len_bytes[8] = {};
  if (!in.read(reinterpret_cast<char*>(len_bytes), 8)) return {};
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | len_bytes[i];
  if (len == 0 || len > kMaxHeader) return {};
  std::string header(len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(len))) return {};
  nlohmann::json json = nlohmann::json::parse(header, nullptr, false);
  if (!json.is_object() || !json.contains("__metadata__") || !json["__metadata__"].is_object()) return {};
  return json["__metadata__"];
}

void check_resume_seed(const std::string& checkpoint, uint64_t seed, bool seed_given) {
  const nlohmann::json metadata = checkpoint_metadata(checkpoint);
  if (!metadata.contains(tnt::checkpoint_key::seed) || !metadata[tnt::checkpoint_key::seed].is_string()) return;
  const std::string stored = metadata[tnt::checkpoint_key::seed].get<std::string>();
  // A seed the flag could not take is no seed a run wrote: the metadata are damaged.
  const bool valid = !stored.empty() && stored.size() <= 20 &&
                     stored.find_first_not_of("0123456789") == std::string::npos &&
                     (stored.size() < 20 || stored <= "18446744073709551615");
  TNT_INPUT_CHECK(valid,
                  "checkpoint '{}': its metadata give the seed '{}', which is not a seed (a number from 0 to "
                  "2^64 - 1): the checkpoint is damaged or was not written by this program; --overwrite starts a "
                  "new run",
                  checkpoint, stored.substr(0, 40));
  TNT_INPUT_CHECK(stored == std::to_string(seed),
                  "--seed={}{}: the run being resumed ({}) was trained with --seed={}; give --seed={} to continue it, "
                  "or --overwrite to start a new run",
                  seed, seed_given ? "" : " (the default: --seed was not given)", checkpoint, stored, stored);
}

}  // namespace tnt_models
