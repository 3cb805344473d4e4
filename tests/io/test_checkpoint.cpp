// safetensors checkpoints: round trips, the exact bytes of the format, a reader and a
// writer in plain Python (struct + json, as the format is specified), every kind of broken
// file, checked loading, and writers that die or fail half-way.
#include "temp_dir.hpp"
#include <catch2/catch.hpp>

#include "tarantella/checkpoint.hpp"

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace tnt;
namespace fs = std::filesystem;

namespace {

using tnt::test::Bytes;
using tnt::test::read_bytes;
using tnt::test::write_bytes;

using TempDir = tnt::test::TempDir;

// A file from a header text and a data buffer, the header length field included.
Bytes make_file(const std::string& header, const Bytes& data) {
  Bytes out;
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

Tensor arange(const Shape& shape, DType dtype, double start = 0) {
  Tensor f32 = Tensor::empty(shape, DType::f32);
  for (int64_t i = 0; i < f32.numel(); ++i) f32.data<float>()[i] = static_cast<float>(start + i);
  if (dtype == DType::f32) return f32;
  Tensor t = Tensor::empty(shape, dtype);
  // Integer-valued and small, so exact in every dtype (bf16 holds integers up to 256).
  for (int64_t i = 0; i < t.numel(); ++i) {
    Tensor one = Tensor::full({}, start + i, dtype);
    std::memcpy(static_cast<char*>(t.raw()) + i * dtype_size(dtype), one.raw(), dtype_size(dtype));
  }
  return t;
}

int run_python(const std::string& script_text, const std::string& args, const TempDir& dir) {
  std::string script = dir.file("check.py");
  std::ofstream(script) << script_text;
  std::string cmd = "python3 '" + script + "' " + args;
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace

TEST_CASE("safetensors round trip of every dtype, with metadata and order kept", "[checkpoint]") {
  TempDir dir("tnt-ckpt");
  NamedTensors tensors = {
      {"layer2.weight", arange({3, 2, 2, 2}, DType::f32, -5)},
      {"layer1.bias", arange({4}, DType::f64, 1)},
      {"h", arange({2, 3}, DType::f16, -3)},
      {"b", arange({5}, DType::bf16, 100)},
      {"i", arange({2, 2}, DType::i32, -2)},
      {"step_count", arange({}, DType::i64, 12345)},
      {"mask", arange({7}, DType::u8, 250 - 6)},
      {"empty", Tensor::zeros({0, 3})},
  };
  Metadata meta = {{"epoch", "3"}, {"step", "1200"}, {"generator", "{\"state\": [1, 2]}"}};
  std::string path = dir.file("model.safetensors");
  write_safetensors(path, tensors, meta);
  CHECK(dir.names() == std::vector<std::string>{"model.safetensors"});
  SafetensorsFile f = read_safetensors(path);
  CHECK(f.metadata == meta);
  REQUIRE(f.tensors.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    CAPTURE(tensors[i].first);
    CHECK(f.tensors[i].first == tensors[i].first);
    CHECK(f.tensors[i].second.dtype() == tensors[i].second.dtype());
    CHECK(f.tensors[i].second.shape() == tensors[i].second.shape());
    CHECK(f.tensors[i].second.to_double_vector() == tensors[i].second.to_double_vector());
  }
  // Header length is a multiple of 8, so the buffer is aligned.
  Bytes b = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | b[i];
  CHECK(n % 8 == 0);
  CHECK_THROWS_AS(write_safetensors(dir.file("dup"), {{"a", Tensor::zeros({1})}, {"a", Tensor::zeros({1})}}), InputError);
  CHECK_THROWS_AS(write_safetensors(dir.file("no-such-dir/x.safetensors"), tensors), InputError);
}

TEST_CASE("safetensors bytes are exactly as the format says", "[checkpoint]") {
  TempDir dir("tnt-ckpt");
  std::string path = dir.file("tiny.safetensors");
  write_safetensors(path, {{"a", Tensor::from_vector({1.0f, 2.0f}, {2})}, {"b", arange({}, DType::i64, 7)}},
                    {{"format", "pt"}});
  std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"I64","shape":[],"data_offsets":[8,16]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  Bytes data = {0, 0, 0x80, 0x3f, 0, 0, 0, 0x40,  // 1.0f, 2.0f little-endian
                7, 0, 0, 0, 0, 0, 0, 0};           // 7 as i64
  CHECK(read_bytes(path) == make_file(header, data));
}

TEST_CASE("a Python reader (struct + json) understands our files, and we read its files", "[checkpoint][python]") {
  TempDir dir("tnt-ckpt");
  std::string ours = dir.file("ours.safetensors");
  Checkpoint c;
  c.add("conv1.weight", arange({2, 1, 3, 3}, DType::f32, -9));
  c.add("conv1.bias", arange({2}, DType::f32, 0.5));
  c.add("fc.weight", arange({3, 4}, DType::bf16, -6));
  c.add("fc.bias", arange({3}, DType::f16, 2));
  c.add("bn.num_batches_tracked", arange({}, DType::i64, 42));
  c.set_metadata_int("epoch", 7);
  c.write(ours);

  const char* script = R"PY(
import json, struct, sys
path, out = sys.argv[1], sys.argv[2]
raw = open(path, 'rb').read()
(n,) = struct.unpack('<Q', raw[:8])
assert n % 8 == 0, 'header length not a multiple of 8'
header = json.loads(raw[8:8 + n])
buf = raw[8 + n:]
meta = header.pop('__metadata__')
assert meta == {'epoch': '7', 'format': 'pt'}, meta
fmt = {'F32': ('f', 4), 'F16': ('e', 2), 'I64': ('q', 8)}
def values(e):
    b, end = e['data_offsets']
    chunk = buf[b:end]
    if e['dtype'] == 'BF16':
        return [struct.unpack('<f', b'\x00\x00' + chunk[i:i + 2])[0] for i in range(0, len(chunk), 2)]
    c, size = fmt[e['dtype']]
    return list(struct.unpack('<%d%s' % (len(chunk) // size, c), chunk))
def numel(shape):
    k = 1
    for d in shape: k *= d
    return k
want = {
  'conv1.weight': ('F32', [2, 1, 3, 3], [float(v) for v in range(-9, 9)]),
  'conv1.bias': ('F32', [2], [0.5, 1.5]),
  'fc.weight': ('BF16', [3, 4], [float(v) for v in range(-6, 6)]),
  'fc.bias': ('F16', [3], [2.0, 3.0, 4.0]),
  'bn.num_batches_tracked': ('I64', [], [42]),
}
assert list(header) == list(want), list(header)
end = 0
for name, (dtype, shape, vals) in want.items():
    e = header[name]
    assert e['dtype'] == dtype and e['shape'] == shape, (name, e)
    assert e['data_offsets'][0] == end, ('not packed', name)
    end = e['data_offsets'][1]
    assert values(e) == vals, (name, values(e))
assert end == len(buf), 'trailing bytes'
# And a file written the way the reference library lays it out: keys sorted in the
# header, data in another order, no metadata.
t = {'zeta': ('F32', [2], struct.pack('<2f', 1.25, -3.0)), 'alpha': ('I32', [3], struct.pack('<3i', 7, -8, 9))}
h, data, off = {}, b'', 0
for name in ['zeta', 'alpha']:
    dtype, shape, blob = t[name]
    h[name] = {'dtype': dtype, 'shape': shape, 'data_offsets': [off, off + len(blob)]}
    off += len(blob); data += blob
text = json.dumps(dict(sorted(h.items()))).encode()
text += b' ' * ((8 - len(text) % 8) % 8)
open(out, 'wb').write(struct.pack('<Q', len(text)) + text + data)
)PY";
  std::string theirs = dir.file("theirs.safetensors");
  REQUIRE(run_python(script, "'" + ours + "' '" + theirs + "'", dir) == 0);
  SafetensorsFile f = read_safetensors(theirs);
  REQUIRE(f.tensors.size() == 2);
  CHECK(f.tensors[0].first == "zeta");  // in data order
  CHECK(f.tensors[0].second.to_vector() == std::vector<float>{1.25f, -3.0f});
  CHECK(f.tensors[1].first == "alpha");
  CHECK(f.tensors[1].second.dtype() == DType::i32);
  CHECK(f.tensors[1].second.to_double_vector() == std::vector<double>{7, -8, 9});
  CHECK(f.metadata.empty());
}

TEST_CASE("read_safetensors rejects broken files and names them", "[checkpoint]") {
  TempDir dir("tnt-ckpt");
  auto expect_error = [&](const std::string& name, const Bytes& bytes, const std::string& what) {
    std::string path = dir.file(name);
    write_bytes(path, bytes);
    CAPTURE(name);
    CHECK_THROWS_AS(read_safetensors(path), InputError);
    CHECK_THROWS_WITH(read_safetensors(path), Catch::Contains(path) && Catch::Contains(what));
  };
  Bytes eight(8, 0);
  auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape, uint64_t b, uint64_t e) {
    return fmt::format(R"("{}":{{"dtype":"{}","shape":{},"data_offsets":[{},{}]}})", name, dtype, shape, b, e);
  };
  auto object = [](std::initializer_list<std::string> entries) { return fmt::format("{{{}}}", fmt::join(entries, ",")); };
  expect_error("short", Bytes{1, 2, 3}, "too short");
  Bytes huge = {0xff, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
  expect_error("long-header", huge, "exceeds");
  expect_error("json", make_file("{\"a\": [1, ", {}), "not valid JSON");
  expect_error("array", make_file("[1, 2]", {}), "not a JSON object");
  expect_error("dtype", make_file(object({entry("w", "F8_E4M3", "[2]", 0, 2)}), Bytes(2)), "unsupported dtype 'F8_E4M3'");
  expect_error("bounds", make_file(object({entry("w", "F32", "[2]", 0, 8)}), Bytes(4)),
               "data_offsets [0, 8] end past the 4 bytes of data after the header: the file is cut short by at least "
               "4 bytes");
  expect_error("backwards", make_file(object({entry("w", "F32", "[0]", 8, 4)}), Bytes(8)), "end before they begin");
  expect_error("size", make_file(object({entry("w", "F32", "[3]", 0, 8)}), Bytes(8)), "needs 12");
  expect_error("reversed", make_file(object({entry("w", "U8", "[0]", 4, 0)}), Bytes(8)), "'w'");
  expect_error("overlap",
               make_file(object({entry("a", "F32", "[2]", 0, 8), entry("b", "F32", "[2]", 4, 12)}), Bytes(12)),
               "overlap");
  expect_error("negative", make_file(object({entry("w", "F32", "[-1]", 0, 0)}), {}), "non-negative");
  expect_error("meta", make_file(R"({"__metadata__":{"epoch":3}})", {}), "metadata value of 'epoch'");
  // Found by fuzzing (scripts/fuzz): a number JSON cannot hold in a double is not a parse
  // error but an out_of_range; a dimension over 2^63 beside a zero one.
  expect_error("big-number", make_file(R"({"w":{"dtype":"F32","shape":[1e999999],"data_offsets":[0,0]}})", {}),
               "not valid JSON");
  expect_error("huge-dim", make_file(object({entry("w", "F32", "[0,18446744073709551615]", 0, 0)}), {}), "over 2^63");
  expect_error("no-offsets", make_file(R"({"w":{"dtype":"F32","shape":[1]}})", Bytes(4)), "data_offsets");
  std::string missing = dir.file("missing.safetensors");
  CHECK_THROWS_WITH(read_safetensors(missing), Catch::Contains(missing));
  // A header that is fine reads fine (so the cases above fail for their own reason).
  write_bytes(dir.file("fine"), make_file(object({entry("a", "F32", "[2]", 0, 8), entry("b", "U8", "[0]", 8, 8)}),
                                          {0, 0, 0x80, 0x3f, 0, 0, 0, 0x40}));
  CHECK(read_safetensors(dir.file("fine")).tensors[0].second.to_vector() == std::vector<float>{1, 2});
}

TEST_CASE("Checkpoint::load_into reports every mismatch at once and copies nothing then", "[checkpoint]") {
  TempDir dir("tnt-ckpt");
  Checkpoint saved;
  saved.add("fc.weight", arange({3, 4}, DType::f32));
  saved.add("fc.bias", arange({3}, DType::f32, 10));
  saved.add("conv.weight", arange({2, 2}, DType::f32));
  saved.add("optimizer.fc.weight.momentum", arange({3, 4}, DType::f32, 100));
  saved.set_metadata_int(checkpoint_key::epoch, 4);
  saved.set_metadata_int(checkpoint_key::step, 1000);
  saved.set_metadata(checkpoint_key::generator, "18446744073709551615");
  std::string path = dir.file("ckpt.safetensors");
  saved.write(path);

  Checkpoint c = Checkpoint::read(path);
  CHECK(c.path() == path);
  CHECK(c.metadata_int("epoch") == 4);
  CHECK(c.metadata_int("step") == 1000);
  CHECK(c.metadata("format") == "pt");
  CHECK(c.metadata(checkpoint_key::generator) == "18446744073709551615");
  CHECK_THROWS_WITH(c.metadata("seed"), Catch::Contains(path) && Catch::Contains("seed"));
  CHECK_THROWS_AS(c.metadata_int("format"), InputError);

  Tensor w = Tensor::zeros({3, 4}), b = Tensor::zeros({3}), m = Tensor::zeros({3, 4});
  Tensor conv = Tensor::zeros({2, 2});
  c.load_into({{"fc.weight", w}, {"fc.bias", b}, {"conv.weight", conv}, {"optimizer.fc.weight.momentum", m}});
  CHECK(w.to_vector() == arange({3, 4}, DType::f32).to_vector());  // landed in w's own storage
  CHECK(b.to_vector() == std::vector<float>{10, 11, 12});
  CHECK(m.to_vector()[0] == 100);

  Tensor w2 = Tensor::zeros({4, 3}), b2 = Tensor::zeros({3}, DType::f64), extra = Tensor::zeros({1});
  try {
    c.load_into({{"fc.weight", w2}, {"fc.bias", b2}, {"head.weight", extra}});
    FAIL("load_into accepted a mismatching model");
  } catch (const InputError& e) {
    std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains(path));
    CHECK_THAT(msg, Catch::Contains("1 missing: head.weight"));
    CHECK_THAT(msg, Catch::Contains("2 unexpected: conv.weight, optimizer.fc.weight.momentum"));
    CHECK_THAT(msg, Catch::Contains("fc.weight (file (3, 4), expected (4, 3))"));
    CHECK_THAT(msg, Catch::Contains("fc.bias (file F32, expected F64)"));
  }
  CHECK(w2.to_vector() == std::vector<float>(12, 0.0f));  // nothing copied
  // Weights only: the optimizer state and the other layer may be ignored on request.
  Tensor w3 = Tensor::zeros({3, 4}), b3 = Tensor::zeros({3}), head = Tensor::full({1}, 5.0);
  LoadOptions lenient;
  lenient.allow_unexpected = true;
  lenient.allow_missing = true;
  c.load_into({{"fc.weight", w3}, {"fc.bias", b3}, {"head.weight", head}}, lenient);
  CHECK(b3.to_vector() == std::vector<float>{10, 11, 12});
  CHECK(head.to_vector() == std::vector<float>{5});
  CHECK_THROWS_AS(c.load_into({{"fc.weight", w3}, {"fc.bias", b3}}), InputError);  // strict by default
}

TEST_CASE("Checkpoint::load_into refuses a NaN or an infinity in a tensor that loads", "[checkpoint]") {
  TempDir dir("tnt-ckpt-nan");
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (float bad : {nan, -inf}) {
    INFO("bad value " << bad);
    Checkpoint saved;
    Tensor w = arange({3, 4}, DType::f32);
    w.data<float>()[7] = bad;  // one value, mid-tensor: the check must read every float
    saved.add("fc.bias", arange({3}, DType::f32, 10));
    saved.add("fc.weight", w);
    saved.add("steps", arange({1}, DType::i64));
    const std::string path = dir.file("bad.safetensors");
    saved.write(path);  // Checkpoint::write writes what it is given
    Checkpoint c = Checkpoint::read(path);

    Tensor w2 = Tensor::zeros({3, 4}), b2 = Tensor::zeros({3}), s2 = Tensor::zeros({1}, DType::i64);
    try {
      c.load_into({{"fc.bias", b2}, {"fc.weight", w2}, {"steps", s2}});
      FAIL("load_into accepted a NaN or an infinity");
    } catch (const InputError& e) {
      const std::string msg = e.what();
      CHECK_THAT(msg, Catch::Contains(path));
      CHECK_THAT(msg, Catch::Contains("'fc.weight'"));
      CHECK_THAT(msg, Catch::Contains("NaN or an infinity"));
    }
    CHECK(b2.to_vector() == std::vector<float>(3, 0.0f));  // nothing copied, not even the good tensor
    // A bad tensor that does not load does not matter.
    LoadOptions weights_only;
    weights_only.allow_unexpected = true;
    c.load_into({{"fc.bias", b2}}, weights_only);
    CHECK(b2.to_vector() == std::vector<float>{10, 11, 12});
    // On request it loads as it is.
    LoadOptions as_is;
    as_is.allow_non_finite = true;
    c.load_into({{"fc.bias", b2}, {"fc.weight", w2}, {"steps", s2}}, as_is);
    CHECK(std::isinf(w2.to_vector()[7]) == std::isinf(bad));
    CHECK(std::isnan(w2.to_vector()[7]) == std::isnan(bad));
  }
}

TEST_CASE("a checkpoint of another model: each kind counted, 10 mismatching tensors named", "[checkpoint]") {
  // 300 tensors in the file and 200 other ones in the model (another network: the message
  // once listed all 500 names, on every rank).
  Checkpoint c;
  for (int i = 0; i < 300; ++i) c.add(fmt::format("file_layer{}.weight", i), Tensor::zeros({2}));
  c.add("shared.weight", Tensor::zeros({3, 4}));
  NamedTensors model;
  for (int i = 0; i < 200; ++i) model.emplace_back(fmt::format("model_layer{}.weight", i), Tensor::zeros({2}));
  model.emplace_back("shared.weight", Tensor::zeros({4, 3}));
  try {
    c.load_into(model);
    FAIL("load_into accepted another model's checkpoint");
  } catch (const InputError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK_THAT(msg, Catch::Contains("(in memory)"));
    // The 10 names shared out in turn: 5 missing, 4 unexpected, the 1 of a wrong shape.
    CHECK_THAT(msg, Catch::Contains("200 missing: model_layer0.weight, model_layer1.weight, model_layer2.weight, "
                                    "model_layer3.weight, model_layer4.weight, and 195 more;"));
    CHECK_THAT(msg, Catch::Contains(" 300 unexpected: file_layer0.weight, file_layer1.weight, file_layer2.weight, "
                                    "file_layer3.weight, and 296 more;"));
    CHECK_THAT(msg, Catch::EndsWith(" 1 with a wrong shape: shared.weight (file (3, 4), expected (4, 3))"));
    size_t names = 0;
    for (size_t at = 0; (at = msg.find(".weight", at)) != std::string::npos; ++at) ++names;
    CHECK(names == 10);
    CHECK(msg.size() < 400);
  }
  // A few mismatches of several kinds: all named while there are at most 10.
  Checkpoint small;
  small.add("a", Tensor::zeros({1}));
  small.add("b", Tensor::zeros({1}));
  Tensor wrong = Tensor::zeros({2});
  CHECK_THROWS_WITH(small.load_into({{"a", wrong}, {"c", Tensor::zeros({1})}}),
                    Catch::EndsWith(": 1 missing: c; 1 unexpected: b; 1 with a wrong shape: a (file (1,), expected (2,))"));
  // Of one kind only: its first 10.
  NamedTensors others;
  for (int i = 0; i < 12; ++i) others.emplace_back(fmt::format("m{}", i), Tensor::zeros({1}));
  CHECK_THROWS_WITH(Checkpoint().load_into(others),
                    Catch::EndsWith(": 12 missing: m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, and 2 more"));
}

TEST_CASE("a writer killed half-way leaves the previous checkpoint, and the next write cleans up", "[checkpoint][crash]") {
  TempDir dir("tnt-ckpt");
  std::string path = dir.file("ckpt.safetensors");
  Tensor old_value = Tensor::full({256}, 1.0);
  write_safetensors(path, {{"w", old_value}}, {{"step", "1"}});
  Tensor big = Tensor::full({1 << 20}, 2.0);  // 4 MiB: far over the 1 MiB file-size limit below

  // The child may write at most 1 MiB per file; going past it raises SIGXFSZ, whose default
  // action kills the process in the middle of write(2), exactly like a crash.
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    rlimit fsize{1 << 20, 1 << 20}, core{0, 0};
    ::setrlimit(RLIMIT_FSIZE, &fsize);
    ::setrlimit(RLIMIT_CORE, &core);
    ::signal(SIGXFSZ, SIG_DFL);
    try {
      write_safetensors(path, {{"w", big}}, {{"step", "2"}});
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGXFSZ);

  // The partial temporary file is there, and the checkpoint is the old one, whole.
  std::vector<std::string> names = dir.names();
  REQUIRE(names.size() == 2);
  CHECK(names[0].rfind(".ckpt.safetensors.tmp-" + std::to_string(pid) + "-", 0) == 0);
  CHECK(fs::file_size(dir.path / names[0]) == (1u << 20));
  SafetensorsFile f = read_safetensors(path);
  CHECK(f.metadata.at("step") == "1");
  CHECK(f.tensors.at(0).second.to_vector() == old_value.to_vector());

  // A write that fails still removes the dead writer's file first (on a full disk, the
  // space it holds is what every later save needs): here a write that fails half-way on a
  // file size limit, as the disk being full would.
  pid_t again = ::fork();
  REQUIRE(again >= 0);
  if (again == 0) {
    rlimit fsize{1 << 20, 1 << 20};
    ::setrlimit(RLIMIT_FSIZE, &fsize);
    ::signal(SIGXFSZ, SIG_IGN);
    try {
      write_safetensors(path, {{"w", big}}, {{"step", "2"}});
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  REQUIRE(::waitpid(again, &status, 0) == again);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 3);
  CHECK(dir.names() == std::vector<std::string>{"ckpt.safetensors"});

  // The next successful write replaces it.
  write_safetensors(path, {{"w", Tensor::full({8}, 3.0)}}, {{"step", "3"}});
  CHECK(dir.names() == std::vector<std::string>{"ckpt.safetensors"});
  CHECK(read_safetensors(path).metadata.at("step") == "3");
}

TEST_CASE("a write that fails half-way throws and leaves no temporary file", "[checkpoint][crash]") {
  TempDir dir("tnt-ckpt");
  std::string path = dir.file("ckpt.safetensors");
  write_safetensors(path, {{"w", Tensor::full({16}, 1.0)}}, {{"step", "1"}});
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // With SIGXFSZ ignored, the write past the limit fails with EFBIG instead.
    rlimit fsize{1 << 20, 1 << 20};
    ::setrlimit(RLIMIT_FSIZE, &fsize);
    ::signal(SIGXFSZ, SIG_IGN);
    try {
      write_safetensors(path, {{"w", Tensor::full({1 << 20}, 2.0)}}, {{"step", "2"}});
    } catch (const Error& e) {
      ::_exit(std::strstr(e.what(), "failed") && std::strstr(e.what(), "ckpt.safetensors") ? 7 : 8);
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 7);
  CHECK(dir.names() == std::vector<std::string>{"ckpt.safetensors"});
  CHECK(read_safetensors(path).metadata.at("step") == "1");
}

TEST_CASE("SIGKILL at a random moment of repeated writes never leaves a torn checkpoint", "[checkpoint][crash]") {
  TempDir dir("tnt-ckpt");
  std::string path = dir.file("ckpt.safetensors");
  write_safetensors(path, {{"w", Tensor::full({1 << 21}, 0.0)}}, {{"k", "0"}});
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    for (int k = 1;; ++k) {  // 8 MiB per write, each one fsynced, until killed
      try {
        write_safetensors(path, {{"w", Tensor::full({1 << 21}, double(k))}}, {{"k", std::to_string(k)}});
      } catch (...) {
        ::_exit(3);
      }
    }
  }
  // Kill it while a temporary file is being written (or soon after, if we miss it).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  bool saw_temp = false;
  while (!saw_temp && std::chrono::steady_clock::now() < deadline) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir.path, ec)) {
      if (e.path().filename().string().rfind(".ckpt", 0) == 0 && fs::file_size(e.path(), ec) > (1u << 20)) saw_temp = true;
    }
    if (!saw_temp) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status));
  CHECK(saw_temp);

  // Whatever is in place is one complete checkpoint: every value equals its metadata k.
  SafetensorsFile f = read_safetensors(path);
  double k = std::stod(f.metadata.at("k"));
  std::vector<float> v = f.tensors.at(0).second.to_vector();
  REQUIRE(v.size() == (1u << 21));
  CHECK(std::all_of(v.begin(), v.end(), [&](float x) { return x == k; }));
  write_safetensors(path, {{"w", Tensor::full({4}, 9.0)}}, {{"k", "9"}});
  CHECK(dir.names() == std::vector<std::string>{"ckpt.safetensors"});
}

TEST_CASE("after tnt::init a file-size limit fails a write with an error, not SIGXFSZ", "[checkpoint][crash]") {
  // Before, a rank under `ulimit -f` died by SIGXFSZ (a core-dumping signal) in the middle
  // of its checkpoint or history write. The runtime's init ignores it (this test's main
  // called tnt::init), and the write fails with EFBIG, naming the file.
  struct sigaction now {};
  REQUIRE(::sigaction(SIGXFSZ, nullptr, &now) == 0);
  CHECK(now.sa_handler == SIG_IGN);
  TempDir dir("tnt-ckpt");
  std::string path = dir.file("ckpt.safetensors");
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    rlimit fsize{1 << 20, 1 << 20};
    ::setrlimit(RLIMIT_FSIZE, &fsize);
    try {
      write_safetensors(path, {{"w", Tensor::full({1 << 20}, 2.0)}}, {{"step", "2"}});
    } catch (const Error& e) {
      // The file meant, not its temporary, and no source location (a user's error).
      const std::string want = "writing '" + path + "' failed: File too large (a file already there is kept as it was)";
      ::_exit(e.what() == want ? 7 : 8);
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  INFO("status " << status);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 7);
  CHECK(dir.names().empty());
}
