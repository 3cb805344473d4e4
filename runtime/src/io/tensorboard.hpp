// TensorBoard event files: a TFRecord file of Event protocol buffers (runtime/proto), the
// first record {wall_time, file_version "brain.Event:2"}, then one Event per (step, scalars)
// with Summary values of simple_value, as TensorFlow's summary writer makes them. The file
// is events.out.tfevents.<unix seconds>.<host> in its directory (".N" appended when a file
// of that name exists, so two runs in one second do not overwrite each other).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tnt {
class TFRecordWriter;  // tarantella/tfrecord.hpp: the framing of data's TFRecord files
}

namespace tnt::io {

class EventFileWriter {
 public:
  // Creates dir if needed; InputError naming it when it cannot.
  explicit EventFileWriter(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(EventFileWriter&&) noexcept;
  EventFileWriter& operator=(EventFileWriter&&) noexcept;
  // One Event at `step` holding every (tag, value); values are stored as float32, as
  // TensorBoard's scalars are.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  void flush();  // whole records to the OS
  void close();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<TFRecordWriter> writer_;
};

}  // namespace tnt::io
