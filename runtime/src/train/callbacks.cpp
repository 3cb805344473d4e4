#include "tarantella/callbacks.hpp"

#include "tarantella/check.hpp"
#include "tarantella/files.hpp"
#include "core/clock.hpp"
#include "io/temp_files.hpp"
#include "io/timeline.hpp"
#include "tarantella/log.hpp"
#include "tarantella/model.hpp"
#include "train/callback_list.hpp"

#include <fmt/ranges.h>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <set>
#include <filesystem>
#include <fstream>

namespace tnt {

using detail::logged_names;


namespace {

using detail::now_s;
bool higher_is_better(const std::string& name) {
  return name.find("acc") != std::string::npos;
}
}  // namespace

bool metric_improved(const std::string& name, MonitorMode mode, double current, double best, double min_delta) {
  bool maximise = mode == MonitorMode::max || (mode == MonitorMode::automatic && higher_is_better(name));
  return maximise ? current > best + min_delta : current < best - min_delta;
}

// ---- History -----------------------------------------------------------------------

void History::on_train_begin(const Logs&) {
  epochs.clear();
  history.clear();
}

void History::on_epoch_end(int epoch, const Logs& logs) {
  epochs.push_back(epoch);
  for (const auto& [k, v] : logs) history[k].push_back(v);
}

double History::last(const std::string& name) const {
  auto it = history.find(name);
  TNT_CHECK(it != history.end() && !it->second.empty(), "History has no metric '{}'", name);
  return it->second.back();
}

// ---- TimeHistory ----------------------------------------------------------------------

TimeHistory::TimeHistory(int64_t batch_size, int64_t log_steps, TimeHistoryOptions options)
    : Callback(Ranks::master), batch_size_(batch_size), log_steps_(log_steps), options_(std::move(options)) {
  TNT_INPUT_CHECK(log_steps_ >= 1, "TimeHistory: log_steps={} must be at least 1", log_steps_);
  TNT_INPUT_CHECK(batch_size_ >= 1 || options_.step_units,
                  "TimeHistory: batch_size={} must be at least 1 (or step_units given)", batch_size_);
  TNT_INPUT_CHECK(!options_.unit.empty(), "TimeHistory: the unit's word is empty");
  if (!options_.out) options_.out = stdout;
}

double TimeHistory::now() const { return options_.clock ? options_.clock() : now_s(); }

void TimeHistory::write(const std::string& line) {
  std::fputs((output_tag() + line + "\n").c_str(), options_.out);
  std::fflush(options_.out);
}

void TimeHistory::on_train_begin(const Logs&) { have_ref_ = false; }

void TimeHistory::on_epoch_begin(int, const Logs&) {
  ref_ = now();
  have_ref_ = true;
}

void TimeHistory::on_train_batch_end(int64_t, const Logs&) {
  const double t = now();
  // Without an epoch's beginning (hooks driven by hand) the first step has no start: it
  // starts the clock and counts no time.
  const double seconds = have_ref_ ? t - ref_ : 0.0;
  ref_ = t;
  have_ref_ = true;
  const double units = options_.step_units ? options_.step_units() : static_cast<double>(batch_size_);
  ++steps_;
  step_number_ = model_ ? model_->global_step() : step_number_ + 1;

  if (open_.first_step == 0) open_.first_step = step_number_;
  open_.last_step = step_number_;
  open_.seconds += seconds;
  open_.units += units;
  if (steps_ > log_steps_) {
    if (after_warmup_.first_step == 0) after_warmup_.first_step = step_number_;
    after_warmup_.last_step = step_number_;
    after_warmup_.seconds += seconds;
    after_warmup_.units += units;
  }
  if (steps_ % log_steps_ != 0) return;
  intervals_.push_back(open_);
  if (intervals_.size() == 1) warmup_ = open_;
  const Interval& i = open_;
  write(fmt::format("TimeHistory: steps {}-{}: {:.1f} {}/s ({:.0f} {} in {:.3f} s)", i.first_step, i.last_step,
                    i.rate(), options_.unit, i.units, options_.unit, i.seconds));
  open_ = Interval{};
}

void TimeHistory::on_train_end(const Logs&) {
  if (steps_ == 0) return;
  const Interval& a = after_warmup_;
  if (a.first_step == 0) {
    write(fmt::format("TimeHistory: no average yet: the {} trained so far are the first interval of {} (warm-up, "
                      "left out); train more steps than log_steps",
                      steps_ == 1 ? std::string("1 step") : fmt::format("{} steps", steps_), log_steps_));
    return;
  }
  write(fmt::format("TimeHistory: {:.1f} {}/s on average over steps {}-{} ({:.0f} {} in {:.3f} s; steps {}-{} left "
                    "out as warm-up)",
                    a.rate(), options_.unit, a.first_step, a.last_step, a.units, options_.unit, a.seconds,
                    warmup_.first_step, warmup_.last_step));
}

// ---- CSVLogger -----------------------------------------------------------------------

CSVLogger::CSVLogger(std::string path, bool append)
    : Callback(Ranks::master_only), path_(std::move(path)), append_(append) {}

CSVLogger::~CSVLogger() {
  if (file_) std::fclose(file_);
}

namespace {

// The complete lines of a text (each with its '\n'); a last line without one was cut short
// by a crash mid-write and is left out.
std::vector<std::string> complete_lines(const std::string& text) {
  std::vector<std::string> lines;
  for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) {
    lines.push_back(text.substr(at, nl + 1 - at));
  }
  return lines;
}

// The whole file, or an InputError naming it: a history that cannot be read must not be
// taken for an empty one (and rewritten as such).
std::string read_history(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TNT_INPUT_CHECK(in.is_open(), "CSVLogger: cannot read '{}' to continue its history: {}", path, std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TNT_INPUT_CHECK(!in.bad(), "CSVLogger: cannot read '{}' to continue its history", path);
  return text;
}

// Replaces path's content in one step: a temporary file in the same directory, flushed to
// disk, renamed over it (the way checkpoints are written), so a crash leaves the old file
// or the new one, never a mix.
void replace_file(const std::string& path, const std::string& content) {
  const std::filesystem::path target(path);
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
  io::remove_stale_temps(dir, target.filename().string());  // first: the space may be needed
  std::string tmp = io::temp_template(dir, target.filename().string());
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) TNT_INPUT_ERROR("CSVLogger: cannot create a temporary file beside '{}': {}", path, std::strerror(errno));
  ::fchmod(fd, 0666 & ~io::current_umask());  // mkstemp makes 0600; the log is an ordinary file
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const bool ok = done == content.size() && ::fsync(fd) == 0;
  const int err = errno;
  if (::close(fd) != 0 || !ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = ok ? errno : err;
    ::unlink(tmp.c_str());
    TNT_INPUT_ERROR("CSVLogger: cannot rewrite '{}': {}", path, std::strerror(e));
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);  // the new directory entry too; best effort, the data are in place
    ::close(dfd);
  }
  // A rewrite killed before its rename (tests/train: SIGKILL mid-rewrite) left its temp.
  io::remove_stale_temps(dir, target.filename().string());
}

}  // namespace

namespace {

// A column name as a CSV field: quoted (RFC 4180, "" for a quote) where it holds a comma or
// a quote, as Python's csv module writes it.
std::string csv_field(const std::string& name) {
  if (name.find_first_of(",\"") == std::string::npos) return name;
  std::string out = "\"";
  for (char c : name) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// The fields of a header line written with csv_field.
std::vector<std::string> csv_header_fields(const std::string& header) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < header.size(); ++i) {
    const char c = header[i];
    if (quoted && c == '"' && i + 1 < header.size() && header[i + 1] == '"') {
      fields.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  return fields;
}

}  // namespace

void CSVLogger::on_train_takeover(int epoch, const Logs& logs) {
  // The rows of the epochs done are the lost master's, and stay; later ones go (a loss at an
  // epoch's end redoes that epoch's end, its row included).
  const bool append = append_;
  append_ = true;
  params_.initial_epoch = epoch;
  on_train_begin(logs);
  append_ = append;  // the truncation is decided: a later fit() starts as the user asked
}

void CSVLogger::on_train_begin(const Logs&) {
  header_written_ = false;
  held_epoch_ = -1;  // a fit that ended by an exception left its held row: the resume redoes that epoch
  held_logs_.clear();
  {
    // A dangling link would have the rows written wherever it points, creating a file
    // there; a FIFO would block the run, a device swallow the history.
    std::error_code ec;
    const auto link_status = std::filesystem::symlink_status(path_, ec);
    if (std::filesystem::is_symlink(link_status)) {
      std::error_code link_ec;
      const auto target = std::filesystem::read_symlink(path_, link_ec);
      TNT_INPUT_CHECK(std::filesystem::exists(std::filesystem::status(path_, ec)),
                      "CSVLogger: '{}' is a symbolic link to '{}', which does not exist: writing the history would "
                      "create a file there; remove the link, or give the path of the file itself",
                      path_, link_ec ? std::string("?") : target.string());
    }
    const auto status = std::filesystem::status(path_, ec);
    TNT_INPUT_CHECK(!std::filesystem::is_directory(status),
                    "CSVLogger: '{}' is a directory: the history goes into a file (give a file's path, or remove the "
                    "directory)",
                    path_);
    TNT_INPUT_CHECK(!std::filesystem::exists(status) || std::filesystem::is_regular_file(status),
                    "CSVLogger: '{}' is not a regular file (a FIFO, socket or device): the history goes into a file "
                    "of its own",
                    path_);
  }
  if (append_ && params_.initial_epoch > 0 && access(path_.c_str(), F_OK) != 0) {
    log_warning("CSVLogger: '{}' is missing: the history of this resumed run starts at epoch {}, without the rows "
                "of epochs 1 to {}",
                path_, params_.initial_epoch + 1, params_.initial_epoch);
  }
  if (append_ && access(path_.c_str(), F_OK) == 0) {
    // A resumed run (initial_epoch = the checkpoint's epoch) redoes the epochs after it:
    // their rows from the run that crashed go, so each epoch has one row. Rows are written
    // before the epoch's checkpoint, so a crash between the two leaves one such row (and a
    // crash mid-row a partial line, dropped as well). The file is replaced atomically.
    std::string text = read_history(path_);
    // A spreadsheet saves UTF-8 with a byte-order mark: the rewritten file goes without it.
    if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
    const std::vector<std::string> lines = complete_lines(text);
    // Checked before anything is rewritten: a file that is not this logger's, or whose
    // columns differ, is refused as it is. Only a header cut short by a crash mid-write
    // (the first row comes with it) passes without a newline, and goes.
    if (!text.empty()) {
      std::string header = text.substr(0, text.find('\n'));
      while (!header.empty() && (header.back() == '\n' || header.back() == '\r')) header.pop_back();
      const bool cut_short = lines.empty() && !header.empty() && std::string("epoch,").rfind(header, 0) == 0;
      TNT_INPUT_CHECK(cut_short || header == "epoch" || header.rfind("epoch,", 0) == 0,
                      "CSVLogger: '{}' does not begin with the header this logger writes ('epoch,...'; it begins "
                      "'{}'), so rows cannot be appended to it: move it away, or start over (--overwrite)",
                      path_, header.substr(0, 60));
      if (!lines.empty()) {
        std::vector<std::string> cols = csv_header_fields(header);
        if (!cols.empty() && cols.front() == "epoch") cols.erase(cols.begin());
        // Rows in other columns than the header's would put each value under another name.
        TNT_INPUT_CHECK(columns_.empty() || columns_ == cols,
                        "CSVLogger: '{}' has the columns epoch,{} but this run logs epoch,{}: its rows would not "
                        "fit under that header; move the file away (a new history starts), or continue with the "
                        "settings of the run that wrote it",
                        path_, fmt::join(cols, ","), fmt::join(columns_, ","));
        if (columns_.empty()) columns_ = cols;
        // Keep the existing header: a resumed run appends rows in the same columns.
        header_written_ = true;
      }
    }
    std::string kept;
    size_t dropped = 0;
    std::set<int> present;
    for (size_t i = 0; i < lines.size(); ++i) {
      const int epoch = i == 0 ? 0 : std::atoi(lines[i].c_str());  // the first column, 1-based
      if (epoch > params_.initial_epoch) {
        ++dropped;
      } else {
        kept += lines[i];
        if (i > 0) present.insert(epoch);
      }
    }
    // Rows of the epochs before the resume that are not there (deleted by hand, a history
    // copied from another run): said, as a missing file is, since a plot would run on over
    // the gap without a sign.
    std::vector<int> missing;
    for (int e = 1; e <= params_.initial_epoch && !lines.empty(); ++e) {
      if (!present.count(e)) missing.push_back(e);
    }
    if (!missing.empty()) {
      std::string list;
      for (size_t i = 0; i < missing.size() && i < 10; ++i) list += (i ? ", " : "") + std::to_string(missing[i]);
      if (missing.size() > 10) list += fmt::format(" and {} more", missing.size() - 10);
      log_warning("CSVLogger: '{}' has no row for epoch{} {} of the {} before this resumed run: the history goes on "
                  "without {}",
                  path_, missing.size() == 1 ? "" : "s", list, params_.initial_epoch,
                  missing.size() == 1 ? "it" : "them");
    }
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(path_, ec);
    if (dropped > 0 || (!ec && size != kept.size())) replace_file(path_, kept);
    if (dropped > 0) {
      log_info("CSVLogger: removed {} row(s) of epochs after {} from '{}' (training resumes there)", dropped,
               params_.initial_epoch, path_);
    }
  }
  // The file is made when the first row is written, so that a run that ends before its
  // first epoch does (nothing to train, interrupted) leaves no empty history behind; whether
  // it can be written is checked now, before any training.
  std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  const auto file_status = std::filesystem::status(path_, ec);
  const auto dir_status = std::filesystem::status(dir, ec);
  int why = 0;  // errno of the open that would fail
  if (std::filesystem::exists(file_status)) {
    if (std::filesystem::is_directory(file_status)) {
      why = EISDIR;
    } else if (access(path_.c_str(), W_OK) != 0) {
      why = errno;
    }
  } else if (!std::filesystem::exists(dir_status)) {
    why = ENOENT;
  } else if (!std::filesystem::is_directory(dir_status)) {
    why = ENOTDIR;
  } else if (access(dir.c_str(), W_OK) != 0) {
    why = errno;
  }
  if (why != 0) TNT_INPUT_ERROR("CSVLogger: cannot open '{}' for writing: {}", path_, std::strerror(why));
  truncate_ = !append_;
  open_ = true;
}

void CSVLogger::on_epoch_end(int epoch, const Logs& logs) {
  if (!open_) return;
  // An epoch that a stop on request (SIGUSR1, a batch system's warning) cut short: if a
  // checkpoint is saved there, the run that resumes it writes the row, for all its steps (as
  // TensorBoard's point); a row here would read as a finished epoch until then.
  if (model_ && model_->stopped_on_request() && model_->partial_epoch_steps() > 0) {
    held_epoch_ = epoch;
    held_logs_ = logs;
    return;
  }
  write_row(epoch, logs);
}

void CSVLogger::write_row(int epoch, const Logs& logs) {
  if (!file_) {
    created_ = truncate_ || access(path_.c_str(), F_OK) != 0;
    wrote_row_ = false;
    file_ = std::fopen(path_.c_str(), truncate_ ? "w" : "a");
    if (!file_) TNT_INPUT_ERROR("CSVLogger: cannot open '{}' for writing: {}", path_, std::strerror(errno));
  }
  // A history that silently lost rows (a full disk, a file size limit) would pass for a
  // complete one: the run ends with the reason instead.
  const auto failed = [&](int err) {
    std::fclose(file_);
    file_ = nullptr;
    open_ = false;
    // An empty or cut header left by a full disk would pass for a run's history (a rerun
    // would take the directory for a run to resume): a file this run made goes again.
    if (created_ && !wrote_row_) ::unlink(path_.c_str());
    throw Error(fmt::format("CSVLogger: writing epoch {}'s row to '{}' failed: {}", epoch + 1, path_,
                            std::strerror(err)));
  };
  if (columns_.empty()) {
    for (const auto& [k, v] : logs) columns_.push_back(k);
    // A first epoch without validation (validation_freq > 1) would leave the val_ columns
    // out of the header for good: they are there from the start, empty where not run.
    if (params_.validates && std::none_of(columns_.begin(), columns_.end(),
                                          [](const std::string& c) { return c.rfind("val_", 0) == 0; })) {
      for (const std::string& m : params_.metrics) columns_.push_back("val_" + m);
      std::sort(columns_.begin(), columns_.end());
    }
  }
  if (!header_written_) {
    std::string header = "epoch";
    for (const auto& c : columns_) {
      header += ',';
      header += csv_field(c);
    }
    if (std::fprintf(file_, "%s\n", header.c_str()) < 0) failed(errno);
    header_written_ = true;
  }
  std::string row = std::to_string(epoch + 1);
  for (const auto& c : columns_) {
    auto it = logs.find(c);
    row += ",";
    // The shortest text that reads back as the value, as Keras' str(float) (not 6 digits).
    if (it != logs.end()) row += fmt::format("{}", it->second);
  }
  if (std::fprintf(file_, "%s\n", row.c_str()) < 0) failed(errno);
  if (std::fflush(file_) != 0) failed(errno);
  wrote_row_ = true;
}

void CSVLogger::on_train_end(const Logs&) {
  const int held = held_epoch_;
  held_epoch_ = -1;
  // No checkpoint of the cut epoch: nothing will resume it, and its row is all there is.
  if (held >= 0 && open_ && model_ && model_->last_checkpoint_step() != model_->global_step()) {
    write_row(held, held_logs_);
  }
  held_logs_.clear();
  if (file_) std::fclose(file_);
  file_ = nullptr;
  open_ = false;
}

// ---- EarlyStopping ---------------------------------------------------------------------

EarlyStopping::EarlyStopping(std::string monitor, double min_delta, int patience, MonitorMode mode,
                             bool restore_best_weights)
    : Callback(Ranks::all),
      monitor_(std::move(monitor)),
      min_delta_(std::fabs(min_delta)),
      patience_(patience),
      mode_(mode),
      restore_best_weights_(restore_best_weights) {}

void EarlyStopping::on_train_begin(const Logs&) {
  have_best_ = false;
  best_epoch_ = -1;
  wait_ = 0;
  stopped_epoch_ = -1;
  best_weights_.clear();
}

namespace {

// Every weight of the model in a fixed order: parameters, then buffers.
std::vector<Tensor> model_weights(Model& model) {
  std::vector<Tensor> out;
  for (auto& p : model.network().named_parameters()) out.push_back(p.param->value);
  for (auto& b : model.network().named_buffers()) out.push_back(b.param->value);
  return out;
}

}  // namespace

void EarlyStopping::on_epoch_end(int epoch, const Logs& logs) {
  auto it = logs.find(monitor_);
  if (it == logs.end()) {
    log_warning("EarlyStopping: metric '{}' is not logged; available: {}", monitor_, logged_names(logs));
    return;
  }
  if (!have_best_ || metric_improved(monitor_, mode_, it->second, best_, min_delta_)) {
    best_ = it->second;
    have_best_ = true;
    best_epoch_ = epoch;
    wait_ = 0;
    if (restore_best_weights_) {
      TNT_CHECK(model_, "EarlyStopping used outside Model::fit");
      std::vector<Tensor> weights = model_weights(*model_);
      if (best_weights_.size() != weights.size()) {
        best_weights_.clear();
        for (const Tensor& w : weights) best_weights_.push_back(w.clone());
      } else {
        for (size_t i = 0; i < weights.size(); ++i) best_weights_[i].copy_from(weights[i]);
      }
    }
    return;
  }
  if (++wait_ > patience_) {
    stopped_epoch_ = epoch;
    TNT_CHECK(model_, "EarlyStopping used outside Model::fit");
    model_->stop_training();
    log_info("EarlyStopping: '{}' did not improve for {} epoch(s); stopping after epoch {}", monitor_, wait_, epoch + 1);
  }
}

void EarlyStopping::on_train_end(const Logs&) {
  if (!restore_best_weights_ || best_weights_.empty()) return;
  TNT_CHECK(model_, "EarlyStopping used outside Model::fit");
  std::vector<Tensor> weights = model_weights(*model_);
  TNT_CHECK(weights.size() == best_weights_.size(),
            "EarlyStopping: the model has {} weight tensors now but had {} at its best epoch", weights.size(),
            best_weights_.size());
  for (size_t i = 0; i < weights.size(); ++i) weights[i].copy_from(best_weights_[i]);
  log_info("EarlyStopping: restored the weights of epoch {} ('{}' = {})", best_epoch_ + 1, monitor_, best_);
  best_weights_.clear();  // the copies are not needed any more
}

// ---- ReduceLROnPlateau -------------------------------------------------------------------

ReduceLROnPlateau::ReduceLROnPlateau(std::string monitor, double factor, int patience, double min_delta, int cooldown,
                                     double min_lr, MonitorMode mode)
    : Callback(Ranks::all),
      monitor_(std::move(monitor)),
      factor_(factor),
      patience_(patience),
      min_delta_(std::fabs(min_delta)),
      cooldown_(cooldown),
      min_lr_(min_lr),
      mode_(mode) {
  TNT_INPUT_CHECK(factor > 0 && factor < 1, "ReduceLROnPlateau: factor={} must be in (0, 1)", factor);
  TNT_INPUT_CHECK(patience >= 0, "ReduceLROnPlateau: patience={} must be >= 0", patience);
  TNT_INPUT_CHECK(cooldown >= 0, "ReduceLROnPlateau: cooldown={} must be >= 0", cooldown);
  TNT_INPUT_CHECK(std::isfinite(min_lr) && min_lr >= 0, "ReduceLROnPlateau: min_lr={} must be >= 0", min_lr);
  TNT_INPUT_CHECK(std::isfinite(min_delta), "ReduceLROnPlateau: min_delta={} must be finite", min_delta);
}

void ReduceLROnPlateau::on_train_begin(const Logs&) {
  // As Keras: the counters start again with each fit; a reduced rate stays reduced.
  have_best_ = false;
  wait_ = 0;
  cooldown_left_ = 0;
  reductions_ = 0;
}

// Keras' order: a cooldown epoch clears the wait first; an improvement resets it; otherwise,
// outside a cooldown, the epoch counts and patience of them reduce the rate.
void ReduceLROnPlateau::on_epoch_end(int epoch, const Logs& logs) {
  auto it = logs.find(monitor_);
  if (it == logs.end()) {
    log_warning("ReduceLROnPlateau: metric '{}' is not logged this epoch (logged: {}); the learning rate stays",
                monitor_, logged_names(logs));
    return;
  }
  if (cooldown_left_ > 0) {
    --cooldown_left_;
    wait_ = 0;
  }
  if (!have_best_ || metric_improved(monitor_, mode_, it->second, best_, min_delta_)) {
    best_ = it->second;
    have_best_ = true;
    wait_ = 0;
    return;
  }
  if (cooldown_left_ > 0 || ++wait_ < patience_) return;
  TNT_CHECK(model_, "ReduceLROnPlateau used outside Model::fit");
  Optimizer& opt = model_->optimizer();
  const double lr = opt.learning_rate();
  if (!(lr > min_lr_)) return;
  opt.set_lr_factor(opt.lr_factor() * factor_, min_lr_);
  log_info("ReduceLROnPlateau: '{}' did not improve for {} epoch(s); after epoch {} the learning rate goes from {} to "
           "{}",
           monitor_, wait_, epoch + 1, lr, opt.learning_rate());
  cooldown_left_ = cooldown_;
  wait_ = 0;
  ++reductions_;
}

// ---- LearningRateScheduler ---------------------------------------------------------------

LearningRateScheduler::LearningRateScheduler(std::function<double(int, double)> fn)
    : Callback(Ranks::all), fn_(std::move(fn)) {}

void LearningRateScheduler::on_epoch_begin(int epoch, const Logs&) {
  TNT_CHECK(model_, "LearningRateScheduler used outside Model::fit");
  double lr = fn_(epoch, model_->learning_rate());
  TNT_INPUT_CHECK(std::isfinite(lr) && lr >= 0,
                  "LearningRateScheduler: the schedule returned the learning rate {} for epoch {}: it must be finite "
                  "and at least 0", lr, epoch + 1);
  model_->set_learning_rate(lr);
}

}  // namespace tnt
