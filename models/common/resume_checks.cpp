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

}  // namespace tnt_models
