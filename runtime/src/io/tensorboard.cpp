#include "io/tensorboard.hpp"

#include "tarantella/check.hpp"
#include "tarantella/tfrecord.hpp"
#include "tf_subset.pb.h"

#include <unistd.h>

#include <chrono>
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
  writer_->write(serialized(first));
  writer_->flush();
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
void EventFileWriter::close() { writer_->close(); }

}  // namespace tnt::io
