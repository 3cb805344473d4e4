#include "foreign_options.hpp"

#include <utility>

namespace tnt::launcher {

namespace {

// What the user may have meant, by the name without its dashes. The texts say which
// launcher the option is from and what does the same here.
constexpr std::string_view kPlacement =
    "tarantella places the ranks itself (a host's slots fill before the next host's) and binds them with "
    "--pin-to-socket; --dry-run prints the plan. Other mpirun options go through --mpi-args \"...\"";
constexpr std::string_view kTagged = "--output-on-all-devices shows every rank's output, each line tagged \"[rank R] \"";
constexpr std::string_view kOneCommand =
    "not needed: tarantella starts the ranks of every host from this one command (through mpirun), and rank 0's "
    "host is the first of --hostfile, -H or the SLURM allocation";
constexpr std::string_view kElastic =
    "tarantella has no elastic mode; --max-restarts K starts the whole job again after a failure, and the programs "
    "continue from their checkpoints";
constexpr std::string_view kNoTuning =
    "no such tuning here: each bucket of gradients (--fusion-threshold KB) is sent as soon as backward fills it";

constexpr std::pair<std::string_view, std::string_view> kHints[] = {
    // Open MPI's mpirun
    {"host", "mpirun's --host is -H/--hosts LIST here (-H node1,node2:4)"},
    {"machinefile", "the hosts' file is --hostfile FILE here"},
    {"default-hostfile", "the hosts' file is --hostfile FILE here"},
    {"map-by", kPlacement},
    {"rank-by", kPlacement},
    {"bind-to", kPlacement},
    {"cpus-per-proc", kPlacement},
    {"cpus-per-rank", kPlacement},
    {"report-bindings", kPlacement},
    {"rankfile", kPlacement},
    {"tag-output", kTagged},
    {"timestamp-output", kTagged},
    {"output-filename", kTagged},
    {"mca", "mpirun's MCA parameters go through --mpi-args \"--mca NAME VALUE\" (or OMPI_MCA_NAME=VALUE in the "
            "environment)"},
    {"gmca", "mpirun's MCA parameters go through --mpi-args \"--mca NAME VALUE\""},
    {"c", "the number of ranks in all is -np N here (mpirun's -c, -n and -np)"},
    {"N", "ranks per node are -n N here (Open MPI's -N)"},
    {"ppn", "ranks per node are -n N here (-ppn of MPICH and Intel MPI)"},
    {"allow-run-as-root", "not needed: tarantella passes it to mpirun when it runs as root"},
    {"prefix", "the Open MPI installation is chosen with --mpirun PATH (its mpirun)"},
    {"wdir", "the ranks start in tarantella's working directory: cd there first"},
    {"wd", "the ranks start in tarantella's working directory: cd there first"},
    {"envall", "every TNT_* variable of this environment reaches the ranks, and -x KEY=VALUE adds others"},
    {"genvall", "every TNT_* variable of this environment reaches the ranks, and -x KEY=VALUE adds others"},
    {"verbose", "--log-level INFO (or DEBUG) says more"},
    {"v", "--log-level INFO (or DEBUG) says more"},
    {"timeout", "the job's limits are --start-timeout, --exit-timeout and --heartbeat-timeout (seconds)"},
    // horovodrun
    {"p", "horovodrun's ssh port is --launch-agent \"ssh -p PORT\" here"},
    {"ssh-port", "horovodrun's ssh port is --launch-agent \"ssh -p PORT\" here"},
    {"i", "horovodrun's ssh identity is --launch-agent \"ssh -i FILE\" here"},
    {"ssh-identity-file", "horovodrun's ssh identity is --launch-agent \"ssh -i FILE\" here"},
    {"gloo", "tarantella always starts the ranks through Open MPI's mpirun"},
    {"mpi", "tarantella always starts the ranks through Open MPI's mpirun"},
    {"network-interface", "the interface is chosen with --mpi-args \"--mca btl_tcp_if_include IFACE\" (and "
                          "-x NCCL_SOCKET_IFNAME=IFACE on GPUs)"},
    {"network-interfaces", "the interface is chosen with --mpi-args \"--mca btl_tcp_if_include IFACE\" (and "
                           "-x NCCL_SOCKET_IFNAME=IFACE on GPUs)"},
    {"fusion-threshold-mb", "the fusion threshold is --fusion-threshold KB here (64 MB is 65536)"},
    {"autotune", "--fusion-threshold auto chooses the threshold from the first steps"},
    {"cycle-time-ms", kNoTuning},
    {"cache-capacity", kNoTuning},
    {"hierarchical-allreduce", kNoTuning},
    {"timeline-filename", "the timeline is --timeline FILE here (a Chrome trace)"},
    {"min-np", kElastic},
    {"max-np", kElastic},
    {"host-discovery-script", kElastic},
    {"slots-per-host", "ranks per node are -n N here"},
    // torchrun
    {"nproc_per_node", "torchrun's ranks per node are -n N here"},
    {"nproc-per-node", "torchrun's ranks per node are -n N here"},
    {"nnodes", "the nodes are the hosts of --hostfile, -H or the SLURM allocation, all started from this command"},
    {"node_rank", kOneCommand},
    {"node-rank", kOneCommand},
    {"master_addr", kOneCommand},
    {"master-addr", kOneCommand},
    {"rdzv_endpoint", kOneCommand},
    {"rdzv-endpoint", kOneCommand},
    {"standalone", kOneCommand},
    {"max_restarts", "restarts are --max-restarts K here"},
    {"ntasks", "srun's tasks in all are -np N here"},
    {"npersocket", kPlacement},
    {"nolocal", "tarantella runs ranks on the hosts it is given; leave this machine out of --hostfile or -H"},
    {"nooversubscribe", "-np N more than the hosts' slots is refused unless --oversubscribe is given"},
    {"novm", "not needed: tarantella starts the ranks through mpirun, one daemon a host"},
    {"nodelist", "srun's nodes are -H LIST (or --hostfile FILE) here"},
};

// Those whose several spellings share a prefix (--master_port, --rdzv-backend, ...).
constexpr std::pair<std::string_view, std::string_view> kPrefixHints[] = {
    {"master_", kOneCommand},
    {"master-", kOneCommand},
    {"rdzv", kOneCommand},
    {"ntasks-per-node", "srun's tasks per node are -n N here"},
    {"ntasks-per-", "srun's tasks per socket, core or GPU: -n N ranks per node here, and --pin-to-socket binds "
                    "each to a socket (NUMA node)"},
};

}  // namespace

std::optional<std::string> foreign_option_hint(std::string_view word) {
  size_t dashes = 0;
  while (dashes < word.size() && dashes < 2 && word[dashes] == '-') ++dashes;
  if (dashes == 0) return std::nullopt;
  std::string_view name = word.substr(dashes);
  name = name.substr(0, name.find('='));
  // A single dash and one letter is a short option ("-p 22"); a single dash and more is
  // mpirun's long option with one dash ("-mca", "-map-by"), never letters run together.
  if (name.empty()) return std::nullopt;
  for (const auto& [key, hint] : kHints) {
    if (name == key) return std::string(hint);
  }
  for (const auto& [prefix, hint] : kPrefixHints) {
    if (name.substr(0, prefix.size()) == prefix) return std::string(hint);
  }
  return std::nullopt;
}

}  // namespace tnt::launcher
