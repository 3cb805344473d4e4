// ImageNet sources (image folders, TFRecord shards).
//
// Both sources are random access over a fixed sample list: a pass of epoch e yields
// sample perm_e[p] at position p (perm_e the identity without shuffle), and builds it only
// when asked for, so distribute() and skip() step over samples without reading them.
// The preprocessing map functions are in imagenet_preprocess.cpp.
#include "tarantella/imagenet.hpp"
#include "tarantella/files.hpp"

#include "data/dataset_node.hpp"
#include "tarantella/random.hpp"
#include "tarantella/log.hpp"

#include <algorithm>
#include <map>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

namespace tnt {
namespace {

namespace fs = std::filesystem;

// One undecoded sample before it becomes an element.
struct RawSample {
  Tensor bytes;        // u8 (n,)
  int64_t label = 0;
  std::string source;  // the file (and record offset) it came from, for error messages
};
using ReadFn = std::function<RawSample(int64_t index)>;

Tensor string_tensor(const std::string& s) {
  return Tensor::from_data(reinterpret_cast<const uint8_t*>(s.data()), {static_cast<int64_t>(s.size())});
}

Tensor scalar_i64(int64_t v) { return Tensor::from_data(&v, {}); }

class SampleIterator : public detail::ElementIterator {
 public:
  SampleIterator(std::shared_ptr<const std::vector<int64_t>> order, int64_t count, ReadFn read, int64_t epoch)
      : order_(std::move(order)), count_(count), read_(std::move(read)), epoch_(epoch) {}
  std::optional<Element> next() override {
    if (pos_ >= count_) return std::nullopt;
    int64_t index = order_ ? (*order_)[static_cast<size_t>(pos_)] : pos_;
    ++pos_;
    RawSample s = read_(index);
    return Element{std::move(s.bytes), scalar_i64(s.label), scalar_i64(index), scalar_i64(epoch_),
                   string_tensor(s.source)};
  }
  int64_t skip(int64_t n) override {
    int64_t k = std::max<int64_t>(0, std::min(n, count_ - pos_));
    pos_ += k;
    return k;
  }

 private:
  std::shared_ptr<const std::vector<int64_t>> order_;  // (count,) or null: identity
  int64_t count_;
  ReadFn read_;
  int64_t epoch_;
  int64_t pos_ = 0;
};

class SampleNode : public detail::DatasetNode {
 public:
  SampleNode(int64_t count, ReadFn read, bool shuffle, uint64_t seed)
      : count_(count), read_(std::move(read)), shuffle_(shuffle), seed_(seed) {}
  std::unique_ptr<detail::ElementIterator> iterate(int64_t epoch) const override {
    std::shared_ptr<std::vector<int64_t>> order;
    if (shuffle_) {
      // Fisher-Yates driven by (seed, epoch): every rank computes the same permutation.
      order = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(count_));
      for (int64_t i = 0; i < count_; ++i) (*order)[static_cast<size_t>(i)] = i;
      detail::SplitMix64 rng(detail::mix64(seed_ ^ 0x696d6167656e6574ull) + detail::mix64(static_cast<uint64_t>(epoch)));
      for (int64_t i = count_ - 1; i > 0; --i)
        std::swap((*order)[static_cast<size_t>(i)], (*order)[rng.below(static_cast<uint64_t>(i) + 1)]);
    }
    return std::make_unique<SampleIterator>(std::move(order), count_, read_, epoch);
  }
  int64_t cardinality() const override { return count_; }
  bool reshuffles() const override { return shuffle_; }

 private:
  int64_t count_;
  ReadFn read_;
  bool shuffle_;
  uint64_t seed_;
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool is_jpeg_name(const fs::path& p) {
  std::string ext = lower(p.extension().string());
  return ext == ".jpeg" || ext == ".jpg";
}

Tensor read_whole_file(const std::string& path) {
  std::ifstream in = open_regular_file(path, "image");
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size < 0) TNT_INPUT_ERROR("image '{}': cannot determine its size", path);
  Tensor bytes = Tensor::empty({static_cast<int64_t>(size)}, DType::u8);  // (n,)
  if (size > 0 && !in.read(reinterpret_cast<char*>(bytes.data<uint8_t>()), size))
    TNT_INPUT_ERROR("image '{}': read error", path);
  return bytes;
}

struct SplitNames {
  std::vector<std::string> folders;  // tried in order
  std::string shard_prefix;
};

SplitNames split_names(const std::string& split) {
  if (split == "train") return {{"train"}, "train"};
  if (split == "val" || split == "validation") return {{"val", "validation"}, "validation"};
  TNT_INPUT_ERROR("imagenet_dataset: split '{}' is not one of train, val, validation", split);
}

// The files of `dir` whose names match `pattern` (groups: shard number, shard count), all
// of them or none: they must agree on the count and leave no number out. `what` is the
// name pattern, for messages. Sorted.
std::vector<std::string> find_shards(const std::string& dir, const std::regex& pattern, const std::string& what) {
  std::vector<std::string> shards;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return shards;
  struct Shard {
    int64_t number, count;
    std::string name;
  };
  std::vector<Shard> found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, pattern) || !entry.is_regular_file(ec)) continue;
    if (m[1].length() > 9 || m[2].length() > 9)
      TNT_INPUT_ERROR("'{}': shard '{}' has a number too large to be a shard number", dir, name);
    found.push_back({std::stoll(m[1].str()), std::stoll(m[2].str()), name});
  }
  if (found.empty()) return shards;
  std::sort(found.begin(), found.end(), [](const Shard& a, const Shard& b) { return a.name < b.name; });
  const int64_t count = found[0].count;
  std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(count, 0)));
  for (const Shard& f : found) {
    if (f.count != count)
      TNT_INPUT_ERROR("'{}': the {} shards disagree on their count: '{}' says {}, '{}' says {}", dir, what,
                      found[0].name, count, f.name, f.count);
    if (f.number >= count)
      TNT_INPUT_ERROR("'{}': shard '{}' is numbered beyond its count {} (numbers run from 0)", dir, f.name, count);
    seen[static_cast<size_t>(f.number)] = true;
    shards.push_back((fs::path(dir) / f.name).string());
  }
  for (int64_t i = 0; i < count; ++i) {
    if (!seen[static_cast<size_t>(i)])
      TNT_INPUT_ERROR("'{}': {} shard {:05d} of {:05d} is missing ({} of {} present)", dir, what, i, count,
                      found.size(), count);
  }
  return shards;
}

std::regex model_garden_pattern(const std::string& prefix) { return std::regex(prefix + "-([0-9]+)-of-([0-9]+)"); }
// TFDS: <dataset>-<split>.tfrecord-NNNNN-of-MMMMM.
std::regex tfds_pattern(const std::string& split) {
  return std::regex("[^/]+-" + split + "\\.tfrecord-([0-9]+)-of-([0-9]+)");
}

// A TFDS version folder's name: numbers separated by dots (5.1.0). Numeric parts, or empty.
std::vector<int64_t> version_parts(const std::string& name) {
  static const std::regex pattern("[0-9]{1,9}(\\.[0-9]{1,9})*");
  std::vector<int64_t> parts;
  if (!std::regex_match(name, pattern)) return parts;
  size_t at = 0;
  while (at <= name.size()) {
    size_t dot = name.find('.', at);
    if (dot == std::string::npos) dot = name.size();
    parts.push_back(std::stoll(name.substr(at, dot - at)));
    at = dot + 1;
  }
  return parts;
}

// The highest version folder in `dir` ("" when none).
std::string latest_version(const std::string& dir) {
  std::error_code ec;
  std::string best;
  std::vector<int64_t> best_parts;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    std::vector<int64_t> parts = version_parts(name);
    if (parts.empty() || !entry.is_directory(ec)) continue;
    if (best.empty() || parts > best_parts) best = name, best_parts = parts;
  }
  return best;
}

bool has_version_folder(const std::string& dir) { return !latest_version(dir).empty(); }

// The tfds layout of data_dir (the --data_dir of download_and_prepare, the dataset folder
// or a version folder); kind empty when data_dir looks like none of them.
ImagenetLayout find_tfds(const std::string& data_dir, const std::string& split) {
  ImagenetLayout out;
  std::error_code ec;
  const std::regex pattern = tfds_pattern(split);
  std::string version_dir;
  bool holds_split_files = false;
  for (const auto& entry : fs::directory_iterator(data_dir, ec)) {
    std::string name = entry.path().filename().string();
    if (std::regex_match(name, pattern) || name == "dataset_info.json" || name == "features.json")
      holds_split_files = true;
  }
  if (holds_split_files) {
    version_dir = data_dir;
  } else {
    std::string dataset_dir;
    if (fs::is_directory(fs::path(data_dir) / "imagenet2012", ec))
      dataset_dir = (fs::path(data_dir) / "imagenet2012").string();
    else if (has_version_folder(data_dir))
      dataset_dir = data_dir;
    if (dataset_dir.empty()) return out;
    const std::string version = latest_version(dataset_dir);
    if (version.empty())
      TNT_INPUT_ERROR("tensorflow_datasets folder '{}' holds no version folder (expected one such as 5.1.0/ with "
                      "imagenet2012-{}.tfrecord-00000-of-NNNNN files)",
                      dataset_dir, split);
    version_dir = (fs::path(dataset_dir) / version).string();
  }
  out.kind = "tfds";
  out.split = split;
  out.dir = version_dir;
  out.version = fs::path(version_dir).filename().string();
  out.shards = find_shards(version_dir, pattern, fmt::format("<dataset>-{}.tfrecord", split));
  if (out.shards.empty())
    TNT_INPUT_ERROR("tensorflow_datasets version folder '{}' holds no {} files (expected "
                    "imagenet2012-{}.tfrecord-00000-of-NNNNN ...)",
                    version_dir, split, split);
  return out;
}

}  // namespace

std::vector<std::string> image_folder_classes(const std::string& split_dir) {
  std::error_code ec;
  if (!fs::is_directory(split_dir, ec))
    TNT_INPUT_ERROR("image folder '{}': no such directory", split_dir);
  std::vector<std::string> classes;
  // Hidden entries (.ipynb_checkpoints, a file manager's or macOS's ._ files) are no class:
  // they are left out (before: a class of no images, an error).
  for (const auto& entry : fs::directory_iterator(split_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory(ec) && name.rfind('.', 0) != 0) classes.push_back(name);
  }
  if (ec) TNT_INPUT_ERROR("image folder '{}': cannot list: {}", split_dir, ec.message());
  if (classes.empty())
    TNT_INPUT_ERROR("image folder '{}': no class folders (expected <wnid>/*.JPEG)", split_dir);
  std::sort(classes.begin(), classes.end());
  return classes;
}

ImageFolderListing list_image_folder(const std::string& split_dir) {
  std::error_code ec;
  ImageFolderListing out;
  out.classes = image_folder_classes(split_dir);
  // What is left out, said once: torchvision's ImageFolder reads images in folders below a
  // class folder, and a broken link or a FIFO named .JPEG fails there; here neither is read.
  std::vector<std::string> folders, not_files;
  for (size_t c = 0; c < out.classes.size(); ++c) {
    fs::path dir = fs::path(split_dir) / out.classes[c];
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string shown = out.classes[c] + "/" + entry.path().filename().string();
      // Hidden files (macOS's ._x.jpg beside x.jpg: no JPEG) and folders are left out.
      if (entry.path().filename().string().rfind('.', 0) == 0) continue;
      if (entry.is_directory(ec)) {
        folders.push_back(shown + "/");
      } else if (is_jpeg_name(entry.path())) {
        if (entry.is_regular_file(ec)) files.push_back(entry.path().string());
        else not_files.push_back(shown);
      }
    }
    if (ec) TNT_INPUT_ERROR("image folder '{}': cannot list: {}", dir.string(), ec.message());
    if (files.empty())
      TNT_INPUT_ERROR("image folder '{}': class folder holds no .JPEG/.jpg images", dir.string());
    std::sort(files.begin(), files.end());
    for (auto& f : files) {
      out.files.push_back(std::move(f));
      out.labels.push_back(static_cast<int64_t>(c));
    }
  }
  auto some = [](const std::vector<std::string>& v) {
    std::string s = v.front();
    for (size_t i = 1; i < v.size() && i < 3; ++i) s += ", " + v[i];
    return v.size() > 3 ? s + fmt::format(" and {} more", v.size() - 3) : s;
  };
  if (!folders.empty()) {
    log_warning("image folder '{}': {} folder(s) inside class folders not read ({}): images go directly in their "
                "class folder",
                split_dir, folders.size(), some(folders));
  }
  if (!not_files.empty()) {
    log_warning("image folder '{}': {} image name(s) that are no readable file left out ({}: a broken link, a FIFO "
                "or the like)",
                split_dir, not_files.size(), some(not_files));
  }
  return out;
}

Dataset image_folder_dataset(const std::string& split_dir, const ImagenetOptions& options) {
  ImageFolderListing own = list_image_folder(split_dir);
  if (!options.class_names.empty()) {
    // Labels by name: a validation split that lacks some of the training classes must not
    // shift the labels of the classes after them.
    std::map<std::string, int64_t> index;
    for (size_t c = 0; c < options.class_names.size(); ++c) index.emplace(options.class_names[c], c);
    std::vector<std::string> unknown;
    std::vector<int64_t> label_of(own.classes.size(), -1);
    for (size_t c = 0; c < own.classes.size(); ++c) {
      if (auto it = index.find(own.classes[c]); it != index.end()) {
        label_of[c] = it->second;
      } else {
        unknown.push_back("'" + own.classes[c] + "'");
      }
    }
    if (!unknown.empty()) {
      const size_t shown = std::min<size_t>(unknown.size(), 5);
      TNT_INPUT_ERROR("image folder '{}': {} class folder{} not among the training split's {} classes: {}{} (each "
                      "class of this split must have its folder, of the same name, in the training split)",
                      split_dir, unknown.size(), unknown.size() == 1 ? " is" : "s are", options.class_names.size(),
                      fmt::join(unknown.begin(), unknown.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
                      unknown.size() > shown ? fmt::format(" and {} more", unknown.size() - shown) : std::string());
    }
    for (int64_t& label : own.labels) label = label_of[static_cast<size_t>(label)];
    own.classes = options.class_names;
  }
  auto listing = std::make_shared<const ImageFolderListing>(std::move(own));
  const auto folders = static_cast<int64_t>(listing->classes.size());
  if (options.num_classes > 0 && folders > options.num_classes) {
    const std::string& first = listing->classes[static_cast<size_t>(options.num_classes)];
    TNT_INPUT_ERROR("image folder '{}': {} class folders, more than the model's {} classes (folder '{}' would be "
                    "label {}, outside [0, {}))",
                    split_dir, folders, options.num_classes, first, options.num_classes, options.num_classes);
  }
  ReadFn read = [listing](int64_t i) {
    const std::string& path = listing->files[static_cast<size_t>(i)];
    return RawSample{read_whole_file(path), listing->labels[static_cast<size_t>(i)], path};
  };
  return Dataset(std::make_shared<SampleNode>(static_cast<int64_t>(listing->files.size()), std::move(read),
                                              options.shuffle, options.seed));
}

Dataset tfrecord_dataset(const std::vector<std::string>& shards, const ImagenetOptions& options) {
  if (shards.empty()) TNT_INPUT_ERROR("tfrecord_dataset: no shard files given");
  struct Index {
    std::vector<std::string> shards;
    std::vector<int64_t> first;     // (shards + 1,): index of each shard's first record
    std::vector<uint64_t> offsets;  // (records,)
  };
  auto index = std::make_shared<Index>();
  index->shards = shards;
  index->first.push_back(0);
  for (const auto& shard : shards) {
    std::vector<uint64_t> offs = index_tfrecord(shard);
    index->offsets.insert(index->offsets.end(), offs.begin(), offs.end());
    index->first.push_back(static_cast<int64_t>(index->offsets.size()));
  }
  if (index->offsets.empty())
    TNT_INPUT_ERROR("tfrecord_dataset: the {} shards from '{}' hold no records", shards.size(), shards[0]);
  const bool one_based = options.one_based_labels;
  const int64_t classes = options.num_classes;
  const std::string image_feature = options.image_feature, label_feature = options.label_feature;
  std::shared_ptr<const Index> idx = index;
  ReadFn read = [idx, one_based, classes, image_feature, label_feature](int64_t i) {
    size_t s = static_cast<size_t>(std::upper_bound(idx->first.begin(), idx->first.end(), i) - idx->first.begin() - 1);
    const std::string& path = idx->shards[s];
    uint64_t offset = idx->offsets[static_cast<size_t>(i)];
    std::string where = fmt::format("'{}' at byte offset {}", path, offset);
    std::vector<uint8_t> record = read_tfrecord(path, offset);
    ImageExample ex = parse_example(record.data(), record.size(), where, image_feature, label_feature);
    int64_t label = one_based ? ex.label - 1 : ex.label;
    if (label < 0)
      TNT_INPUT_ERROR("TFRecord {}: label {} is {}", where, ex.label,
                      one_based ? "below 1, but this layout's labels are 1-based (1 to the number of classes)" : "negative");
    if (classes > 0 && label >= classes) {
      TNT_INPUT_ERROR("TFRecord {} (record {} of the shard): label {} is outside the model's {} classes ({})", where,
                      i - idx->first[s], ex.label, classes,
                      one_based ? fmt::format("1 to {}, 1-based", classes) : fmt::format("0 to {}", classes - 1));
    }
    Tensor bytes = Tensor::from_data(ex.encoded.data(), {static_cast<int64_t>(ex.encoded.size())});  // (n,)
    // The decoder quotes the name itself ("image '...': cannot decode JPEG").
    return RawSample{std::move(bytes), label, fmt::format("{}, record at byte offset {}", path, offset)};
  };
  return Dataset(std::make_shared<SampleNode>(static_cast<int64_t>(index->offsets.size()), std::move(read),
                                              options.shuffle, options.seed));
}

std::string ImagenetLayout::describe() const {
  if (kind == "folders") return fmt::format("{} data: JPEG class folders in '{}'", split, dir);
  const std::string shard_count = fmt::format("{} shard{}", shards.size(), shards.size() == 1 ? "" : "s");
  if (kind == "tfds")
    return fmt::format("{} data: tensorflow_datasets version {} in '{}' ({}; features image, label 0-based)", split,
                       version, dir, shard_count);
  return fmt::format("{} data: TF Model Garden TFRecord shards in '{}' ({}; features image/encoded, "
                     "image/class/label 1-based)",
                     split, dir, shard_count);
}

ImagenetLayout find_imagenet_layout(const std::string& data_dir, const std::string& split, const std::string& layout) {
  const SplitNames names = split_names(split);
  if (layout != "auto" && layout != "folders" && layout != "tfrecord" && layout != "tfds")
    TNT_INPUT_ERROR("imagenet_dataset: layout '{}' is not one of auto, folders, tfrecord, tfds", layout);
  std::error_code ec;
  if (!fs::is_directory(data_dir, ec))
    TNT_INPUT_ERROR("imagenet_dataset: data directory '{}' does not exist", data_dir);
  ImagenetLayout out;
  if (layout == "auto" || layout == "folders") {
    for (const auto& folder : names.folders) {
      fs::path dir = fs::path(data_dir) / folder;
      if (fs::is_directory(dir, ec)) return {"folders", folder, dir.string(), {}, ""};
    }
  }
  if (layout == "auto" || layout == "tfrecord") {
    std::vector<std::string> shards = find_shards(
        data_dir, model_garden_pattern(names.shard_prefix), fmt::format("{}-NNNNN-of-MMMMM", names.shard_prefix));
    if (!shards.empty()) return {"tfrecord", names.shard_prefix, data_dir, std::move(shards), ""};
  }
  if (layout == "auto" || layout == "tfds") {
    out = find_tfds(data_dir, names.shard_prefix);
    if (!out.kind.empty()) return out;
  }
  TNT_INPUT_ERROR(
      "imagenet_dataset: '{}' holds no {} data: expected the folder '{}/{}/<wnid>/*.JPEG', TFRecord shards "
      "'{}/{}-00000-of-NNNNN', or tensorflow_datasets' '{}/imagenet2012/<version>/imagenet2012-{}.tfrecord-00000-of-"
      "NNNNN'",
      data_dir, split, data_dir, names.folders[0], data_dir, names.shard_prefix, data_dir, names.shard_prefix);
}

Dataset imagenet_dataset(const ImagenetLayout& layout, const ImagenetOptions& options) {
  if (layout.kind == "folders") return image_folder_dataset(layout.dir, options);
  ImagenetOptions opts = options;
  if (layout.kind == "tfds") {
    opts.image_feature = "image";
    opts.label_feature = "label";
    opts.one_based_labels = false;
  }
  return tfrecord_dataset(layout.shards, opts);
}

Dataset imagenet_dataset(const std::string& data_dir, const std::string& split, const ImagenetOptions& options) {
  return imagenet_dataset(find_imagenet_layout(data_dir, split, options.layout), options);
}

}  // namespace tnt
