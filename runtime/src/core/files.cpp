#include "tarantella/files.hpp"

#include "tarantella/check.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace tnt {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  return "of an unknown kind";
}

}  // namespace

uint64_t check_regular_file(const std::string& path, std::string_view what) {
  struct stat st {};
  // stat, not open: opening a FIFO would wait for a writer.
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) TNT_INPUT_ERROR("{} '{}': no such file", what, path);
    TNT_INPUT_ERROR("{} '{}': cannot read it: {}", what, path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) TNT_INPUT_ERROR("{} '{}': not a regular file ({})", what, path, kind_of(st.st_mode));
  return static_cast<uint64_t>(st.st_size);
}

std::ifstream open_regular_file(const std::string& path, std::string_view what) {
  check_regular_file(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) TNT_INPUT_ERROR("{} '{}': cannot open: {}", what, path, std::strerror(errno));
  return in;
}

std::ifstream open_text_file(const std::string& path, std::string_view what) {
  std::ifstream in = open_regular_file(path, what);
  char bom[3] = {};
  in.read(bom, 3);
  const bool has_bom = in.gcount() == 3 && bom[0] == '\xEF' && bom[1] == '\xBB' && bom[2] == '\xBF';
  in.clear();
  if (!has_bom) in.seekg(0);
  return in;
}

}  // namespace tnt
