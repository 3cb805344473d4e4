// ModelCheckpoint: its file name pattern (Keras' {epoch:02d}, {val_loss:.2f}) and the early
// check that its directory can take the files.
#include "tarantella/callbacks.hpp"

#include "tarantella/check.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/log.hpp"
#include "tarantella/model.hpp"
#include "tarantella/runtime.hpp"
#include "io/timeline.hpp"
#include "train/callback_list.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace tnt {

namespace {

struct Field {
  size_t begin = 0, end = 0;  // of "{...}" in the pattern
  std::string name, spec;     // "epoch" / a logged name, and the format spec after ':'
};

// The {name} and {name:spec} fields of a pattern; "{{" and "}}" are literal braces.
std::vector<Field> fields_of(const std::string& pattern) {
  std::vector<Field> out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '}') {
      TNT_INPUT_CHECK(i + 1 < pattern.size() && pattern[i + 1] == '}',
                      "ModelCheckpoint: '{}': a '}}' without its '{{' (write '}}}}' for a brace)", pattern);
      ++i;
      continue;
    }
    if (pattern[i] != '{') continue;
    if (i + 1 < pattern.size() && pattern[i + 1] == '{') {
      ++i;
      continue;
    }
    const size_t close = pattern.find('}', i);
    TNT_INPUT_CHECK(close != std::string::npos, "ModelCheckpoint: '{}': a '{{' without its '}}'", pattern);
    Field f;
    f.begin = i;
    f.end = close + 1;
    const std::string inside = pattern.substr(i + 1, close - i - 1);
    const size_t colon = inside.find(':');
    f.name = inside.substr(0, colon);
    if (colon != std::string::npos) f.spec = inside.substr(colon + 1);
    TNT_INPUT_CHECK(!f.name.empty(), "ModelCheckpoint: '{}': a field without a name ('{{}}'); give {{epoch}} or a "
                    "logged metric such as {{val_loss:.2f}}", pattern);
    out.push_back(f);
    i = close;
  }
  return out;
}

std::string unescape(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    out += text[i];
    if ((text[i] == '{' || text[i] == '}') && i + 1 < text.size() && text[i + 1] == text[i]) ++i;
  }
  return out;
}

// One field's text: the epoch (1-based; plain {epoch} is two digits, as before) or a value.
std::string field_text(const std::string& pattern, const Field& f, double value, bool is_epoch) {
  try {
    if (is_epoch) {
      const int epoch = static_cast<int>(value);
      return f.spec.empty() ? fmt::format("{:02d}", epoch) : fmt::format(fmt::runtime("{:" + f.spec + "}"), epoch);
    }
    return f.spec.empty() ? fmt::format("{}", value) : fmt::format(fmt::runtime("{:" + f.spec + "}"), value);
  } catch (const fmt::format_error& e) {
    TNT_INPUT_ERROR("ModelCheckpoint: '{}': the format '{}' of {{{}}} does not fit {} ({})", pattern, f.spec, f.name,
                    is_epoch ? "an epoch number (an integer: e.g. 02d)" : "a metric's value (e.g. .2f, .4g)",
                    e.what());
  }
}

}  // namespace

ModelCheckpoint::ModelCheckpoint(std::string path, std::string monitor, bool save_best_only, MonitorMode mode)
    : Callback(Ranks::all),
      path_(std::move(path)),
      monitor_(std::move(monitor)),
      save_best_only_(save_best_only),
      mode_(mode),
      best_(0) {}

std::string ModelCheckpoint::path_for(int epoch, const Logs& logs) const {
  const std::vector<Field> fields = fields_of(path_);
  std::string out;
  size_t at = 0;
  for (const Field& f : fields) {
    out += unescape(path_.substr(at, f.begin - at));
    at = f.end;
    if (f.name == "epoch") {
      out += field_text(path_, f, epoch + 1, true);
      continue;
    }
    const auto it = logs.find(f.name);
    if (it == logs.end()) {
      // A validation metric of an epoch without validation (validation_freq): said, and a
      // word in its place, rather than a training stopped for a file name.
      log_warning("ModelCheckpoint: '{}': {{{}}} is not logged after epoch {}; 'none' in its place", path_, f.name,
                  epoch + 1);
      out += "none";
      continue;
    }
    out += field_text(path_, f, it->second, false);
  }
  return out + unescape(path_.substr(at));
}

void ModelCheckpoint::on_train_begin(const Logs&) {
  // The pattern's fields: names fit will log and formats that fit them, before any epoch
  // trains (before: a file named 'ck_{epoch:02d}.safetensors', overwritten every epoch).
  std::vector<std::string> known{"epoch", "loss", "learning_rate", "seconds", "val_loss", "loss_scale"};
  for (const std::string& m : params_.metrics) {
    known.push_back(m);
    known.push_back("val_" + m);
  }
  for (const Field& f : fields_of(path_)) {
    TNT_INPUT_CHECK(std::find(known.begin(), known.end(), f.name) != known.end(),
                    "ModelCheckpoint: '{}': {{{}}} is neither {{epoch}} nor a value this fit logs ({})", path_, f.name,
                    fmt::join(known.begin() + 1, known.end(), ", "));
    field_text(path_, f, 1, f.name == "epoch");
  }
  // The directory takes the files: checked now, before the first epoch's work (before: a
  // missing directory failed the run after its first epoch). The master writes them.
  std::string error;
  if (is_master_rank()) {
    namespace fs = std::filesystem;
    // A directory named by fields (one a epoch) is made by nobody: checked as given when it
    // has none.
    const std::string parent = fs::path(path_).parent_path().string();
    fs::path dir = parent.find('{') == std::string::npos && parent.find('}') == std::string::npos
                       ? fs::path(parent.empty() ? "." : parent) : fs::path();
    std::error_code ec;
    const fs::file_status st = dir.empty() ? fs::file_status{} : fs::status(dir, ec);
    int why = 0;
    if (dir.empty()) {
      why = 0;
    } else if (!fs::exists(st)) {
      why = ENOENT;
    } else if (!fs::is_directory(st)) {
      why = ENOTDIR;
    } else if (::access(dir.c_str(), W_OK) != 0) {
      why = errno;
    }
    if (why != 0) {
      error = fmt::format("ModelCheckpoint: cannot write checkpoints into '{}' (for '{}'): {}", dir.string(), path_,
                          std::strerror(why));
    }
  }
  communicator().broadcast(error, master_rank());
  if (!error.empty()) throw InputError(error);
}

void ModelCheckpoint::on_epoch_end(int epoch, const Logs& logs) {
  TNT_CHECK(model_, "ModelCheckpoint used outside Model::fit");
  if (save_best_only_) {
    auto it = logs.find(monitor_);
    if (it == logs.end()) {
      log_warning("ModelCheckpoint: metric '{}' is not logged this epoch (logged: {}); not saving", monitor_,
                  detail::logged_names(logs));
      return;
    }
    if (have_best_ && !metric_improved(monitor_, mode_, it->second, best_, 0.0)) return;
    best_ = it->second;
    have_best_ = true;
  }
  const std::string path = path_for(epoch, logs);
  {
    timeline::Span span(timeline::Lane::compute, "checkpoint write", [&] { return R"("path":")" + timeline::escape(path) + "\""; });
    // An epoch that fit cut short (max_steps) is saved as unfinished: a resume takes its
    // remaining steps, rather than counting it done.
    const int64_t part = model_->partial_epoch_steps();
    model_->save_checkpoint(path, part > 0 ? epoch : epoch + 1, part);
  }
  last_path_ = path;
}

}  // namespace tnt
