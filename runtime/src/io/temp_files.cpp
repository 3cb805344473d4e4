#include "io/temp_files.hpp"

#include "tarantella/check.hpp"
#include "tarantella/files.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <system_error>

#include <sys/stat.h>
#include <unistd.h>

namespace tnt::io {
namespace {

std::string temp_prefix(const std::string& base) { return "." + base + ".tmp-"; }

}  // namespace

std::string temp_template(const std::filesystem::path& dir, const std::string& base) {
  return (dir / (temp_prefix(base) + std::to_string(::getpid()) + "-XXXXXX")).string();
}

unsigned current_umask() noexcept {
  try {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("Umask:", 0) == 0) return static_cast<unsigned>(std::stoul(line.substr(6), nullptr, 8));
    }
  } catch (...) {
  }
  return 022;
}

void remove_stale_temps(const std::filesystem::path& dir, const std::string& base) noexcept {
  const std::string prefix = temp_prefix(base);
  std::error_code ec;
  try {
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind(prefix, 0) != 0) continue;
      // A process that is still running may be writing one right now.
      const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
      const bool alive = pid > 0 && pid != ::getpid() && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
      std::error_code rm_ec;
      if (!alive) std::filesystem::remove(it->path(), rm_ec);
    }
  } catch (...) {
  }
}

}  // namespace tnt::io

namespace tnt {

void write_file_atomically(const std::string& path, std::string_view content, std::string_view what) {
  const std::filesystem::path target(path);
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  const std::string base = target.filename().string();
  TNT_INPUT_CHECK(!base.empty(), "{} '{}': not a file name", what, path);
  io::remove_stale_temps(dir, base);
  std::string tmp = io::temp_template(dir, base);
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    TNT_INPUT_ERROR("{} '{}': cannot create a temporary file in '{}': {}", what, path, dir.string(),
                    std::strerror(errno));
  }
  ::fchmod(fd, 0666 & ~io::current_umask());  // mkstemp makes 0600; this is an ordinary file
  std::string failed;
  for (size_t done = 0; done < content.size() && failed.empty();) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) failed = fmt::format("writing failed: {}", std::strerror(n < 0 ? errno : EIO));
    else done += static_cast<size_t>(n);
  }
  if (failed.empty() && ::fsync(fd) != 0) failed = fmt::format("fsync failed: {}", std::strerror(errno));
  if (::close(fd) != 0 && failed.empty()) failed = fmt::format("closing failed: {}", std::strerror(errno));
  if (failed.empty() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    failed = fmt::format("cannot rename the temporary file to it: {}", std::strerror(errno));
  }
  if (!failed.empty()) {
    ::unlink(tmp.c_str());
    TNT_INPUT_ERROR("{} '{}': {} (the file is as it was)", what, path, failed);
  }
}

}  // namespace tnt
