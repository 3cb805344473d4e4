// libtnt_kernel_table.so on a GPU: a child process runs known work outside and inside a
// cudaProfilerStart/Stop window with the library injected (CUDA_INJECTION64_PATH); the table
// must hold exactly the window's work: 7 launches of one kernel, 2 of another, one memset,
// one copy each way, and none of the 3 + 2 launches outside it.
//   test_kernel_table_cuda path/to/libtnt_kernel_table.so
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

__global__ void kt_probe_scale(float* x, int n, float a) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}

__global__ void kt_probe_other(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}

int fail(const std::string& why) {
  std::fprintf(stderr, "FAIL: %s\n", why.c_str());
  return 1;
}

#define CHECK_CUDA(call)                                                                   \
  do {                                                                                     \
    cudaError_t e = (call);                                                                \
    if (e != cudaSuccess) return fail(std::string(#call) + ": " + cudaGetErrorString(e)); \
  } while (0)

int child() {
  const int n = 1 << 20;
  float* d = nullptr;
  float* h = nullptr;  // pinned: each copy is one DMA transfer, one record
  CHECK_CUDA(cudaMalloc(&d, n * sizeof(float)));
  CHECK_CUDA(cudaMallocHost(&h, n * sizeof(float)));
  for (int i = 0; i < n; ++i) h[i] = 1.0f;
  for (int k = 0; k < 3; ++k) kt_probe_scale<<<n / 256, 256>>>(d, n, 1.0f);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaProfilerStart());
  CHECK_CUDA(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(d, 0, n * sizeof(float)));
  for (int k = 0; k < 7; ++k) kt_probe_scale<<<n / 256, 256>>>(d, n, 0.5f);
  for (int k = 0; k < 2; ++k) kt_probe_other<<<n / 256, 256>>>(d, n);
  CHECK_CUDA(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaProfilerStop());
  for (int k = 0; k < 2; ++k) kt_probe_other<<<n / 256, 256>>>(d, n);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaFree(d));
  const float h0 = h[0];
  CHECK_CUDA(cudaFreeHost(h));
  return h0 == 2.0f ? 0 : fail("the child's arithmetic is off: " + std::to_string(h0));
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        out.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        out.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--child") == 0) return child();
  if (argc != 2) return fail("usage: test_kernel_table_cuda path/to/libtnt_kernel_table.so");
  if (access(argv[1], R_OK) != 0) return fail(std::string(argv[1]) + ": not readable");
  char dir[] = "/tmp/tnt_kernel_table.XXXXXX";
  if (!mkdtemp(dir)) return fail("mkdtemp failed");
  const std::string table = std::string(dir) + "/table.csv";
  pid_t pid = fork();
  if (pid == 0) {
    setenv("CUDA_INJECTION64_PATH", argv[1], 1);
    setenv("TNT_KERNEL_TABLE", table.c_str(), 1);
    execl("/proc/self/exe", argv[0], "--child", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return fail("could not run the child");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return fail("the child failed");
  std::ifstream in(table);
  if (!in) return fail(table + " was not written");
  std::string line;
  std::getline(in, line);
  if (line != "kind,name,calls,total_us,mean_us,min_us,max_us") return fail("header: " + line);
  std::map<std::string, long> calls;  // "kind name" -> calls
  std::map<std::string, double> total;
  while (std::getline(in, line)) {
    auto f = split_csv(line);
    if (f.size() != 7) return fail("row with " + std::to_string(f.size()) + " fields: " + line);
    std::string key = f[0] + " " + f[1];
    if (f[0] == "kernel") key = f[1].find("kt_probe_scale") != std::string::npos   ? "scale"
                                : f[1].find("kt_probe_other") != std::string::npos ? "other"
                                                                                    : key;
    calls[key] += std::stol(f[2]);
    total[key] += std::stod(f[3]);
    std::printf("%s\n", line.c_str());
  }
  int bad = 0;
  auto expect = [&](const std::string& key, long n) {
    if (calls[key] != n) {
      std::fprintf(stderr, "FAIL: %s: %ld calls in the table, expected %ld\n", key.c_str(), calls[key], n);
      ++bad;
    }
  };
  expect("scale", 7);
  expect("other", 2);
  expect("memset memset", 1);
  expect("memcpy host to device", 1);
  expect("memcpy device to host", 1);
  expect("window window", 1);
  expect("busy busy", 1);
  double rows = 0;
  for (const auto& [k, t] : total)
    if (k != "window window" && k != "busy busy") rows += t;
  // Busy is the union of the rows' intervals: positive, within the window, at most their sum
  // (1% for the 3-decimal rounding of each row).
  if (!(total["busy busy"] > 0 && total["busy busy"] <= total["window window"] * 1.0001 &&
        total["busy busy"] <= rows * 1.01 + 0.01)) {
    std::fprintf(stderr, "FAIL: busy %.3f us, window %.3f us, rows %.3f us\n", total["busy busy"],
                 total["window window"], rows);
    ++bad;
  }
  std::remove(table.c_str());
  rmdir(dir);
  return bad ? 1 : 0;
}
