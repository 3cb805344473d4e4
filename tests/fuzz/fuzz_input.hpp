// Shared by the libFuzzer targets. A target feeds the bytes to one parser of user input;
// the parser's documented answer to bad input is an InputError (the runtime's or the
// launcher's). Anything else that escapes (std::bad_alloc from a size field believed,
// std::out_of_range, a crash, a sanitizer report) is a finding.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace tnt::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Parsers that take a path get the bytes in a file of their own per process (libFuzzer's
// -fork/-jobs modes run several processes side by side).
class ScratchFile {
 public:
  explicit ScratchFile(const char* suffix) {
    const char* dir = getenv("TMPDIR");
    path_ = std::string(dir && *dir ? dir : "/tmp") + "/tnt_fuzz_" + std::to_string(getpid()) + suffix;
  }
  ~ScratchFile() { std::remove(path_.c_str()); }
  const std::string& write(const uint8_t* data, size_t size) {
    FILE* f = std::fopen(path_.c_str(), "wb");
    if (!f) __builtin_trap();  // the harness itself failed, not the parser
    if (size && std::fwrite(data, 1, size, f) != size) __builtin_trap();
    std::fclose(f);
    return path_;
  }

 private:
  std::string path_;
};

}  // namespace tnt::fuzz
