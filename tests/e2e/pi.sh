#!/usr/bin/env bash
# examples/pi through the launcher.
#
#   pi.sh LAUNCHER PI CASE
#
# CASE:
#   ranks: the same samples on 1, 2 and 3 ranks (-np N) print the same estimate, bit for bit
#     (each sample is drawn at its own counter, whichever rank draws it; the count inside is
#     an integer), and that estimate is within 5 standard errors of pi. The standard error of
#     4 * inside / N is 4 sqrt(q (1 - q) / N) with q = pi/4, 1.64 / sqrt(N): 8.2e-4 for the
#     4,000,000 samples here, so the bound is 4.1e-3. A fixed seed makes the run repeatable;
#     for a random seed, a correct program would exceed 5 standard errors once in about 1.7
#     million runs, while a wrong share (a sample drawn twice, or skipped) breaks the bitwise
#     equality and a wrong formula misses by far more.
#   bad_flags: an unknown flag, a value that is not a whole number, --samples=0 and a missing
#     value each end the job on 2 ranks with exit status 2 and one line naming the flag; an
#     output that cannot be written (/dev/full) ends it with exit status 1, naming it.
set -uo pipefail
[[ $# -eq 3 ]] || { echo "usage: $0 LAUNCHER PI CASE" >&2; exit 2; }
launcher=$1
pi=$2
case_name=$3
for f in "$launcher" "$pi"; do
  [[ -x "$f" ]] || { echo "FAIL: $f is not an executable (build tarantella_launcher and pi)" >&2; exit 1; }
done
# 4e6 samples take about 0.1 s; a run longer than this is a hang.
limit=${TNT_E2E_TIMEOUT:-60}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tnt_pi_e2e.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# run NAME LAUNCHER_ARGS... -- PI_ARGS...: $rc, $out (stdout), $err (stderr).
run() {
  local name=$1
  shift
  local largs=()
  while [[ $# -gt 0 && $1 != "--" ]]; do largs+=("$1"); shift; done
  shift
  echo "+ $launcher ${largs[*]} -- $pi $*"
  timeout -k 10 "$limit" "$launcher" "${largs[@]}" -- "$pi" "$@" </dev/null >"$tmp/$name.out" 2>"$tmp/$name.err"
  rc=$?
  out=$(cat "$tmp/$name.out")
  err=$(cat "$tmp/$name.err")
  echo "--- exit status $rc; stdout:"
  echo "$out"
  echo "--- stderr:"
  echo "$err"
  echo "---"
}

case $case_name in
  ranks)
    samples=4000000
    declare -A estimate
    for p in 1 2 3; do
      run "np$p" -np "$p" -x TNT_NUM_THREADS=1 -- --samples=$samples --seed=7
      if [[ $rc -eq 0 ]]; then pass "$p rank(s): exit status 0"; else fail "$p rank(s): exit status $rc"; fi
      estimate[$p]=$(sed -n 's/^pi = \([0-9.]*\) .*/\1/p' <<<"$out")
      inside=$(sed -n 's/^samples: [0-9]* on [0-9]* ranks\{0,1\}, \([0-9]*\) inside, seed 7$/\1/p' <<<"$out")
      [[ -n ${estimate[$p]} && -n $inside ]] || { fail "$p rank(s): no 'pi = ...' and 'samples: ...' lines"; continue; }
      grep -qx "samples: $samples on $p rank$([[ $p -gt 1 ]] && echo s), $inside inside, seed 7" <<<"$out" &&
        pass "$p rank(s): the samples line names $samples samples and $p rank(s)" ||
        fail "$p rank(s): the samples line does not name $samples samples on $p rank(s)"
      grep -Eqx 'time: [0-9]+\.[0-9]{3} s' <<<"$out" && pass "$p rank(s): the time is printed" ||
        fail "$p rank(s): no 'time: S s' line"
      n=$(grep -c '^pi = ' <<<"$out")
      [[ $n -eq 1 ]] && pass "$p rank(s): the master alone prints" || fail "$p rank(s): 'pi = ' printed $n times"
    done
    for p in 2 3; do
      if [[ ${estimate[$p]:-x} == "${estimate[1]:-y}" ]]; then
        pass "$p ranks print the estimate of 1 rank, ${estimate[1]}"
      else
        fail "$p ranks print ${estimate[$p]:-nothing}, 1 rank ${estimate[1]:-nothing}: not the same samples"
      fi
    done
    if awk -v e="${estimate[1]:-0}" -v n=$samples 'BEGIN {
         pi = atan2(0, -1); se = sqrt(pi * (4 - pi) / n); d = e - pi; if (d < 0) d = -d; exit !(d <= 5 * se) }'; then
      pass "the estimate ${estimate[1]} is within 5 standard errors of pi"
    else
      fail "the estimate ${estimate[1]:-nothing} is not within 5 standard errors (4.1e-3) of pi"
    fi
    ;;

  bad_flags)
    # expect_refused MESSAGE PI_ARGS...: 2 ranks, exit 2, MESSAGE once on stderr.
    expect_refused() {
      local message=$1
      shift
      run bad -np 2 -x TNT_NUM_THREADS=1 -- "$@"
      [[ $rc -eq 2 ]] && pass "$*: exit status 2" || fail "$*: exit status $rc, expected 2"
      local n
      n=$(grep -cFx "pi: $message (see --help)" <<<"$err")
      [[ $n -eq 1 ]] && pass "$*: '$message' once" || fail "$*: '$message' printed $n times, expected once"
      [[ -z $out ]] && pass "$*: nothing on stdout" || fail "$*: something on stdout"
    }
    expect_refused "unknown flag '--sample'" --sample=10
    expect_refused "--samples=1e6: expected a whole number of points from 1 to 2^62" --samples=1e6
    expect_refused "--samples=0: expected a whole number of points from 1 to 2^62" --samples 0
    expect_refused "--seed=-1: expected a whole number from 0 to 2^64-1" --seed=-1
    expect_refused "--seed: missing its value" --seed
    expect_refused "unexpected argument 'many'" many
    # A bad TNT_* value, refused before the runtime starts: each rank's message is tagged
    # with its rank, so the launcher shows it once (before: an untagged line per rank).
    TNT_FUSION_THRESHOLD=abc run tnt_value -np 2 -- --samples=1000
    [[ $rc -eq 2 ]] && pass "TNT_FUSION_THRESHOLD=abc: exit status 2" || fail "TNT_FUSION_THRESHOLD=abc: exit status $rc, expected 2"
    n=$(grep -c "TNT_FUSION_THRESHOLD='abc'" <<<"$err")
    [[ $n -eq 1 ]] && pass "TNT_FUSION_THRESHOLD=abc: the message once" ||
      fail "TNT_FUSION_THRESHOLD=abc: the message $n times, expected once"
    grep -q "^error (rank [01] of 2): TNT_FUSION_THRESHOLD='abc'" <<<"$err" &&
      pass "TNT_FUSION_THRESHOLD=abc: tagged with its rank" || fail "TNT_FUSION_THRESHOLD=abc: no rank tag"
    # Output that cannot be written (a full disk) fails the program, naming it; before, the
    # estimate went nowhere and the exit status said success.
    echo "+ $pi --samples=1000 >/dev/full"
    timeout -k 10 "$limit" "$pi" --samples=1000 </dev/null >/dev/full 2>"$tmp/full.err"
    rc=$?
    cat "$tmp/full.err"
    [[ $rc -eq 1 ]] && pass "stdout on /dev/full: exit status 1" || fail "stdout on /dev/full: exit status $rc, expected 1"
    grep -q "^error: writing the program's standard output failed" "$tmp/full.err" &&
      pass "stdout on /dev/full: named" || fail "stdout on /dev/full: no message naming the failed output"
    run help -np 2 -- --help
    [[ $rc -eq 0 ]] && pass "--help: exit status 0" || fail "--help: exit status $rc"
    n=$(grep -c 'tarantella -np 4 -- build/bin/pi' <<<"$out")
    [[ $n -eq 1 ]] && pass "--help: printed once, with its example" || fail "--help: the example printed $n times"
    ;;

  *)
    echo "unknown case '$case_name'" >&2
    exit 2
    ;;
esac

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
