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

// Removes from the event files in `dir` (events.out.tfevents.*) the points a resumed run
// will write again: scalars at steps >= first_epoch, except "batch_*" ones, which go at
// steps > last_step (INT64_MAX: none of that kind). A file that loses points is replaced
// atomically (with a record cut short by a crash, and what follows it, dropped). Returns the
// points removed; a file that cannot be read or replaced is left as it was and named, with
// the reason, in `skipped`.
int64_t prune_events_after(const std::string& dir, int64_t first_epoch, int64_t last_step,
                           std::vector<std::string>* skipped);

}  // namespace tnt::io
