// ImageNet input pipeline: the two on-disk layouts people have, JPEG decoding with
// libjpeg-turbo, and the standard training and evaluation preprocessing.
//
// Layouts (find_imagenet_layout finds which one data_dir holds, tried in this order):
//   folders   <data_dir>/train/<wnid>/*.JPEG, <data_dir>/val/<wnid>/*.JPEG. The class index
//             is the position of the wnid among the sorted folder names; files are sorted
//             by name within a class; extensions .jpeg/.jpg in any case.
//   tfrecord  TF Model Garden shards: <data_dir>/train-00000-of-01024 ...,
//             <data_dir>/validation-00000-of-00128 ... holding tf.train.Example records
//             with image/encoded (bytes) and image/class/label (int64). Those labels are
//             1-based (0 is the "background" class of the Inception preprocessing scripts),
//             so the element's label is file label - 1 by default;
//             ImagenetOptions::one_based_labels = false keeps it.
//   tfds      what tensorflow_datasets' download_and_prepare --datasets=imagenet2012
//             --data_dir=D writes: D/imagenet2012/<version>/imagenet2012-train.tfrecord-
//             00000-of-01024 ..., imagenet2012-validation.tfrecord-... (beside
//             dataset_info.json), with features image (bytes) and label (int64, 0-based,
//             always taken as is). data_dir may be D, D/imagenet2012 or a version folder;
//             of several versions the highest (numerically: 5.10.0 > 5.9.0) is read.
// The shards of a split must be complete: every NNNNN of MMMMM present, one MMMMM.
//
// The source is random access: element p of a pass is built only when asked for, so
// distribute() steps over the other ranks' samples without opening their files. Shuffle
// with ImagenetOptions::shuffle (a full permutation per epoch, keyed by (seed, epoch)), not
// with Dataset::shuffle, whose buffer would read every file on every rank. For the same
// reason the shards are read by record offset rather than through Dataset::interleave
// (which walks files in order, so every rank would read every record, and whose order
// is not a full permutation); so they must be uncompressed (GZIP shards: an error saying so).
//
// Undecoded element (what the source yields):
//   0 bytes  u8 (n,)  the encoded image file
//   1 label  i64 ()   class index in [0, classes)
//   2 index  i64 ()   the sample's position in the sorted listing / the shards (unshuffled)
//   3 epoch  i64 ()   the pass it was drawn in
//   4 source u8 (m,)  where the bytes came from, UTF-8 ("path" or "'shard' at byte offset
//                     N"), so that a decoding error in a map worker names the file
// The preprocess map function keys its randomness by (seed, index, epoch) through
// CounterRng, so a sample's crop and flip are the same in every run, on any number of ranks
// and map workers, and differ from epoch to epoch. It returns {image f32 (3, S, S), label
// i64 ()}.
//
//   auto train = tnt::imagenet_dataset(dir, "train", {.shuffle = true, .seed = 1})
//                    .distribute(512, tnt::Remainder::drop)
//                    .map(tnt::imagenet_preprocess(224, true, 1), 8)
//                    .prefetch(4);
#pragma once

#include "tarantella/dataset.hpp"
#include "tarantella/tensor.hpp"
#include "tarantella/tfrecord.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace tnt {

struct ImagenetOptions {
  bool shuffle = false;          // permute the samples in every epoch (by seed and epoch)
  uint64_t seed = 0;
  bool one_based_labels = true;  // TFRecord labels: true maps label L to L - 1
  std::string layout = "auto";   // "auto", "folders", "tfrecord" (Model Garden) or "tfds"
  // The model's classes: a label beyond them (more class folders, a TFRecord label too
  // large) is an error naming the folder, or the record's file and offset, where it is
  // read, not at a training step. 0: not checked.
  int64_t num_classes = 0;
  // The Example features of a TFRecord sample (tfrecord_dataset); the tfds layout sets
  // image and label.
  std::string image_feature = "image/encoded";
  std::string label_feature = "image/class/label";
  // Image folders: the class names in label order (the training split's folders, from
  // image_folder_classes), so that another split gets the same label for the same class
  // folder whatever folders it lacks; a folder that is not one of them is refused, naming
  // it. Empty: the split's own folders, sorted, are labels 0, 1, ...
  std::vector<std::string> class_names{};
};

// Where one split's files are.
struct ImagenetLayout {
  std::string kind;                 // "folders", "tfrecord" or "tfds"
  std::string split;                // "train" or "validation" ("val" for folders)
  std::string dir;                  // the split folder (folders), or the folder of the shards
  std::vector<std::string> shards;  // TFRecord layouts: every shard, sorted
  std::string version;              // tfds: the version folder's name, e.g. "5.1.0"
  std::string describe() const;     // one line for the log, naming the kind and the folder
};
// layout as ImagenetOptions::layout. InputError naming the folder and what was expected:
// nothing usable, a TFDS dataset folder without version folders, a version folder without
// the split's files, shards that disagree on their count or miss one (named NNNNN of MMMMM).
ImagenetLayout find_imagenet_layout(const std::string& data_dir, const std::string& split,
                                    const std::string& layout = "auto");
Dataset imagenet_dataset(const ImagenetLayout& layout, const ImagenetOptions& options = {});

// split: "train", or "val" / "validation" (folders: val/, else validation/; TFRecord:
// validation-*). find_imagenet_layout, then the dataset of what it found.
Dataset imagenet_dataset(const std::string& data_dir, const std::string& split,
                         const ImagenetOptions& options = {});

// The training (random resized crop, flip) or evaluation (resize, centre crop) map function;
// see imagenet.cpp for the exact recipe. Input: an undecoded element as above; output
// {image f32 (3, S, S), label i64 ()}. Thread-safe (map workers call it concurrently).
MapFn imagenet_preprocess(int64_t image_size, bool training, uint64_t seed = 0);

// ImageNet's per-channel statistics of [0, 1] RGB pixels.
inline constexpr float kImagenetMean[3] = {0.485f, 0.456f, 0.406f};
inline constexpr float kImagenetStd[3] = {0.229f, 0.224f, 0.225f};

// ---- image folders
struct ImageFolderListing {
  std::vector<std::string> classes;  // sorted wnids
  std::vector<std::string> files;    // every image, by class then by name
  std::vector<int64_t> labels;       // (files,)
};
// Throws InputError naming the path: missing directory, no class folders, a class folder
// without images.
ImageFolderListing list_image_folder(const std::string& split_dir);
// The class folders of a split, sorted (what list_image_folder's classes are), without
// listing their images.
std::vector<std::string> image_folder_classes(const std::string& split_dir);
Dataset image_folder_dataset(const std::string& split_dir, const ImagenetOptions& options = {});

// ---- JPEG (libjpeg-turbo)
// u8 (H', W', 3) RGB; grayscale and CMYK files are converted. `name` (a path) is what an
// InputError names when the bytes are not a readable JPEG. scale_denom 2, 4 or 8 decodes
// at 1/2, 1/4 or 1/8 size in the DCT domain (H' = ceil(H / scale_denom)), which is much
// faster than decoding in full and then shrinking, and averages instead of aliasing. A
// progressive file that lacks some AC coefficients is shown without libjpeg's guesses of
// them from the neighbouring blocks ("block smoothing"), so that a part of an image
// (ImageNet preprocessing's crop) decodes to the same pixels as the whole.
Tensor decode_jpeg(const uint8_t* data, size_t size, const std::string& name, int scale_denom = 1);
struct JpegSize {
  int64_t height = 0;
  int64_t width = 0;
};
JpegSize jpeg_size(const uint8_t* data, size_t size, const std::string& name);  // header only
// rgb: u8 (H, W, 3). For tests and for writing datasets.
std::vector<uint8_t> encode_jpeg(const Tensor& rgb, int quality = 95);

// ---- TFRecord
// CRC-32C (Castagnoli), and the masked form TFRecord stores:
// ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t crc32c(const uint8_t* data, size_t size, uint32_t crc = 0);
uint32_t masked_crc32c(const uint8_t* data, size_t size);

// tf.train.Example with the two features ImageNet shards carry.
struct ImageExample {
  std::vector<uint8_t> encoded;  // image/encoded
  int64_t label = 0;             // image/class/label, as stored
};
std::vector<uint8_t> encode_example(const ImageExample& example);
// `where` names the record in errors ("file at offset 123").
ImageExample parse_example(const uint8_t* data, size_t size, const std::string& where);
// The same with other feature names (TFDS: "image", "label").
ImageExample parse_example(const uint8_t* data, size_t size, const std::string& where,
                           const std::string& image_feature, const std::string& label_feature);

// TFRecordWriter, TFRecordReader, the general Example: tarantella/tfrecord.hpp.
// The byte offsets of the records of one file. Scans the headers once and checks every
// length's CRC (the data CRC is checked when a record is read).
std::vector<uint64_t> index_tfrecord(const std::string& path);
// The record starting at `offset`, both CRCs checked. Errors name the file and offset.
std::vector<uint8_t> read_tfrecord(const std::string& path, uint64_t offset);
// Every record of shards, in file order, as a random-access source of ImageExamples
// turned into undecoded elements (see above).
Dataset tfrecord_dataset(const std::vector<std::string>& shards, const ImagenetOptions& options = {});

}  // namespace tnt
