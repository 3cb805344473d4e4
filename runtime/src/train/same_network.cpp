// The ranks' agreement on their networks before tensors go out one by one, and the master's
// buffers on every rank before an evaluation (train/same_network.hpp).
#include "train/same_network.hpp"

#include "comm/agreement.hpp"
#include "tarantella/check.hpp"
#include "tarantella/runtime.hpp"

#include <fmt/format.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tnt {

namespace detail {

namespace {

void require_same_entries(Communicator& comm, std::vector<std::string> entries, const std::string& what) {
  entries.push_back(fmt::format("{} tensors in all", entries.size()));
  if (std::optional<Disagreement> d = find_disagreement(comm, entries)) {
    TNT_INPUT_ERROR("{}: the ranks built different networks (tensor {}: {}); every rank must build the same model "
                    "(the same program and flags on every rank; layers left unnamed are numbered in the order a "
                    "process builds them)",
                    what, d->entry + 1, d->describe());
  }
}

}  // namespace

void require_same_network(Communicator& comm, Network& network, const std::string& what) {
  if (comm.size() < 2) return;
  std::vector<std::string> entries;
  auto add = [&](const char* kind, const std::vector<NamedParameter>& list) {
    for (const NamedParameter& p : list) {
      entries.push_back(fmt::format("{} '{}' {} {}", kind, p.name, shape_str(p.param->value.shape()),
                                    dtype_name(p.param->value.dtype())));
    }
  };
  add("parameter", network.named_parameters());
  add("buffer", network.named_buffers());
  require_same_entries(comm, std::move(entries), what);
}

void require_same_tensors(Communicator& comm, const std::vector<std::pair<std::string, Tensor>>& tensors,
                          const std::string& what) {
  if (comm.size() < 2) return;
  std::vector<std::string> entries;
  for (const auto& [name, t] : tensors) {
    entries.push_back(fmt::format("'{}' {} {}", name, shape_str(t.shape()), dtype_name(t.dtype())));
  }
  require_same_entries(comm, std::move(entries), what);
}

void share_master_buffers(Communicator& comm, Network& network) {
  if (comm.size() < 2) return;
  // Through host memory: after parameter-server training the servers' buffers are on the
  // CPU and the workers' may be on a GPU, and one collective needs one kind on every rank.
  for (const NamedParameter& b : network.named_buffers()) broadcast_via_host(comm, b.param->value, master_rank());
}

void broadcast_via_host(Communicator& comm, Tensor& t, int root) {
  if (t.device().is_cpu()) {
    comm.broadcast(t, root);
    return;
  }
  Tensor host = t.to(Device::cpu());
  comm.broadcast(host, root);
  t.copy_from(host);
}

}  // namespace detail

}  // namespace tnt
