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

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

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

int remove_ompi_leftovers(pid_t pid, const std::string& tmp_dir, const std::string& shm_dir) {
  const std::string uid = std::to_string(::getuid());
  const std::string pid_dir = fmt::format("pid.{}", pid);
  int removed = 0;
  std::error_code ec;
  for (const auto& session : fs::directory_iterator(tmp_dir, ec)) {
    const std::string name = session.path().filename().string();
    if (name.rfind("ompi.", 0) != 0 || !ends_with(name, "." + uid)) continue;
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
  return remove_ompi_leftovers(pid, base != nullptr && *base != '\0' ? base : "/tmp", "/dev/shm");
}

}  // namespace tnt::launcher
