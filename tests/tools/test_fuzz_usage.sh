#!/usr/bin/env bash
# scripts/fuzz refuses bad arguments before it builds or starts anything: exit 2 and a message
# naming the argument. Runs no fuzzer (FUZZ_BUILD_DIR points at an empty folder that must stay
# empty); each call is bounded at 20 s, so a check that lets bad input through fails here
# quickly instead of building the fuzz tree.
set -uo pipefail
root=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
expect_usage() {  # expect_usage WORD-IN-MESSAGE ENV... -- ARGS...
  local word=$1 envs=()
  shift
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  local out rc
  # Bounded: a check that lets bad input through would go on to build the fuzz tree.
  out=$(timeout 20 env "${envs[@]}" FUZZ_BUILD_DIR="$tmp/build" "$root/scripts/fuzz" "$@" 2>&1)
  rc=$?
  if [[ $rc -ne 2 || "$out" != *"$word"* ]]; then
    echo "FAIL: ${envs[*]} scripts/fuzz $*: rc=$rc, wanted 2 and a message with '$word'; got: $out"
    fails=$((fails + 1))
  fi
}
expect_usage "seconds" -- 0 bleu
expect_usage "seconds" -- abc
expect_usage "unknown target 'nope'" -- 5 nope
expect_usage "FUZZ_RUNS" FUZZ_RUNS=many -- 5 bleu
expect_usage "FUZZ_TIMEOUT" FUZZ_TIMEOUT=0 -- 5 bleu
expect_usage "FUZZ_TIMEOUT" FUZZ_TIMEOUT=1.5 -- 5 bleu
[[ -e "$tmp/build" ]] && { echo "FAIL: a refused run created its build folder"; fails=$((fails + 1)); }
[[ $fails -eq 0 ]] && echo "scripts/fuzz usage errors: all refused with exit 2"
exit $((fails > 0))
