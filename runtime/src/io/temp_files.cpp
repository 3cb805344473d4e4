#include "io/temp_files.hpp"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <system_error>

#include <unistd.h>

namespace tnt::io {
namespace {

std::string temp_prefix(const std::string& base) { return "." + base + ".tmp-"; }

}  // namespace

std::string temp_template(const std::filesystem::path& dir, const std::string& base) {
  return (dir / (temp_prefix(base) + std::to_string(::getpid()) + "-XXXXXX")).string();
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
