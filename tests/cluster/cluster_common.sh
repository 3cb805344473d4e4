# Shared by the cluster tests (sourced, not run): each test makes its own test bed of hosts
# in network namespaces (scripts/testbed), runs jobs on it over real TCP, and removes it,
# whatever happens (a trap). Every wait is bounded; only the test bed's addresses and
# loopback are ever contacted. They need root; where namespaces (or SLURM) cannot be
# started they fail, they never skip.
#
#   source cluster_common.sh LAUNCHER FASHION_MNIST [RESNET50]
#   cl_up N                        hosts h1..hN (the trap takes them down again)
#   cl_run NAME ON LIMIT LAUNCHER_ARGS... -- PROGRAM_ARGS...
#        runs LAUNCHER with fashion_mnist on host ON (h1, ...; "here" for this machine's
#        own namespace, where every host is remote) -> $cl_rc, $cl_out, $cl_seconds
set -uo pipefail

[[ $# -ge 2 ]] || { echo "usage: $0 LAUNCHER FASHION_MNIST [RESNET50]" >&2; exit 2; }
cl_launcher=$1
cl_program=$2
cl_resnet50=${3:-}
shift 2
[[ $# -gt 0 ]] && shift
for f in "$cl_launcher" "$cl_program"; do
  [[ -x $f ]] || { echo "FAIL: $f is not an executable (build tarantella_launcher and fashion_mnist)" >&2; exit 1; }
done
cl_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cl_testbed=$cl_root/scripts/testbed
cl_agent=$("$cl_testbed" agent)
cl_data=${TNT_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The ranks' threads: 1 each (the machine may have 2 cores for all hosts together).
cl_launch=(-x TNT_NUM_THREADS=1 --launch-agent "$cl_agent")
cl_wrap=()
cl_failures=0
cl_tmp=$(mktemp -d "${TMPDIR:-/tmp}/tnt_cluster.XXXXXX")
chmod 755 "$cl_tmp"

cl_fail() {
  echo "FAIL: $*"
  cl_failures=$((cl_failures + 1))
}
cl_pass() { echo "ok: $*"; }

cl_lock_pid=""
cl_cleanup() {
  if [[ -n $cl_lock_pid ]]; then
    "$cl_testbed" down || echo "testbed down failed" >&2
    kill "$cl_lock_pid" 2>/dev/null  # releases the test bed to the next test
  fi
  rm -rf "$cl_tmp"
}
trap cl_cleanup EXIT

cl_finish() {
  if [[ $cl_failures -gt 0 ]]; then
    echo "$cl_failures check(s) failed"
    exit 1
  fi
  echo "all checks passed"
  exit 0
}

# Fatal: the test cannot go on.
cl_abort() {
  echo "FAIL: $*"
  exit 1
}

# One test bed per machine: CTest runs these tests one at a time (RESOURCE_LOCK), and this
# lock keeps out the tests of another build or checkout running beside them. It is held by
# a process of this test's own, which nothing the test starts inherits it from, and which
# lets go within a second of the test's end, however the test ends (killed by a CTest
# timeout too: the next test's `testbed up` then removes what it left).
cl_lock() {
  local test_pid=$$
  (
    exec 9>/run/tnt-testbed.lock
    flock -w 300 9 || exit 1
    echo locked
    while kill -0 "$test_pid" 2>/dev/null; do sleep 1; done
  ) >"$cl_tmp/lock" 2>&1 &
  cl_lock_pid=$!
  local end=$((SECONDS + 310))
  while ((SECONDS < end)); do
    grep -q locked "$cl_tmp/lock" 2>/dev/null && return 0
    kill -0 "$cl_lock_pid" 2>/dev/null || break
    sleep 0.2
  done
  cl_abort "another test bed held /run/tnt-testbed.lock for 300 s"
}

cl_up() {
  [[ $(id -u) -eq 0 ]] || cl_abort "the cluster tests need root (network namespaces, veth devices, /etc/hosts)"
  cl_lock
  "$cl_testbed" up "$1" || cl_abort "cannot make a test bed of $1 hosts (scripts/testbed up $1)"
  for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    [[ -f $cl_data/$f.gz || -f $cl_data/$f ]] || cl_abort "$cl_data/$f(.gz) not found: install dataset-fashion-mnist"
  done
}

# cl_run NAME ON LIMIT LAUNCHER_ARGS... -- PROGRAM_ARGS...
cl_run() {
  local name=$1 on=$2 limit=$3
  shift 3
  local largs=()
  while [[ $# -gt 0 && $1 != "--" ]]; do
    largs+=("$1")
    shift
  done
  [[ $# -gt 0 ]] && shift
  local where=()
  [[ $on != here ]] && where=("$cl_testbed" exec "$on")
  # cl_wrap: a command the launcher runs under (set by a test, empty by default).
  where=(${cl_wrap[@]+"${cl_wrap[@]}"} ${where[@]+"${where[@]}"})
  echo "+ [$on] tarantella ${largs[*]} -- fashion_mnist $*"
  local start
  start=$(date +%s.%N)
  timeout -k 5 "$limit" "${where[@]}" "$cl_launcher" "${largs[@]}" -- "$cl_program" "$@" </dev/null \
    >"$cl_tmp/$name.out" 2>&1
  cl_rc=$?
  cl_seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  cl_out=$(cat "$cl_tmp/$name.out")
  echo "--- $name: exit status $cl_rc after ${cl_seconds}s:"
  grep -v '^ *$' "$cl_tmp/$name.out" | tail -n 40
  echo "---"
  [[ $cl_rc -eq 124 || $cl_rc -eq 137 ]] && cl_fail "$name: still running after ${limit}s (a hang)"
  return 0
}

# Processes on the hosts now ("pid host comm" lines), SLURM's daemons left out.
cl_host_processes() {
  local pid host comm
  "$cl_testbed" pids | while read -r pid host; do
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
    [[ $comm == slurmd ]] && continue
    echo "$pid $host $comm"
  done
}

# Waits (at most $1 s) until no process is left on any host; fails NAME otherwise.
cl_expect_no_processes() {
  local limit=$1 name=$2 left=""
  local end=$((SECONDS + limit))
  while ((SECONDS <= end)); do
    left=$(cl_host_processes)
    [[ -z $left ]] && break
    sleep 0.5
  done
  if [[ -z $left ]]; then
    cl_pass "$name: no process left on any host"
  else
    cl_fail "$name: processes still on the hosts after ${limit}s:"
    echo "$left" | while read -r pid host comm; do
      echo "  $host: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-160) (pid $pid)"
    done
  fi
}

# cl_expect_contains NAME TEXT WHAT: the last run's output holds TEXT.
cl_expect_contains() {
  if grep -qF -- "$2" <<<"$cl_out"; then
    cl_pass "$1: $3"
  else
    cl_fail "$1: the output does not contain '$2' ($3)"
  fi
}

cl_expect_lacks() {
  if grep -qF -- "$2" <<<"$cl_out"; then
    cl_fail "$1: the output contains '$2' ($3)"
  else
    cl_pass "$1: $3"
  fi
}

cl_expect_exit() {  # NAME WANT
  if [[ $cl_rc -eq $2 ]]; then cl_pass "$1: exit status $2"; else cl_fail "$1: exit status $cl_rc, expected $2"; fi
}

# cl_same_weights NAME DIR_A DIR_B: the two runs' checkpoints are bitwise the same.
cl_same_weights() {
  local a=$2/checkpoint.safetensors b=$3/checkpoint.safetensors
  if [[ ! -f $a || ! -f $b ]]; then
    cl_fail "$1: a checkpoint is missing ($a, $b)"
  elif cmp -s "$a" "$b"; then
    cl_pass "$1: the weights are bitwise the same"
  else
    cl_fail "$1: the weights differ ($a, $b)"
  fi
}

# The PIDs of the fashion_mnist programs on HOST.
cl_programs_on() {
  cl_host_processes | awk -v h="$1" '$2 == h && $3 == "fashion_mnist" { print $1 }'
}

# Waits (at most $2 s) until HOST runs at least $3 (default 1) fashion_mnist programs.
cl_wait_for_programs() {
  local host=$1 limit=$2 want=${3:-1}
  local end=$((SECONDS + limit))
  while ((SECONDS <= end)); do
    [[ $(cl_programs_on "$host" | wc -l) -ge $want ]] && return 0
    sleep 0.1
  done
  return 1
}
