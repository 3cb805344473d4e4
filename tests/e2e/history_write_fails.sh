#!/usr/bin/env bash
# A run whose history.csv can no longer be written ends with an error naming the file, not
# with exit status 0 and a history that silently lost rows (issue 29). resnet50 without
# --enable_checkpoint_and_export writes nothing but history.csv, so no other write fails
# first. The write is made to fail as a full disk would: once the run has written its first
# row, its file size limit (RLIMIT_FSIZE, set from outside with prlimit, so that Open MPI's
# own start-up files are not limited) is put just above the file's size; SIGXFSZ is ignored,
# so the next row's write fails with EFBIG instead of killing the process.
#
#   history_write_fails.sh RESNET50
set -uo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 RESNET50" >&2; exit 2; }
program=$1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tnt_history_write.XXXXXX")
pid=
cleanup() {
  [[ -n $pid ]] && kill -9 "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
csv=$tmp/model/history.csv
# 1 process, 1 step of 4 images of 32x32 an epoch: rows come about every second on a busy
# 2-core machine; 400 epochs keep it running long past the limit.
(
  trap '' XFSZ
  "$program" --use_synthetic_data --image_size=32 --num_classes=2 --batch_size=4 --synthetic_samples=4 \
    --synthetic_eval_samples=4 --train_epochs=400 --verbose=0 --log_steps=0 --model_dir="$tmp/model"
  echo "exit status $?"
) </dev/null 2>&1 | cat >"$tmp/out" &
for _ in $(seq 50); do
  pid=$(pgrep -f -- "--model_dir=$tmp/model" | head -1)
  [[ -n $pid ]] && break
  sleep 0.1
done
for _ in $(seq 600); do [[ -s $csv ]] && break; sleep 0.1; done
if [[ ! -s $csv || -z $pid ]]; then
  echo "FAIL: no history row after 60 s (process '${pid}')"
  cat "$tmp/out"
  exit 1
fi
size=$(stat -c %s "$csv")
prlimit --pid "$pid" --fsize=$((size + 8)) || { echo "FAIL: prlimit on process $pid"; exit 1; }
for _ in $(seq 1200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
still_running=0
if kill -0 "$pid" 2>/dev/null; then
  still_running=1
  kill -9 "$pid"
fi
wait
cat "$tmp/out"
failures=0
status=$(sed -nE 's/^exit status ([0-9]+)$/\1/p' "$tmp/out")
if [[ $still_running -eq 1 ]]; then
  echo "FAIL: still running 120 s after the history could no longer grow"
  failures=1
elif [[ -z $status || $status -eq 0 ]]; then
  echo "FAIL: exit status '${status}', expected an error exit"
  failures=1
else
  echo "ok: exit status $status"
fi
if grep -qF "error: CSVLogger: writing epoch" "$tmp/out" && grep -qF "row to '$csv' failed: File too large" "$tmp/out"; then
  echo "ok: the run ended with an error naming history.csv and the reason"
else
  echo "FAIL: no 'error: CSVLogger: writing epoch N's row to '$csv' failed: File too large'"
  failures=1
fi
if grep -q "^Evaluation: top-1" "$tmp/out"; then
  echo "FAIL: the run went on to its final result"
  failures=1
fi
pid=
exit "$failures"
