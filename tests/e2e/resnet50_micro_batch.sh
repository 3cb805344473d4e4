#!/usr/bin/env bash
# resnet50 --micro_batch_size through the launcher (synthetic data, image size 32).
#
#   resnet50_micro_batch.sh LAUNCHER RESNET50 NP
#
# On NP ranks, --micro_batch_size=2 trains on a global batch of 2 x NP: the start lines say
# so, the learning rate is the one of that global batch (0.1 per 256), and history.csv equals
# (bitwise, the seconds aside: losses, accuracies and learning rate) that of the same run with --batch_size=2xNP. --batch_size and
# --micro_batch_size that disagree are refused naming both, on every rank, with exit status
# 2; a negative --micro_batch_size likewise. --help explains the flag with an example.
set -uo pipefail
[[ $# -eq 3 ]] || { echo "usage: $0 LAUNCHER RESNET50 NP" >&2; exit 2; }
launcher=$1
program=$2
np=$3
for f in "$launcher" "$program"; do
  [[ -x "$f" ]] || { echo "FAIL: $f is not an executable" >&2; exit 1; }
done
# A 2-step run at image size 32 takes about 5 s on a busy 2-core machine; longer is a hang.
limit=${TNT_E2E_TIMEOUT:-120}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tnt_resnet50_micro.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

run() {
  echo "+ $launcher -n $np -x TNT_NUM_THREADS=1 -- $program $*"
  timeout -k 10 "$limit" "$launcher" -n "$np" -x TNT_NUM_THREADS=1 -- "$program" "$@" \
    </dev/null >"$tmp/stdout" 2>"$tmp/stderr"
  rc=$?
  out=$(cat "$tmp/stdout" "$tmp/stderr")
  echo "--- exit status $rc; stdout:"
  cat "$tmp/stdout"
  echo "--- stderr:"
  cat "$tmp/stderr"
  echo "---"
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then fail "did not finish within ${limit}s (a hang)"; fi
}

# history.csv without its seconds column (the last).
losses() { cut -d, -f1-8 "$1"; }

global=$((2 * np))
common=(--use_synthetic_data --image_size=32 --num_classes=10 --synthetic_eval_samples=8 --train_steps=2
        --synthetic_samples=$((4 * global)) --verbose=2)

run "${common[@]}" --micro_batch_size=2 --model_dir="$tmp/micro"
if [[ $rc -eq 0 ]]; then pass "--micro_batch_size=2 on $np ranks: exit 0"; else fail "--micro_batch_size=2: exit $rc"; fi
line="$np ranks, global batch $global (--micro_batch_size=2 x $np ranks), $((4 * global)) training samples per epoch (synthetic)"
if grep -qxF "$line" <<<"$out"; then pass "the global batch is 2 x $np"; else fail "no line '$line'"; fi
# The schedule follows the global batch (its values: history.csv's learning_rate, below).
if grep -Eq "^learning rate: [0-9.e-]+ \(0\.1 per 256 images, global batch $global\)" <<<"$out"; then
  pass "the learning rate is scaled to the global batch $global"
else
  fail "no 'learning rate: ... (0.1 per 256 images, global batch $global)' line"
fi

run "${common[@]}" --batch_size="$global" --model_dir="$tmp/global"
if [[ $rc -eq 0 ]]; then pass "--batch_size=$global: exit 0"; else fail "--batch_size=$global: exit $rc"; fi
if [[ -s $tmp/micro/history.csv ]] && [[ "$(losses "$tmp/micro/history.csv")" == "$(losses "$tmp/global/history.csv")" ]]; then
  pass "history.csv of --micro_batch_size=2 equals that of --batch_size=$global"
else
  fail "history.csv differs:"; cat "$tmp/micro/history.csv" "$tmp/global/history.csv" 2>/dev/null
fi

# Agreeing values are accepted.
run "${common[@]}" --batch_size="$global" --micro_batch_size=2 --model_dir="$tmp/both"
if [[ $rc -eq 0 ]]; then pass "--batch_size=$global --micro_batch_size=2 agree: exit 0"; else fail "agreeing flags: exit $rc"; fi

# expect_refusal MESSAGE ARGS...: exit 2, and MESSAGE after an "error (rank r of NP): " prefix.
expect_refusal() {
  local message=$1
  shift
  run "${common[@]}" --model_dir="$tmp/refused" "$@"
  if [[ $rc -eq 2 ]]; then pass "$*: exit status 2"; else fail "$*: exit status $rc, expected 2"; fi
  if grep -Eq "^error \(rank [0-9]+ of $np\): " <<<"$out" && grep -qF -- "$message" <<<"$out"; then
    pass "$*: '$message'"
  else
    fail "$*: no error line with '$message'"
  fi
  if [[ ! -e $tmp/refused/history.csv ]]; then pass "no history.csv"; else fail "history.csv written by a refused run"; fi
}
expect_refusal "--batch_size=$((global + 1)) and --micro_batch_size=2 disagree: on $np ranks the global batch is --micro_batch_size x ranks = $global; give one of the two" \
  --batch_size=$((global + 1)) --micro_batch_size=2
expect_refusal "--micro_batch_size=-1: must be positive (or 0: --batch_size alone)" --micro_batch_size=-1

# cxxopts wraps the help text: compared with its lines joined.
help=$("$program" --help 2>&1 | tr '\n' ' ' | tr -s ' ')
if grep -q -- "--micro_batch_size" <<<"$help" && grep -qF "e.g. tarantella -n 4 -- build/bin/resnet50 --use_synthetic_data --micro_batch_size=64" <<<"$help"; then
  pass "--help explains --micro_batch_size with an example"
else
  fail "--help has no --micro_batch_size with an example"
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
