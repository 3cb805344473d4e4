#!/usr/bin/env bash
# What fashion_mnist leaves in --model_dir when a run goes wrong, on 2 ranks through the
# launcher: a good checkpoint is never lost, history.csv holds each epoch once and comes from
# the master alone.
#
#   fashion_mnist_model_dir.sh LAUNCHER PROGRAM CASE
#
# CASE:
#   diverged: a resumed run with an enormous learning rate ends with a non-zero exit and an
#     error naming the step and the epoch; the checkpoint and history.csv of the good run
#     are left as they were.
#   output_on_all_devices: a resumed run with --output-on-all-devices prints progress on both
#     ranks but history.csv gets each new row once (the master alone writes files).
#   resume_after_crash: a crash between epoch 2's history row and its checkpoint (rebuilt
#     by putting epoch 1's checkpoint back, and a row cut short), then --resume: history.csv
#     has epochs 1, 2, 3 once each.
#   resume_nothing_to_train: --resume at the checkpoint's epoch trains nothing; the test set
#     is then evaluated (once), giving the first run's result (which reused its last
#     validation).
#   existing_model_dir: a run without --resume in the directory of a trained model is
#     refused before any training (non-zero exit, the directory and the choices named, both
#     files left as they were); with --overwrite it trains from scratch in it.
#   interrupted_first_epoch: what a run stopped in epoch 1 leaves (an empty history.csv, no
#     checkpoint) is refused without suggesting --resume, which would only fail there: the
#     message says there is no checkpoint to resume from and offers --overwrite; --overwrite
#     then trains.
#   resume_below_checkpoint: --resume with --train_epochs below the checkpoint's epoch trains
#     nothing, says so naming both, and evaluates the checkpoint's weights (exit 0, the
#     checkpoint and history.csv left as they were).
#   overwrite_tensorboard: --overwrite removes the earlier run's TensorBoard event files
#     (train/ and validation/ then hold the new run's alone) and nothing else of the user's.
#   resume_missing_model_dir: --resume in a --model_dir that does not exist fails naming it
#     and creates nothing; a --model_dir that is a file is refused as such, an empty one as
#     empty, and one without a checkpoint as such, left as it was.
#   default_run_dirs: without --model_dir, each run gets its own ./fashion_mnist_model/run-*
#     (named at the start; latest links to the newest), so a second run is not refused and
#     leaves the first's files as they were; --resume without --model_dir continues the
#     newest run that has a checkpoint; a restart (TNT_RUN_ID, TNT_RESTART) goes on in its
#     first attempt's run directory.
#   early_warning_signal: SIGUSR1 as the ranks start stops training after its first step,
#     with a checkpoint, exit 0 (it ended the programs).
#   fifo_checkpoint: a FIFO in the checkpoint's place is refused by --resume and
#     --resume=auto, naming it, at once.
#   overwrite_symlinked_train: a train/ that is a symbolic link to another directory is
#     refused (exit 2, naming it), also with --overwrite, which removes nothing through it.
#   dangling_history_link: a history.csv that is a dangling symbolic link is refused (exit 2),
#     and no file appears where it points; a --model_dir that is one is refused naming its
#     target.
#   concurrent_runs: a second run on a --model_dir in use is refused (exit 2) naming the
#     first run's process; after that process is killed (SIGKILL), the directory is free.
#   resume_other_columns: a resumed run whose history.csv has other columns is refused,
#     naming the file, which stays as it was.
#   resume_missing_history: a resumed run whose history.csv is gone says so, and starts a
#     new one at the resumed epoch.
source "$(dirname "${BASH_SOURCE[0]}")/fashion_mnist_common.sh" "$@"
[[ $# -eq 3 ]] || { echo "usage: $0 LAUNCHER PROGRAM CASE" >&2; exit 2; }
case_name=$3
fm_need_data

launch=(-n 2 -x TNT_NUM_THREADS=1)
model_dir=$fm_tmp/model
small=(--model=mlp --num_train_samples=256 --batch_size=64 --verbose=0 --model_dir="$model_dir")
ckpt=$model_dir/checkpoint.safetensors
csv=$model_dir/history.csv

# train_good NAME EPOCHS [ARGS...]: a run that must succeed (the case cannot go on otherwise).
train_good() {
  local name=$1 epochs=$2
  shift 2
  fm_run "$name" "${launch[@]}" -- "${small[@]}" --train_epochs="$epochs" "$@"
  if [[ $fm_rc -ne 0 || ! -f $ckpt ]]; then
    fm_fail "$name: training $epochs epoch(s) failed (exit status $fm_rc)"
    fm_finish
  fi
}

expect_exit() {  # NAME WANT: WANT is 0 or "failure" (an error exit, not a timeout or signal)
  if [[ $2 == 0 ]]; then
    if [[ $fm_rc -eq 0 ]]; then fm_pass "$1: exit status 0"; else fm_fail "$1: exit status $fm_rc, expected 0"; fi
  elif [[ $fm_rc -ne 0 && $fm_rc -lt 124 ]]; then
    fm_pass "$1: exit status $fm_rc"
  else
    fm_fail "$1: exit status $fm_rc, expected an error exit"
  fi
}

same_file() {  # NAME FILE COPY WHAT
  if cmp -s "$2" "$3"; then fm_pass "$1: $4 left as it was"; else fm_fail "$1: $4 changed"; fi
}

# The epochs (first column) of history.csv's rows, space-separated.
csv_epochs() { awk -F, 'NR > 1 { printf "%s%s", sep, $1; sep = " " }' "$csv"; }


# A run of sig_args in the background ($job: timeout's pid; its output in signal.out), and
# its end: SIGUSR1 to $launcher_pid, the wait, the output in $fm_out, exit status 0 expected.
start_signal_run() {
  echo "+ $fm_launcher ${launch[*]} -- $fm_program ${sig_args[*]} &"
  timeout -k 10 "$fm_limit" "$fm_launcher" "${launch[@]}" -- "$fm_program" "${sig_args[@]}" \
    </dev/null >"$fm_tmp/signal.out" 2>&1 &
  job=$!
}
end_signal_run() {
  if [[ -n $launcher_pid ]]; then kill -USR1 "$launcher_pid"; else fm_fail "$case_name: the launcher's process not found"; fi
  fm_rc=0
  wait "$job" || fm_rc=$?
  fm_out=$(cat "$fm_tmp/signal.out")
  cat "$fm_tmp/signal.out"
  expect_exit "$case_name" 0
}
case $case_name in
  resume_nothing_to_train)
    train_good first 1 --verbose=2
    first=$(sed -nE 's/^(Test loss: .*)  \(1 epoch, 2 ranks\)$/\1/p' <<<"$fm_out")
    # The checkpoint is at epoch 1 = --train_epochs: no epoch runs, so no validation to
    # reuse: the test set is evaluated once, with the checkpoint's weights.
    fm_run resumed "${launch[@]}" -- "${small[@]}" --train_epochs=1 --resume --verbose=2
    expect_exit resumed 0
    n=$(grep -Ec '^Evaluating on 10000 samples' <<<"$fm_out")
    if [[ $n -eq 1 ]]; then fm_pass "resumed: the test set evaluated once"; else fm_fail "resumed: $n evaluations, expected 1"; fi
    again=$(sed -nE 's/^(Test loss: .*)  \(1 epoch, 2 ranks\)$/\1/p' <<<"$fm_out")
    if [[ -n $first && $first == "$again" ]]; then fm_pass "resumed: the same test result ($again)"; else fm_fail "resumed: '$again', the first run's '$first'"; fi
    ;;
  diverged)
    train_good good 1
    cp "$ckpt" "$fm_tmp/good.safetensors"
    cp "$csv" "$fm_tmp/good.csv"
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --train_epochs=2 --resume --learning_rate=1e30
    expect_exit "$case_name" failure
    fm_expect_grep "$case_name" "loss is -?(nan|inf) at step [0-9]+ \(epoch 2, batch [0-9]+ of 4\)" "the step and the epoch"
    fm_expect_grep "$case_name" "diverged" "what happened"
    if grep -q '^Test loss' <<<"$fm_out"; then fm_fail "$case_name: a test result was printed"; else fm_pass "$case_name: no test result"; fi
    same_file "$case_name" "$ckpt" "$fm_tmp/good.safetensors" "the checkpoint"
    same_file "$case_name" "$csv" "$fm_tmp/good.csv" "history.csv"
    ;;

  output_on_all_devices)
    train_good good 1
    fm_run "$case_name" "${launch[@]}" --output-on-all-devices -- "${small[@]}" --train_epochs=2 --resume --verbose=2
    expect_exit "$case_name" 0
    # Each rank's lines carry its tag, so that mixed on one terminal they can be told apart.
    n=$(grep -c -e '^\[rank 0\] Epoch 2/2$' -e '^\[rank 1\] Epoch 2/2$' <<<"$fm_out")
    if [[ $n -eq 2 ]]; then fm_pass "$case_name: progress from both ranks, tagged"; else fm_fail "$case_name: '[rank R] Epoch 2/2' printed $n times, expected 2 (one per rank)"; fi
    got=$(csv_epochs)
    if [[ $got == "1 2" ]]; then fm_pass "$case_name: history.csv rows 1 2"; else fm_fail "$case_name: history.csv rows are epochs '$got', expected '1 2'"; cat "$csv"; fi
    ;;

  resume_auto)
    # --resume=auto: one command to run again as it is (a requeued batch job): it starts a
    # run where there is none, continues one with a checkpoint, and starts over where a run
    # left no checkpoint and no epoch; a run whose checkpoint was removed after epochs is
    # refused.
    fm_run first "${launch[@]}" -- "${small[@]}" --train_epochs=1 --resume=auto
    expect_exit first 0
    if grep -qF -- "--resume=auto: $model_dir has no checkpoint to continue, so a new run starts there" <<<"$fm_out"; then fm_pass "first: a new run, said"; else fm_fail "first: no line '--resume=auto: $model_dir has no checkpoint to continue, so a new run starts there'"; fi
    if [[ -s $ckpt && $(csv_epochs) == "1" ]]; then fm_pass "first: a checkpoint and row 1"; else fm_fail "first: no checkpoint or rows '$(csv_epochs)'"; fi
    fm_run again "${launch[@]}" -- "${small[@]}" --train_epochs=2 --resume=auto
    expect_exit again 0
    if grep -qF -- "Resuming from $ckpt at epoch 1" <<<"$fm_out"; then fm_pass "again: the run continued"; else fm_fail "again: no line 'Resuming from $ckpt at epoch 1'"; fi
    if [[ $(csv_epochs) == "1 2" ]]; then fm_pass "again: rows 1 2"; else fm_fail "again: rows '$(csv_epochs)', expected '1 2'"; fi
    # The checkpoint removed after epochs were done (history rows 1 2): refused, not
    # replaced (before, the run's history went without a word).
    rm -f "$ckpt"
    fm_run removed "${launch[@]}" -- "${small[@]}" --train_epochs=1 --resume=auto
    expect_exit removed 2
    if grep -qF -- "--resume=auto: $model_dir has no checkpoint to continue, but its history.csv records 2 epochs: the run's checkpoint was removed" <<<"$fm_out"; then fm_pass "removed: refused, saying why"; else fm_fail "removed: no line '--resume=auto: $model_dir has no checkpoint to continue, but its history.csv records 2 epochs ...'"; fi
    if [[ $(csv_epochs) == "1 2" ]]; then fm_pass "removed: the history kept"; else fm_fail "removed: rows '$(csv_epochs)'"; fi
    # A run stopped in its first epoch leaves at most one row (written before the epoch's
    # checkpoint): replaced.
    head -n 2 "$model_dir/history.csv" >"$fm_tmp/header.csv" && mv "$fm_tmp/header.csv" "$model_dir/history.csv"
    fm_run over "${launch[@]}" -- "${small[@]}" --train_epochs=1 --resume=auto
    expect_exit over 0
    if grep -qF -- "--resume=auto: $model_dir has no checkpoint to continue (what a run without one left there is replaced), so a new run starts there" <<<"$fm_out"; then fm_pass "over: starting over, said"; else fm_fail "over: no line '--resume=auto: $model_dir has no checkpoint to continue (what a run without one left there is replaced), so a new run starts there'"; fi
    if [[ -s $ckpt && $(csv_epochs) == "1" ]]; then fm_pass "over: a new checkpoint and row 1 alone"; else fm_fail "over: rows '$(csv_epochs)'"; fi
    ;;

  warning_signal)
    # SIGUSR1 to the launcher (SLURM's --signal=B:USR1@120 warning) reaches every rank's
    # program: training stops after the current step on every rank, with a checkpoint of it
    # (inside its epoch), and the master says so; the same command with --resume=auto then
    # ends where a run straight through ends, bitwise. Before, training went on to the time
    # limit and the epoch under way was lost (and earlier still, the signal ended the ranks).
    sig_args=("${small[@]}" --num_train_samples=1024 --train_epochs=12)
    start_signal_run
    for _ in $(seq 300); do [[ -s $csv ]] && break; sleep 0.1; done
    # To the launcher, timeout's child (timeout itself would end by SIGUSR1).
    launcher_pid=$(pgrep -P "$job" | head -n 1)
    end_signal_run
    got=$(grep -c "^fashion_mnist: SIGUSR1 received (a batch system's warning before the time limit, say): training stops after the current step, with a checkpoint of it" <<<"$fm_out")
    if [[ $got == 1 ]]; then fm_pass "$case_name: the master said it once"; else fm_fail "$case_name: said $got times, expected once"; fi
    if grep -Eq "^fashion_mnist: stopped after step [0-9]+ on SIGUSR1 \(the run is not finished\): $ckpt holds it(, [0-9]+ steps? into its epoch| at the end of its epoch); run the same command with --resume=auto" <<<"$fm_out"; then
      fm_pass "$case_name: said where it stopped and how to continue"
    else
      fm_fail "$case_name: no 'fashion_mnist: stopped after step N on SIGUSR1 ...'"
    fi
    got=$(csv_epochs)
    if [[ -n $got && $got != *12 ]]; then fm_pass "$case_name: stopped before the end (history '$got')"; else fm_fail "$case_name: history.csv rows '$got'"; fi
    # A row for each finished epoch, none for the one the stop cut (16 steps an epoch): its
    # row comes with the resume, for all its steps (before, a row of its first steps alone).
    stop_step=$(sed -nE 's/^fashion_mnist: stopped after step ([0-9]+) on SIGUSR1.*/\1/p' <<<"$fm_out")
    if [[ -n $stop_step ]]; then
      # The checkpoint says how far into its epoch it is ("16 steps into its epoch" at an
      # epoch's last step when its validation was due: that epoch is unfinished too).
      into=$(sed -nE 's/^fashion_mnist: stopped after step [0-9]+ on SIGUSR1.*, ([0-9]+) steps? into its epoch.*/\1/p' <<<"$fm_out")
      finished=$(( (stop_step - ${into:-0}) / 16 ))
      want=$(seq -s ' ' 1 "$finished")
      if [[ $got == "$want" ]]; then fm_pass "$case_name: rows of the finished epochs only ('$got')"; else fm_fail "$case_name: history rows '$got' after a stop at step $stop_step, expected '$want'"; fi
    fi
    if grep -q "Forwarding signal" <<<"$fm_out"; then fm_fail "$case_name: mpirun's 'Forwarding signal' line came through"; fi
    fm_run "${case_name}_again" "${launch[@]}" -- "${sig_args[@]}" --resume=auto
    expect_exit "${case_name}_again" 0
    got=$(csv_epochs)
    if [[ $got == "1 2 3 4 5 6 7 8 9 10 11 12" ]]; then fm_pass "$case_name: all 12 epochs after --resume=auto"; else fm_fail "$case_name: history.csv rows '$got' after --resume=auto"; fi
    cp "$ckpt" "$fm_tmp/continued.safetensors"
    rm -r "$model_dir"
    fm_run "${case_name}_straight" "${launch[@]}" -- "${sig_args[@]}"
    expect_exit "${case_name}_straight" 0
    if cmp -s "$ckpt" "$fm_tmp/continued.safetensors"; then
      fm_pass "$case_name: the continued run's checkpoint equals the straight run's, byte for byte"
    else
      fm_fail "$case_name: the continued run's checkpoint differs from the straight run's"
    fi
    ;;

  resume_master_only_dir)
    # A --model_dir on the master's own disk: rank 1 sees an empty file system of its own over
    # it (a second host without that disk), and a resume still continues the run, with the
    # same result as where every rank sees the directory (the checkpoints are compared).
    train_good first 1
    cp -a "$model_dir" "$fm_tmp/shared_copy"
    wrap=$fm_tmp/other_disk.sh
    cat >"$wrap" <<EOF
#!/bin/sh
if [ "\${OMPI_COMM_WORLD_RANK:-0}" != 0 ]; then
  exec unshare --mount --propagation private sh -c 'mount -t tmpfs -o size=1m tnt-other-disk "\$0" && shift && exec "\$@"' "$model_dir" sh "$fm_program" "\$@"
fi
exec "$fm_program" "\$@"
EOF
    chmod +x "$wrap"
    real_program=$fm_program
    fm_program=$wrap
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --train_epochs=2 --resume
    fm_program=$real_program
    expect_exit "$case_name" 0
    if grep -qF "Resuming from $ckpt at epoch 1" <<<"$fm_out"; then fm_pass "$case_name: resumed at epoch 1"; else fm_fail "$case_name: no 'Resuming from $ckpt at epoch 1'"; fi
    got=$(csv_epochs)
    if [[ $got == "1 2" ]]; then fm_pass "$case_name: history.csv rows 1 2"; else fm_fail "$case_name: history.csv rows '$got', expected '1 2'"; fi
    fm_run shared "${launch[@]}" -- "${small[@]/--model_dir=*/--model_dir=$fm_tmp/shared_copy}" --train_epochs=2 --resume
    expect_exit shared 0
    if cmp -s "$ckpt" "$fm_tmp/shared_copy/checkpoint.safetensors"; then
      fm_pass "$case_name: the same checkpoint as a resume in a directory every rank sees"
    else
      fm_fail "$case_name: the checkpoint differs from a resume in a directory every rank sees"
    fi
    ;;

  resume_after_crash)
    train_good good 1
    cp "$ckpt" "$fm_tmp/epoch1.safetensors"
    train_good two 2 --resume
    cp "$fm_tmp/epoch1.safetensors" "$ckpt"
    printf '3,0.4' >>"$csv"
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --train_epochs=3 --resume
    expect_exit "$case_name" 0
    got=$(csv_epochs)
    if [[ $got == "1 2 3" ]]; then
      fm_pass "$case_name: history.csv rows 1 2 3"
    else
      fm_fail "$case_name: history.csv rows are epochs '$got', expected '1 2 3'"
      cat "$csv"
    fi
    if ls -A "$model_dir" | grep -q 'tmp'; then fm_fail "$case_name: a temporary file was left in $model_dir"; fi
    ;;

  existing_model_dir)
    train_good good 1
    cp "$ckpt" "$fm_tmp/good.safetensors"
    cp "$csv" "$fm_tmp/good.csv"
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --train_epochs=0
    expect_exit "$case_name" failure
    fm_expect_fixed "$case_name" "--model_dir=$model_dir already holds" "the directory"
    fm_expect_grep "$case_name" "--resume.*--overwrite" "the choices"
    # Every rank refuses, but the first one to fail ends the job (MPI_Abort), so the other's
    # line may not get through before it is stopped: at least one, at most one per rank.
    n=$(grep -c '^error' <<<"$fm_out")
    if [[ $n -ge 1 && $n -le 2 ]]; then fm_pass "$case_name: reported ($n error lines)"; else fm_fail "$case_name: $n error lines, expected 1 or 2"; fi
    same_file "$case_name" "$ckpt" "$fm_tmp/good.safetensors" "the checkpoint"
    same_file "$case_name" "$csv" "$fm_tmp/good.csv" "history.csv"
    fm_run overwrite "${launch[@]}" -- "${small[@]}" --train_epochs=2 --overwrite --seed=7
    expect_exit overwrite 0
    got=$(csv_epochs)
    if [[ $got == "1 2" ]]; then fm_pass "overwrite: history.csv rows 1 2"; else fm_fail "overwrite: history.csv rows are epochs '$got', expected '1 2'"; fi
    if cmp -s "$ckpt" "$fm_tmp/good.safetensors"; then fm_fail "overwrite: the old checkpoint is still there"; else fm_pass "overwrite: a new checkpoint"; fi
    ;;

  interrupted_first_epoch)
    # As SIGINT in epoch 1 leaves it: CSVLogger has opened history.csv, no epoch has ended.
    mkdir -p "$model_dir"
    : >"$csv"
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --train_epochs=1
    expect_exit "$case_name" failure
    fm_expect_fixed "$case_name" "--model_dir=$model_dir holds an earlier run's history.csv but no checkpoint to resume \
from (checkpoint.safetensors): give --overwrite to replace it, or choose another --model_dir" "the directory and the choices"
    if grep -q -- "--resume" <<<"$fm_err"; then
      fm_fail "$case_name: --resume suggested where there is no checkpoint"
    else
      fm_pass "$case_name: --resume not suggested"
    fi
    [[ -s $csv || -e $ckpt ]] && fm_fail "$case_name: the refused run wrote to the directory"
    fm_run overwrite "${launch[@]}" -- "${small[@]}" --train_epochs=1 --overwrite
    expect_exit overwrite 0
    got=$(csv_epochs)
    if [[ $got == "1" && -f $ckpt ]]; then fm_pass "overwrite: trained epoch 1"; else fm_fail "overwrite: history.csv rows '$got', checkpoint $([[ -f $ckpt ]] && echo present || echo missing)"; fi
    ;;

  resume_below_checkpoint)
    train_good good 2
    cp "$ckpt" "$fm_tmp/good.safetensors"
    cp "$csv" "$fm_tmp/good.csv"
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --train_epochs=1 --resume
    expect_exit "$case_name" 0
    line="Nothing to train (the checkpoint is at epoch 2, --train_epochs=1): evaluating its weights"
    if grep -qxF "$line" <<<"$fm_out"; then fm_pass "$case_name: '$line'"; else fm_fail "$case_name: no line '$line'"; fi
    if grep -Eq '^Test loss: [0-9.]+  test accuracy: [0-9.]+  \(2 epochs, 2 ranks\)$' <<<"$fm_out"; then
      fm_pass "$case_name: the test result of the 2 epochs"
    else
      fm_fail "$case_name: no 'Test loss: ... (2 epochs, 2 ranks)'"
    fi
    same_file "$case_name" "$csv" "$fm_tmp/good.csv" "history.csv"
    epoch=$(head -c 4096 "$ckpt" | grep -ao '"epoch":"[0-9]*"')
    if [[ $epoch == '"epoch":"2"' ]]; then fm_pass "$case_name: the checkpoint still at epoch 2"; else fm_fail "$case_name: checkpoint metadata $epoch, expected epoch 2"; fi
    ;;

  overwrite_tensorboard)
    train_good first 1 --enable_tensorboard
    # The user's own files beside the event files stay.
    echo notes >"$model_dir/train/notes.txt"
    echo notes >"$model_dir/validation/events.txt"
    echo notes >"$model_dir/notes.txt"
    events() { find "$model_dir/train" "$model_dir/validation" -name 'events.out.tfevents.*' | sort; }
    old=$(events)
    if [[ $(wc -l <<<"$old") -eq 2 ]]; then fm_pass "first: an event file in train/ and one in validation/"; else fm_fail "first: event files '$old'"; fi
    train_good second 1 --enable_tensorboard --overwrite
    n_train=$(find "$model_dir/train" -name 'events.out.tfevents.*' | wc -l)
    n_val=$(find "$model_dir/validation" -name 'events.out.tfevents.*' | wc -l)
    if [[ $n_train -eq 1 && $n_val -eq 1 ]]; then
      fm_pass "second: one event file in train/ and one in validation/ (the earlier run's removed)"
    else
      fm_fail "second: $n_train event files in train/, $n_val in validation/, expected 1 and 1"
    fi
    for f in train/notes.txt validation/events.txt notes.txt; do
      if [[ -f $model_dir/$f ]]; then fm_pass "second: $f kept"; else fm_fail "second: $f removed"; fi
    done
    ;;

  resume_missing_model_dir)
    absent=$fm_tmp/absent/model
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --model_dir="$absent" --train_epochs=1 --resume
    expect_exit "$case_name" failure
    fm_expect_fixed "$case_name" "--model_dir=$absent: no such directory" "the directory"
    if [[ -e $fm_tmp/absent ]]; then fm_fail "$case_name: $fm_tmp/absent was created"; else fm_pass "$case_name: nothing created"; fi
    : >"$fm_tmp/a_file"
    fm_run model_dir_file "${launch[@]}" -- "${small[@]}" --model_dir="$fm_tmp/a_file" --train_epochs=1
    expect_exit model_dir_file failure
    fm_expect_fixed model_dir_file "--model_dir=$fm_tmp/a_file: is a file, expected a directory" "what the path is"
    # An empty --model_dir (an unset shell variable) is named as such (before: "cannot
    # create it: Invalid argument").
    fm_run model_dir_empty "${launch[@]}" -- "${small[@]}" --model_dir= --train_epochs=1
    expect_exit model_dir_empty failure
    fm_expect_fixed model_dir_empty "--model_dir is empty" "the empty flag"
    # A directory of the user's without a checkpoint: refused as such, and left as it was
    # (before: refused later, with the run's lock file left in it).
    mkdir "$fm_tmp/theirs"
    echo notes >"$fm_tmp/theirs/notes.txt"
    fm_run resume_other_dir "${launch[@]}" -- "${small[@]}" --model_dir="$fm_tmp/theirs" --train_epochs=1 --resume
    expect_exit resume_other_dir failure
    fm_expect_fixed resume_other_dir "--resume: no checkpoint at $fm_tmp/theirs/checkpoint.safetensors, so no run to continue there" \
      "the checkpoint it looked for"
    got=$(ls -A "$fm_tmp/theirs" | tr '\n' ' ')
    [[ $got == "notes.txt " ]] && fm_pass "resume_other_dir: the directory left as it was" || fm_fail "resume_other_dir: it holds '$got'"
    ;;

  default_run_dirs)
    # The default directory is relative: run from the test's own directory. The data go
    # through a link in it, so that every command line names the test's directory.
    cd "$fm_tmp" || exit 1
    ln -s "$fm_data" "$fm_tmp/data"
    plain=(--model=mlp --num_train_samples=256 --batch_size=64 --verbose=0 --data_dir="$fm_tmp/data")
    base=$fm_tmp/fashion_mnist_model
    fm_run first "${launch[@]}" -- "${plain[@]}" --train_epochs=1
    expect_exit first 0
    first=$(sed -nE 's|^Writing to \./fashion_mnist_model/(run-[0-9]{8}-[0-9]{6}(-[0-9]+)?) .*|\1|p' <<<"$fm_out")
    if [[ -n $first && -f $base/$first/checkpoint.safetensors ]]; then fm_pass "first: named $first, wrote there"; else fm_fail "first: no 'Writing to ./fashion_mnist_model/run-...' line naming a directory with a checkpoint"; fi
    cp "$base/$first/checkpoint.safetensors" "$fm_tmp/first.safetensors"
    fm_run second "${launch[@]}" -- "${plain[@]}" --train_epochs=1 --seed=7
    expect_exit second 0
    second=$(sed -nE 's|^Writing to \./fashion_mnist_model/(run-[^ ]*) .*|\1|p' <<<"$fm_out")
    if [[ -n $second && $second != "$first" && -f $base/$second/history.csv ]]; then fm_pass "second: its own directory $second"; else fm_fail "second: directory '$second' (the first's: '$first')"; fi
    same_file second "$base/$first/checkpoint.safetensors" "$fm_tmp/first.safetensors" "the first run's checkpoint"
    if [[ $(readlink "$base/latest") == "$second" ]]; then fm_pass "latest -> $second"; else fm_fail "latest -> '$(readlink "$base/latest")', expected $second"; fi
    # A newer run without a checkpoint (one that failed before its first epoch ended) is
    # passed over.
    mkdir "$base/run-99991231-235959"
    fm_run resumed "${launch[@]}" -- "${plain[@]}" --train_epochs=2 --resume --seed=7
    expect_exit resumed 0
    if grep -qF "continuing ./fashion_mnist_model/$second (the newest run under ./fashion_mnist_model with a checkpoint)" <<<"$fm_out"; then fm_pass "resumed: continues $second, named"; else fm_fail "resumed: no line naming $second as the run continued"; fi
    got=$(awk -F, 'NR > 1 { printf "%s%s", sep, $1; sep = " " }' "$base/$second/history.csv")
    if [[ $got == "1 2" ]]; then fm_pass "resumed: $second/history.csv rows 1 2"; else fm_fail "resumed: $second/history.csv rows '$got', expected '1 2'"; fi
    # A restart of tarantella --max-restarts (the variables it sets for each attempt) goes on
    # in its first attempt's run directory, not in a new one.
    TNT_RUN_ID=fm-e2e-launch TNT_RESTART=0 fm_run attempt0 "${launch[@]}" -- "${plain[@]}" --train_epochs=1
    expect_exit attempt0 0
    attempt=$(sed -nE 's|^Writing to \./fashion_mnist_model/(run-[^ ]*) .*|\1|p' <<<"$fm_out")
    TNT_RUN_ID=fm-e2e-launch TNT_RESTART=1 fm_run attempt1 "${launch[@]}" -- "${plain[@]}" --train_epochs=2
    expect_exit attempt1 0
    if [[ -n $attempt ]] && grep -qF "Restart 1 (TNT_RESTART): continuing from ./fashion_mnist_model/$attempt/checkpoint.safetensors" <<<"$fm_out"; then
      fm_pass "attempt1: continues $attempt"
    else
      fm_fail "attempt1: does not continue the first attempt's run directory '$attempt'"
    fi
    # A restart whose first attempt left no checkpoint starts over, and says so.
    rm -f "$base/$attempt/checkpoint.safetensors"
    TNT_RUN_ID=fm-e2e-launch TNT_RESTART=2 fm_run attempt2 "${launch[@]}" -- "${plain[@]}" --train_epochs=1
    expect_exit attempt2 0
    if grep -qF "Restart 2 (TNT_RESTART): the first attempt ended before its first checkpoint, so training starts over in ./fashion_mnist_model/$attempt" <<<"$fm_out"; then
      fm_pass "attempt2: starting over is said"
    else
      fm_fail "attempt2: no line saying that the restart starts over"
    fi
    # A `latest` that is the user's own file is left alone, and the note no longer claims it
    # names the newest run (before: a warning, then "... latest is the newest").
    rm -f "$base/latest"
    echo mine >"$base/latest"
    fm_run own_latest "${launch[@]}" -- "${plain[@]}" --train_epochs=1
    expect_exit own_latest 0
    if grep -qF "fashion_mnist_model/latest is not a symbolic link: not pointing it at the new run" <<<"$fm_out"; then fm_pass "own_latest: the warning"; else fm_fail "own_latest: no warning that latest is not a link"; fi
    if grep -qE '^Writing to .*is the newest' <<<"$fm_out"; then fm_fail "own_latest: the note says latest is the newest"; else fm_pass "own_latest: the note does not claim latest"; fi
    if [[ $(cat "$base/latest") == mine ]]; then fm_pass "own_latest: the file is left as it was"; else fm_fail "own_latest: the user's latest was changed"; fi
    ;;

  restart_taken_over)
    # A launch with --max-restarts (its variables set by hand; the launcher's run id begins
    # with the launch's start, seconds since the epoch) trains in $model_dir; then, before
    # its restart, another run takes the directory. Before, the restart continued the other
    # run's checkpoint as its own (a run without a launch kept the first one's marker), or
    # applied its first attempt's --overwrite to the other launch's finished run.
    a_id="$(date +%s)-fm-e2e-a"
    TNT_RUN_ID=$a_id TNT_RESTART=0 train_good a0 1
    fm_run by_hand "${launch[@]}" -- "${small[@]}" --train_epochs=1 --seed=9 --overwrite
    expect_exit by_hand 0
    cp "$ckpt" "$fm_tmp/by_hand.safetensors"
    TNT_RUN_ID=$a_id TNT_RESTART=1 fm_run a1 "${launch[@]}" -- "${small[@]}" --train_epochs=2
    [[ $fm_rc -eq 2 ]] && fm_pass "a1: exit status 2" || fm_fail "a1: exit status $fm_rc, expected 2"
    grep -qF "restart 1 (TNT_RESTART) of this launch finds the directory taken by another run since its first attempt (a run without --max-restarts wrote" <<<"$fm_out" &&
      fm_pass "a1: the takeover named" || fm_fail "a1: no message about the directory taken over"
    same_file a1 "$ckpt" "$fm_tmp/by_hand.safetensors" "the run by hand's checkpoint"
    # Another launch (its own marker), both with --overwrite, as a sweep script starts them.
    a_id="$(date +%s)-fm-e2e-a2"
    TNT_RUN_ID=$a_id TNT_RESTART=0 train_good a0_again 1 --overwrite
    b_id="$(date +%s)-fm-e2e-b"
    TNT_RUN_ID=$b_id TNT_RESTART=0 train_good b0 1 --overwrite --seed=9
    cp "$ckpt" "$fm_tmp/b.safetensors"
    TNT_RUN_ID=$a_id TNT_RESTART=1 fm_run a1_again "${launch[@]}" -- "${small[@]}" --train_epochs=2 --overwrite
    [[ $fm_rc -eq 2 ]] && fm_pass "a1_again: exit status 2" || fm_fail "a1_again: exit status $fm_rc, expected 2"
    grep -qF "(another launch marked it), so it neither continues nor replaces that run" <<<"$fm_out" &&
      fm_pass "a1_again: the other launch named" || fm_fail "a1_again: no message about the other launch"
    same_file a1_again "$ckpt" "$fm_tmp/b.safetensors" "the other launch's checkpoint"
    # Its own directory, untouched since: the restart continues as before.
    TNT_RUN_ID=$b_id TNT_RESTART=1 fm_run b1 "${launch[@]}" -- "${small[@]}" --train_epochs=2 --overwrite --seed=9
    expect_exit b1 0
    grep -qF "Restart 1 (TNT_RESTART): continuing from $ckpt" <<<"$fm_out" &&
      fm_pass "b1: continues its own run" || fm_fail "b1: does not continue its own run"
    # A launch whose first attempt failed before it marked the directory (a node lost while
    # resnet50 scanned its data) finds an earlier launch's marker and outputs, all older than
    # itself: its restart is checked as its first attempt was (--resume: it continues).
    sleep 1.1
    c_id="$(date +%s)-fm-e2e-c"
    TNT_RUN_ID=$c_id TNT_RESTART=1 fm_run c1 "${launch[@]}" -- "${small[@]}" --train_epochs=3 --resume --seed=9
    expect_exit c1 0
    [[ $(csv_epochs) == "1 2 3" ]] && fm_pass "c1: continued the earlier run to epoch 3" ||
      fm_fail "c1: history.csv rows '$(csv_epochs)', expected '1 2 3'"
    ;;

  overwrite_symlinked_train)
    train_good first 1
    mkdir -p "$fm_tmp/unrelated"
    echo keep >"$fm_tmp/unrelated/events.out.tfevents.1.host"
    ln -s "$fm_tmp/unrelated" "$model_dir/train"
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --train_epochs=1 --overwrite
    if [[ $fm_rc -eq 2 ]]; then fm_pass "$case_name: exit status 2"; else fm_fail "$case_name: exit status $fm_rc, expected 2"; fi
    fm_expect_fixed "$case_name" "$model_dir/train is a symbolic link (to $fm_tmp/unrelated)" "the link"
    if [[ -f $fm_tmp/unrelated/events.out.tfevents.1.host ]]; then fm_pass "$case_name: the file behind the link kept"; else fm_fail "$case_name: the file behind the link was removed"; fi
    ;;

  dangling_history_link)
    mkdir -p "$model_dir"
    ln -s "$fm_tmp/elsewhere.csv" "$csv"
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --train_epochs=1
    if [[ $fm_rc -eq 2 ]]; then fm_pass "$case_name: exit status 2"; else fm_fail "$case_name: exit status $fm_rc, expected 2"; fi
    fm_expect_fixed "$case_name" "$csv is a symbolic link (to $fm_tmp/elsewhere.csv)" "the link"
    if [[ -e $fm_tmp/elsewhere.csv ]]; then fm_fail "$case_name: a file was written where the link points"; else fm_pass "$case_name: nothing written where the link points"; fi
    # A --model_dir that is a dangling link: named with its target (before: 'cannot create
    # it: File exists').
    ln -s "$fm_tmp/nowhere" "$fm_tmp/linked_dir"
    fm_run dangling_dir "${launch[@]}" -- "${small[@]/--model_dir=*/--model_dir=$fm_tmp/linked_dir}" --train_epochs=1
    expect_exit dangling_dir 2
    fm_expect_fixed dangling_dir "--model_dir=$fm_tmp/linked_dir: a symbolic link to $fm_tmp/nowhere, which does not exist" "the link and its target"
    ;;

  early_warning_signal)
    # SIGUSR1 while the ranks start (a requeued job that starts near its limit): before, the
    # programs died by it (exit 138). Now tarantella holds it until the ranks enter MPI_Init,
    # and a program of models/ keeps one that comes earlier still: training stops after its
    # first step, with a checkpoint of it, exit 0.
    sig_args=("${small[@]}" --num_train_samples=1024 --train_epochs=12)
    start_signal_run
    # As soon as the launcher has started mpirun (timeout's child's child): its ranks are
    # starting then.
    launcher_pid=""
    for _ in $(seq 300); do
      launcher_pid=$(pgrep -P "$job" | head -n 1)
      [[ -n $launcher_pid && -n $(pgrep -P "$launcher_pid") ]] && break
      sleep 0.01
    done
    end_signal_run
    if grep -Fq "fashion_mnist: stopped after step 1 on SIGUSR1 (the run is not finished): $ckpt holds it, 1 step into its epoch" <<<"$fm_out"; then
      fm_pass "$case_name: stopped after the first step, and said so"
    else
      fm_fail "$case_name: no 'fashion_mnist: stopped after step 1 on SIGUSR1 ... 1 step into its epoch'"
    fi
    if [[ -f $ckpt ]]; then fm_pass "$case_name: the checkpoint is there"; else fm_fail "$case_name: no checkpoint"; fi
    # Inside an epoch the batches must stay: another --batch_size is refused, naming it (before:
    # the library's 'global batch of N samples', without the flag).
    fm_run inside_other_batch "${launch[@]}" -- "${sig_args[@]}" --batch_size=48 --resume
    expect_exit inside_other_batch 2
    if grep -Eq -- "--batch_size=48: the run being resumed \($ckpt\) stopped 1 step into epoch 1 with --batch_size=[0-9]+, and a resume inside an epoch skips the batches already taken" <<<"$fm_out"; then
      fm_pass "inside_other_batch: refused, naming the flag and the step"
    else
      fm_fail "inside_other_batch: no '--batch_size=48: the run being resumed ... stopped 1 step into epoch 1 ...'"
    fi
    # The same with --micro_batch_size: the message says how the global batch came about, and
    # the micro-batch that gives the one needed (before, it named a --batch_size never given,
    # and its advice was refused as disagreeing with the micro-batch).
    micro_args=()
    for a in "${sig_args[@]}"; do [[ $a == --batch_size=* ]] || micro_args+=("$a"); done
    fm_run inside_other_micro "${launch[@]}" -- "${micro_args[@]}" --micro_batch_size=16 --resume
    expect_exit inside_other_micro 2
    fm_expect_fixed inside_other_micro "the global batch 32 (--micro_batch_size=16 x 2 ranks): the run being resumed" \
      "the global batch and the micro-batch"
    fm_expect_fixed inside_other_micro \
      "give --batch_size=64 (without --micro_batch_size), or --micro_batch_size=32 to finish the epoch" "the advice"
    ;;

  fifo_checkpoint)
    # A FIFO where the checkpoint goes: --resume and --resume=auto are refused naming it
    # (before, the resume check opened it and waited for a writer that never came).
    mkdir -p "$model_dir"
    mkfifo "$model_dir/checkpoint.safetensors"
    for resume in --resume --resume=auto; do
      fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --train_epochs=1 "$resume"
      if [[ $fm_rc -eq 2 ]]; then fm_pass "$case_name: $resume: exit status 2"; else fm_fail "$case_name: $resume: exit status $fm_rc, expected 2"; fi
      fm_expect_fixed "$case_name" "$model_dir/checkpoint.safetensors': not a regular file (a FIFO" "the FIFO"
    done
    ;;

  concurrent_runs)
    # The first run trains long enough (200 epochs of 4 steps) to be running when the
    # second starts; its first history row says it is past the directory's checks.
    timeout -k 5 "$fm_limit" "$fm_launcher" "${launch[@]}" -- "$fm_program" "${small[@]}" --train_epochs=200 \
      </dev/null >"$fm_tmp/first.out" 2>&1 &
    first_job=$!
    # While it runs, its processes are not the second run's strays.
    fm_strays() {
      local p
      for p in $(pgrep -f -- "$fm_tmp"); do
        tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "--train_epochs=200" || echo "$p"
      done
    }
    for _ in $(seq 200); do [[ -s $csv ]] && break; sleep 0.2; done
    [[ -s $csv ]] || fm_fail "first: no history row after 40 s"
    fm_run second "${launch[@]}" -- "${small[@]}" --train_epochs=1 --overwrite
    if [[ $fm_rc -eq 2 ]]; then fm_pass "second: exit status 2"; else fm_fail "second: exit status $fm_rc, expected 2"; fi
    owner=$(sed -nE 's/.*another run is using it \(process ([0-9]+) on .*/\1/p' <<<"$fm_err" | head -1)
    if [[ -n $owner ]] && grep -q -- "$fm_program" "/proc/$owner/cmdline" 2>/dev/null; then
      fm_pass "second: names the first run's process ($owner)"
    else
      fm_fail "second: names process '$owner', which is not a running $fm_program"
    fi
    # A crash leaves no stale lock: the kernel drops it with the process.
    [[ -n $owner ]] && kill -9 "$owner"
    wait "$first_job"
    fm_strays() { pgrep -f -- "$fm_tmp" || true; }
    fm_run third "${launch[@]}" -- "${small[@]}" --train_epochs=1 --overwrite
    expect_exit third 0
    # A --resume while another run holds the directory and its checkpoint is gone (an
    # --overwrite that has just removed it): the run using it is named. Before: "no
    # checkpoint ..., so no run to continue there".
    held=$fm_tmp/held
    mkdir -p "$held"
    echo "$$ lockholder" >"$held/.tarantella-lock"
    (
      exec 9>>"$held/.tarantella-lock"
      flock 9
      exec sleep 60  # holds the lock (fd 9) until it is killed
    ) &
    holder=$!
    fm_strays() { pgrep -f -- "$fm_tmp" | grep -vx "$holder" || true; }
    sleep 0.5
    fm_run held "${launch[@]}" -- --model=mlp --num_train_samples=256 --batch_size=64 --verbose=0 \
      --model_dir="$held" --resume --train_epochs=1
    kill "$holder" 2>/dev/null
    wait "$holder" 2>/dev/null
    fm_strays() { pgrep -f -- "$fm_tmp" || true; }
    [[ $fm_rc -eq 2 ]] && fm_pass "held: exit status 2" || fm_fail "held: exit status $fm_rc, expected 2"
    grep -qF "another run is using it (process $$ on lockholder" <<<"$fm_err" &&
      fm_pass "held: names the run holding it" || fm_fail "held: does not name the run holding the directory"
    ;;

  resume_other_columns)
    train_good first 1
    sed -i '1s/.*/epoch,loss,accuracy,val_loss/' "$csv"
    cp "$csv" "$fm_tmp/before.csv"
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --train_epochs=2 --resume
    if [[ $fm_rc -eq 2 ]]; then fm_pass "$case_name: exit status 2"; else fm_fail "$case_name: exit status $fm_rc, expected 2"; fi
    fm_expect_fixed "$case_name" "CSVLogger: '$csv' has the columns epoch,loss,accuracy,val_loss but this run logs" "the file and the columns"
    same_file "$case_name" "$csv" "$fm_tmp/before.csv" "history.csv"
    ;;

  resume_missing_history)
    train_good first 1
    rm "$csv"
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --train_epochs=2 --resume
    expect_exit "$case_name" 0
    if grep -qF "CSVLogger: '$csv' is missing: the history of this resumed run starts at epoch 2" <<<"$fm_out"; then fm_pass "$case_name: said so"; else fm_fail "$case_name: no line saying history.csv is missing"; fi
    got=$(csv_epochs)
    if [[ $got == "2" ]]; then fm_pass "$case_name: a new history.csv from epoch 2"; else fm_fail "$case_name: history.csv rows '$got', expected '2'"; fi
    ;;

  *)
    echo "unknown case '$case_name'" >&2
    exit 2
    ;;
esac
fm_finish
