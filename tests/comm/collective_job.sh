#!/usr/bin/env bash
# A collective called on some ranks only, as a whole job under mpirun (collective_job.cpp):
# the job must end by itself, fast (well inside TNT_COLLECTIVE_TIMEOUT=600), with a non-zero
# exit, a message that names the call and the fix, and no rank left behind. Also
# TNT_COLLECTIVE_TIMEOUT=0 (no timeout: a late rank is waited for) and values that are
# refused on every rank.
#
#   collective_job.sh CASE NP PROGRAM MPIRUN [MPIRUN FLAGS...]
#   CASE: master_callback, master_save, master_save_midway, master_allreduce, master_evaluate, timeout_zero,
#   bad_timeout
set -uo pipefail
[[ $# -ge 4 ]] || { echo "usage: $0 CASE NP PROGRAM MPIRUN [FLAGS...]" >&2; exit 2; }
case_name=$1
np=$2
program=$3
shift 3
mpirun=("$@")
[[ -x "$program" ]] || { echo "FAIL: $program is not an executable (build test_comm_collective_job)" >&2; exit 1; }

# Not a speed claim: a bound that tells "failed at once" (a few seconds: start-up, the
# 1.5 s grace of the mismatch check, a loaded 2-core machine) from "waited for the 600 s
# timeout".
fast_s=30
# Beyond this the job is hung; the test fails instead of waiting for CTest's own limit.
limit_s=120

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tnt_collective_job.XXXXXX")
failures=0
wrap=()  # a command around each rank (bad_timeout)
# Every rank's command line names $tmp: a process that still shows it after mpirun
# returned is a rank left behind.
strays() { pgrep -f -- "$tmp" || true; }
cleanup() {
  local pids
  pids=$(strays)
  [[ -n "$pids" ]] && kill -9 $pids 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
pass() { echo "ok: $*"; }

# run NAME TIMEOUT_VALUE PROGRAM_CASE -> $rc, $out, $errors (the "error ..." lines), $seconds
run() {
  local name=$1 timeout_value=$2 program_case=$3
  echo "+ TNT_COLLECTIVE_TIMEOUT=$timeout_value ${mpirun[*]} -np $np ${wrap[*]} $program $program_case $tmp/weights.safetensors"
  local start end
  start=$(date +%s.%N)
  out=$(TNT_COLLECTIVE_TIMEOUT=$timeout_value timeout -k 10 "$limit_s" "${mpirun[@]}" -np "$np" \
          "${wrap[@]}" "$program" "$program_case" "$tmp/weights.safetensors" </dev/null 2>&1)
  rc=$?
  end=$(date +%s.%N)
  seconds=$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')
  errors=$(grep -E '^error' <<<"$out")
  echo "--- $name: exit status $rc after ${seconds}s; output:"
  echo "$out"
  echo "---"
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    fail "$name: did not end within ${limit_s}s (a hang)"
  fi
  local pids=""
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(strays)
    [[ -z "$pids" ]] && break
    sleep 0.5
  done
  if [[ -n "$pids" ]]; then
    fail "$name: ranks still running after mpirun returned: $pids"
  fi
  if grep -Eq 'terminate called|Segmentation fault|core dumped' <<<"$out"; then
    fail "$name: a crash instead of an error message"
  fi
}

expect_fast_failure() {
  if [[ $rc -eq 0 ]]; then
    fail "$1: exit status 0, expected non-zero"
  else
    pass "$1: exit status $rc"
  fi
  if awk -v s="$seconds" -v m="$fast_s" 'BEGIN {exit !(s < m)}'; then
    pass "$1: ended after ${seconds}s (< ${fast_s}s, with TNT_COLLECTIVE_TIMEOUT=600)"
  else
    fail "$1: ended after ${seconds}s, not within ${fast_s}s: it waited for a timeout"
  fi
}

# expect_error NAME STRING: an error line holds the literal string.
expect_error() {
  if grep -Fq -- "$2" <<<"$errors"; then
    pass "$1: the error names '$2'"
  else
    fail "$1: no error line holds '$2'"
  fi
}

case $case_name in
  master_callback)
    run "$case_name" 600 master_callback
    expect_fast_failure "$case_name"
    expect_error "$case_name" "save_weights is a collective"
    expect_error "$case_name" "callback 'MasterSaver'"
    expect_error "$case_name" "Callback::Ranks::all"
    # Refused before anything was done: no file.
    if [[ -e $tmp/weights.safetensors ]]; then
      fail "$case_name: the master wrote the weights file before refusing"
    else
      pass "$case_name: nothing written"
    fi
    ;;
  master_allreduce)
    run "$case_name" 600 master_allreduce
    expect_fast_failure "$case_name"
    expect_error "$case_name" "the ranks called different collectives"
    expect_error "$case_name" "allreduce_sum(2 value(s))"
    expect_error "$case_name" "allreduce(ring, 4 x f32)"
    expect_error "$case_name" "Callback::Ranks::all"
    ;;
  master_evaluate)
    # evaluate() on the master only: the other ranks end their program (in MPI_Finalize,
    # Open MPI's fence) while the master waits in evaluate's first collective. Before,
    # the master waited for the whole timeout and then called them "unreachable".
    run "$case_name" 600 master_evaluate
    expect_fast_failure "$case_name"
    expect_error "$case_name" "finished the program without calling it, and never will"
    expect_error "$case_name" "finished its program (in tnt::finalize; last collective: #"
    expect_error "$case_name" "Callback::Ranks::all"
    ;;
  out_of_memory)
    # std::bad_alloc on the master: named as what it is, with what to look at, and the job
    # ends (before: "error: std::bad_alloc").
    run "$case_name" 600 out_of_memory
    expect_fast_failure "$case_name"
    expect_error "$case_name" "out of host memory: an allocation failed (std::bad_alloc)"
    ;;
  no_threads)
    # A thread that cannot be started (the process and thread limit): named, with the limit
    # and what needs fewer (before: "Resource temporarily unavailable" alone).
    run "$case_name" 600 no_threads
    expect_fast_failure "$case_name"
    expect_error "$case_name" "a thread could not be started (Resource temporarily unavailable): this user's limit on processes and threads"
    expect_error "$case_name" "compute threads (TNT_NUM_THREADS)"
    ;;
  master_save_midway)
    # save_weights under is_master_rank() between two fits: the collectives complete, paired
    # wrongly, and the values they carry are garbage. Before: "fit: micro_batch_size=0,
    # 6734557811357791880 (ranks 0 to 1) disagrees with batch_size=16", a usage error.
    run "$case_name" 600 master_save_midway
    expect_fast_failure "$case_name"
    expect_error "$case_name" "because they called different collectives"
    expect_error "$case_name" "in save_weights"
    expect_error "$case_name" "Callback::Ranks::all"
    if grep -q "disagrees with" <<<"$errors"; then fail "$case_name: the garbage values are shown"; else pass "$case_name: no garbage values"; fi
    ;;
  master_save)
    # save_weights under is_master_rank(): the master's broadcasts meet the others' first
    # collective of fit (the check that every rank built the same network), which fails at
    # once; the message must say why.
    run "$case_name" 600 master_save
    expect_fast_failure "$case_name"
    expect_error "$case_name" "called different collectives: as collective #1, rank(s) 0 called broadcast(root 0, 1 x i64, cpu) in save_weights"
    expect_error "$case_name" "Callback::Ranks::all"
    ;;
  timeout_zero)
    # 0 = no timeout: the last rank's 2 s delay is waited for, and the job succeeds.
    run "$case_name" 0 late_rank
    if [[ $rc -eq 0 ]]; then pass "$case_name: exit status 0"; else fail "$case_name: exit status $rc"; fi
    n=$(grep -c "^late_rank: rank [0-9]* of $np, timeout 0 s, sum $np\$" <<<"$out")
    if [[ $n -eq $np ]]; then
      pass "$case_name: all $np ranks waited (timeout 0) and summed $np"
    else
      fail "$case_name: $n of $np ranks reported the sum $np with timeout 0"
    fi
    ;;
  bad_timeout)
    # Each rank must refuse the value itself. mpirun stops the others when the first one
    # exits, which would hide their own messages, so it is told to let every rank end by
    # itself (its own exit status then says nothing), and each rank's status is printed by
    # a shell around it.
    mpirun+=(--mca orte_abort_on_non_zero_status 0)
    wrap=(bash -c '"$0" "$@"; echo "status of a rank: $?"')
    for value in -1 soon nan; do
      run "$case_name $value" "$value" late_rank
      # 2: a refused input (tnt::run_main), which a restart would not mend.
      n=$(grep -c "^status of a rank: 2\$" <<<"$out")
      if [[ $n -eq $np ]]; then
        pass "$case_name $value: every rank ($np) exits with status 2"
      else
        fail "$case_name $value: $n of $np ranks exit with status 2"
      fi
      n=$(grep -Fc -- "TNT_COLLECTIVE_TIMEOUT='$value' is not a non-negative number" <<<"$errors")
      if [[ $n -eq $np ]]; then
        pass "$case_name $value: every rank ($np) names the variable and the value"
      else
        fail "$case_name $value: $n of $np ranks name TNT_COLLECTIVE_TIMEOUT='$value'"
      fi
    done
    ;;
  *)
    echo "unknown case $case_name" >&2
    exit 2
    ;;
esac

if [[ $failures -gt 0 ]]; then
  echo "$case_name: $failures check(s) failed"
  exit 1
fi
echo "$case_name: all checks passed"
