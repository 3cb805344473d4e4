// Datasets: lazy, value-type pipelines of elements, and their distribution across ranks.
//
// An element is a std::vector<Tensor> of columns (e.g. {image (C, H, W), label ()}) on the
// host; for Model a last column after the target may hold the sample's loss weight, f32 ()
// (see Batch::sample_weights). A Dataset is an immutable description (copying it is cheap:
// the stages are shared); iterate(epoch) starts a fresh pass. Every random choice depends
// only on (seed, epoch), so a pass is reproducible: the same dataset built the same way
// gives the same elements in the same order on every rank and in every run.
//
// Elements may share storage with the source (from_tensors hands out row views), so a map
// function must return new tensors rather than write into its input. Source and map
// functions may run on other threads than the caller's (map workers, prefetch); a source
// is never called concurrently, a map function with workers > 1 is.
//
// Distribution (distribute(), below): the user gives the GLOBAL batch size B. Every rank
// walks the same unbatched stream, cuts it into global batches of B consecutive elements
// and keeps only its own contiguous slice of each: rank r keeps B/p + (r < B%p ? 1 : 0)
// elements starting at r*(B/p) + min(r, B%p). It steps over the other ranks' elements
// without mapping them, so the expensive per-sample work (decoding, augmentation) belongs
// AFTER distribute: DistributedDataset::map runs only on this rank's samples. (A
// Dataset::map with k workers before distribute also maps what its workers read ahead, up
// to 2k samples of other ranks per global batch; a prefetch before it reads everything.)
//
//   auto data = tnt::Dataset::from_tensors({images, labels})   // (N, 1, 28, 28), (N,)
//                   .shuffle(60000, seed)
//                   .distribute(global_batch, tnt::Remainder::pad)
//                   .map(augment, 4)                              // this rank's samples only
//                   .prefetch(2);
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     auto it = data.iterate(epoch);
//     while (auto batch = it.next()) { ... batch->columns, batch->real_samples ... }
//   }
#pragma once

#include "tarantella/tensor.hpp"
#include "tarantella/tfrecord.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tnt {

using Element = std::vector<Tensor>;  // one sample (or one batch): its columns
using MapFn = std::function<Element(Element)>;
using ElementFn = std::function<std::optional<Element>()>;  // nullopt ends the pass

namespace detail {
class DatasetNode;
class ElementIterator;
}  // namespace detail

// One column of a synthetic dataset. Floating types: uniform in [low, high); integer types:
// uniform integers in [low, high) (e.g. labels: i64, low 0, high 1000).
struct SyntheticColumn {
  Shape shape;  // one element's shape, e.g. {3, 224, 224}; {} for a scalar label
  DType dtype = DType::f32;
  double low = 0.0;
  double high = 1.0;
};

enum class Remainder {
  drop,  // a last partial global batch is dropped
  pad,   // ... is padded with zero-weight samples so every rank runs the same steps
};

class DistributedDataset;

class Dataset {
 public:
  class Iterator {
   public:
    explicit Iterator(std::unique_ptr<detail::ElementIterator> impl);
    Iterator(Iterator&&) noexcept;
    Iterator& operator=(Iterator&&) noexcept;
    ~Iterator();  // stops and joins background threads (map workers, prefetch)
    // The next element, or nullopt at the end of the pass. An exception thrown by a source
    // or a map function (also on a worker or prefetch thread) is rethrown here, in order.
    std::optional<Element> next();

   private:
    std::unique_ptr<detail::ElementIterator> impl_;
  };

  Dataset();  // an empty dataset

  // ---- sources
  // Columns with a common leading dimension N; element i is row i of every column (a view).
  static Dataset from_tensors(std::vector<Tensor> columns);
  // count elements; element i depends only on (seed, i), so any order or subset is cheap.
  static Dataset synthetic(std::vector<SyntheticColumn> columns, int64_t count, uint64_t seed = 0);
  // A streaming source: make(epoch) is called at the start of each pass and returns the
  // function that yields that pass's elements. cardinality: elements per pass, -1 unknown.
  static Dataset generator(std::function<ElementFn(int64_t epoch)> make, int64_t cardinality = -1);
  // A random-access source of count elements: get(i) builds element i on demand, and the
  // elements that distribute() or skip() step over are never built.
  static Dataset from_function(int64_t count, std::function<Element(int64_t index)> get);
  // A CSV file (RFC 4180: fields separated by `delimiter`, optionally in double quotes, which
  // may hold delimiters and line breaks, "" for a quote; LF or CRLF line ends), read and
  // checked whole when called, so a bad file fails here, on every rank that reads it.
  // Blank lines (empty or only spaces, tabs, CR) and lines starting with `comment` (at the
  // start of a record, '\0': none) are skipped. Element: {features (F,) f32} and, with label
  // columns, the label: () for one column, (L,) for several, in label_dtype (i32: integers
  // as written, 3 or 3.0; f32). Columns are chosen by header name or 0-based index; features
  // empty = every column not a label. Unselected columns are not read (they may hold text).
  // Numbers may carry surrounding spaces; an empty, non-numeric or non-finite field, a row
  // with another field count than the first, an unknown column, a file without data rows,
  // an i32 label that is fractional or out of range: an InputError naming the file, the
  // line and the column.
  struct CsvColumn {
    CsvColumn(std::string column_name) : name(std::move(column_name)) {}
    CsvColumn(const char* column_name) : name(column_name) {}
    CsvColumn(int column_index) : index(column_index) {}
    std::string name;    // by header name, or
    int64_t index = -1;  // by position (0-based)
  };
  struct CsvOptions {
    bool header = true;  // the first record names the columns
    std::vector<CsvColumn> features;
    std::vector<CsvColumn> labels;
    DType label_dtype = DType::i32;  // or f32
    char delimiter = ',';
    char comment = '#';
  };
  // TFRecord files read in order, one element {record u8 (n,)} per record (tf.data's
  // TFRecordDataset(files, compression_type)). Errors name the file, the record and its
  // offset. skip() steps over records without keeping them (uncompressed files: seeking past
  // the data). See tarantella/tfrecord.hpp for GZIP and its detection.
  static Dataset from_tfrecord(std::vector<std::string> files,
                               TFRecordCompression compression = TFRecordCompression::detect);
  // One element {u8 (n,)} per string, e.g. the file names that interleave() opens;
  // element_string() reads such a column back.
  static Dataset from_strings(std::vector<std::string> strings);
  static Dataset from_csv(const std::string& path);  // header, every column a feature
  static Dataset from_csv(const std::string& path, const CsvOptions& options);

  // ---- transformations (each returns a new Dataset; this one is unchanged)
  // Buffered shuffle: keeps buffer_size elements and emits a random one of them (uniform
  // over the whole dataset when buffer_size >= cardinality). The order depends on
  // (seed, epoch): each epoch differs, and a given epoch is the same in every run.
  Dataset shuffle(int64_t buffer_size, uint64_t seed) const;
  // fn on every element, on `workers` threads (1: inline), output in input order.
  Dataset map(MapFn fn, int workers = 1) const;
  // Stacks batch_size consecutive elements: each column (S...) becomes (b, S...). The last
  // batch has fewer rows unless drop_remainder.
  Dataset batch(int64_t batch_size, bool drop_remainder = false) const;
  // tf.data's interleave(map_func, cycle_length, block_length, num_parallel_calls,
  // deterministic): fn turns each element of this dataset (say a file name) into a dataset
  // (say its records); cycle_length of those are open at a time, and the output takes
  // block_length elements from each in turn. A finished one's slot gets the next element's
  // dataset when the cycle comes back to it (the order tf.data gives). Every opened dataset
  // is iterated with this pass's epoch.
  //   auto records = tnt::Dataset::from_strings(files)
  //                      .interleave([](const tnt::Element& f) {
  //                        return tnt::Dataset::from_tfrecord({tnt::element_string(f[0])});
  //                      }, {.cycle_length = 4, .block_length = 16, .num_parallel_calls = 4});
  // num_parallel_calls > 1: that many threads read ahead, up to block_length elements from
  // each open dataset and from the next cycle_length datasets to be opened (opened early, in
  // order, on the caller's thread); the output order is still exactly the sequential one,
  // in every run. deterministic = false lets next() take from another open dataset while
  // the one whose turn it is has nothing ready (tf.data's deterministic=False): the same
  // elements, in an order that depends on timing.
  // With deterministic = false and read-ahead threads, distribute() over several ranks is
  // refused (each rank would read another order, and their slices overlap).
  // Composes with distribute() like any stage: every rank walks the same interleaved stream
  // and steps over other ranks' elements (read inline, with the opened datasets' skip(),
  // which for from_tfrecord keeps no record; with read-ahead threads, read and dropped), and
  // the order depends only on the input and the epoch, so a run resumed at an epoch sees
  // the same order. To read only a share of the FILES on each rank instead, shard() the file list
  // before interleave (tf.data's FILE auto-sharding); the batches then differ with the rank
  // count. Cardinality: unknown (it is the opened datasets' sum).
  struct InterleaveOptions {
    int64_t cycle_length = 1;
    int64_t block_length = 1;
    int num_parallel_calls = 1;  // 1: read inline, on the caller's thread
    bool deterministic = true;
  };
  Dataset interleave(std::function<Dataset(const Element&)> fn, InterleaveOptions options) const;
  // Elements index, index + num_shards, index + 2*num_shards, ...
  Dataset shard(int64_t num_shards, int64_t index) const;
  // count passes over this dataset (-1: forever). Pass k of epoch e iterates this dataset
  // with epoch e*count + k (e*2^32 + k when forever), so a shuffle before repeat() gives a
  // new order in every pass.
  Dataset repeat(int64_t count = -1) const;
  // A background thread keeps up to buffer_size elements ready.
  Dataset prefetch(int64_t buffer_size = 2) const;
  // count -1: all (take), all (skip), as in tf.data.
  Dataset take(int64_t count) const;
  Dataset skip(int64_t count) const;

  // This rank's share of every global batch (see the file comment); uses tnt::rank() and
  // tnt::size(). Apply to an UNBATCHED dataset.
  DistributedDataset distribute(int64_t global_batch, Remainder remainder = Remainder::drop) const;
  DistributedDataset distribute(int64_t global_batch, int rank, int size,
                                Remainder remainder = Remainder::drop) const;

  // Elements per pass; -1 when unknown or infinite.
  int64_t cardinality() const;
  // Whether the order of elements changes from epoch to epoch (shuffle() in the pipeline, or
  // a source that shuffles itself, such as ImageNet's sample list).
  bool reshuffles_each_epoch() const;
  Iterator iterate(int64_t epoch = 0) const;

  // Internal: datasets are built from stages defined in runtime/src/data.
  explicit Dataset(std::shared_ptr<const detail::DatasetNode> node);
  const std::shared_ptr<const detail::DatasetNode>& node() const { return node_; }

 private:
  std::shared_ptr<const detail::DatasetNode> node_;
};

// The bytes of a u8 (n,) tensor (an element of from_strings()) as a string.
std::string element_string(const Tensor& bytes);

// Rank r's part of a global batch of B: B/p + (r < B%p ? 1 : 0) samples, starting at
// r*(B/p) + min(r, B%p). Throws InputError when B < p (some rank would get no sample).
int64_t micro_batch_size(int64_t global_batch, int rank, int size);
int64_t micro_batch_offset(int64_t global_batch, int rank, int size);

// One step's input on this rank.
// Padding always goes last, so "which rows are real" has one encoding: rows [0, real_samples)
// are real samples, the rest (up to micro_batch_size) are padding that must not count.
struct Batch {
  std::vector<Tensor> columns;      // each (b, ...): this rank's slice of the global batch
  int64_t micro_batch_size = 0;     // b, the same in every step of this rank
  int64_t real_samples = 0;         // the first real_samples rows are real, the rest padding
  int64_t global_real_samples = 0;  // real samples in the whole global batch: the loss is
                                    // sum(loss of real rows) / global_real_samples on every rank
  int64_t global_batch_size = 0;    // B, as the user gave it
  int64_t step = 0;                 // index of the global batch in this pass
  int64_t sample_offset = 0;        // index of this rank's first sample in the global batch
  // Per-sample loss weights (b,) f32 on the host, undefined: all 1. The datasets leave it
  // undefined: a sample weight is one more column of an element, {inputs..., target,
  // sample_weight} (Keras' (x, y, sample_weight)), so it stays with its sample through
  // shuffle, distribute and map, and a padding row copies a real row's weight but is still
  // not real. Model moves that column here (times FitOptions::class_weight, model.hpp).
  Tensor sample_weights;
};

// A rank's view of a dataset cut into global batches. Every rank must build it from the
// same dataset with the same seed (so all ranks walk the same sequence of elements).
//
// Padding (Remainder::pad): the slots of a last, partial global batch keep the layout of a
// full batch: the first n slots are the n real samples, the rest are padding, so every
// rank keeps its usual micro-batch size b (and the same tensor shapes in every step). A
// padding slot holds a copy of one of this rank's real samples (of this batch, else of an
// earlier one; if the very first global batch is already partial, of the batch's first
// sample, which is why a rank other than 0 keeps that one element of the first batch). It
// passes through map() like a real sample and has weight 0. global_real_samples = n.
// With Remainder::drop a partial last batch is skipped on every rank.
class DistributedDataset {
 public:
  class Iterator {
   public:
    Iterator(Dataset::Iterator inner, int64_t global_batch, int64_t micro_batch, int64_t sample_offset,
             int64_t first_step = 0);
    std::optional<Batch> next();

   private:
    Dataset::Iterator inner_;
    int64_t global_batch_;
    int64_t micro_batch_;
    int64_t sample_offset_;
    int64_t step_ = 0;
  };

  // unbatched: a dataset of single samples (distribute() above is the usual way in).
  DistributedDataset(const Dataset& unbatched, int64_t global_batch, int rank, int size,
                     Remainder remainder = Remainder::drop);
  // For a dataset that already yields global batches (every column (B, ...); only the last
  // may have fewer rows: a short batch before it is an InputError): each rank slices its rows. map() is not available on the result;
  // map before batching.
  static DistributedDataset from_batched(const Dataset& batched, int64_t global_batch, int rank,
                                         int size, Remainder remainder = Remainder::drop);

  // fn on each of this rank's samples (never on other ranks' samples), `workers` threads.
  DistributedDataset map(MapFn fn, int workers = 1) const;
  // A background thread keeps up to buffer_size micro-batches ready.
  DistributedDataset prefetch(int64_t buffer_size = 2) const;

  int64_t steps() const;  // global batches per pass (the same on every rank); -1 unknown
  int64_t micro_batch_size() const { return micro_batch_; }
  int64_t micro_batch_offset() const { return offset_; }
  int64_t global_batch_size() const { return global_batch_; }
  // first_step: the pass starts at that global batch (a run resumed inside an epoch). The
  // batches before it are skipped without building their samples where the source is
  // random-access (from_function, synthetic, the file sources' skip()); map() never sees them.
  Iterator iterate(int64_t epoch = 0, int64_t first_step = 0) const;

 private:
  DistributedDataset() = default;
  Dataset samples_;  // this rank's samples + {weight f32 (), global count i64 ()}; unbatched
  Dataset batched_;  // from_batched: micro-batches + {weights (b,), global count (b,)}
  bool from_batched_ = false;
  int64_t prefetch_ = 0;
  int64_t global_batch_ = 0;
  int64_t micro_batch_ = 0;
  int64_t offset_ = 0;
  int64_t steps_ = -1;
};

}  // namespace tnt
