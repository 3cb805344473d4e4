# shellcheck shell=bash disable=SC2034,SC2154
# (tmp and sample_s come from the caller; run_rc and smi_peak are for it.)
# Sourced by the GPU benchmarks (scripts/bench/resnet50_gpu, transformer_gpu): a run's peak
# GPU memory as nvidia-smi sees it, beside the allocator's peak the program prints itself.
# nvidia-smi is sampled in the background while the run lasts, and the run's processes (the
# command and its descendants, e.g. tarantella -> mpirun -> the rank) are summed per sample:
# that figure includes the CUDA context, cuDNN/cuBLAS workspaces and each allocator's cache,
# so it compares two frameworks like for like. Where nvidia-smi cannot see the processes (a
# PID namespace lists none of the run's pids), the device's used memory above its level just
# before the run is taken instead, marked "(dev)".
# The caller sets tmp (a folder for the outputs) and sample_s (seconds between samples), and
# calls gpu_memory_cleanup first in its EXIT trap.
#   run_measured NAME CMD...   runs CMD, output in $tmp/NAME.out; sets run_rc and smi_peak
#                              ("N" MiB of the run's processes, "N (dev)", or "n/a"); with
#                              stream_prefix set (for the call: stream_prefix=P run_measured
#                              ...), CMD's lines are also printed as they come, after P, so
#                              that a benchmark killed from outside has shown them
#   "${ours_timeout[@]}" CMD   CMD under `timeout -k 5 OURS_LIMIT` (default 90 s): how the
#                              benchmarks run our programs, so that a hang in a path never run
#                              on a GPU before ends as exit 124 (their FALLBACK follows) and
#                              leaves PyTorch's runs and the next items their time
#   program_peak_mib FILE      N of the program's last "peak GPU memory: N MiB" line, or ""
#   memory_ratio A B           A / B to 3 places ("(dev)" marks dropped), "n/a" if either
#                              is not a number
sampler_pid=""
streamer_pid=""
run_pid=""
ours_timeout=(timeout -k 5 "${OURS_LIMIT:-90}")

# Appends, every sample_s seconds: "T <MiB used on all GPUs>" and "A <pid> <MiB>" per process.
sample_gpu_memory() {
  while :; do
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null |
      awk '{s += $1} END {print "T", s + 0}' || true
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
      awk -F', *' '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {print "A", $1, $2}' || true
    sleep "$sample_s"
  done
}

# The pid and its descendants, one a line.
process_tree() {
  local p
  echo "$1"
  for p in $(pgrep -P "$1" 2>/dev/null); do process_tree "$p"; done
}

run_measured() {
  local name=$1
  shift
  local idle
  idle=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | awk '{s += $1} END {print s + 0}')
  # The file exists before the streamer below opens it (the run's redirection is the child's).
  : >"$tmp/$name.out"
  "$@" </dev/null >"$tmp/$name.out" 2>&1 &
  local pid=$!
  run_pid=$pid
  if [[ -n "${stream_prefix:-}" ]]; then
    # Follows the output until the run's process is gone, then prints the rest and ends.
    tail -n +1 -s 0.5 -f --pid="$pid" "$tmp/$name.out" 2>/dev/null |
      awk -v p="$stream_prefix" '{print p $0; fflush()}' &
    streamer_pid=$!
  fi
  : >"$tmp/$name.smi"
  : >"$tmp/$name.pids"
  sample_gpu_memory >>"$tmp/$name.smi" &
  sampler_pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    process_tree "$pid" >>"$tmp/$name.pids"
    sleep "$sample_s"
  done
  run_rc=0
  wait "$pid" || run_rc=$?
  run_pid=""
  kill "$sampler_pid" 2>/dev/null || true
  wait "$sampler_pid" 2>/dev/null || true
  sampler_pid=""
  if [[ -n "$streamer_pid" ]]; then
    wait "$streamer_pid" 2>/dev/null || true
    streamer_pid=""
  fi
streamer_pid=""
run_pid=""
ours_timeout=(timeout -k 5 "${OURS_LIMIT:-90}")
  # The run's processes summed per sample (a sample starts at each "T" line); the largest sum.
  smi_peak=$(awk -v idle="$idle" '
    FILENAME == ARGV[1] {mine[$1] = 1; next}
    $1 == "T" {n++; if ($2 - idle > dev) dev = $2 - idle; next}
    $1 == "A" && ($2 in mine) {sum[n] += $3; seen = 1}
    END {
      if (seen) {for (i in sum) if (sum[i] > best) best = sum[i]; print best}
      else if (n > 0 && dev > 0) print dev " (dev)"
      else print "n/a"
    }' "$tmp/$name.pids" "$tmp/$name.smi")
}

program_peak_mib() {
  sed -nE 's/^peak GPU memory: ([0-9.]+) MiB.*/\1/p' "$1" | tail -n 1
}

memory_ratio() {
  awk -v a="${1% (dev)}" -v b="${2% (dev)}" 'BEGIN {
    if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && b > 0) printf "%.3f", a / b; else printf "n/a"
  }'
}

# A background subshell killed right after its fork can still run the caller's EXIT trap:
# returns non-zero there, so that only the script itself cleans up. The process's own id is
# read from /proc: in such a subshell, bash's BASHPID can still give the parent's id (seen
# with bash 5.2: the sampler, killed as it started, removed the run's folder).
gpu_memory_cleanup() {
  local self
  read -r self _ </proc/self/stat || return 1
  [[ $self == "$$" ]] || return 1
  # Stopped from outside: a second TERM (timeout passes its own on to the whole group) must
  # not end the clean-up halfway, nor must a write to a reader that is gone already (SIGPIPE);
  # the commands of the clean-up (rm) inherit the same.
  trap '' TERM INT PIPE
  if [[ -n "$sampler_pid" ]]; then kill "$sampler_pid" 2>/dev/null || true; fi
  # A run still going (the benchmark was stopped from outside): the run and, where it is
  # under ours_timeout (its own process group), everything it started.
  if [[ -n "$run_pid" ]]; then
    kill -TERM -- "-$run_pid" 2>/dev/null || true
    kill -TERM "$run_pid" 2>/dev/null || true
  fi
  if [[ -n "$streamer_pid" ]]; then kill "$streamer_pid" 2>/dev/null || true; fi
  return 0
}
