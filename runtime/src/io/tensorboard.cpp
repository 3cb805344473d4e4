#include "io/tensorboard.hpp"

#include "tarantella/check.hpp"
#include "tarantella/tfrecord.hpp"
#include "tf_subset.pb.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

namespace tnt::io {

namespace {

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string event_file_path(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) TNT_INPUT_ERROR("TensorBoard: cannot create the directory '{}': {}", dir, ec.message());
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "localhost");
  const std::string base = fmt::format("{}/events.out.tfevents.{}.{}", dir, static_cast<int64_t>(wall_time()), host);
  std::string path = base;
  for (int n = 1; fs::exists(path); ++n) path = fmt::format("{}.{}", base, n);
  return path;
}

std::string serialized(const tfpb::Event& event) {
  std::string out;
  TNT_CHECK(event.SerializeToString(&out), "TensorBoard: serializing an Event failed");
  return out;
}

}  // namespace

EventFileWriter::EventFileWriter(const std::string& dir) : path_(event_file_path(dir)), writer_(std::make_unique<TFRecordWriter>(path_)) {
  tfpb::Event first;
  first.set_wall_time(wall_time());
  first.set_file_version("brain.Event:2");
  try {
    writer_->write(serialized(first));
    writer_->flush();
  } catch (...) {  // a full disk: no empty or cut file is left for TensorBoard to list
    writer_.reset();
    std::error_code ec;
    std::filesystem::remove(path_, ec);
    throw;
  }
}

void EventFileWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  tfpb::Event event;
  event.set_wall_time(wall_time());
  event.set_step(step);
  tfpb::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : values) {
    tfpb::Summary::Value* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  writer_->write(serialized(event));
}

EventFileWriter::~EventFileWriter() = default;
EventFileWriter::EventFileWriter(EventFileWriter&&) noexcept = default;
EventFileWriter& EventFileWriter::operator=(EventFileWriter&&) noexcept = default;

void EventFileWriter::flush() { writer_->flush(); }

namespace {

bool is_batch_tag(const std::string& tag) { return tag.rfind("batch_", 0) == 0; }

// One file's points beyond the resume, removed; the file replaced atomically (a temporary
// file beside it, renamed over it) when any went.
int64_t prune_file(const std::string& path, int64_t first_epoch, int64_t last_step, std::string* damage) {
  std::vector<std::string> kept;
  int64_t removed = 0;
  {
    TFRecordReader reader(path, TFRecordCompression::none);
    std::string record;
    while (true) {
      try {
        if (!reader.next(record)) break;
      } catch (const InputError& e) {
        // A record cut short or failing its CRC (a crash mid-write): it and what follows go,
        // said, unless nothing before it could be read (then the file is left as it is).
        if (kept.empty()) throw;
        *damage = e.what();
        break;
      }
      tfpb::Event event;
      if (!event.ParseFromString(record) || !event.has_summary()) {
        kept.push_back(std::move(record));
        continue;
      }
      tfpb::Summary* summary = event.mutable_summary();
      const int before = summary->value_size();
      auto* values = summary->mutable_value();
      values->erase(std::remove_if(values->begin(), values->end(),
                                   [&](const tfpb::Summary::Value& v) {
                                     return is_batch_tag(v.tag()) ? event.step() > last_step
                                                                  : event.step() >= first_epoch;
                                   }),
                    values->end());
      removed += before - summary->value_size();
      if (summary->value_size() == before) {
        kept.push_back(std::move(record));
      } else if (summary->value_size() > 0) {
        kept.push_back(serialized(event));
      }
    }
  }
  if (removed == 0) return 0;  // a damaged tail alone: TensorBoard reads up to it anyway
  // A name TensorBoard does not read (it loads every "*tfevents*"), removed on any failure.
  namespace fs = std::filesystem;
  const std::string tmp = (fs::path(path).parent_path() / fmt::format(".tnt-prune-{}.tmp", ::getpid())).string();
  try {
    TFRecordWriter writer(tmp);
    for (const std::string& r : kept) writer.write(r);
    writer.close();
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) TNT_INPUT_ERROR("TensorBoard: cannot replace '{}': {}", path, ec.message());
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  return removed;
}

}  // namespace

int64_t prune_events_after(const std::string& dir, int64_t first_epoch, int64_t last_step,
                           std::vector<std::string>* skipped) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return 0;
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("events.out.tfevents.", 0) == 0 && entry.is_regular_file(ec)) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  int64_t removed = 0;
  for (const std::string& f : files) {
    try {
      std::string damage;
      const int64_t n = prune_file(f, first_epoch, last_step, &damage);
      removed += n;
      if (n > 0 && !damage.empty() && skipped) {
        skipped->push_back(fmt::format("'{}' lost its records from a damaged one on ({})", f, damage));
      }
    } catch (const std::exception& e) {
      if (skipped) {
        skipped->push_back(fmt::format("'{}' is left as it is ({}); points of the epochs this resumed run redoes "
                                       "may show twice",
                                       f, e.what()));
      }
    }
  }
  return removed;
}
void EventFileWriter::close() { writer_->close(); }

}  // namespace tnt::io
