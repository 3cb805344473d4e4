#include "ompi_leftovers.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace tnt::launcher {

namespace fs = std::filesystem;

namespace {

// The job family of the session directory's contact.txt ("1195900928.0;tcp://..."): the
// ranks' job id is family + 1 (the launched application is job 1 of its family).
bool job_family(const fs::path& contact, unsigned long long* family) {
  std::ifstream in(contact);
  std::string first;
  if (!std::getline(in, first)) return false;
  const size_t dot = first.find('.');
  if (dot == 0 || dot == std::string::npos) return false;
  char* end = nullptr;
  const std::string digits = first.substr(0, dot);
  *family = std::strtoull(digits.c_str(), &end, 10);
  return end != nullptr && *end == '\0' && *family <= 0xffffffffULL;
}

}  // namespace

int remove_ompi_leftovers(pid_t pid, const std::string& tmp_dir, const std::string& shm_dir, const std::string& host) {
  const std::string uid = std::to_string(::getuid());
  const std::string pid_dir = fmt::format("pid.{}", pid);
  // Open MPI names the session directory by the host's name, without its domain unless
  // told to keep it: either form is this host's. Another host's (a TMPDIR shared between
  // nodes) may hold a live mpirun of the same process ID there.
  const std::string short_host = host.substr(0, host.find('.'));
  int removed = 0;
  std::error_code ec;
  for (const auto& session : fs::directory_iterator(tmp_dir, ec)) {
    const std::string name = session.path().filename().string();
    if (name != "ompi." + host + "." + uid && name != "ompi." + short_host + "." + uid) continue;
    const fs::path dir = session.path() / pid_dir;
    std::error_code dir_ec;
    if (!fs::is_directory(fs::symlink_status(dir, dir_ec))) continue;
    unsigned long long family = 0;
    if (job_family(dir / "contact.txt", &family)) {
      // vader_segment.<host>.<uid>.<job id in hex>.<local rank>
      const std::string job = fmt::format(".{}.{:x}.", uid, family + 1);
      std::error_code shm_ec;
      for (const auto& seg : fs::directory_iterator(shm_dir, shm_ec)) {
        const std::string seg_name = seg.path().filename().string();
        if (seg_name.rfind("vader_segment.", 0) != 0 || seg_name.find(job) == std::string::npos) continue;
        std::error_code rm_ec;
        if (fs::remove(seg.path(), rm_ec)) ++removed;
      }
    }
    std::error_code rm_ec;
    if (fs::remove_all(dir, rm_ec) > 0) ++removed;
  }
  return removed;
}

int remove_ompi_leftovers(pid_t pid) {
  const char* base = std::getenv("OMPI_MCA_orte_tmpdir_base");
  if (base == nullptr || *base == '\0') base = std::getenv("TMPDIR");
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return 0;
  return remove_ompi_leftovers(pid, base != nullptr && *base != '\0' ? base : "/tmp", "/dev/shm", host);
}

}  // namespace tnt::launcher
