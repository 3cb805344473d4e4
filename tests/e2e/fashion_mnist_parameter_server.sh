#!/usr/bin/env bash
# fashion_mnist with --strategy=parameter_server through the launcher's --parameter-servers.
#
#   fashion_mnist_parameter_server.sh LAUNCHER PROGRAM CASE
#
# CASE:
#   staleness0: 1 server + 2 workers with --max_staleness=0 give the test loss and accuracy
#     of synchronous training on 2 ranks (printed to 4 decimals: the sums differ only in
#     their order, which moved nothing in the 4th decimal when measured).
#   async: fully asynchronous training (1 server + 2 workers) reaches within 1.5 points of
#     synchronous accuracy after the same 4 epochs of 12,000 samples (asynchronous Adam takes
#     a step per push, twice the updates), in the mean of five asynchronous runs. After 2
#     epochs of 6,000 (about 77%, still steep) the gap ranged from 2.7 points below to 1.9
#     above; at 4 epochs of 12,000 (about 83%) one run's gap measured -1.06 to +1.03 points
#     in 15 runs with one to three jobs sharing the 2-core machine, mean +0.02, standard
#     deviation 0.63 (and -1.6 once before; CI once saw a single run more than 1.5 below):
#     how the workers' pushes interleave moves one run. The load moves it further: at a load
#     average of 10-15 (the workers' speeds differ more, so gradients are staler) 15 runs
#     measured -2.47 to +0.52, mean -0.52, deviation 0.80, and the mean of three, the test
#     before, fell below 1 point in 1 of 5 tests there (-1.34; about 1 in 7 expected from
#     those numbers). The mean of five deviates by 0.36 there: 1.5 points is 2.7 of those
#     below the loaded mean and 5 at light load, while lost updates cost more (a quarter
#     of them, 2 epochs of 6,000, is about 6 points). (8 epochs did not narrow the spread:
#     -0.9 to +1.35.) The test takes both CTest slots.
#   resume_across: a checkpoint written by a parameter-server run is resumed by a
#     synchronous run, and one written by a synchronous run by a parameter-server run;
#     history.csv gets one row per epoch.
#   server_stopped: the server rank stopped (SIGSTOP) in the middle of training: the workers
#     give up after TNT_COLLECTIVE_TIMEOUT (3 s here) naming server rank 0, and the job ends
#     with a non-zero status within seconds of the stop, no process left behind.
#   server_killed: the server rank killed (SIGTERM: SIGKILL's status 137 reads as a hang to
#     fm_run) in the middle of training: the job ends within seconds of the kill, and the
#     launcher names rank 0 as the parameter server that failed first.
#   Both time the end from the signal, not from the start: at a load average of 10-15 the
#   runs took 14-33 s against the old 45 s bound on the whole run, nearly all of it start-up
#   and the first epoch (60,000 samples) before the signal, which the load stretches.
#   worker_killed: a worker (rank 2 of 1 server + 3 workers) SIGKILLed in the middle of the
#     second epoch: the job goes on without it (--heartbeat-timeout 2), finishes its 5
#     epochs and the test evaluation with exit 0, and the launcher says the worker was
#     dropped and how every rank ended; the timeline (--timeline) merges the 2 workers left.
#     (That the lost worker's samples are each trained on once is counted exactly by tests/ps
#     ps_lost_worker*.)
#   first_worker_killed: the first worker (the fit's master) killed in training: the next
#     worker writes history.csv's rows and TensorBoard's events from then on.
#   worker_lost_at_start: a worker ended as its program starts, before parameter-server
#     training: the job ends at once, naming it (the others would wait for it).
#   heartbeat_off: with --heartbeat-timeout 0 a worker lost in training ends the job, named.
#   last_worker_lost: the only worker ended in training: the job ends, naming it, with its
#     status.
#   server_restart: the server SIGKILLed after the first epoch's checkpoint, with
#     --max-restarts 1: the launcher names rank 0 as the parameter server that failed first,
#     ends the job at once (mpirun, run with --enable-recovery, would not) and restarts it;
#     the restart continues from the checkpoint and ends with history.csv rows 1 to 5.
#   timeline: --timeline trace.json on 2 servers + 2 workers: trace.json holds the workers'
#     pull and push spans (2 ranks), trace.servers.json the servers' apply spans (2 ranks,
#     the window's 10 updates each).
#   bad_roles: --parameter-servers that leaves no worker is refused by the launcher (exit 2,
#     naming the flag) before any rank starts; the program alone on one rank refuses
#     --strategy=parameter_server (exit 2, naming the need for 2 ranks); --parameter-servers
#     without --strategy=parameter_server trains synchronously, with one warning naming both.
set -uo pipefail
source "$(dirname "$0")/fashion_mnist_common.sh" "$1" "$2"
case_name=${3:?case}
fm_need_data

common=(--model=mlp --num_train_samples=6000 --batch_size=128 --verbose=0)

result_of() { grep -Eo 'test accuracy: [0-9.]+' <<<"$fm_out" | grep -Eo '[0-9.]+$'; }
# out_has NAME REGEX: a line of the run's output (launcher and program) matches.
out_has() { grep -Eq -- "$2" <<<"$fm_out" && fm_pass "$1: /$2/" || fm_fail "$1: no line matches /$2/"; }
loss_of() { grep -Eo 'Test loss: [0-9.]+' <<<"$fm_out" | grep -Eo '[0-9.]+$'; }
# ended_after_signal NAME: the job ended within 20 s of the signal $fm_tmp/signalled_at
# records. 20 s: the 3 s collective timeout (server_stopped), then the job's teardown; the
# whole took 3.4-6.2 s stopped and 0.3-4.5 s killed at a load average of 10-11. A job that
# waits for the default 600 s collective timeout, or hangs, fails it.
ended_after_signal() {
  if [[ ! -s $fm_tmp/signalled_at ]]; then
    fm_fail "$1: the server was never signalled (no running rank 0 found)"
    return
  fi
  local after
  after=$(awk -v a="$(cat "$fm_tmp/signalled_at")" -v b="$fm_ended_at" 'BEGIN { printf "%.1f", b - a }')
  awk -v s="$after" 'BEGIN { exit !(s < 20) }' && fm_pass "$1: ended ${after}s after the signal (the run: ${fm_seconds}s)" ||
    fm_fail "$1: ended ${after}s after the signal (the run: ${fm_seconds}s), not within 20 s"
}

# signal_rank_after_row DIR RANK SIG [PAUSE [FILE]]: in the background ($killer), once
# DIR/FILE exists (history.csv unless given; 300 looks, 0.1 s apart) and PAUSE seconds
# more, SIG to the program of job rank RANK that runs in DIR, where it still runs; the time
# of the signal goes to $fm_tmp/signalled_at. The rank's process is found while the first
# epoch runs, so that little lies between FILE and the signal: looking for it afterwards took
# several process starts (pgrep, then tr and grep for each rank), and with the ranks busy
# on both cores that once took longer than the 4 s of training left: nothing was signalled.
signal_rank_after_row() {
  local dir=$1 rank=$2 sig=$3 pause=${4:-0} file=${5:-history.csv}
  (
    find_rank() {
      local p
      for p in $(pgrep -f -- "^$fm_program .*$dir"); do
        if tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank"; then
          echo "$p"
        fi
      done
    }
    pids=
    for _ in $(seq 1 300); do
      [[ -n $pids ]] || pids=$(find_rank)
      [[ -e $dir/$file ]] && break
      sleep 0.1
    done
    [[ -n $pids ]] || pids=$(find_rank)
    sleep "$pause"
    for p in $pids; do
      # The same program still (not a process that took an ended rank's number).
      [[ $(tr '\0' ' ' </proc/$p/cmdline 2>/dev/null) == "$fm_program "* ]] || continue
      kill "-$sig" "$p" && date +%s.%N >"$fm_tmp/signalled_at"
    done
  ) &
  killer=$!
}

case $case_name in
  staleness0)
    fm_run sync -np 2 -- "${common[@]}" --train_epochs=2 --model_dir="$fm_tmp/sync"
    [[ $fm_rc -eq 0 ]] || fm_fail "sync: exit $fm_rc"
    acc_sync=$(result_of) loss_sync=$(loss_of)
    fm_run ps -np 3 --parameter-servers 1 -- "${common[@]}" --train_epochs=2 --strategy=parameter_server \
      --max_staleness=0 --model_dir="$fm_tmp/ps"
    [[ $fm_rc -eq 0 ]] || fm_fail "ps: exit $fm_rc"
    acc_ps=$(result_of) loss_ps=$(loss_of)
    if [[ -n $acc_sync && $acc_sync == "$acc_ps" && $loss_sync == "$loss_ps" ]]; then
      fm_pass "staleness 0: loss $loss_ps, accuracy $acc_ps, as synchronous"
    else
      fm_fail "staleness 0: loss $loss_ps accuracy $acc_ps; synchronous: loss $loss_sync accuracy $acc_sync"
    fi
    ;;
  async)
    longer=(--model=mlp --num_train_samples=12000 --batch_size=128 --verbose=0 --train_epochs=4)
    fm_run sync -np 2 -- "${longer[@]}" --model_dir="$fm_tmp/sync"
    acc_sync=$(result_of)
    accs=()
    for run in 1 2 3 4 5; do
      fm_run ps$run -np 3 --parameter-servers 1 -- "${longer[@]}" --strategy=parameter_server \
        --model_dir="$fm_tmp/ps$run"
      [[ $fm_rc -eq 0 ]] || fm_fail "ps$run: exit $fm_rc"
      accs+=("$(result_of)")
    done
    acc_ps=$(printf '%s\n' "${accs[@]}" | awk 'NF { s += $1; n++ } END { if (n == 5) printf "%.4f", s / 5 }')
    if [[ -n $acc_sync && -n $acc_ps ]] && awk -v a="$acc_sync" -v b="$acc_ps" 'BEGIN { exit !(b >= a - 0.015) }'; then
      fm_pass "asynchronous accuracy $acc_ps (mean of ${accs[*]}), synchronous $acc_sync"
    else
      fm_fail "asynchronous accuracy '$acc_ps' (mean of '${accs[*]}') more than 1.5 points below synchronous '$acc_sync'"
    fi
    ;;
  resume_across)
    fm_run ps1 -np 3 --parameter-servers 1 -- "${common[@]}" --train_epochs=1 --strategy=parameter_server \
      --model_dir="$fm_tmp/a"
    [[ $fm_rc -eq 0 ]] || fm_fail "ps1: exit $fm_rc"
    fm_run sync2 -np 2 -- "${common[@]}" --train_epochs=2 --resume --model_dir="$fm_tmp/a"
    [[ $fm_rc -eq 0 ]] || fm_fail "sync2 (resumed from the parameter-server checkpoint): exit $fm_rc"
    rows=$(tail -n +2 "$fm_tmp/a/history.csv" | cut -d, -f1 | tr '\n' ' ')
    [[ $rows == "1 2 " ]] && fm_pass "ps then sync: history epochs $rows" || fm_fail "ps then sync: history epochs '$rows'"
    fm_run sync1 -np 2 -- "${common[@]}" --train_epochs=1 --model_dir="$fm_tmp/b"
    fm_run ps2 -np 3 --parameter-servers 1 -- "${common[@]}" --train_epochs=2 --resume --strategy=parameter_server \
      --model_dir="$fm_tmp/b"
    [[ $fm_rc -eq 0 ]] || fm_fail "ps2 (resumed from the synchronous checkpoint): exit $fm_rc"
    rows=$(tail -n +2 "$fm_tmp/b/history.csv" | cut -d, -f1 | tr '\n' ' ')
    [[ $rows == "1 2 " ]] && fm_pass "sync then ps: history epochs $rows" || fm_fail "sync then ps: history epochs '$rows'"
    ;;
  server_stopped)
    (
      # Rank 0 (the server) stops once training has begun (its history.csv exists).
      for _ in $(seq 1 200); do
        [[ -e $fm_tmp/e/history.csv ]] && break
        sleep 0.1
      done
      sleep 1
      for p in $(pgrep -f -- "^$fm_program .*$fm_tmp/e"); do
        if tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=0'; then
          kill -STOP "$p" && date +%s.%N >"$fm_tmp/signalled_at"
        fi
      done
    ) &
    stopper=$!
    fm_run stopped -np 3 --parameter-servers 1 -x TNT_COLLECTIVE_TIMEOUT=3 -- --model=mlp --train_epochs=50 \
      --batch_size=128 --verbose=0 --strategy=parameter_server --model_dir="$fm_tmp/e"
    wait $stopper
    [[ $fm_rc -ne 0 ]] || fm_fail "stopped: exit 0 with a stopped server"
    fm_expect_grep stopped "server rank\(s\) 0 did not answer" "the stopped server"
    ended_after_signal stopped
    ;;
  server_killed)
    (
      for _ in $(seq 1 200); do
        [[ -e $fm_tmp/k/history.csv ]] && break
        sleep 0.1
      done
      sleep 1
      for p in $(pgrep -f -- "^$fm_program .*$fm_tmp/k"); do
        if tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=0'; then
          kill -TERM "$p" && date +%s.%N >"$fm_tmp/signalled_at"
        fi
      done
    ) &
    killer=$!
    fm_run killed -np 3 --parameter-servers 1 -- --model=mlp --train_epochs=50 --batch_size=128 --verbose=0 \
      --strategy=parameter_server --model_dir="$fm_tmp/k"
    wait $killer
    [[ $fm_rc -eq 143 ]] && fm_pass "killed: exit 143 (the server's signal)" || fm_fail "killed: exit $fm_rc, expected 143"
    grep -q "tarantella: rank 0 (parameter server, host .*) failed first: signal 15" <<<"$fm_out" &&
      fm_pass "killed: the launcher names the parameter server" || fm_fail "killed: no line naming rank 0 as the server"
    ended_after_signal killed
    ;;
  worker_killed)
    # The first epoch's checkpoint (written after its history row, by every worker together:
    # a worker lost in that save ends the job), then 0.3 s: the workers are stepping in the
    # second epoch. The work comes in 5 short epochs so that at least 3 are left when the
    # kill lands on any machine: on a fast one an epoch of 21,600 samples takes about 1 s and
    # the kill lands about 0.5 s after the first checkpoint (as 3 epochs of 36,000, the whole
    # run took 6.9 s there and a kill 1.5 s after the first row came after the end); on a
    # loaded one epochs are 10 times longer and the kill lands early in the second. A worker lost in the epoch's end is
    # dropped too (its metrics and validation are redone by the others; in a callback's
    # collective the job ends, the epoch named: docs/parameter_server.md; tests/ps has those
    # cases).
    signal_rank_after_row "$fm_tmp/w" 2 KILL 0.3 checkpoint.safetensors
    # The heaviest run of these tests (108,000 samples on 4 ranks, about 15 s alone on a
    # slower machine): on the 2-core machine at a load average of 10-15 the same run without
    # a kill took 88 s, so the 60 s guard (TNT_E2E_TIMEOUT) called it a hang in 3 of 4 such
    # runs. 150 s still ends a hang well inside CTest's 240.
    fm_limit=$((fm_limit > 150 ? fm_limit : 150))
    fm_run wk -np 4 --parameter-servers 1 --heartbeat-timeout 2 -x TNT_COLLECTIVE_TIMEOUT=20 --timeline "$fm_tmp/wk.json" -- --model=mlp \
      --num_train_samples=21600 \
      --train_epochs=5 --batch_size=120 --verbose=0 --strategy=parameter_server --model_dir="$fm_tmp/w"
    wait $killer
    [[ $fm_rc -eq 0 ]] && fm_pass "wk: exit 0" || fm_fail "wk: exit $fm_rc, expected 0"
    out_has wk "tarantella: worker rank 2 \(host .*\) ended: signal 9 \(SIGKILL\); parameter-server training goes on"
    out_has wk "rank 2 \(worker, host .*\): signal 9 \(SIGKILL\): dropped"
    out_has wk "rank 0 \(parameter server, host .*\): exit code 0"
    out_has wk "test accuracy: [0-9.]+"
    got=$(awk -F, 'NR > 1 { printf "%s%s", sep, $1; sep = " " }' "$fm_tmp/w/history.csv")
    [[ $got == "1 2 3 4 5" ]] && fm_pass "wk: history.csv rows 1 to 5" || fm_fail "wk: history.csv rows '$got'"
    # The timeline merges the workers left (before: the merge broadcast from the lost worker's
    # number, and the job failed after training, with no trace).
    if python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["otherData"]["ranks"] == 2, d["otherData"]' \
      "$fm_tmp/wk.json"; then fm_pass "wk: the timeline of the 2 workers left"; else fm_fail "wk: no timeline of the workers left"; fi
    ;;
  first_worker_killed)
    # The first worker (rank 1), the fit's master, SIGKILLed in the second epoch: the next
    # worker takes over what the master alone does, so history.csv gets every epoch's row
    # and TensorBoard the later epochs in an event file of its own (before: the rows and
    # events of the epochs after the loss were never written, silently). 4 short epochs, so
    # that 2 are left after the kill on a fast machine too, and the kill after the first
    # epoch's checkpoint (see worker_killed).
    signal_rank_after_row "$fm_tmp/f" 1 KILL 0.3 checkpoint.safetensors
    fm_limit=$((fm_limit > 150 ? fm_limit : 150))
    fm_run fk -np 3 --parameter-servers 1 --heartbeat-timeout 2 -x TNT_COLLECTIVE_TIMEOUT=20 -- --model=mlp \
      --num_train_samples=18000 --train_epochs=4 --batch_size=120 --verbose=0 --strategy=parameter_server \
      --enable_tensorboard --model_dir="$fm_tmp/f"
    wait $killer
    [[ $fm_rc -eq 0 ]] && fm_pass "fk: exit 0" || fm_fail "fk: exit $fm_rc, expected 0"
    out_has fk "rank 1 \(worker, host .*\): signal 9 \(SIGKILL\): dropped"
    got=$(awk -F, 'NR > 1 { printf "%s%s", sep, $1; sep = " " }' "$fm_tmp/f/history.csv")
    [[ $got == "1 2 3 4" ]] && fm_pass "fk: history.csv rows 1 to 4" || fm_fail "fk: history.csv rows '$got'"
    n=$(find "$fm_tmp/f/train" -name 'events.out.tfevents.*' | wc -l)
    [[ $n -eq 2 ]] && fm_pass "fk: the new master's TensorBoard event file beside the first's" ||
      fm_fail "fk: $n training event files, expected 2 (the lost master's and the new one's)"
    ;;
  heartbeat_off)
    # With --heartbeat-timeout 0 nothing tells the servers that a worker is gone, so its loss
    # (SIGTERM to rank 2 in training) ends the job at once, naming it (before: the launcher
    # said training goes on, and the ranks waited for the 600 s collective timeout).
    signal_rank_after_row "$fm_tmp/h" 2 TERM
    fm_run h0 -np 3 --parameter-servers 1 --heartbeat-timeout 0 -- --model=mlp --num_train_samples=6000 \
      --train_epochs=50 --batch_size=64 --verbose=0 --strategy=parameter_server --model_dir="$fm_tmp/h"
    wait $killer
    [[ $fm_rc -eq 143 ]] && fm_pass "h0: exit 143 (the worker's signal)" || fm_fail "h0: exit $fm_rc, expected 143"
    out_has h0 "tarantella: rank 2 \(host .*\) failed first: signal 15 \(SIGTERM\)"
    ended_after_signal h0
    ;;
  worker_lost_at_start)
    # A worker (rank 2 of 1 server + 2 workers) ended (SIGTERM) as soon as its program runs,
    # before parameter-server training begins: the others would wait for it in the set-up's
    # collectives (the weights' broadcast), so the job ends at once, naming it (before: the
    # launcher said training goes on without it, and the ranks waited for the 600 s
    # collective timeout).
    (
      for _ in $(seq 1 1000); do
        for p in $(pgrep -f -- "^$fm_program .*$fm_tmp/s0"); do
          if tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=2'; then
            kill -TERM "$p" && date +%s.%N >"$fm_tmp/signalled_at"
            exit 0
          fi
        done
        sleep 0.02
      done
    ) &
    killer=$!
    fm_run s0 -np 3 --parameter-servers 1 --heartbeat-timeout 2 -- --model=mlp --train_epochs=5 --batch_size=64 \
      --verbose=0 --strategy=parameter_server --model_dir="$fm_tmp/s0"
    wait $killer
    [[ $fm_rc -eq 143 ]] && fm_pass "s0: exit 143 (the worker's signal)" || fm_fail "s0: exit $fm_rc, expected 143"
    out_has s0 "tarantella: rank 2 \(host .*\) failed first: signal 15 \(SIGTERM\)"
    if grep -q "training goes on without it" <<<"$fm_out"; then fm_fail "s0: said training goes on"; else fm_pass "s0: did not say training goes on"; fi
    ended_after_signal s0
    ;;
  last_worker_lost)
    # The one worker of 1 server + 1 worker ended (SIGTERM) in training: the job ends, naming
    # the worker and with its status (before: the server, which the launcher itself had
    # stopped, was named, and the job's status was the server's).
    signal_rank_after_row "$fm_tmp/l" 1 TERM
    fm_run l1 -np 2 --parameter-servers 1 --heartbeat-timeout 2 -- --model=mlp --num_train_samples=6000 \
      --train_epochs=50 --batch_size=64 --verbose=0 --strategy=parameter_server --model_dir="$fm_tmp/l"
    wait $killer
    [[ $fm_rc -eq 143 ]] && fm_pass "l1: exit 143 (the worker's signal)" || fm_fail "l1: exit $fm_rc, expected 143"
    out_has l1 "tarantella: every worker is lost; ending the job"
    out_has l1 "tarantella: rank 1 \(host .*\) failed first: signal 15 \(SIGTERM\)"
    ended_after_signal l1
    ;;
  server_restart)
    # The server found while the first epoch runs (so the first run's, not the restart's),
    # SIGKILLed 0.3 s after the first epoch's checkpoint: 5 short epochs, so that 3 are left
    # when the kill lands on a fast machine too (as 3 epochs of 12,000 samples the whole run
    # took 5.5 s in the suite and the kill, 0.5 s after the first row, came after its end).
    signal_rank_after_row "$fm_tmp/r" 0 KILL 0.3 checkpoint.safetensors
    fm_run sr -np 3 --parameter-servers 1 --max-restarts 1 -- --model=mlp --num_train_samples=9000 \
      --train_epochs=5 --batch_size=128 --verbose=0 --strategy=parameter_server --model_dir="$fm_tmp/r"
    wait $killer
    [[ $fm_rc -eq 0 ]] && fm_pass "sr: exit 0 after the restart" || fm_fail "sr: exit $fm_rc, expected 0"
    out_has sr "tarantella: rank 0 \(parameter server, host .*\) failed first: signal 9 \(SIGKILL\)"
    out_has sr "tarantella: restarting the whole job \(restart 1 of 1"
    out_has sr "Restart 1 \(TNT_RESTART\): continuing from"
    got=$(awk -F, 'NR > 1 { printf "%s%s", sep, $1; sep = " " }' "$fm_tmp/r/history.csv")
    [[ $got == "1 2 3 4 5" ]] && fm_pass "sr: history.csv rows 1 to 5" || fm_fail "sr: history.csv rows '$got'"
    ;;
  timeline)
    fm_run tl -np 4 --parameter-servers 2 --timeline "$fm_tmp/trace.json" -- "${common[@]}" --num_train_samples=1280 \
      --train_epochs=1 --strategy=parameter_server --model_dir="$fm_tmp/t"
    [[ $fm_rc -eq 0 ]] || fm_fail "tl: exit $fm_rc"
    if python3 - "$fm_tmp/trace.json" "$fm_tmp/trace.servers.json" <<'PY'
import collections, json, sys
def spans(path):
    d = json.load(open(path))
    c = collections.Counter((e["name"], e["pid"]) for e in d["traceEvents"] if e.get("ph") == "X")
    return d["otherData"]["ranks"], c
ranks, w = spans(sys.argv[1])
assert ranks == 2, ranks
for pid in (0, 1):
    assert w[("pull", pid)] > 0 and w[("push", pid)] > 0, (pid, w)
ranks, s = spans(sys.argv[2])
assert ranks == 2, ranks
assert s[("apply", 0)] == 10 and s[("apply", 1)] == 10, s
PY
    then fm_pass "tl: pull and push spans of both workers, 10 apply spans of each server"; else fm_fail "tl: the traces"; fi
    # The traces were written: no warning that nothing was recorded (the fit discards its
    # recorder at its end; tnt::finalize said so once).
    if grep -q "timeline: nothing recorded" <<<"$fm_out"; then fm_fail "tl: a false 'nothing recorded' warning"; else
      fm_pass "tl: no 'nothing recorded' warning"; fi
    # Resumed, the servers number their updates on from the checkpoint's 20 steps, as the
    # workers do: a window of steps 21-30 records them (before: they counted from 1 again,
    # and recorded nothing).
    fm_run tl_resumed -np 4 --parameter-servers 2 --timeline "$fm_tmp/resumed.json" -x TNT_TIMELINE_STEPS=21-30 -- \
      "${common[@]}" --num_train_samples=1280 --train_epochs=2 --resume --strategy=parameter_server --model_dir="$fm_tmp/t"
    [[ $fm_rc -eq 0 ]] || fm_fail "tl_resumed: exit $fm_rc"
    if python3 - "$fm_tmp/resumed.servers.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
updates = sorted({e["args"]["update"] for e in d["traceEvents"] if e.get("ph") == "X" and e["name"] == "apply"})
assert updates and updates[0] >= 21 and updates[-1] <= 30, updates
PY
    then fm_pass "tl_resumed: the servers' updates 21-30 recorded"; else fm_fail "tl_resumed: no servers' trace of updates 21-30"; fi
    ;;
  bad_roles)
    fm_run no_worker -np 2 --parameter-servers 2 -- "${common[@]}" --strategy=parameter_server \
      --model_dir="$fm_tmp/c"
    [[ $fm_rc -eq 2 ]] || fm_fail "no_worker: exit $fm_rc, expected 2"
    grep -q -- "--parameter-servers 2 with 2 ranks leaves no worker" <<<"$fm_out" &&
      fm_pass "no_worker: refused naming the flag" || fm_fail "no_worker: no message naming --parameter-servers"
    [[ ! -e $fm_tmp/c ]] && fm_pass "no_worker: nothing started" || fm_fail "no_worker: the program ran"
    fm_run one_rank -np 1 -- "${common[@]}" --strategy=parameter_server --model_dir="$fm_tmp/d"
    [[ $fm_rc -eq 2 ]] || fm_fail "one_rank: exit $fm_rc, expected 2"
    fm_expect_grep one_rank "needs at least 2 ranks" "the need for a server and a worker"
    # The roles without the strategy: the launcher's server rank (no GPU) trains
    # synchronously beside the workers; allowed (a program may fit both ways), but said.
    fm_run sync_with_roles -np 3 --parameter-servers 1 -- "${common[@]}" --train_epochs=1 --model_dir="$fm_tmp/e"
    [[ $fm_rc -eq 0 ]] && fm_pass "sync_with_roles: exit status 0" || fm_fail "sync_with_roles: exit $fm_rc, expected 0"
    n=$(grep -c "TNT_PS_SERVERS=0 (tarantella --parameter-servers) gives ranks parameter-server roles, but this fit trains synchronously" <<<"$fm_out")
    [[ $n -eq 1 ]] && fm_pass "sync_with_roles: said once" || fm_fail "sync_with_roles: the warning appears $n times, expected once"
    # The workers alone split the global batch: 2 samples for 2 workers (and 1 server) train
    # (before: refused as smaller than the 3 ranks); 1 is refused, naming the workers.
    # With output on every rank, each line is tagged with the job's rank, as the launcher
    # numbers them (before: the workers tagged themselves 0 and 1, the server 0 as well).
    fm_run batch_of_workers -np 3 --parameter-servers 1 --output-on-all-devices -- --model=mlp --num_train_samples=64 \
      --batch_size=2 --train_epochs=1 --verbose=2 --strategy=parameter_server --model_dir="$fm_tmp/g"
    [[ $fm_rc -eq 0 ]] && fm_pass "batch_of_workers: exit 0" || fm_fail "batch_of_workers: exit $fm_rc, expected 0"
    out_has batch_of_workers "^\[rank 1\] Epoch 1/1"
    out_has batch_of_workers "^\[rank 2\] Epoch 1/1"
    if grep -q "^\[rank 0\] Epoch" <<<"$fm_out"; then fm_fail "batch_of_workers: the server's tag on a worker's line"; else fm_pass "batch_of_workers: no worker tagged as rank 0"; fi
    fm_run batch_below_workers -np 3 --parameter-servers 1 -- --model=mlp --num_train_samples=64 --batch_size=1 \
      --train_epochs=1 --verbose=0 --strategy=parameter_server --model_dir="$fm_tmp/h"
    [[ $fm_rc -eq 2 ]] || fm_fail "batch_below_workers: exit $fm_rc, expected 2"
    fm_expect_grep batch_below_workers "--batch_size=1: smaller than the 2 workers" "the flag and the workers"
    ;;
  *)
    echo "unknown case $case_name" >&2
    exit 2
    ;;
esac
fm_finish
