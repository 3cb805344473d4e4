// libtnt_kernel_table.so: a kernel table of a CUDA program's profiled steps, for machines
// where ncu cannot read the GPU's counters (docs/gpu.md, "A kernel table without ncu").
//
//   CUDA_INJECTION64_PATH=build/bin/libtnt_kernel_table.so TNT_KERNEL_TABLE=kernels.csv
//     TNT_CUDA_PROFILE_STEPS=20-21 build/bin/resnet50 --use_synthetic_data ...   (one line)
//
// The CUDA driver loads the library at cuInit and calls InitializeInjection. It records, with
// CUPTI's activity API, every kernel, copy and memset that runs between cudaProfilerStart and
// cudaProfilerStop (TNT_CUDA_PROFILE_STEPS places them around training steps; the runtime
// waits for the GPU at both ends), nothing outside them: the run's speed elsewhere is the
// program's own. At the stop it writes TNT_KERNEL_TABLE (a "%p" in it becomes the process
// id), through a temporary file and a rename:
//   kind,name,calls,total_us,mean_us,min_us,max_us
// one row per kernel name (demangled) or copy direction, most time first, and two summary
// rows: "window" (first start to last end on the GPU) and "busy" (the union of the rows'
// intervals: window - busy is time the GPU had nothing to run, the host's share of a step).
// Only GPU time: counters need ncu. scripts/bench/kernel_table prints and compares tables.
#include <cupti.h>

#include <cxxabi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace {

struct Row {
  uint64_t calls = 0, total_ns = 0, min_ns = UINT64_MAX, max_ns = 0;
};

struct Table {
  std::mutex mu;
  std::map<std::pair<std::string, std::string>, Row> rows;  // (kind, name)
  std::vector<std::pair<uint64_t, uint64_t>> intervals;     // GPU [start, end) of every record
  std::map<const char*, std::string> demangled;             // CUPTI's name pointers are stable
  std::atomic<bool> on{false};
  bool written = false;
  uint64_t dropped = 0;
};

Table& table() {
  static Table* t = new Table;  // never destroyed: CUPTI's threads may call in at exit
  return *t;
}

void warn(const char* what, CUptiResult r) {
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  std::fprintf(stderr, "kernel table: %s failed: %s\n", what, s ? s : "?");
}

#define KT_CHECK(call)                               \
  do {                                               \
    CUptiResult kt_r = (call);                       \
    if (kt_r != CUPTI_SUCCESS) warn(#call, kt_r);    \
  } while (0)

const std::string& kernel_name(Table& t, const char* mangled) {
  auto it = t.demangled.find(mangled);
  if (it != t.demangled.end()) return it->second;
  std::string name = mangled ? mangled : "?";
  int status = 0;
  char* d = mangled ? abi::__cxa_demangle(mangled, nullptr, nullptr, &status) : nullptr;
  if (d && status == 0) name = d;
  std::free(d);
  return t.demangled.emplace(mangled, std::move(name)).first->second;
}

const char* copy_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "host to device";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "device to host";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "device to device";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "peer to peer";
    default: return "other";
  }
}

void add(Table& t, const char* kind, const std::string& name, uint64_t start, uint64_t end) {
  if (end < start) return;
  Row& r = t.rows[{kind, name}];
  const uint64_t ns = end - start;
  ++r.calls;
  r.total_ns += ns;
  r.min_ns = std::min(r.min_ns, ns);
  r.max_ns = std::max(r.max_ns, ns);
  t.intervals.emplace_back(start, end);
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kBytes = 8 << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBytes));
  *size = *buffer ? kBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  Table& t = table();
  {
    std::lock_guard<std::mutex> lock(t.mu);
    CUpti_Activity* rec = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
      switch (rec->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
          auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(rec);
          add(t, "kernel", kernel_name(t, k->name), k->start, k->end);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(rec);
          add(t, "memcpy", copy_kind(m->copyKind), m->start, m->end);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(rec);
          add(t, "memset", "memset", m->start, m->end);
          break;
        }
        default: break;
      }
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS) t.dropped += dropped;
  }
  std::free(buffer);
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c == '\n' ? ' ' : c;
  }
  return q + "\"";
}

std::string out_path() {
  const char* p = std::getenv("TNT_KERNEL_TABLE");
  std::string path = p && *p ? p : "kernel_table.csv";
  const size_t at = path.find("%p");
  if (at != std::string::npos) path.replace(at, 2, std::to_string(getpid()));
  return path;
}

void write_table(Table& t) {
  std::vector<std::pair<std::pair<std::string, std::string>, Row>> rows;
  std::vector<std::pair<uint64_t, uint64_t>> iv;
  uint64_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    if (t.written) return;
    t.written = true;
    rows.assign(t.rows.begin(), t.rows.end());
    iv = t.intervals;
    dropped = t.dropped;
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.total_ns > b.second.total_ns; });
  std::sort(iv.begin(), iv.end());
  uint64_t busy = 0, window = 0, cur_s = 0, cur_e = 0;
  if (!iv.empty()) {
    uint64_t last = 0;
    for (const auto& [s, e] : iv) last = std::max(last, e);
    window = last - iv.front().first;
    cur_s = iv.front().first;
    cur_e = iv.front().second;
    for (const auto& [s, e] : iv) {
      if (s > cur_e) {
        busy += cur_e - cur_s;
        cur_s = s;
        cur_e = e;
      } else {
        cur_e = std::max(cur_e, e);
      }
    }
    busy += cur_e - cur_s;
  }
  const std::string path = out_path();
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "kernel table: cannot write %s: %s\n", tmp.c_str(), std::strerror(errno));
    return;
  }
  std::fprintf(f, "kind,name,calls,total_us,mean_us,min_us,max_us\n");
  std::fprintf(f, "window,window,1,%.3f,%.3f,%.3f,%.3f\n", window / 1e3, window / 1e3, window / 1e3, window / 1e3);
  std::fprintf(f, "busy,busy,1,%.3f,%.3f,%.3f,%.3f\n", busy / 1e3, busy / 1e3, busy / 1e3, busy / 1e3);
  for (const auto& [key, r] : rows) {
    std::fprintf(f, "%s,%s,%llu,%.3f,%.3f,%.3f,%.3f\n", key.first.c_str(), csv_field(key.second).c_str(),
                 static_cast<unsigned long long>(r.calls), r.total_ns / 1e3, r.total_ns / 1e3 / r.calls,
                 r.min_ns / 1e3, r.max_ns / 1e3);
  }
  const bool ok = std::fflush(f) == 0 && !std::ferror(f);
  if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "kernel table: writing %s failed: %s\n", path.c_str(), std::strerror(errno));
    std::remove(tmp.c_str());
    return;
  }
  std::fprintf(stderr, "kernel table: %zu rows, GPU busy %.3f of %.3f ms%s -> %s\n", rows.size(), busy / 1e6,
               window / 1e6, dropped ? " (records were dropped: the table is short)" : "", path.c_str());
}

void start() {
  Table& t = table();
  if (t.on.exchange(true)) return;
  for (auto k : kKinds) KT_CHECK(cuptiActivityEnable(k));
}

void stop() {
  Table& t = table();
  if (!t.on.exchange(false)) return;
  KT_CHECK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  for (auto k : kKinds) KT_CHECK(cuptiActivityDisable(k));
  write_table(t);
}

// After the API returned: the start then records only what follows it, and the stop comes
// after the program waited for the GPU (TNT_CUDA_PROFILE_STEPS does).
void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (info->callbackSite != CUPTI_API_EXIT) return;
  const bool runtime = domain == CUPTI_CB_DOMAIN_RUNTIME_API;
  if ((runtime && id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000) ||
      (!runtime && id == CUPTI_DRIVER_TRACE_CBID_cuProfilerStart)) {
    start();
  } else if ((runtime && id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000) ||
             (!runtime && id == CUPTI_DRIVER_TRACE_CBID_cuProfilerStop)) {
    stop();
  }
}

void at_exit() {
  Table& t = table();
  if (t.on.load()) {
    std::fprintf(stderr, "kernel table: the program ended inside its profiled window; writing what was recorded\n");
    stop();
  } else if (!t.written) {
    std::fprintf(stderr,
                 "kernel table: no cudaProfilerStart/Stop window ran (set TNT_CUDA_PROFILE_STEPS=a-b); "
                 "%s not written\n",
                 out_path().c_str());
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  static bool done = false;
  if (done) return 1;
  done = true;
  CUpti_SubscriberHandle sub;
  CUptiResult r = cuptiSubscribe(&sub, reinterpret_cast<CUpti_CallbackFunc>(on_api), nullptr);
  if (r != CUPTI_SUCCESS) {
    warn("cuptiSubscribe (is another profiler attached?)", r);
    return 0;
  }
  KT_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  KT_CHECK(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000));
  KT_CHECK(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000));
  KT_CHECK(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStart));
  KT_CHECK(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStop));
  std::atexit(at_exit);
  std::fprintf(stderr, "kernel table: recording between cudaProfilerStart and cudaProfilerStop into %s\n",
               out_path().c_str());
  return 1;
}
