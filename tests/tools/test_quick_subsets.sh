#!/usr/bin/env bash
# The test subsets that scripts run instead of the whole suite keep the 3-rank variants of
# the ring allreduce and of an uneven global batch: on 2 ranks a ring has one neighbour on
# both sides and the test batches split evenly, so bugs there pass unseen.
#   test_quick_subsets.sh SOURCE_DIR BUILD_DIR
# Subsets: scripts/gpu-bundle's cpu_tests (the CPU tests of the GPU kit) and
# scripts/sanitize's tsan_tests (what ThreadSanitizer runs). The ASan pass and scripts/test
# run every CPU test.
set -uo pipefail
[[ $# -eq 2 ]] || { echo "usage: $0 SOURCE_DIR BUILD_DIR" >&2; exit 2; }
src=$1
build=$2
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# regex_of SCRIPT VAR: the value of the line VAR='...' in SCRIPT.
regex_of() { sed -n "s/^$2='\\(.*\\)'\$/\\1/p" "$1" | head -n 1; }

check() {  # NAME REGEX
  local name=$1 regex=$2 tests
  if [[ -z $regex ]]; then
    fail "$name: no regular expression found"
    return
  fi
  tests=$(cd "$build" && ctest -N -R "$regex" 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: //p')
  echo "$name ($regex): $(echo $tests)"
  # The ring allreduce on 3 ranks.
  if grep -qx 'comm_collectives\.np3' <<<"$tests"; then pass "$name: comm_collectives.np3"; else fail "$name: no comm_collectives.np3 (the ring on 3 ranks)"; fi
  # A global batch that 3 ranks do not divide: the model equals the serial one, or the
  # dataset's slices cover each global batch.
  if grep -Eqx 'train_model_parallel\.np3|data_distributed\.np3' <<<"$tests"; then
    pass "$name: an uneven batch on 3 ranks"
  else
    fail "$name: neither train_model_parallel.np3 nor data_distributed.np3 (an uneven batch on 3 ranks)"
  fi
}

check "scripts/gpu-bundle cpu_tests" "$(regex_of "$src/scripts/gpu-bundle" cpu_tests)"
check "scripts/sanitize tsan_tests" "$(regex_of "$src/scripts/sanitize" tsan_tests)"
if [[ $failures -gt 0 ]]; then echo "$failures check(s) failed"; exit 1; fi
echo "all checks passed"
