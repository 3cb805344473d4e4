#include "hostfile.hpp"

#include "error.hpp"
#include "text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_map>

namespace tnt::launcher {

namespace {

// Far more than any cluster's host list; a file beyond it (a device, a binary given by
// mistake) is refused before it is read to its end, which for /dev/zero never comes.
constexpr size_t max_hostfile_bytes = 16 * 1024 * 1024;
// The most slots of one host, merged lines included (as parse_count bounds one line).
constexpr int max_slots = 1'000'000;

bool valid_host_name(std::string_view name) {
  if (name.empty() || name.front() == '-' || name.front() == '.') return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '.' || c == '_';
    if (!ok) return false;
  }
  return true;
}

int parse_slots(std::string_view text, const std::string& where) {
  if (auto n = parse_count(text)) return *n;
  throw InputError(fmt::format("{}: slots must be an integer from 1 to 1000000, got '{}'", where, excerpt(text)));
}

// `host` or `host:N`
HostEntry parse_host_token(std::string_view token, const std::string& where) {
  HostEntry entry;
  entry.origin = where;
  // "::1", "fe80::1", "[::1]:2": the colons would be read as "host:N". The report and
  // lifeline addresses the ranks are given hold no IPv6 literals either.
  if (token.front() == '[' || std::count(token.begin(), token.end(), ':') > 1) {
    throw InputError(fmt::format("{}: '{}' looks like an IPv6 address, which is not supported here: give the "
                                 "host's name (or an IPv4 address)", where, excerpt(token)));
  }
  auto colon = token.find(':');
  std::string_view name = token.substr(0, colon);
  if (colon != std::string_view::npos) entry.slots = parse_slots(token.substr(colon + 1), where);
  if (!valid_host_name(name)) {
    throw InputError(
        fmt::format("{}: '{}' is not a host name (letters, digits, '.', '-', '_')", where, excerpt(name)));
  }
  entry.name = std::string(name);
  return entry;
}

// Where each host's entry is, and how many lines have named it so far.
struct Seen {
  size_t at = 0;
  int lines = 0;
};
using HostIndex = std::unordered_map<std::string, Seen>;

// Merges a host listed again into its first entry. Every line is a slot unless it gives
// slots (as Open MPI counts), so `a:2` then `a` is 3, and `a` twice is 2; only a host named
// by one line without slots keeps none, for -n or the default to decide. `index` makes a list of N lines cost N
// look-ups rather than N^2/2 compares (a 100,000-line hostfile took 26 s with a scan per line).
// The names of the loopback interface all name this machine: one key for them, so that
// `localhost` and `127.0.0.1` are not planned as two hosts (two ranks given local rank 0,
// the same GPU and the same cores).
std::string host_key(const std::string& name) {
  const bool ipv4_loopback =
      name.rfind("127.", 0) == 0 && name.find_first_not_of("0123456789.") == std::string::npos;
  if (name == "localhost" || name.rfind("localhost.", 0) == 0 || ipv4_loopback || name == "::1" ||
      name == "ip6-localhost" || name == "ip6-loopback") {
    return "localhost";
  }
  return name;
}

void add_merging(HostList& list, HostIndex& index, HostEntry entry) {
  const auto [it, added] = index.try_emplace(host_key(entry.name), Seen{list.hosts.size(), 1});
  if (added) {
    list.hosts.push_back(std::move(entry));
    return;
  }
  Seen& seen = it->second;
  HostEntry& existing = list.hosts[seen.at];
  // Before any line gave slots, each of the `lines` so far was one.
  const long long total = static_cast<long long>(existing.slots.value_or(seen.lines)) + entry.slots.value_or(1);
  if (total > max_slots) {
    throw InputError(fmt::format("{}: host '{}' has more than {} slots in all", entry.origin, entry.name, max_slots));
  }
  if (existing.max_slots || entry.max_slots) {  // each line's cap, its slots where it gave none
    existing.max_slots = static_cast<int>(std::min<long long>(
        max_slots, static_cast<long long>(existing.max_slots.value_or(existing.slots.value_or(seen.lines))) +
                       entry.max_slots.value_or(entry.slots.value_or(1))));
  }
  existing.slots = static_cast<int>(total);
  ++seen.lines;
  if (entry.name == existing.name) {
    list.warnings.push_back(fmt::format("{}: host '{}' is already listed ({}); merged into one entry with slots={}",
                                        entry.origin, entry.name, existing.origin, *existing.slots));
  } else {
    list.warnings.push_back(fmt::format(
        "{}: host '{}' is this machine's loopback, as '{}' is ({}); merged into one entry with slots={}",
        entry.origin, entry.name, existing.name, existing.origin, *existing.slots));
  }
}

}  // namespace

HostList parse_hostfile(std::string_view text, std::string_view file_name) {
  HostList list;
  HostIndex index;
  int line_no = 0;
  for (auto line : split(text, '\n')) {
    ++line_no;
    const std::string where = fmt::format("hostfile '{}', line {}", file_name, line_no);
    auto hash = line.find('#');
    if (hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) continue;

    std::vector<std::string_view> tokens;
    for (size_t i = 0; i < line.size();) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
      size_t j = i;
      while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
      if (j > i) tokens.push_back(line.substr(i, j - i));
      i = j;
    }
    HostEntry entry = parse_host_token(tokens[0], where);
    for (size_t t = 1; t < tokens.size(); ++t) {
      if (starts_with(tokens[t], "slots=")) {
        if (entry.slots) throw InputError(fmt::format("{}: slots given twice", where));
        entry.slots = parse_slots(tokens[t].substr(6), where);
      } else if (starts_with(tokens[t], "max_slots=") || starts_with(tokens[t], "max-slots=")) {
        if (entry.max_slots) throw InputError(fmt::format("{}: max_slots given twice", where));
        entry.max_slots = parse_slots(tokens[t].substr(10), where);
      } else {
        throw InputError(fmt::format("{}: unexpected '{}' (a line is 'host', 'host slots=N' or 'host:N', and may "
                                     "end with max_slots=N)", where, excerpt(tokens[t])));
      }
    }
    if (entry.slots && entry.max_slots && *entry.max_slots < *entry.slots) {
      throw InputError(fmt::format("{}: max_slots={} is less than slots={}", where, *entry.max_slots, *entry.slots));
    }
    entry.origin = fmt::format("line {}", line_no);
    try {
      add_merging(list, index, std::move(entry));
    } catch (const InputError& e) {
      throw InputError(fmt::format("hostfile '{}', {}", file_name, e.what()));
    }
  }
  if (list.hosts.empty()) {
    throw InputError(fmt::format("hostfile '{}' lists no hosts (only blank lines and comments)", file_name));
  }
  for (auto& w : list.warnings) w = fmt::format("hostfile '{}', {}", file_name, w);
  return list;
}

HostList read_hostfile(const std::string& path) {
  // open/read rather than ifstream, so that the message carries the real reason
  // (ENOENT, EACCES). O_NONBLOCK: opening a FIFO must not wait for a writer; it is
  // refused below with the other files that are not regular ones.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw InputError(fmt::format("cannot read hostfile '{}': {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string kind = ::fstat(fd, &st) == 0 ? file_kind(st.st_mode) : std::strerror(errno);
    ::close(fd);
    throw InputError(fmt::format("hostfile '{}' is not a regular file ({}): give a file that lists the hosts", path,
                                 kind));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::string text;
  char buf[4096];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      throw InputError(fmt::format("cannot read hostfile '{}': {}", path, std::strerror(err)));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > max_hostfile_bytes) {
      ::close(fd);
      throw InputError(fmt::format("hostfile '{}' is larger than {} KiB: not a list of hosts", path,
                                   max_hostfile_bytes / 1024));
    }
  }
  ::close(fd);
  return parse_hostfile(text, path);
}

HostList parse_host_list(std::string_view list) {
  HostList out;
  HostIndex index;
  int item = 0;
  for (auto token : split(list, ',')) {
    ++item;
    const std::string where = fmt::format("-H {}: item {}", excerpt(list, 80), item);
    token = trim(token);
    if (token.empty()) throw InputError(fmt::format("{} is empty", where));
    HostEntry entry = parse_host_token(token, where);
    entry.origin = fmt::format("item {}", item);
    try {
      add_merging(out, index, std::move(entry));
    } catch (const InputError& e) {
      throw InputError(fmt::format("-H, {}", e.what()));
    }
  }
  for (auto& w : out.warnings) w = fmt::format("-H, {}", w);
  return out;
}

}  // namespace tnt::launcher
