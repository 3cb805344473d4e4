# Shared by the fashion_mnist end-to-end scripts (sourced, not run). Each script starts the
# program through the launcher (2 ranks, except where a case says otherwise) with a private
# temp dir on its command line; every command line it starts names that dir, so a process
# still running with the dir in its command line after the launcher returned is a stray
# rank left behind by the job.
#
#   source fashion_mnist_common.sh LAUNCHER PROGRAM
#   fm_run NAME [LAUNCHER ARGS...] -- [PROGRAM ARGS...]   -> $fm_rc, $fm_out (stdout+stderr),
#                                              $fm_err (the program's "error ..." lines),
#                                              $fm_stdout (the stdout file), $fm_seconds
set -uo pipefail

[[ $# -ge 2 ]] || { echo "usage: $0 LAUNCHER PROGRAM ..." >&2; exit 2; }
fm_launcher=$1
fm_program=$2
shift 2
for f in "$fm_launcher" "$fm_program"; do
  [[ -x "$f" ]] || { echo "FAIL: $f is not an executable (build the targets tarantella_launcher and fashion_mnist)" >&2; exit 1; }
done

# The Debian package dataset-fashion-mnist puts the four IDX files here; the program uses
# the same default.
fm_data=${TNT_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
# A run that takes longer than this is a hang. The slowest case (train 1 epoch on 256
# samples, validate and test on 10000) takes 3 to 6 s on a busy 2-core machine; the margin
# is for a loaded machine running other tests alongside.
fm_limit=${TNT_E2E_TIMEOUT:-60}

fm_tmp=$(mktemp -d "${TMPDIR:-/tmp}/tnt_fm_e2e.XXXXXX")
fm_failures=0

fm_strays() { pgrep -f -- "$fm_tmp" || true; }

fm_cleanup() {
  local pids
  pids=$(fm_strays)
  # Only processes of this test's own job carry its temp dir in their command line.
  [[ -n "$pids" ]] && kill -9 $pids 2>/dev/null
  rm -rf "$fm_tmp"
}
trap fm_cleanup EXIT

fm_fail() {
  echo "FAIL: $*"
  fm_failures=$((fm_failures + 1))
}

fm_pass() { echo "ok: $*"; }

# fm_run NAME LAUNCHER_ARGS... -- PROGRAM_ARGS...
fm_run() {
  local name=$1
  shift
  local largs=()
  while [[ $# -gt 0 && $1 != "--" ]]; do
    largs+=("$1")
    shift
  done
  [[ $# -gt 0 ]] && shift
  fm_stdout=$fm_tmp/$name.stdout
  local stderr=$fm_tmp/$name.stderr
  echo "+ $fm_launcher ${largs[*]} -- $fm_program $*"
  local start end
  start=$(date +%s.%N)
  # stdin from /dev/null and stdout to a file: the program must not see a terminal.
  timeout -k 10 "$fm_limit" "$fm_launcher" "${largs[@]}" -- "$fm_program" "$@" \
    </dev/null >"$fm_stdout" 2>"$stderr"
  fm_rc=$?
  end=$(date +%s.%N)
  fm_ended_at=$end  # for a case that times the job's end from an event of its own
  fm_seconds=$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')
  fm_out=$(cat "$fm_stdout" "$stderr")
  # The program reports a failure as "error: ..." or "error (rank r of p): ..."; matching
  # only those lines keeps a launcher or MPI line that echoes the command from passing.
  fm_err=$(grep -E '^error' <<<"$fm_out")
  echo "--- $name: exit status $fm_rc after ${fm_seconds}s; stdout:"
  cat "$fm_stdout"
  echo "--- $name: stderr:"
  cat "$stderr"
  echo "---"
  if [[ $fm_rc -eq 124 || $fm_rc -eq 137 ]]; then
    fm_fail "$name: did not finish within ${fm_limit}s (a hang)"
  fi
  fm_check_no_strays "$name"
}

fm_check_no_strays() {
  # mpirun reaps its ranks before it exits, but give a loaded machine a moment.
  local pids=""
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(fm_strays)
    [[ -z "$pids" ]] && break
    sleep 0.5
  done
  if [[ -n "$pids" ]]; then
    fm_fail "$1: processes still running after the launcher returned:"
    ps -o pid,ppid,etime,args -p "$(echo $pids | tr ' ' ,)" || true
  else
    fm_pass "$1: no stray processes"
  fi
}

# fm_expect_grep NAME EXTENDED_REGEX WHAT: an error line of the last run matches.
fm_expect_grep() {
  if grep -Eq -- "$2" <<<"$fm_err"; then
    fm_pass "$1: the error message names $3"
  else
    fm_fail "$1: no error line ('error ...') matches /$2/ ($3)"
  fi
}

# fm_expect_fixed NAME STRING WHAT: the same for a literal string (paths).
fm_expect_fixed() {
  if grep -Fq -- "$2" <<<"$fm_err"; then
    fm_pass "$1: the error message names $3"
  else
    fm_fail "$1: no error line ('error ...') contains '$2' ($3)"
  fi
}

fm_finish() {
  if [[ $fm_failures -gt 0 ]]; then
    echo "$fm_failures check(s) failed"
    exit 1
  fi
  echo "all checks passed"
  exit 0
}

fm_need_data() {
  local f
  for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    if [[ ! -f $fm_data/$f.gz && ! -f $fm_data/$f ]]; then
      echo "FAIL: $fm_data/$f(.gz) not found: install Debian's dataset-fashion-mnist or set TNT_FASHION_MNIST_DIR"
      exit 1
    fi
  done
}
