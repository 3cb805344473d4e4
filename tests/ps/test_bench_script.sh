#!/usr/bin/env bash
# scripts/bench/parameter_server, tiny (1 round, 10 steps, 2 trainers): four CSV rows with a
# positive rate each, and the summary line with both ratios.
#   test_bench_script.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
out=$(BUILD_DIR=$2 timeout -k 5 200 "$1/scripts/bench/parameter_server" --trainers 2 --rounds 1 --steps 10) ||
  { echo "FAIL: scripts/bench/parameter_server exited $?"; exit 1; }
echo "$out"
rows=$(grep -Ec '^(synchronous|parameter_server),[^,]+,2,(-1|1),[0-9]+,[0-9]+,[0-9.]*[1-9][0-9.]*$' <<<"$out")
[[ $rows -eq 4 ]] || { echo "FAIL: $rows CSV rows with a positive rate, expected 4"; exit 1; }
grep -Eq '^asynchronous / synchronous: [0-9.]+x without a slow trainer .*, [0-9.]+x with one' <<<"$out" ||
  { echo "FAIL: no summary line"; exit 1; }
echo "ok"
