#!/usr/bin/env bash
# Bad input to fashion_mnist on 2 ranks through the launcher: each case must end with a
# non-zero exit, a message that names the bad input, no hang and no process left behind.
#
#   fashion_mnist_bad_input.sh LAUNCHER PROGRAM CASE
#
# CASE: missing_data_dir, truncated_gzip, truncated_idx, corrupt_gzip,
#       batch_smaller_than_ranks, micro_batch_mismatch, checkpoint_other_model,
#       micro_batch_uneven, negative_micro_batch, too_many_train_samples, resume_other_seed,
#       checkpoint_negative_epoch, label_out_of_range, wrong_image_size, checkpoint_negative_step,
#       empty_test_set, gzip_bomb
#
# Every case also checks that Open MPI's own account of the failure (the MPI_ABORT banner,
# ORTE_ERROR_LOG lines naming its source files, "Primary job terminated normally") stays
# out of the output: the ranks' messages and the launcher's line say what happened.
source "$(dirname "${BASH_SOURCE[0]}")/fashion_mnist_common.sh" "$@"
[[ $# -eq 3 ]] || { echo "usage: $0 LAUNCHER PROGRAM CASE" >&2; exit 2; }
case_name=$3

# Every run: 2 ranks, 1 thread each (the machine may have 2 cores only), small and quick.
launch=(-n 2 -x TNT_NUM_THREADS=1)
small=(--model=mlp --num_train_samples=256 --train_epochs=1 --verbose=0 --model_dir="$fm_tmp/model")

# A copy of the data set to damage.
copy_data() {
  fm_need_data
  mkdir -p "$fm_tmp/data"
  cp "$fm_data"/*-idx?-ubyte* "$fm_tmp/data/"
}

# The checks every bad-input case shares.
expect_failure() {
  local name=$1
  if [[ $fm_rc -eq 0 ]]; then
    fm_fail "$name: exit status 0, expected non-zero"
  elif [[ $fm_rc -ge 124 ]]; then
    fm_fail "$name: exit status $fm_rc (a timeout or a signal), expected an error exit"
  else
    fm_pass "$name: exit status $fm_rc"
  fi
  # A clear message, not a crash.
  if grep -Eq 'terminate called|Segmentation fault|core dumped|Assertion .* failed' <<<"$fm_out"; then
    fm_fail "$name: the program crashed instead of reporting the error"
  fi
  if grep -Eq 'MPI_ABORT|ORTE_ERROR_LOG|Primary job|exited with non-zero status|orte_base_help_aggregate' <<<"$fm_out"
  then
    fm_fail "$name: Open MPI's banner or log lines in the output"
  else
    fm_pass "$name: no Open MPI banner or log line"
  fi
  if grep -Eq 'tarantella: rank [01] \(host .*\) failed first: exit code [1-9]' <<<"$fm_out"; then
    fm_pass "$name: the launcher names the rank that failed first"
  else
    fm_fail "$name: no 'tarantella: rank N (host ...) failed first: exit code ...' line"
  fi
}

# Trains the MLP for one epoch on 1 rank with the given extra flags, for a checkpoint in
# $fm_tmp/model (which job wrote it does not matter to the cases that use it).
train_checkpoint() {
  fm_run train_mlp -n 1 -x TNT_NUM_THREADS=1 -- "${small[@]}" "$@"
  if [[ $fm_rc -ne 0 || ! -f $fm_tmp/model/checkpoint.safetensors ]]; then
    fm_fail "train_mlp: training the MLP to make a checkpoint failed (exit status $fm_rc)"
    fm_finish
  fi
}

# set_checkpoint_metadata KEY VALUE: rewrites one metadata entry of the trained checkpoint
# (an empty VALUE removes it)
# (the safetensors header, padded to 8 bytes), as a damaged or foreign file would have it.
set_checkpoint_metadata() {
  local python=${PYTHON:-python3}
  command -v "$python" >/dev/null || python=/usr/bin/python3
  "$python" - "$fm_tmp/model/checkpoint.safetensors" "$1" "$2" <<'PY'
import json, struct, sys
path, key, value = sys.argv[1:4]
data = open(path, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
if value:
    header["__metadata__"][key] = value
else:
    header["__metadata__"].pop(key, None)
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(path, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PY
}

case $case_name in
  missing_data_dir)
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --data_dir="$fm_tmp/no_such_dir"
    expect_failure "$case_name"
    fm_expect_fixed "$case_name" "--data_dir=$fm_tmp/no_such_dir" "the flag and the directory"
    fm_expect_grep "$case_name" "no such directory" "the problem"
    ;;

  truncated_gzip)
    # Half of the compressed training images: the gzip stream ends early.
    copy_data
    f=$fm_tmp/data/train-images-idx3-ubyte.gz
    truncate -s $(($(stat -c %s "$f") / 2)) "$f"
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --data_dir="$fm_tmp/data"
    expect_failure "$case_name"
    fm_expect_fixed "$case_name" "$f" "the damaged file"
    fm_expect_grep "$case_name" "truncated" "the problem"
    ;;

  truncated_idx)
    # An uncompressed IDX file (which the loader prefers to the .gz beside it) cut short
    # inside its data: the header promises 10000 labels, the file holds 5000.
    copy_data
    f=$fm_tmp/data/t10k-labels-idx1-ubyte
    gunzip -c "$f.gz" >"$f"
    truncate -s $((8 + 5000)) "$f"
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --data_dir="$fm_tmp/data"
    expect_failure "$case_name"
    fm_expect_fixed "$case_name" "'$f'" "the damaged file"
    # The header's numbers, not the file's size + 1 (5001 values, 5001 bytes).
    fm_expect_fixed "$case_name" "truncated: 10000 values of u8 with dimensions (10000,) need 10000 data bytes, the file has 5000" "the problem with the header's numbers"
    ;;

  corrupt_gzip)
    # 64 bytes of zeros in the middle of the compressed test images: the deflate stream is
    # invalid or its CRC-32 does not match.
    copy_data
    f=$fm_tmp/data/t10k-images-idx3-ubyte.gz
    dd if=/dev/zero of="$f" bs=1 count=64 seek=$(($(stat -c %s "$f") / 2)) conv=notrunc status=none
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --data_dir="$fm_tmp/data"
    expect_failure "$case_name"
    fm_expect_fixed "$case_name" "$f" "the damaged file"
    fm_expect_grep "$case_name" "gzip" "the problem"
    ;;

  label_out_of_range)
    # Label 12 (of 10 classes) at sample 5 of the test labels: named with its file and
    # sample when the data are loaded, on every rank, not at a training step.
    copy_data
    f=$fm_tmp/data/t10k-labels-idx1-ubyte
    gunzip -c "$f.gz" >"$f"
    rm "$f.gz"  # beside a plain file with other data, it is refused as such (data_idx)
    printf '\x0c' | dd of="$f" bs=1 seek=$((8 + 5)) conv=notrunc status=none
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --data_dir="$fm_tmp/data"
    expect_failure "$case_name"
    fm_expect_fixed "$case_name" "'$f': label 12 of sample 5 (0-based) is outside the 10 classes" \
      "the file, the label and the sample"
    ;;

  wrong_image_size)
    # Test images of 32x32 (the model takes 28x28): named with their file.
    copy_data
    f=$fm_tmp/data/t10k-images-idx3-ubyte
    rm "$f.gz"
    { printf '\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x20\x00\x00\x00\x20'; head -c 2048 /dev/zero; } >"$f"
    f2=$fm_tmp/data/t10k-labels-idx1-ubyte
    { printf '\x00\x00\x08\x01\x00\x00\x00\x02\x01\x02'; } >"$f2"
    rm "$f2.gz"
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --data_dir="$fm_tmp/data"
    expect_failure "$case_name"
    fm_expect_fixed "$case_name" "'$f': its images are 32x32, expected 28x28" "the file and the sizes"
    ;;

  batch_smaller_than_ranks)
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --batch_size=1
    expect_failure "$case_name"
    fm_expect_grep "$case_name" "batch[ _]size[ =]1\b" "the batch size 1"
    fm_expect_grep "$case_name" "ranks? 2|2 ranks" "the number of ranks"
    fm_expect_fixed "$case_name" "--batch_size=1: smaller than the 2 ranks" "the flag and the ranks"
    ;;

  ranks_disagree)
    # Each rank given its own flags (a wrapper adds RANK_ARGS_<rank>). Another --seed on one
    # rank is refused naming both (before: each rank took its part of other shuffled
    # batches, exit 0); another --model builds another network, refused naming the first
    # tensor that differs (before: SIGSEGV inside MPI's broadcast, exit 139).
    printf '#!/bin/bash\nextra=RANK_ARGS_${OMPI_COMM_WORLD_RANK:-0}\nexec "%s" "$@" ${!extra}\n' "$fm_program" \
      >"$fm_tmp/per_rank.sh"
    chmod +x "$fm_tmp/per_rank.sh"
    fm_program=$fm_tmp/per_rank.sh
    base=(--num_train_samples=256 --train_epochs=1 --verbose=0 --model_dir="$fm_tmp/model")
    fm_run seed "${launch[@]}" -x RANK_ARGS_0=--seed=42 -x RANK_ARGS_1=--seed=43 -- --model=mlp "${base[@]}"
    expect_failure seed
    [[ $fm_rc -eq 2 ]] && fm_pass "seed: exit status 2 (input)" || fm_fail "seed: exit status $fm_rc, expected 2"
    fm_expect_fixed seed "--seed: the ranks were given different seeds (rank 0 has 42, rank 1 has 43)" \
      "the flag and each rank's value"
    fm_run model "${launch[@]}" -x RANK_ARGS_0=--model=mlp -x RANK_ARGS_1=--model=cnn -- "${base[@]}"
    expect_failure model
    [[ $fm_rc -eq 2 ]] && fm_pass "model: exit status 2 (input)" || fm_fail "model: exit status $fm_rc, expected 2"
    fm_expect_fixed model "the ranks built different networks (tensor 1: rank(s) 0:" "the networks and the ranks"
    # A resume whose ranks compiled other optimizers: the master's checkpoint holds Adam's
    # state, rank 1's model SGD's (before: the broadcasts paired other sizes).
    train_checkpoint
    fm_run optimizer "${launch[@]}" -x RANK_ARGS_1=--optimizer=sgd -- --model=mlp --num_train_samples=256 \
      --train_epochs=2 --verbose=0 --model_dir="$fm_tmp/model" --resume
    expect_failure optimizer
    [[ $fm_rc -eq 2 ]] && fm_pass "optimizer: exit status 2 (input)" || fm_fail "optimizer: exit status $fm_rc, expected 2"
    fm_expect_fixed optimizer "load_checkpoint_from_master '$fm_tmp/model/checkpoint.safetensors': the ranks built different networks" \
      "the checkpoint and the ranks"
    ;;

  newer_checkpoint)
    # A checkpoint of a later format (a newer release's) is refused by name before its flags
    # are compared, on every rank, with exit status 2.
    train_checkpoint
    set_checkpoint_metadata tnt_checkpoint_version 2
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --train_epochs=2 --resume
    expect_failure "$case_name"
    [[ $fm_rc -eq 2 ]] && fm_pass "$case_name: exit status 2" || fm_fail "$case_name: exit status $fm_rc, expected 2"
    fm_expect_fixed "$case_name" "was written by a newer Tarantella (checkpoint format 2; this one reads up to 1)" \
      "the version"
    ;;

  timeline_directory)
    # A --timeline that names a directory is refused naming it, and nothing after the
    # error contradicts it (before: "timeline: nothing recorded ...: this run has trained no
    # step" followed it). One rank: the process ends through its own finalize.
    fm_run "$case_name" -n 1 -x TNT_NUM_THREADS=1 --timeline "$fm_tmp/newdir/" -- "${small[@]}"
    expect_failure "$case_name"
    [[ $fm_rc -eq 2 ]] && fm_pass "$case_name: exit status 2" || fm_fail "$case_name: exit status $fm_rc, expected 2"
    fm_expect_fixed "$case_name" "names a directory" "the path's problem"
    if grep -qF "timeline: nothing recorded for" <<<"$fm_out"; then fm_fail "$case_name: a 'nothing recorded' warning after the error"; else fm_pass "$case_name: no warning after the error"; fi
    ;;

  micro_batch_mismatch)
    # --micro_batch_size makes the global batch micro x ranks (as resnet50's and the
    # transformer's, and the advanced topics' local batch size): 60 x 2 ranks is not 128.
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --batch_size=128 --micro_batch_size=60
    expect_failure "$case_name"
    fm_expect_grep "$case_name" "micro_batch_size[ =]60\b" "the micro-batch size"
    fm_expect_grep "$case_name" "batch_size[ =]128\b" "the batch size"
    # The flags, not the library's names for them ("fit: micro_batch_size=...").
    fm_expect_fixed "$case_name" "--batch_size=128 and --micro_batch_size=60 disagree: on 2 ranks the global batch is --micro_batch_size x ranks = 120" "the flags"
    # Alone it trains, at a global batch of 2 x 64 (before: refused unless it was batch_size / ranks).
    fm_run micro_alone "${launch[@]}" -- --model=mlp --num_train_samples=256 --train_epochs=1 --verbose=2 \
      --model_dir="$fm_tmp/model" --overwrite --micro_batch_size=64
    if [[ $fm_rc -eq 0 ]]; then fm_pass "micro_alone: exit status 0"; else fm_fail "micro_alone: exit status $fm_rc"; fi
    if grep -q "^2/2 - " "$fm_stdout"; then fm_pass "micro_alone: 2 steps of 128 samples over 256"; else fm_fail "micro_alone: no '2/2 - ' epoch line (2 steps of 128 samples)"; fi
    ;;

  micro_batch_uneven)
    # 63 x 2 ranks is 126, not 127: refused by both ranks alike.
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --batch_size=127 --micro_batch_size=63
    expect_failure "$case_name"
    msg="--batch_size=127 and --micro_batch_size=63 disagree: on 2 ranks the global batch is --micro_batch_size x ranks = 126; give one of the two"
    n=$(grep -cFx -e "error (rank 0 of 2): $msg" -e "error (rank 1 of 2): $msg" \
      -e "error (rank 1 of 2): the same error as rank 0" -e "error (rank 0 of 2): the same error as rank 1" <<<"$fm_out")
    if [[ $n -eq 2 ]]; then fm_pass "$case_name: both ranks refuse it alike"; else fm_fail "$case_name: '$msg' from $n ranks, expected 2"; fi
    ;;

  checkpoint_other_model)
    # The checkpoint records the flags that decide the network and the optimizer's state:
    # an MLP run resumed with --model=cnn is refused naming the flag and both values (before:
    # a list of tensor names), and so is another --optimizer, both in one message. The MLP
    # trains on 1 rank: which job wrote a checkpoint does not matter here.
    ckpt=$fm_tmp/model/checkpoint.safetensors
    train_checkpoint
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --model=cnn --train_epochs=2 --resume
    expect_failure "$case_name"
    fm_expect_fixed "$case_name" "--model=cnn: the run being resumed ($ckpt) was trained with --model=mlp, and that flag decides" \
      "the flag, both values and the checkpoint"
    fm_run other_optimizer "${launch[@]}" -- "${small[@]}" --model=cnn --optimizer=sgd --train_epochs=2 --resume
    expect_failure other_optimizer
    fm_expect_fixed other_optimizer "--model=cnn --optimizer=sgd: the run being resumed ($ckpt) was trained with --model=mlp --optimizer=adam" \
      "both flags and their values"
    # A training setting may change on resume: the run goes on with it, and says so.
    fm_run other_learning_rate "${launch[@]}" -- "${small[@]}" --learning_rate=0.0005 --train_epochs=2 --resume
    if [[ $fm_rc -eq 0 ]]; then fm_pass "other_learning_rate: exit status 0"; else fm_fail "other_learning_rate: exit status $fm_rc"; fi
    if grep -qF -- "--learning_rate=0.0005: the run being resumed was trained with --learning_rate=0.001; it goes on with 0.0005" <<<"$fm_out"; then
      fm_pass "other_learning_rate: the change is said"
    else
      fm_fail "other_learning_rate: no line saying the learning rate changed"
    fi
    # A checkpoint that records no flags (an older version's): the loader names the tensors
    # that do not fit: conv1/conv2 are missing, fc3 is unexpected, fc1/fc2 have other shapes.
    set_checkpoint_metadata flags ""
    fm_run no_flags "${launch[@]}" -- "${small[@]}" --model=cnn --train_epochs=3 --resume
    expect_failure no_flags
    fm_expect_fixed no_flags "$ckpt" "the checkpoint"
    fm_expect_grep no_flags "conv1\.weight" "a missing tensor (conv1.weight)"
    fm_expect_grep no_flags "fc3\.weight" "an unexpected tensor (fc3.weight)"
    fm_expect_grep no_flags "fc1\.weight" "a tensor of another shape (fc1.weight)"
    ;;

  negative_micro_batch)
    # Taken before as "not given" (0): a negative per-rank batch is a mistake.
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --micro_batch_size=-3
    expect_failure "$case_name"
    fm_expect_fixed "$case_name" "--micro_batch_size=-3: must be positive (or 0: --batch_size alone)" "the flag"
    ;;

  too_many_train_samples)
    # More samples than the training set holds trained on all of them, silently.
    fm_need_data
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --num_train_samples=60001
    expect_failure "$case_name"
    fm_expect_fixed "$case_name" "--num_train_samples=60001: the training set in --data_dir=$fm_data holds only 60000 samples" \
      "the flag and the size of the training set"
    ;;

  resume_other_seed)
    # The checkpoint records the seed of the run that wrote it.
    train_checkpoint --seed=7
    cp "$fm_tmp/model/checkpoint.safetensors" "$fm_tmp/checkpoint.before"
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --seed=8 --train_epochs=2 --resume
    expect_failure "$case_name"
    fm_expect_fixed "$case_name" \
      "--seed=8: the run being resumed ($fm_tmp/model/checkpoint.safetensors) was trained with --seed=7; give --seed=7" \
      "both seeds and the checkpoint"
    if cmp -s "$fm_tmp/checkpoint.before" "$fm_tmp/model/checkpoint.safetensors"; then
      fm_pass "$case_name: the checkpoint is left as it was"
    else
      fm_fail "$case_name: the checkpoint changed"
    fi
    # Without --seed, the message says the default was taken.
    fm_run resume_default_seed "${launch[@]}" -- "${small[@]}" --train_epochs=2 --resume
    expect_failure resume_default_seed
    fm_expect_fixed resume_default_seed \
      "--seed=42 (the default: --seed was not given): the run being resumed ($fm_tmp/model/checkpoint.safetensors) was trained with --seed=7; give --seed=7" \
      "the default named"
    # The same seed continues it.
    fm_run resume_same_seed "${launch[@]}" -- "${small[@]}" --seed=7 --train_epochs=2 --resume
    if [[ $fm_rc -eq 0 ]]; then fm_pass "resume_same_seed: exit status 0"; else fm_fail "resume_same_seed: exit status $fm_rc"; fi
    # A seed in the metadata that no run could have given (damaged): named as such, not
    # offered as a --seed to give (before: "give --seed=7x to continue it").
    python3 - "$fm_tmp/model/checkpoint.safetensors" <<'PY'
import sys
p = sys.argv[1]
b = open(p, "rb").read()
assert b.count(b'"seed":"7"') == 1, "no seed 7 in the header"
open(p, "wb").write(b.replace(b'"seed":"7"', b'"seed":"x"'))
PY
    fm_run resume_bad_seed "${launch[@]}" -- "${small[@]}" --seed=7 --train_epochs=3 --resume
    expect_failure resume_bad_seed
    fm_expect_fixed resume_bad_seed "checkpoint '$fm_tmp/model/checkpoint.safetensors': its metadata give the seed 'x', which is not a seed" \
      "the checkpoint and its damaged seed"
    ;;

  checkpoint_negative_epoch)
    # A checkpoint whose metadata says epoch -5 (damaged, or written by something else):
    # refused at load, naming the file, rather than training from "epoch -5".
    train_checkpoint
    set_checkpoint_metadata epoch -5
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --train_epochs=2 --resume
    expect_failure "$case_name"
    fm_expect_fixed "$case_name" \
      "checkpoint '$fm_tmp/model/checkpoint.safetensors': metadata epoch=-5 is not a number of epochs completed" \
      "the file and the epoch"
    ;;

  resume_other_batch)
    # A warmup in epochs, resumed at 4 times the global batch: the learning rates of the
    # resumed epochs are those of a run at the new batch from the start (the schedule goes
    # on from the epoch reached). Before, the checkpoint's step of 16-sample batches was
    # read as 64-sample steps: 4 times as far into the warmup.
    warm=(--warmup_epochs=4 --scale_learning_rate=false)
    train_checkpoint "${warm[@]}" --batch_size=16 --train_epochs=2
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" "${warm[@]}" --batch_size=64 --train_epochs=5 --resume
    if [[ $fm_rc -eq 0 ]]; then fm_pass "$case_name: exit status 0"; else fm_fail "$case_name: exit status $fm_rc"; fi
    if grep -qF "The checkpoint's step 32 is epoch 2 of the learning-rate schedule at 4 steps an epoch" <<<"$fm_out"; then
      fm_pass "$case_name: the schedule's new place is said"
    else
      fm_fail "$case_name: no line saying where the schedule goes on"
    fi
    fm_run straight "${launch[@]}" -- "${small[@]}" "${warm[@]}" --batch_size=64 --train_epochs=5 \
      --model_dir="$fm_tmp/straight"
    rates() {
      awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "learning_rate") c = i; next } $1 >= 3 { print $1, $c }' \
        "$1/history.csv" 2>/dev/null
    }
    got=$(rates "$fm_tmp/model")
    want=$(rates "$fm_tmp/straight")
    if [[ -n $want && $(wc -l <<<"$want") -eq 3 && $got == "$want" ]]; then
      fm_pass "$case_name: epochs 3-5 at the learning rates of a run at the new batch ($(tr '\n' ' ' <<<"$want"))"
    else
      fm_fail "$case_name: learning rates of epochs 3-5 '$got', expected '$want'"
    fi
    ;;
  checkpoint_negative_step)
    # step=-1 in a checkpoint: an input error naming the file (exit 2, which the launcher
    # does not restart), not the optimizer's internal check.
    train_checkpoint
    set_checkpoint_metadata step -1
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --train_epochs=2 --resume
    expect_failure "$case_name"
    fm_expect_fixed "$case_name" \
      "checkpoint '$fm_tmp/model/checkpoint.safetensors': metadata step=-1 is not a number of steps taken" \
      "the file and the step"
    if grep -Eq 'failed first: exit code 2\b' <<<"$fm_out"; then
      fm_pass "$case_name: exit code 2 (an input error)"
    else
      fm_fail "$case_name: the rank's exit code is not 2 (an input error)"
    fi
    ;;

  empty_test_set)
    # A test set of 0 images (valid IDX files): refused, naming it, not "test accuracy 0".
    copy_data
    rm -f "$fm_tmp"/data/t10k-*
    printf '\x00\x00\x08\x03\x00\x00\x00\x00\x00\x00\x00\x1c\x00\x00\x00\x1c' >"$fm_tmp/data/t10k-images-idx3-ubyte"
    printf '\x00\x00\x08\x01\x00\x00\x00\x00' >"$fm_tmp/data/t10k-labels-idx1-ubyte"
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --data_dir="$fm_tmp/data"
    expect_failure "$case_name"
    fm_expect_fixed "$case_name" "--data_dir=$fm_tmp/data: the test set (t10k-images-idx3-ubyte[.gz]) holds no samples" \
      "the folder and the empty test set"
    ;;

  gzip_bomb)
    # Test labels whose header says 10000 but which inflate to 256 MiB: refused once the
    # data pass the header's size, naming the file, instead of inflating all of it.
    copy_data
    f=$fm_tmp/data/t10k-labels-idx1-ubyte.gz
    { gunzip -c "$f"; head -c $((256 << 20)) /dev/zero; } | gzip -1 >"$f.new" && mv "$f.new" "$f"
    fm_run "$case_name" "${launch[@]}" -- "${small[@]}" --data_dir="$fm_tmp/data"
    expect_failure "$case_name"
    fm_expect_fixed "$case_name" "IDX file '$f': length mismatch: it inflates to more than the 10008 bytes its header gives" \
      "the file and the header's size"
    ;;

  *)
    echo "unknown case '$case_name'" >&2
    exit 2
    ;;
esac
fm_finish
