#!/usr/bin/env bash
# fashion_mnist on 2 ranks through the launcher with --enable_tensorboard and --timeline:
#   1. the event files in model_dir/train and model_dir/validation read back record by record
#      with read_tfevents.py (independent CRC-32C and protobuf decoding), and every value of
#      history.csv is in them (float32 against 6 significant digits: relative 1e-5);
#   2. the timeline (TNT_TIMELINE_STEPS=3-5) is JSON, has a row and events for each rank, only
#      steps 3-5, and no per-rank part is left;
#   3. a run killed (SIGKILL) in its fourth epoch leaves event files that read back whole,
#      with at least the first two epochs in them, and each rank's timeline part readable
#      (Chrome's array form without its closing bracket) with that rank's events;
#   4. a window the run never reaches (TNT_TIMELINE_STEPS=100-200, 2 steps run) is one warning
#      naming it, and leaves no file;
#   5. a run that trains no step says that nothing was recorded;
#   6. a trace path another job is writing now (its part locked) is refused, that part kept.
#   test_tensorboard_timeline_e2e.sh LAUNCHER FASHION_MNIST
set -uo pipefail
launcher=$1
program=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=${PYTHON:-python3}
limit=${TNT_E2E_TIMEOUT:-120}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tnt_tb_e2e.XXXXXX")
job_pid=""
cleanup() {
  [[ -n "$job_pid" ]] && kill -9 -- "-$job_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}

common=(--num_train_samples 1024 --batch_size 128 --verbose 0 --enable_tensorboard)

# --- 1 and 2: a whole run ------------------------------------------------------------------------
TNT_TIMELINE_STEPS=3-5 timeout -k 5 "$limit" "$launcher" --timeline "$tmp/trace.json" -n 2 -- \
  "$program" "${common[@]}" --train_epochs 2 --model_dir "$tmp/run" || fail "the run failed (status $?)"

"$py" - "$here/read_tfevents.py" "$tmp/run" "$tmp/trace.json" <<'EOF' || fail "checks of the run's files"
import csv, glob, json, os, subprocess, sys
reader, run, trace_path = sys.argv[1:4]

def events(split):
    files = glob.glob(os.path.join(run, split, "events.out.tfevents.*"))
    assert len(files) == 1, "%s: expected one event file, found %s" % (split, files)
    out = subprocess.run([sys.executable, reader, files[0]], capture_output=True, text=True)
    assert out.returncode == 0, "read_tfevents.py %s: %s" % (files[0], out.stdout + out.stderr)
    recs = [json.loads(line) for line in out.stdout.splitlines()]
    assert recs[0]["file_version"] == "brain.Event:2", recs[0]
    return {r["step"]: r["values"] for r in recs[1:]}

train, validation = events("train"), events("validation")
rows = list(csv.DictReader(open(os.path.join(run, "history.csv"))))
assert len(rows) == 2 and sorted(train) == [0, 1] and sorted(validation) == [0, 1], (rows, train, validation)
for row in rows:
    step = int(row["epoch"]) - 1
    for column, text in row.items():
        if column == "epoch":
            continue
        expected = float(text)
        split, tag = (validation, "epoch_" + column[4:]) if column.startswith("val_") else (train, "epoch_" + column)
        got = split[step].get(tag)
        assert got is not None, "epoch %d: %s not in the event file (%s)" % (step + 1, tag, split[step])
        # float32 in the file, 6 significant digits in the CSV
        assert abs(got - expected) <= 1e-5 * abs(expected) + 1e-12, (column, step, got, expected)
    for tag in ("epoch_step_time_ms", "epoch_samples_per_second", "epoch_hidden_communication"):
        assert tag in train[step], (tag, train[step])
    assert 0.0 <= train[step]["epoch_hidden_communication"] <= 1.0
print("event files: every history.csv value found; step time, samples/s, hidden fraction present")

trace = json.load(open(trace_path))
ev = trace["traceEvents"]
names = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
assert sorted(names) == [0, 1] and all(names[r].startswith("rank %d on " % r) for r in names), names
for r in (0, 1):
    mine = [e for e in ev if e["ph"] == "X" and e["pid"] == r]
    assert mine, "rank %d has no events" % r
    assert sorted({e["args"]["step"] for e in mine}) == [3, 4, 5], sorted({e["args"]["step"] for e in mine})
    assert any(e["name"] == "allreduce" and e["tid"] == 2 and e["args"]["bytes"] > 0 for e in mine)
assert not glob.glob(trace_path + ".rank*"), glob.glob(trace_path + ".rank*")
print("timeline: JSON, rows 'rank R on HOST', steps 3-5 only, allreduce events, parts removed")
EOF

# --- 3: killed in the fourth epoch ---------------------------------------------------------------
# The kill waits for history.csv's third row: an epoch's row comes before its TensorBoard
# events (CSVLogger, ModelCheckpoint, then TensorBoard), 12-22 ms before them measured at a
# load average of 10, so a kill at the second row could land before epoch 2's events were
# written; they are written before the third row.
TNT_TIMELINE_STEPS=1-100000 setsid "$launcher" --timeline "$tmp/killed_trace.json" -n 2 -- \
  "$program" "${common[@]}" --train_epochs 50 --model_dir "$tmp/killed" \
  >"$tmp/killed.log" 2>&1 &
job_pid=$!
for _ in $(seq 1 $((limit * 10))); do
  rows=$( (tail -n +2 "$tmp/killed/history.csv" 2>/dev/null || true) | wc -l)
  [[ $rows -ge 3 ]] && break
  kill -0 "$job_pid" 2>/dev/null || fail "the run ended before its third epoch: $(cat "$tmp/killed.log")"
  sleep 0.1
done
[[ $rows -ge 3 ]] || fail "no third epoch within ${limit}s"
kill -9 -- "-$job_pid"
wait "$job_pid" 2>/dev/null
job_pid=""
for split in train validation; do
  f=$(ls "$tmp/killed/$split"/events.out.tfevents.*) || fail "no $split event file after the kill"
  out=$("$py" "$here/read_tfevents.py" "$f") || fail "$f does not read back whole after the kill: $out"
  steps=$(grep -c '"epoch_loss"' <<<"$out")
  [[ $steps -ge 2 ]] || fail "$f: $steps epochs after the kill, expected at least 2: $out"
done
"$py" - "$tmp/killed_trace.json" <<'EOF' || fail "the killed run's timeline parts"
import json, sys
path = sys.argv[1]
for rank in (0, 1):
    text = open("%s.rank%d" % (path, rank)).read().rstrip().rstrip(",")
    events = json.loads(text + "]")
    steps = {e["args"]["step"] for e in events if e["ph"] == "X"}
    assert all(e["pid"] == rank for e in events), rank
    assert len(steps) >= 16, (rank, sorted(steps))  # two whole epochs of 8 steps, at least
print("killed run: both ranks' timeline parts parse, with their steps")
EOF
echo "killed run: event files read back whole with the epochs before the kill"

# --- 4: a window the run never reaches ------------------------------------------------------------
out=$(TNT_TIMELINE_STEPS=100-200 timeout -k 5 "$limit" "$launcher" --timeline "$tmp/unreached.json" -n 2 -- \
  "$program" --num_train_samples 256 --batch_size 128 --verbose 0 --train_epochs 1 --model_dir "$tmp/unreached" 2>&1) ||
  fail "the run with an unreached window failed: $out"
grep -q "timeline: nothing recorded for '$tmp/unreached.json': the window 100-200 (TNT_TIMELINE_STEPS) opens at step 100, and training has run 2 step(s) so far" <<<"$out" ||
  fail "no warning about the unreached window: $out"
[[ $(grep -c "timeline: nothing recorded" <<<"$out") -eq 1 ]] || fail "the warning is not printed once: $out"
left=$(ls "$tmp"/unreached.json* 2>/dev/null)
[[ -z "$left" ]] || fail "files left by a timeline that recorded nothing: $left"
echo "unreached window: one warning, no part files left"

# --- 5: a run that trains no step (0 epochs) ------------------------------------------------------
# Before, it wrote nothing and said nothing (a timeline starts with fit). Now tnt::finalize says so.
out=$(timeout -k 5 "$limit" "$launcher" --timeline "$tmp/none.json" -n 2 -- \
  "$program" --num_train_samples 256 --batch_size 128 --verbose 0 --train_epochs 0 --model_dir "$tmp/none" 2>&1) ||
  fail "the run of 0 epochs failed: $out"
grep -q "timeline: nothing recorded for '$tmp/none.json': this run has trained no step" <<<"$out" ||
  fail "no warning about the timeline of a run without steps: $out"
[[ $(grep -c "timeline: nothing recorded" <<<"$out") -eq 1 ]] || fail "the warning is not printed once: $out"
echo "no step trained: one warning"

# --- 6: another job writing the same trace now ----------------------------------------------------
# Its rank-0 part is locked by a running process (a job of its own, as another tarantella
# holds it). Before, this run truncated it and later removed it: the other job lost its
# events. Now it is refused on every rank, and the other part is left as it was.
echo '[{"other job": 1},' >"$tmp/busy.json.rank0"
cp "$tmp/busy.json.rank0" "$tmp/busy.copy"
(
  exec 9>>"$tmp/busy.json.rank0"
  flock 9
  exec sleep 60  # holds the lock until killed
) &
holder=$!
sleep 0.5
out=$(timeout -k 5 "$limit" "$launcher" --timeline "$tmp/busy.json" -n 2 -- \
  "$program" --num_train_samples 256 --batch_size 128 --verbose 0 --train_epochs 1 --model_dir "$tmp/busy" 2>&1)
rc=$?
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
[[ $rc -eq 2 ]] || fail "the run beside another job's trace: exit $rc, expected 2: $out"
grep -q "timeline '$tmp/busy.json': another job is writing this trace now" <<<"$out" ||
  fail "no message naming the other job's trace: $out"
cmp -s "$tmp/busy.json.rank0" "$tmp/busy.copy" || fail "the other job's part was changed"
# Rank 1's part was opened before the refusal: it is removed, not left empty beside the trace.
[[ ! -e "$tmp/busy.json.rank1" ]] || fail "the refused run left its rank-1 part: $(ls -l "$tmp/busy.json.rank1")"
echo "another job's trace: refused, its part left as it was"
echo "PASS"
