#!/usr/bin/env bash
# Automatic restart (tarantella --max-restarts): rank 1's program on h2 is killed in the
# middle of epoch 2 of 3. The launcher starts the whole job again, fashion_mnist continues
# from epoch 1's checkpoint, and the run ends with the weights of an uninterrupted one,
# bitwise, reporting one restart. Input the program refuses (exit status 2) is not
# restarted. A job that fails with no restart left ends as without --max-restarts, with the
# last attempt's status.
#
#   restart.sh LAUNCHER FASHION_MNIST
source "$(dirname "${BASH_SOURCE[0]}")/cluster_common.sh" "$@"
cl_up 2

# About 1.5 s an epoch on two hosts sharing two cores; evaluation only at the end.
run=(--model=mlp --num_train_samples=12288 --batch_size=64 --train_epochs=3 --epochs_between_evals=3 --verbose=2)
cl_run uninterrupted h1 90 -H h1,h2 "${cl_launch[@]}" -- "${run[@]}" --model_dir="$cl_tmp/uninterrupted"
cl_expect_exit uninterrupted 0

(
  # Epoch 1's checkpoint is written: epoch 2 has begun. A moment into it, rank 1 dies.
  end=$((SECONDS + 60))
  while ((SECONDS < end)) && [[ ! -f $cl_tmp/restarted/checkpoint.safetensors ]]; do sleep 0.05; done
  # Half an epoch later (epoch 1 took the seconds in its history row): mid epoch 2.
  half=$(awk -F, 'NR == 2 { s = $NF / 2; print (s < 0.2 ? 0.2 : s) }' "$cl_tmp/restarted/history.csv")
  sleep "${half:-0.5}"
  pid=$(cl_programs_on h2 | head -n 1)
  if [[ -n $pid ]]; then
    # The epochs complete just before and just after the kill: on a loaded machine the half
    # epoch above can run past epoch 2's end, and the restart then rightly resumes later.
    rows() { echo $(($(wc -l <"$cl_tmp/restarted/history.csv") - 1)); }
    before=$(rows)
    echo "killing rank 1's program (pid $pid on h2)"
    kill -KILL "$pid"
    echo "$before $(rows)" >"$cl_tmp/kill_epochs"
  fi
) &
killer=$!
cl_run restarted h1 120 -H h1,h2 --max-restarts 1 "${cl_launch[@]}" -- "${run[@]}" --model_dir="$cl_tmp/restarted"
wait "$killer"
cl_expect_exit restarted 0
cl_expect_contains restarted "tarantella: rank 1 (host h2, local rank 0) failed first: signal 9 (SIGKILL)" \
  "the first attempt's failure is named"
cl_expect_contains restarted "tarantella: restarting the whole job (restart 1 of 1, TNT_RESTART=1)" "one restart"
# The restart continues from the last checkpoint before the kill: epoch 1's when the kill
# came in epoch 2 as planned.
read -r done_before done_after <"$cl_tmp/kill_epochs" 2>/dev/null || done_before=1 done_after=1
resumed() { grep -qF -- "Resuming from $cl_tmp/restarted/checkpoint.safetensors at epoch $1" <<<"$cl_out"; }
if resumed "$done_before" || { [[ $done_after != "$done_before" ]] && resumed "$done_after"; }; then
  cl_pass "restarted: the restart continues from the checkpoint of epoch $done_before, the last before the kill"
else
  cl_fail "restarted: no 'Resuming from $cl_tmp/restarted/checkpoint.safetensors at epoch $done_before' (epochs done at the kill: $done_before, just after: $done_after)"
fi
cl_expect_contains restarted "tarantella: the job succeeded after 1 restart" "the launcher reports the restart"
cl_same_weights restarted "$cl_tmp/uninterrupted" "$cl_tmp/restarted"
if [[ $(awk -F, 'NR > 1 { printf "%s ", $1 }' "$cl_tmp/restarted/history.csv") == "1 2 3 " ]]; then
  cl_pass "restarted: history.csv has epochs 1 2 3 once each"
else
  cl_fail "restarted: history.csv rows: $(awk -F, 'NR > 1 { printf "%s ", $1 }' "$cl_tmp/restarted/history.csv")"
fi

# Input the program refuses (a --data_dir that does not exist: exit status 2) is not
# restarted: a restart would only be refused the same way.
cl_run input_error h1 60 -H h1 -n 1 --max-restarts 1 "${cl_launch[@]}" -- --data_dir="$cl_tmp/no-such-dir" \
  --model_dir="$cl_tmp/none"
cl_expect_exit input_error 2
if [[ $(grep -c "tarantella: restarting the whole job" <<<"$cl_out") -eq 0 ]]; then
  cl_pass "input_error: not restarted"
else
  cl_fail "input_error: restarted $(grep -c "tarantella: restarting the whole job" <<<"$cl_out") times, expected none"
fi
cl_expect_contains input_error "tarantella: no restart tried (1 of 1 left): rank 0 (host h1, local rank 0) exited with code 2" \
  "the launcher says why it does not restart"

# No restart left: every attempt fails (its program killed by SIGALRM, which ends a process
# without a core file, 0.3 s after it appears, before any checkpoint; the programs take
# SIGUSR1 as a batch system's warning and stop after a step); the last attempt's status, and a line
# that says so.
(
  end=$((SECONDS + 50))
  last="" killed=0
  while ((SECONDS < end && killed < 2)); do
    pid=$(cl_programs_on h1 | head -n 1)
    if [[ -n $pid && $pid != "$last" ]]; then
      sleep 0.3
      if kill -ALRM "$pid" 2>/dev/null; then
        echo "killed attempt $((killed + 1))'s program (pid $pid on h1)"
        killed=$((killed + 1))
      fi
      last=$pid
    fi
    sleep 0.1
  done
) &
killer=$!
cl_run no_restart_left h1 60 -H h1 -n 1 --max-restarts 1 "${cl_launch[@]}" -- "${run[@]}" \
  --model_dir="$cl_tmp/no_restart_left"
wait "$killer"
cl_expect_exit no_restart_left 142
if [[ $(grep -c "tarantella: restarting the whole job" <<<"$cl_out") -eq 1 ]]; then
  cl_pass "no_restart_left: restarted once"
else
  cl_fail "no_restart_left: restarted $(grep -c "tarantella: restarting the whole job" <<<"$cl_out") times, expected 1"
fi
cl_expect_contains no_restart_left "tarantella: the job failed with no restart left (1 of 1 used)" "no restart left"
cl_expect_no_processes 5 restart
cl_finish
