// Host lists from a hostfile or from -H. A hostfile line is `host`, `host slots=N`
// (Open MPI's form) or `host:N`; `#` starts a comment. A host listed twice is merged into
// one entry (slots add up, as in Open MPI) and reported as a warning, not an error,
// because hostfiles are often concatenated from several sources.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tnt::launcher {

struct HostEntry {
  std::string name;
  std::optional<int> slots;  // ranks on this host when -n is not given
  std::string origin;        // "hosts:3" or "-H item 2", for messages
  std::optional<int> max_slots;  // Open MPI's max_slots=N: the most ranks this host may get, oversubscribed or not
};

struct HostList {
  std::vector<HostEntry> hosts;
  std::vector<std::string> warnings;
};

// Throws InputError naming the file (and the line, for a bad line): missing, unreadable,
// empty, bad slots, malformed names.
HostList read_hostfile(const std::string& path);
HostList parse_hostfile(std::string_view text, std::string_view file_name);

// "node1,node2:4". Throws InputError naming the item.
HostList parse_host_list(std::string_view list);

}  // namespace tnt::launcher
