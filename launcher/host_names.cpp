#include "host_names.hpp"

#include "error.hpp"
#include "text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <netdb.h>
#include <optional>
#include <sys/socket.h>
#include <thread>

namespace tnt::launcher {

namespace {

// Lookups under way at once: enough for a large allocation within the limit, few enough
// not to flood the resolver.
constexpr size_t max_parallel_lookups = 16;

// Shared by the launcher and the lookup threads; a thread still waiting for the resolver
// when the time is up keeps it alive, and finds nobody interested when it returns.
struct Lookups {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::string> names;
  std::vector<std::optional<NameLookup>> results;
  size_t next = 0, done = 0;
  bool abandoned = false;
};

void work(std::shared_ptr<Lookups> s, NameResolver resolve) {
  while (true) {
    std::string name;
    size_t i = 0;
    {
      std::lock_guard lock(s->mutex);
      if (s->abandoned || s->next == s->names.size()) return;
      i = s->next++;
      name = s->names[i];
    }
    NameLookup r;
    try {
      r = resolve(name);
    } catch (const std::exception& e) {
      r = {NameLookup::Result::failed, e.what()};
    }
    std::lock_guard lock(s->mutex);
    s->results[i] = std::move(r);
    ++s->done;
    s->changed.notify_all();
  }
}

// "hostfile 'hosts', line 3", "-H, item 2", "SLURM job 42, SLURM_JOB_NODELIST"
std::string listed_at(const HostSelection& hosts, const HostEntry& entry) {
  return entry.origin.empty() ? hosts.source : fmt::format("{}, {}", hosts.source, entry.origin);
}

}  // namespace

NameLookup resolve_name(const std::string& name) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(name.c_str(), nullptr, &hints, &found);
  if (rc == 0) {
    ::freeaddrinfo(found);
    return {NameLookup::Result::found, ""};
  }
  const std::string reason = rc == EAI_SYSTEM ? std::string("system error") : ::gai_strerror(rc);
#ifdef EAI_NODATA
  if (rc == EAI_NODATA) return {NameLookup::Result::unknown, reason};
#endif
  if (rc == EAI_NONAME) return {NameLookup::Result::unknown, reason};
  return {NameLookup::Result::failed, reason};
}

std::vector<std::string> check_host_names(const HostSelection& hosts, const LaunchPlan& plan,
                                          const NameResolver& resolve, std::chrono::milliseconds limit) {
  auto s = std::make_shared<Lookups>();
  std::vector<const HostEntry*> entries;
  // By name: the plan leaves out the hosts that -np gives no rank, so the lists need not
  // line up (a host is listed once: hostfile.hpp merges repeats).
  for (const auto& planned : plan.hosts) {
    if (planned.local) continue;
    auto entry = std::find_if(hosts.hosts.begin(), hosts.hosts.end(),
                              [&](const HostEntry& h) { return h.name == planned.name; });
    if (entry == hosts.hosts.end()) continue;
    entries.push_back(&*entry);
    s->names.push_back(entry->name);
  }
  if (entries.empty()) return {};
  s->results.resize(s->names.size());
  const size_t threads = std::min(max_parallel_lookups, s->names.size());
  for (size_t t = 0; t < threads; ++t) std::thread(work, s, resolve).detach();

  std::vector<std::optional<NameLookup>> results;
  {
    std::unique_lock lock(s->mutex);
    s->changed.wait_for(lock, limit, [&] { return s->done == s->names.size(); });
    s->abandoned = true;
    results = s->results;
  }

  std::vector<std::string> unknown, warnings, unanswered;
  for (size_t i = 0; i < entries.size(); ++i) {
    const HostEntry& e = *entries[i];
    if (!results[i]) {
      unanswered.push_back(e.name);
    } else if (results[i]->result == NameLookup::Result::unknown) {
      unknown.push_back(fmt::format("{}: host '{}' is not a known host name ({})", listed_at(hosts, e),
                                    excerpt(e.name, 200), results[i]->detail));
    } else if (results[i]->result == NameLookup::Result::failed) {
      warnings.push_back(fmt::format("{}: host '{}' could not be looked up ({}); starting the job anyway",
                                     listed_at(hosts, e), excerpt(e.name, 200), results[i]->detail));
    }
  }
  if (!unknown.empty()) {
    std::string text = unknown.size() == 1 ? unknown.front() : fmt::format("{} hosts are not known host names:", unknown.size());
    if (unknown.size() > 1) {
      for (size_t i = 0; i < unknown.size() && i < 8; ++i) text += "\n  " + unknown[i];
      if (unknown.size() > 8) text += fmt::format("\n  and {} more", unknown.size() - 8);
    }
    throw InputError(text + (unknown.size() == 1 ? "; " : "\n") +
                     "fix the name, or make it resolvable on this machine (DNS, /etc/hosts), or give "
                     "--skip-host-lookup if only the launch agent knows it (an ssh alias, a container)");
  }
  if (!unanswered.empty()) {
    std::string names;
    for (size_t i = 0; i < unanswered.size() && i < 8; ++i) names += (i ? ", " : "") + unanswered[i];
    if (unanswered.size() > 8) names += fmt::format(" and {} more", unanswered.size() - 8);
    warnings.push_back(fmt::format("no answer from the name resolver within {} s for {} host{} ({}); starting "
                                   "the job anyway",
                                   std::chrono::duration_cast<std::chrono::seconds>(limit).count(),
                                   unanswered.size(), unanswered.size() == 1 ? "" : "s", names));
  }
  return warnings;
}

}  // namespace tnt::launcher
