// Checkpoint: named tensors plus string metadata, and the checked load into a model.
#include "tarantella/checkpoint.hpp"

#include "tarantella/ops.hpp"

#include <algorithm>
#include <charconv>
#include <set>

namespace tnt {

void check_checkpoint_version(const std::string& path, const Metadata& metadata) {
  const auto it = metadata.find(checkpoint_key::version);
  if (it == metadata.end()) return;
  int64_t version = 0;
  const char* end = it->second.data() + it->second.size();
  const auto [ptr, ec] = std::from_chars(it->second.data(), end, version);
  TNT_INPUT_CHECK(ec == std::errc() && ptr == end && version >= 1,
                  "checkpoint '{}': metadata {}={} is not a format version (1 or more); the file is damaged", path,
                  checkpoint_key::version, it->second.substr(0, 60));
  TNT_INPUT_CHECK(version <= kCheckpointVersion,
                  "checkpoint '{}' was written by a newer Tarantella (checkpoint format {}; this one reads up to "
                  "{}): resume it with that version, or load only its weights with load_weights",
                  path, version, kCheckpointVersion);
}

Checkpoint Checkpoint::read(const std::string& path) {
  SafetensorsFile file = read_safetensors(path);
  Checkpoint c;
  c.path_ = path;
  for (auto& [name, t] : file.tensors) c.add(name, t);
  c.metadata_ = std::move(file.metadata);
  return c;
}

void Checkpoint::write(const std::string& path) const {
  Metadata meta = metadata_;
  meta.emplace(checkpoint_key::format, "pt");
  write_safetensors(path, tensors_, meta);
}

void Checkpoint::add(const std::string& name, const Tensor& tensor) {
  TNT_CHECK(tensor.defined(), "Checkpoint::add: tensor '{}' is undefined", name);
  TNT_CHECK(index_.emplace(name, tensors_.size()).second, "Checkpoint::add: tensor '{}' added twice", name);
  tensors_.emplace_back(name, tensor);
}

bool Checkpoint::contains(const std::string& name) const { return index_.count(name) != 0; }

const Tensor& Checkpoint::tensor(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    TNT_INPUT_ERROR("checkpoint '{}' has no tensor '{}'", path_.empty() ? "(in memory)" : path_, name);
  }
  return tensors_[it->second].second;
}

const std::string& Checkpoint::metadata(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) {
    TNT_INPUT_ERROR("checkpoint '{}' has no metadata '{}'", path_.empty() ? "(in memory)" : path_, key);
  }
  return it->second;
}

int64_t Checkpoint::metadata_int(const std::string& key) const {
  const std::string& text = metadata(key);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    TNT_INPUT_ERROR("checkpoint '{}': metadata '{}' = '{}' is not a decimal integer",
                    path_.empty() ? "(in memory)" : path_, key, text);
  }
  return v;
}

void Checkpoint::load_into(const NamedTensors& destinations, const LoadOptions& options) const {
  std::vector<std::string> missing, unexpected, wrong_shape, wrong_dtype;
  std::set<std::string> wanted;
  for (const auto& [name, dst] : destinations) {
    TNT_CHECK(wanted.insert(name).second, "Checkpoint::load_into: destination '{}' given twice", name);
    TNT_CHECK(dst.defined(), "Checkpoint::load_into: destination '{}' is undefined", name);
    auto it = index_.find(name);
    if (it == index_.end()) {
      if (!options.allow_missing && !options.optional.count(name)) missing.push_back(name);
      continue;
    }
    const Tensor& src = tensors_[it->second].second;
    if (src.shape() != dst.shape()) {
      wrong_shape.push_back(fmt::format("{} (file {}, expected {})", name, shape_str(src.shape()), shape_str(dst.shape())));
    }
    if (src.dtype() != dst.dtype()) {
      wrong_dtype.push_back(fmt::format("{} (file {}, expected {})", name, dtype_safetensors(src.dtype()),
                                        dtype_safetensors(dst.dtype())));
    }
  }
  if (!options.allow_unexpected) {
    for (const auto& [name, t] : tensors_) {
      if (!wanted.count(name)) unexpected.push_back(name);
    }
  }
  if (!missing.empty() || !unexpected.empty() || !wrong_shape.empty() || !wrong_dtype.empty()) {
    std::string msg =
        fmt::format("{} '{}' does not match the model:", options.kind, path_.empty() ? "(in memory)" : path_);
    // Each kind's count, and kMaxNamed names in all, shared out in turn so that every kind
    // has at least one: a checkpoint of another model would otherwise list every tensor,
    // on every rank.
    constexpr size_t kMaxNamed = 10;
    const std::vector<std::string>* kinds[] = {&missing, &unexpected, &wrong_shape, &wrong_dtype};
    size_t shown[4] = {0, 0, 0, 0};
    for (size_t named = 0, last = 1; named < kMaxNamed && last != named;) {
      last = named;
      for (size_t k = 0; k < 4 && named < kMaxNamed; ++k) {
        if (shown[k] < kinds[k]->size()) {
          ++shown[k];
          ++named;
        }
      }
    }
    size_t kind = 0;
    auto list = [&](const char* what, const std::vector<std::string>& items) {
      const size_t n = shown[kind++];
      if (items.empty()) return;
      std::vector<std::string> names(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(n));
      if (n < items.size()) names.push_back(fmt::format("and {} more", items.size() - n));
      msg += fmt::format(" {} {}: {};", items.size(), what, fmt::join(names, ", "));
    };
    list("missing", missing);
    list("unexpected", unexpected);
    list("with a wrong shape", wrong_shape);
    list("with a wrong dtype", wrong_dtype);
    msg.pop_back();
    TNT_INPUT_ERROR("{}", msg);
  }
  // The savers never write a NaN or an infinity (Model::save_checkpoint, tnt::save_model):
  // such a value in a file is damage or another writer's diverged run, and loaded it would
  // only fail later, at the next save, after a history row for an epoch without checkpoint.
  // One pass over the tensors that load; every rank reads the same file and throws alike.
  if (!options.allow_non_finite) {
    for (const auto& [name, dst] : destinations) {
      auto it = index_.find(name);
      if (it == index_.end() || !ops::has_non_finite(tensors_[it->second].second)) continue;
      TNT_INPUT_ERROR("{} '{}': tensor '{}' holds a NaN or an infinity (a damaged file, or one written "
                      "after the training diverged); nothing was loaded",
                      options.kind, path_.empty() ? "(in memory)" : path_, name);
    }
  }
  for (const auto& [name, dst] : destinations) {
    auto it = index_.find(name);
    if (it == index_.end()) continue;
    Tensor target = dst;  // a handle: copy_from writes into the storage dst shares
    target.copy_from(tensors_[it->second].second);
  }
}

}  // namespace tnt
