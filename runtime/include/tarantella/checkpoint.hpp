// Checkpoints as safetensors files.
//
// Format: an 8-byte little-endian header length N, N bytes of JSON, then the data buffer.
// The JSON maps each tensor name to {"dtype": "F32", "shape": [...], "data_offsets":
// [begin, end]} (offsets relative to the buffer start, tensors packed contiguously in the
// order given) plus an optional "__metadata__" object of string -> string. The header is
// padded with spaces to a multiple of 8 bytes. Data are little-endian, row-major.
//
// Conventions of a training checkpoint (written by Model, read by anyone): weights under
// their PyTorch names and layouts ("conv1.weight" [out, in, kh, kw], "fc.weight"
// [out, in], "bn1.running_mean"), so the file loads into the same PyTorch model;
// optimizer state under "optimizer.<parameter name>.<slot>" with PyTorch's slot names (SGD:
// ".momentum_buffer"; Adam: ".exp_avg", ".exp_avg_sq", ".step");
// the training position in the metadata as decimal strings (keys below); anything
// structured as JSON text inside a metadata value.
//
// Writes are atomic: the file is written to a temporary file in the same directory
// (".<name>.tmp-<pid>-XXXXXX"), flushed to disk (fsync of the file, then of the directory
// after the rename) and renamed over the target, so a crash leaves either the old file or
// the new one, never a truncated one. A successful write also removes temporary files
// that earlier, crashed writes of the same target left behind. Only one process should
// write a given path at a time: in a training job, the master rank.
#pragma once

#include "tarantella/tensor.hpp"

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace tnt {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::map<std::string, std::string>;

// Metadata keys of a training checkpoint.
namespace checkpoint_key {
inline constexpr const char* format = "format";        // "pt", as PyTorch tools expect
inline constexpr const char* epoch = "epoch";          // epochs completed
inline constexpr const char* step = "step";            // optimizer steps taken in total
inline constexpr const char* seed = "seed";            // the job's seed
inline constexpr const char* generator = "generator";  // generator state (decimal or JSON)
// The meaning of the training metadata, an integer: files without it were written before
// it existed and read as version 1; a file of a later version is refused by name.
inline constexpr const char* version = "tnt_checkpoint_version";
}  // namespace checkpoint_key

// The version save_checkpoint writes, and the newest load_checkpoint reads.
inline constexpr int kCheckpointVersion = 1;

// InputError naming `path` when `metadata` give a format version above kCheckpointVersion
// (or one that is no version); nothing when the key is absent (an unversioned file).
void check_checkpoint_version(const std::string& path, const std::map<std::string, std::string>& metadata);

// Tensors may be on any device (copied to the host one at a time). Names must be unique
// and non-empty. Throws InputError naming the file when it cannot be created, Error when a
// write fails; either way the target is untouched and no temporary file is left.
void write_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});

struct SafetensorsFile {
  NamedTensors tensors;  // host tensors, in the order of their data in the file
  Metadata metadata;
};

// Validates the whole header before reading data: the header length fits in the file, the
// JSON parses, every dtype is known, shapes and offsets agree, offsets lie inside the
// buffer and do not overlap, metadata values are strings. Errors are InputError naming the
// file (and the tensor).
SafetensorsFile read_safetensors(const std::string& path);

struct LoadOptions {
  bool allow_missing = false;     // destinations absent from the file keep their values
  bool allow_unexpected = false;  // tensors of the file that no destination asks for
  // Destinations that may be absent from the file (they keep their values), e.g. buffers
  // that older files of the same model did not have.
  std::set<std::string> optional;
  // A tensor that loads and holds a NaN or an infinity is refused (InputError naming the
  // file and the tensor), as the savers refuse to write one; true loads it as it is.
  bool allow_non_finite = false;
  // What the file is, in messages: "checkpoint", "weights file", ...
  const char* kind = "checkpoint";
};

class Checkpoint {
 public:
  Checkpoint() = default;
  static Checkpoint read(const std::string& path);
  // Atomic write (see above); adds metadata "format": "pt" unless set.
  void write(const std::string& path) const;

  void add(const std::string& name, const Tensor& tensor);  // a name may be added once
  bool contains(const std::string& name) const;
  const Tensor& tensor(const std::string& name) const;  // InputError when absent
  const NamedTensors& tensors() const { return tensors_; }

  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  void set_metadata_int(const std::string& key, int64_t value) { metadata_[key] = std::to_string(value); }
  bool has_metadata(const std::string& key) const { return metadata_.count(key) != 0; }
  void erase_metadata(const std::string& key) { metadata_.erase(key); }
  const std::string& metadata(const std::string& key) const;  // InputError when absent
  int64_t metadata_int(const std::string& key) const;         // ... or not a decimal integer
  const Metadata& metadata() const { return metadata_; }

  // Copies each checkpoint tensor into the destination of the same name (a Tensor handle:
  // the copy lands in the storage it shares, on any device). First checks everything and
  // reports every mismatch in one InputError: missing names, unexpected names, wrong
  // shapes, wrong dtypes. Then refuses a NaN or an infinity in a tensor that would load
  // (LoadOptions::allow_non_finite). Nothing is copied unless all match.
  void load_into(const NamedTensors& destinations, const LoadOptions& options = {}) const;

  const std::string& path() const { return path_; }  // the file it was read from, if any

 private:
  std::string path_;
  NamedTensors tensors_;
  std::map<std::string, size_t> index_;  // name -> position in tensors_
  Metadata metadata_;
};

}  // namespace tnt
