#!/usr/bin/env bash
# resnet50 through the launcher on 2 ranks, at image size 32.
#
#   resnet50_launcher.sh LAUNCHER PROGRAM CASE [TEST_RESNET50]
#
# synthetic_2_ranks: synthetic data, 2 steps: exit 0, "images/s:" printed once (by the
#   master), history.csv with its header and one row, checkpoint and exported weights.
# log_steps: 5 steps logged every 2: the windows (steps 2-3, 4-5: an epoch's first step is
#   not timed) named by their steps; the schedule in shortest numbers; the evaluation line
#   gives its images and the training steps.
# micro_batch_of_one: --batch_size=2 (or 3) on 2 ranks at --image_size=32 is refused before
#   training, naming the flags (BatchNorm would see one value per channel in layer4);
#   --image_size=64 trains.
# dtype_fp16_2_ranks: --dtype=fp16 on CPU ranks (emulated mixed precision): exit 0, the
#   precision and the loss-scaling summary printed once, a loss_scale column in history.csv.
# dtype_bad: --dtype=fp8 ends with an error naming --dtype and the choices.
# imagenet_folders: a tiny ImageNet in the folder layout (written by TEST_RESNET50's hidden
#   test case), one epoch of 3 steps and an evaluation: exit 0, history.csv with a
#   validation accuracy, the data workers announced (2 as asked; auto: 4 on CPU ranks).
# imagenet_tfds: the tiny ImageNet as tensorflow_datasets writes it (two versions, the
#   older unreadable for 2 classes): exit 0, the layout named once, an evaluation; then a
#   missing shard is named.
# truncated_jpeg: the tiny ImageNet with one training JPEG cut to 90% of its bytes ends
#   with an error naming the file ("Premature end of JPEG file"), not a silent run.
# missing_data_dir: --data_dir naming no directory ends with an error naming it; --help
#   names both layouts (JPEG folders, TFRecord shards).
# diverged: an enormous learning rate ends with an error naming the step and the epoch,
#   and no evaluation result.
# synthetic_eval_default: without --synthetic_eval_samples, the evaluation is proportionate
#   to what is trained (ImageNet's 50,000 per 1,281,167, at least one global batch), and
#   announced; the epoch line counts the --train_steps that run.
# existing_model_dir: a second run in the first one's --model_dir is refused (naming the
#   directory and --overwrite, history.csv left as it was), before the data and the model
#   are made (a missing --data_dir is not what it names); with --overwrite it runs.
# resume: --resume continues a run written with --enable_checkpoint_and_export: 1 epoch,
#   then --resume to 2, gives the weights, training losses and learning rates of 2 epochs
#   straight, history.csv epochs 1 2 and a checkpoint at epoch 2; --resume at its
#   --train_steps evaluates the checkpoint, saying so; --resume below the
#   checkpoint's epoch trains nothing and evaluates its weights.
# resume_mid_epoch: a run cut by --train_steps inside an epoch resumes at the next step of
#   it (twice), and ends with the weights of the run straight through.
# resume_refused: --resume without --enable_checkpoint_and_export, together with
#   --overwrite, in a --model_dir that does not exist (nothing created), and on a checkpoint
#   of another model (--num_classes) ends with an error naming the flags or the file.
# profile_steps: --enable_tensorboard --profile_steps=2 leaves one trace,
#   <model_dir>/train/plugins/profile/<run>/timeline.trace.json, valid JSON whose spans are all
#   of step 2, from both ranks, and the master names it once; --profile_steps=0 leaves none;
#   unset, --enable_tensorboard profiles step 2, and --enable_time_history --log_steps=1 prints
#   a TimeHistory line per step and the average without step 1, in place of the program's
#   own images/s lines.
# memory_estimate: --image_size=1024 --batch_size=100000, and --num_classes=2000000000, are
#   refused before training, naming the flags and the estimate against the host's memory.
# imagenet_val_classes: a val/ class folder that train/ lacks is refused, naming it; a val/
#   lacking one of train/'s classes trains.
# data_format: 2 steps with the default format (channels_last, on CPU ranks too, announced)
#   and 2 with --data_format=channels_first give the same loss within 1e-3; --help shows the
#   flag and its one default; a bad value ends with an error naming --data_format.
set -uo pipefail
[[ $# -eq 3 || $# -eq 4 ]] || { echo "usage: $0 LAUNCHER PROGRAM CASE [TEST_RESNET50]" >&2; exit 2; }
launcher=$1
program=$2
case_name=$3
writer=${4:-}
for f in "$launcher" "$program"; do
  [[ -x "$f" ]] || { echo "FAIL: $f is not an executable" >&2; exit 1; }
done
# A 2-step run at image size 32 takes about 5 s on a busy 2-core machine; longer is a hang.
limit=${TNT_E2E_TIMEOUT:-90}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tnt_resnet50_e2e.XXXXXX")
source "$(dirname "${BASH_SOURCE[0]}")/strays.sh"
trap 'kill -9 $(e2e_strays "$tmp") 2>/dev/null; rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

run() {
  echo "+ $launcher -n 2 -x TNT_NUM_THREADS=1 -- $program $*"
  timeout -k 10 "$limit" "$launcher" -n 2 -x TNT_NUM_THREADS=1 -- "$program" "$@" \
    </dev/null >"$tmp/stdout" 2>"$tmp/stderr"
  rc=$?
  out=$(cat "$tmp/stdout" "$tmp/stderr")
  echo "--- exit status $rc; stdout:"
  cat "$tmp/stdout"
  echo "--- stderr:"
  cat "$tmp/stderr"
  echo "---"
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then fail "did not finish within ${limit}s (a hang)"; fi
  e2e_no_strays "$tmp" || fail "ranks left running after the launcher returned"
  # The check above finds a rank by $tmp on its command line: a case must name it.
  [[ "$*" == *"$tmp"* ]] || fail "the command line names no path under $tmp: ranks left behind would go unseen"
}

expect_error() {  # REGEX WHAT: non-zero exit and an "error..." line matching REGEX
  if [[ $rc -ne 0 && $rc -ne 124 && $rc -ne 137 ]]; then pass "non-zero exit ($rc)"; else fail "exit status $rc, expected a failure"; fi
  if grep -E '^error' <<<"$out" | grep -Eq -- "$1"; then pass "the error names $2"; else fail "no 'error ...' line matches /$1/ ($2)"; fi
}

common=(--use_synthetic_data --image_size=32 --num_classes=10 --batch_size=4 --synthetic_eval_samples=8
        --model_dir="$tmp/model" --log_steps=1)
case $case_name in
  synthetic_2_ranks)
    run "${common[@]}" --train_steps=2 --enable_checkpoint_and_export
    if [[ $rc -eq 0 ]]; then pass "exit status 0"; else fail "exit status $rc"; fi
    n=$(grep -Ec '^images/s: [0-9.]+ \(global batch 4, 2 ranks, 1 timed step, ' <<<"$out")
    if [[ $n -eq 1 ]]; then pass "'images/s: ...' printed once"; else fail "'images/s: ... (global batch 4, 2 ranks, 1 timed step, ' appears $n times, expected once"; fi
    n=$(grep -Ec '^ResNet-50 v1.5: 23528522 parameters' <<<"$out")
    if [[ $n -eq 1 ]]; then pass "the parameter count is printed once"; else fail "'ResNet-50 v1.5: 23528522 parameters' appears $n times"; fi
    csv=$tmp/model/history.csv
    header="epoch,loss,accuracy,top5_accuracy,val_loss,val_accuracy,val_top5_accuracy,learning_rate,seconds"
    if [[ -f $csv && $(head -n 1 "$csv") == "$header" && $(wc -l <"$csv") -eq 2 ]]; then
      pass "history.csv has the header and one row"
    else
      fail "history.csv missing or not header + 1 row:"; cat "$csv" 2>/dev/null
    fi
    for f in checkpoint.safetensors model.safetensors; do
      if [[ -s $tmp/model/$f ]]; then pass "$f written"; else fail "$f missing"; fi
    done
    # The export is a model file (tnt::load_model), as the tutorial's is: the architecture in
    # its header's metadata (before, weights alone, which load_model refuses).
    if [[ $(head -c 1000000 "$tmp/model/model.safetensors" | grep -ac '"architecture"') -gt 0 ]]; then
      pass "model.safetensors holds the architecture"
    else
      fail "model.safetensors has no architecture in its metadata"
    fi
    ;;
  log_steps)
    # 5 steps, a log every 2 timed steps: step 1 is not timed, so the windows are steps 2-3
    # and 4-5, named by the step that ends them.
    run "${common[@]}" --train_steps=5 --log_steps=2
    if [[ $rc -eq 0 ]]; then pass "exit status 0"; else fail "exit status $rc"; fi
    logs=$(grep -E '^step [0-9]+: ' <<<"$out" | sed -E 's/: [0-9.]+ images\/s/: R images\/s/; s/loss [0-9.]+/loss L/')
    want=$'step 3: R images/s over the last 2 steps (2 to 3), loss L\nstep 5: R images/s over the last 2 steps (4 to 5), loss L'
    if [[ $logs == "$want" ]]; then pass "the step logs name their windows"; else fail "step logs: '$logs', expected '$want'"; fi
    if grep -Eq '^images/s: [0-9.]+ \(global batch 4, 2 ranks, 4 timed steps, ' <<<"$out"; then pass "4 timed steps in all"; else fail "no 'images/s: ... 4 timed steps'"; fi
    # The schedule in shortest numbers: 0.1 * 4 / 256 = 0.0015625; times 0.1 is
    # 0.00015625000000000003 in full.
    lr_line="learning rate: 0.0015625 (0.1 per 256 images, global batch 4), linear warmup over 5 epochs = 1601455 steps, then 0.00015625, 1.5625e-05, 1.5625e-06 after epochs 30, 60, 80 = steps 9608730, 19217460, 25623280"
    if grep -qxF "$lr_line" <<<"$out"; then pass "the schedule is printed in shortest numbers"; else fail "no line '$lr_line'"; fi
    # The evaluation's own size, not the training steps, and the steps said as such.
    if grep -Eq '^Evaluation: top-1 accuracy [0-9.]+, top-5 accuracy [0-9.]+, loss [0-9.]+ \(8 images, after 5 training steps, 2 ranks\)$' <<<"$out"; then
      pass "the evaluation line gives its images and the training steps"
    else
      fail "no 'Evaluation: ... (8 images, after 5 training steps, 2 ranks)'"
    fi
    ;;
  micro_batch_of_one)
    # One 32x32 image per rank leaves layer4's BatchNorm one value per channel: refused
    # before anything runs, naming the flags; also where only one rank gets a single image.
    run "${common[@]}" --train_steps=1 --batch_size=2
    expect_error "^error \(rank [01] of 2\): --batch_size=2 over 2 ranks gives each rank a micro-batch of 1 image, and --image_size=32 gives the last stage \(layer4\) feature maps of 1x1: .*give --batch_size at least 4" "--batch_size, the ranks and --image_size"
    if grep -q '\.cpp:[0-9]' <<<"$out"; then fail "a source location in the output"; else pass "no source location"; fi
    if grep -q '^Epoch 1' <<<"$out"; then fail "training started"; else pass "refused before training"; fi
    run "${common[@]}" --train_steps=1 --batch_size=3
    expect_error "--batch_size=3 over 2 ranks gives a rank a micro-batch of 1 image" "the uneven split"
    # 64x64 images give 2x2 maps: one image per rank trains.
    run "${common[@]}" --train_steps=1 --batch_size=2 --image_size=64 --synthetic_eval_samples=2 --overwrite
    if [[ $rc -eq 0 ]]; then pass "one 64x64 image per rank trains"; else fail "--batch_size=2 --image_size=64: exit $rc"; fi
    ;;
  dtype_fp16_2_ranks)
    run "${common[@]}" --train_steps=2 --dtype=fp16
    if [[ $rc -eq 0 ]]; then pass "exit status 0"; else fail "exit status $rc"; fi
    n=$(grep -Ec '^precision: fp16 compute, fp32 master weights, dynamic loss scaling from 65536' <<<"$out")
    if [[ $n -eq 1 ]]; then pass "the precision is printed once"; else fail "'precision: fp16 compute, ...' appears $n times, expected once"; fi
    n=$(grep -Ec '^loss scaling: final scale [0-9.e+]+, [0-9]+ of 2 steps skipped for overflow' <<<"$out")
    if [[ $n -eq 1 ]]; then pass "the loss-scaling summary is printed once"; else fail "'loss scaling: final scale ..., N of 2 steps skipped' appears $n times, expected once"; fi
    if grep -q 'emulated' <<<"$out"; then pass "the CPU emulation is pointed out"; else fail "no warning that fp16 is emulated on the CPU"; fi
    csv=$tmp/model/history.csv
    if [[ -f $csv && $(head -n 1 "$csv") == *,loss_scale ]]; then pass "history.csv has a loss_scale column"; else fail "history.csv has no loss_scale column:"; head -n 1 "$csv" 2>/dev/null; fi
    ;;
  dtype_bad)
    run "${common[@]}" --train_steps=1 --dtype=fp8
    expect_error '--dtype=fp8: expected fp32, bf16 or fp16' "--dtype and the choices"
    ;;
  imagenet_folders)
    [[ -x $writer ]] || { echo "FAIL: imagenet_folders needs the test_resnet50 executable" >&2; exit 1; }
    TNT_TINY_IMAGENET_DIR=$tmp/imagenet "$writer" "[.write_tiny_imagenet]" >"$tmp/writer.out" 2>&1 ||
      { cat "$tmp/writer.out"; echo "FAIL: writing the tiny ImageNet"; exit 1; }
    # 12 training images, global batch 4: 3 steps; 4 validation images: one batch.
    run --data_dir="$tmp/imagenet" --model_dir="$tmp/model" --image_size=32 --num_classes=2 --batch_size=4 \
      --train_epochs=1 --data_workers=2 --log_steps=0
    if [[ $rc -eq 0 ]]; then pass "exit status 0"; else fail "exit status $rc"; fi
    if grep -Eq '12 training samples per epoch' <<<"$out"; then pass "12 training samples"; else fail "no '12 training samples per epoch' line"; fi
    if grep -Fxq 'data workers: 2 a rank' <<<"$out"; then pass "the data workers announced"; else fail "no 'data workers: 2 a rank' line"; fi
    # Without --num_classes the head has the default 1000 outputs for 2 class folders: a
    # note says so (the run then stops at its batch of 64, more than the 12 images).
    run --data_dir="$tmp/imagenet" --model_dir="$tmp/model_default" --image_size=32 --batch_size=64 --log_steps=0
    if grep -Fq "note: 2 class folders in $tmp/imagenet/train, and the model has --num_classes=1000 outputs (the default); give --num_classes=2" <<<"$out"; then
      pass "the note on the default of 1000 classes"
    else
      fail "no note on 2 class folders under --num_classes=1000"
    fi
    # The default, auto: 4 on CPU ranks.
    run --data_dir="$tmp/imagenet" --model_dir="$tmp/model_auto" --image_size=32 --num_classes=2 --batch_size=4 \
      --train_epochs=1 --log_steps=0
    if [[ $rc -eq 0 ]] &&
      grep -Fxq 'data workers: 4 on rank 0 (auto: on CPU ranks, whose cores also train; each rank sizes its own)' <<<"$out"; then
      pass "--data_workers auto: 4 on CPU ranks, said why"
    else
      fail "--data_workers auto (exit $rc): no 'data workers: 4 on rank 0 (auto: ...)' line"
    fi
    csv=$tmp/model/history.csv
    if [[ -f $csv ]] && awk -F, 'NR == 2 && $1 == 1 && $6 != "" && $6 >= 0 && $6 <= 1 { ok = 1 } END { exit !ok }' "$csv"; then
      pass "history.csv has epoch 1 with a validation accuracy"
    else
      fail "history.csv missing or without val_accuracy in row 1:"; cat "$csv" 2>/dev/null
    fi
    ;;
  imagenet_tfds)
    # The same tiny ImageNet as tensorflow_datasets writes it (imagenet2012/5.1.0 beside an
    # older 5.0.0 whose labels no model of 2 classes has), --data_dir the folder given to
    # download_and_prepare, as in the tutorial.
    [[ -x $writer ]] || { echo "FAIL: imagenet_tfds needs the test_resnet50 executable" >&2; exit 1; }
    TNT_TINY_IMAGENET_LAYOUT=tfds TNT_TINY_IMAGENET_DIR=$tmp/datasets "$writer" "[.write_tiny_imagenet]" \
      >"$tmp/writer.out" 2>&1 || { cat "$tmp/writer.out"; echo "FAIL: writing the tiny ImageNet"; exit 1; }
    run --data_dir="$tmp/datasets" --model_dir="$tmp/model" --image_size=32 --num_classes=2 --batch_size=4 \
      --train_epochs=1 --data_workers=2 --log_steps=0
    if [[ $rc -eq 0 ]]; then pass "exit status 0"; else fail "exit status $rc"; fi
    if grep -Eq '12 training samples per epoch' <<<"$out"; then pass "12 training samples"; else fail "no '12 training samples per epoch' line"; fi
    n=$(grep -c "train data: tensorflow_datasets version 5.1.0 in '$tmp/datasets/imagenet2012/5.1.0' (2 shards" <<<"$out")
    if [[ $n -eq 1 ]]; then pass "the layout found printed once"; else fail "the train layout line printed $n times"; fi
    if grep -q "validation data: tensorflow_datasets version 5.1.0" <<<"$out"; then pass "validation layout"; else fail "no validation layout line"; fi
    csv=$tmp/model/history.csv
    if [[ -f $csv ]] && awk -F, 'NR == 2 && $1 == 1 && $6 != "" && $6 >= 0 && $6 <= 1 { ok = 1 } END { exit !ok }' "$csv"; then
      pass "history.csv has epoch 1 with a validation accuracy"
    else
      fail "history.csv missing or without val_accuracy in row 1:"; cat "$csv" 2>/dev/null
    fi
    # Validation images in class folders beside training records, one class's folder
    # missing: the folders' labels (their place among the folders) would not be the
    # records' (indices of all classes), so it is refused, naming both (before, the second
    # class's images were labelled 0, silently).
    TNT_TINY_IMAGENET_DIR=$tmp/folders "$writer" "[.write_tiny_imagenet]" >"$tmp/writer.out" 2>&1 ||
      { cat "$tmp/writer.out"; echo "FAIL: writing the tiny ImageNet in folders"; exit 1; }
    mkdir -p "$tmp/datasets/val"
    cp -r "$tmp/folders/val/n01443537" "$tmp/datasets/val/"
    run --data_dir="$tmp/datasets" --model_dir="$tmp/model_mixed" --image_size=32 --num_classes=2 --batch_size=4 \
      --train_epochs=1 --data_workers=2 --log_steps=0
    expect_error "the val split is in class folders \\(1 of them\\) and the train split in record files, whose labels index all 2 classes" \
      "the two layouts and the folder count"
    rm -r "$tmp/datasets/val"
    # A missing shard of the newest version is named, not read around.
    rm "$tmp/datasets/imagenet2012/5.1.0/imagenet2012-train.tfrecord-00001-of-00002"
    run --data_dir="$tmp/datasets" --model_dir="$tmp/model2" --image_size=32 --num_classes=2 --batch_size=4 \
      --train_epochs=1 --data_workers=2 --log_steps=0
    expect_error "shard 00001 of 00002 is missing" "the missing shard"
    ;;
  truncated_jpeg)
    # One training image cut short inside its image data (libjpeg only warns and pads it
    # with grey): the run ends with an error naming the file, on every rank's behalf.
    [[ -x $writer ]] || { echo "FAIL: truncated_jpeg needs the test_resnet50 executable" >&2; exit 1; }
    TNT_TINY_IMAGENET_DIR=$tmp/imagenet "$writer" "[.write_tiny_imagenet]" >"$tmp/writer.out" 2>&1 ||
      { cat "$tmp/writer.out"; echo "FAIL: writing the tiny ImageNet"; exit 1; }
    bad=$tmp/imagenet/train/n01443537/3.JPEG
    size=$(stat -c %s "$bad")
    truncate -s $((size * 9 / 10)) "$bad"
    run --data_dir="$tmp/imagenet" --model_dir="$tmp/model" --image_size=32 --num_classes=2 --batch_size=4 \
      --train_epochs=1 --data_workers=2 --log_steps=0
    expect_error "image '$bad': cannot decode JPEG: Premature end of JPEG file" "the file and the problem"
    if grep -q '\.cpp:[0-9]' <<<"$out"; then fail "a source location in the output"; else pass "no source location"; fi
    if [[ ! -e $tmp/model/history.csv ]] || [[ $(wc -l <"$tmp/model/history.csv") -le 1 ]]; then pass "no epoch recorded"; else fail "an epoch was recorded in history.csv"; fi
    ;;
  missing_data_dir)
    run --data_dir="$tmp/no_such_dir" --model_dir="$tmp/model"
    expect_error "$tmp/no_such_dir" "the directory"
    # --help names both layouts --data_dir reads.
    "$program" --help >"$tmp/help" 2>&1
    if tr -s ' \n' ' ' <"$tmp/help" | grep -q "JPEG class folders (train/<wnid>/\*.JPEG, val/<wnid>/\*.JPEG), or TFRecord shards (train-00000-of-01024"; then
      pass "--help names the folder and TFRecord layouts of --data_dir"
    else
      fail "--help does not name both layouts of --data_dir"
    fi
    ;;
  diverged)
    run "${common[@]}" --train_steps=6 --base_learning_rate=1e30
    expect_error "loss is -?(nan|inf) at step [0-9]+ \(epoch 1, batch [0-9]+ of [0-9]+\)" "the step and the epoch"
    if grep -q '^Evaluation:' <<<"$out"; then fail "an evaluation result was printed"; else pass "no evaluation result"; fi
    ;;
  synthetic_eval_default)
    # 26 steps of 4: 104 samples trained, 104 * 50000 / 1281167 = 4.06: 5 samples, 2 steps.
    limit=${TNT_E2E_TIMEOUT:-150}  # 26 steps: about 35 s on a busy 2-core machine
    base=(--use_synthetic_data --image_size=32 --num_classes=10 --model_dir="$tmp/model" --log_steps=0 --overwrite)
    run "${base[@]}" --batch_size=4 --train_steps=26
    if [[ $rc -eq 0 ]]; then pass "exit status 0"; else fail "exit status $rc"; fi
    n=$(grep -Ec '^Evaluating on 5 samples \(2 steps, global batch 4\)$' <<<"$out")
    if [[ $n -eq 1 ]]; then pass "5 evaluation samples, announced once"; else fail "'Evaluating on 5 samples (2 steps, global batch 4)' appears $n times, expected once"; fi
    n=$(grep -Ec '^26/26 - .* - evaluation: ' <<<"$out")
    if [[ $n -eq 1 ]]; then pass "the epoch line counts the 26 steps that ran"; else fail "no epoch line '26/26 - ... - evaluation: ...'"; fi
    # The epochs that run (one, not the default --train_epochs=90), and where the run stops.
    n=$(grep -Ec '^Epoch 1/1 \(26 of 320291 steps: the run stops at step 26\)$' <<<"$out")
    if [[ $n -eq 1 ]]; then pass "'Epoch 1/1 (26 of 320291 steps: ...)'"; else fail "no 'Epoch 1/1 (26 of 320291 steps: the run stops at step 26)' line"; fi
    # 2 steps of 6: 12 samples trained, 0.5 evaluation samples: one global batch.
    run "${base[@]}" --batch_size=6 --train_steps=2
    if [[ $rc -eq 0 ]]; then pass "exit status 0"; else fail "exit status $rc"; fi
    if grep -Eq '^Evaluating on 6 samples \(1 step, global batch 6\)$' <<<"$out"; then pass "at least one global batch"; else fail "no 'Evaluating on 6 samples (1 step, global batch 6)'"; fi
    # The rule is in --help.
    "$program" --help >"$tmp/help" 2>&1
    if tr -s ' \n' ' ' <"$tmp/help" | grep -q "50,000 per 1,281,167"; then pass "--help states the rule"; else fail "--help does not state the default of --synthetic_eval_samples"; fi
    ;;
  data_format)
    loss_of() { awk -F, 'NR == 2 { print $2 }' "$tmp/model/history.csv" 2>/dev/null; }
    fmt=(--use_synthetic_data --image_size=32 --num_classes=10 --batch_size=8 --synthetic_eval_samples=8
         --model_dir="$tmp/model" --log_steps=0 --overwrite --train_steps=2)
    run "${fmt[@]}"
    if [[ $rc -eq 0 ]]; then pass "default format: exit status 0"; else fail "default format: exit status $rc"; fi
    n=$(grep -Ec '^data format: channels_last$' <<<"$out")
    if [[ $n -eq 1 ]]; then pass "CPU ranks default to channels_last, announced once"; else fail "'data format: channels_last' appears $n times, expected once"; fi
    last=$(loss_of)
    run "${fmt[@]}" --data_format=channels_first
    if [[ $rc -eq 0 ]]; then pass "channels_first: exit status 0"; else fail "channels_first: exit status $rc"; fi
    n=$(grep -Ec '^data format: channels_first$' <<<"$out")
    if [[ $n -eq 1 ]]; then pass "channels_first announced once"; else fail "'data format: channels_first' appears $n times, expected once"; fi
    first=$(loss_of)
    # The same network and data; only BatchNorm's summation order differs between the
    # formats, amplified by its statistics over 4 values per rank in the last stage (1x1
    # feature maps): 2.4e-4 measured on a loss near 2.6 (at a global batch of 16 on 64x64
    # images, none in 6 digits), so 1e-3 leaves room while a misplaced element (an O(1)
    # change of an activation) moves the loss by far more; tests/layers and tests/nn
    # compare the engines and a network tightly.
    if [[ -n $first && -n $last ]] && awk -v a="$first" -v b="$last" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-3) }'; then
      pass "the same loss in both formats ($first, $last)"
    else
      fail "losses differ: channels_first '$first', channels_last '$last'"
    fi
    "$program" --help >"$tmp/help" 2>&1
    if tr -s ' \n' ' ' <"$tmp/help" | grep -q -- "--data_format=channels_first"; then pass "--help has an example"; else fail "--help has no --data_format example"; fi
    # One default, stated once (it said "default channels_last" in the text and (default: "")).
    entry=$(tr -s ' \n' ' ' <"$tmp/help" | grep -o -- '--data_format arg .*--dtype arg' || true)
    if grep -q '(default: channels_last)' <<<"$entry"; then pass "--help states the default"; else fail "--help does not state the default of --data_format: $entry"; fi
    if [[ $(grep -o 'default' <<<"$entry" | wc -l) -eq 1 ]]; then pass "--help states one default"; else fail "--data_format's help names a default more than once: $entry"; fi
    run "${common[@]}" --train_steps=1 --data_format=nhwc8
    expect_error '--data_format=nhwc8: expected channels_first or channels_last' "--data_format and the choices"
    ;;
  memory_estimate)
    # Runs that cannot fit the host's memory are refused before anything is allocated,
    # naming the flags and the estimate, with an input error's exit 2 (before: the kernel's
    # OOM killer, or a bare std::bad_alloc).
    run --use_synthetic_data --image_size=1024 --batch_size=100000 --model_dir="$tmp/model" --train_steps=1
    expect_error '--image_size=1024, --batch_size=100000 over 2 ranks \(a micro-batch of 50000\) and --num_classes=1000 need at least [0-9.]+ GiB per rank, more than the [0-9.]+ GiB of this host' "the flags and the estimate"
    if grep -Eq 'failed first: exit code 2\b' <<<"$out"; then pass "exit code 2"; else fail "the rank's exit code is not 2"; fi
    run --use_synthetic_data --image_size=32 --batch_size=4 --num_classes=2000000000 --model_dir="$tmp/model" --train_steps=1
    expect_error '--num_classes=2000000000 need at least' "--num_classes"
    if grep -q '^Epoch 1' <<<"$out"; then fail "training started"; else pass "refused before training"; fi
    # Under ulimit -v (a user's or a batch system's address-space limit) the rank's share is
    # what the limit leaves of its address space: refused by name. Before, the host's memory
    # (several times the 5.9 GiB this needs) passed it, and the run ended in a failed
    # allocation, or a crash inside oneDNN.
    ulimit -S -v 3000000
    run --use_synthetic_data --image_size=224 --batch_size=256 --model_dir="$tmp/model" --train_steps=1
    ulimit -S -v unlimited
    expect_error "need at least [0-9.]+ GiB per rank, more than the [0-9.]+ GiB of what this process's address-space limit \(ulimit -v: 2929 MB\) leaves" "ulimit -v"
    if grep -Eq 'failed first: exit code 2\b' <<<"$out"; then pass "ulimit -v: exit code 2"; else fail "ulimit -v: the rank's exit code is not 2"; fi
    ;;
  imagenet_val_classes)
    # val/ holding a class folder that train/ lacks: refused, naming it, rather than given
    # the label of whatever folder sorts there. val/ lacking one of train/'s classes trains:
    # its images are labelled by their folders' names.
    [[ -x $writer ]] || { echo "FAIL: imagenet_val_classes needs the test_resnet50 executable" >&2; exit 1; }
    TNT_TINY_IMAGENET_DIR=$tmp/imagenet "$writer" "[.write_tiny_imagenet]" >"$tmp/writer.out" 2>&1 ||
      { cat "$tmp/writer.out"; echo "FAIL: writing the tiny ImageNet"; exit 1; }
    mv "$tmp/imagenet/val/n01440764" "$tmp/imagenet/val/n09999999"
    run --data_dir="$tmp/imagenet" --model_dir="$tmp/model" --image_size=32 --num_classes=2 --batch_size=4 \
      --train_epochs=1 --data_workers=2 --log_steps=0
    expect_error "image folder '$tmp/imagenet/val': 1 class folder is not among the training split's 2 classes: 'n09999999'" "the folder and the class"
    if grep -q '^Epoch 1' <<<"$out"; then fail "training started"; else pass "refused before training"; fi
    rm -r "$tmp/imagenet/val/n09999999"
    run --data_dir="$tmp/imagenet" --model_dir="$tmp/model" --image_size=32 --num_classes=2 --batch_size=4 \
      --train_epochs=1 --data_workers=2 --log_steps=0 --overwrite
    if [[ $rc -eq 0 ]]; then pass "val/ with one of train/'s classes trains"; else fail "exit status $rc"; fi
    ;;
  resume)
    # 2 steps an epoch; the validation is left out of the comparison: BatchNorm's running
    # statistics are each rank's own, and only the master's are in the checkpoint.
    rs=(--use_synthetic_data --image_size=32 --num_classes=10 --batch_size=8 --synthetic_samples=16
        --synthetic_eval_samples=8 --log_steps=0 --verbose=0 --enable_checkpoint_and_export)
    run "${rs[@]}" --model_dir="$tmp/resumed" --train_epochs=1
    if [[ $rc -eq 0 ]]; then pass "epoch 1: exit status 0"; else fail "epoch 1: exit status $rc"; fi
    run "${rs[@]}" --model_dir="$tmp/resumed" --train_epochs=2 --resume
    if [[ $rc -eq 0 ]]; then pass "--resume: exit status 0"; else fail "--resume: exit status $rc"; fi
    if grep -qxF "Resuming from $tmp/resumed/checkpoint.safetensors at epoch 1" <<<"$out"; then
      pass "--resume continues from epoch 1"
    else
      fail "no 'Resuming from $tmp/resumed/checkpoint.safetensors at epoch 1'"
    fi
    run "${rs[@]}" --model_dir="$tmp/straight" --train_epochs=2
    if [[ $rc -eq 0 ]]; then pass "2 epochs straight: exit status 0"; else fail "2 epochs straight: exit status $rc"; fi
    if cmp -s "$tmp/resumed/model.safetensors" "$tmp/straight/model.safetensors"; then
      pass "the same weights as 2 epochs straight"
    else
      fail "the weights differ from 2 epochs straight"
    fi
    # epoch, loss, accuracy, top5_accuracy, learning_rate
    train_columns() { awk -F, '{ print $1, $2, $3, $4, $8 }' "$1/history.csv" 2>/dev/null; }
    got=$(train_columns "$tmp/resumed")
    want=$(train_columns "$tmp/straight")
    if [[ -n $want && $got == "$want" && $(wc -l <"$tmp/resumed/history.csv") -eq 3 ]]; then
      pass "history.csv: epochs 1 2 with the losses and learning rates of 2 epochs straight"
    else
      fail "history.csv: '$got', expected '$want'"
    fi
    epoch=$(head -c 4096 "$tmp/resumed/checkpoint.safetensors" | grep -ao '"epoch":"[0-9]*"')
    if [[ $epoch == '"epoch":"2"' ]]; then pass "the checkpoint is at epoch 2"; else fail "checkpoint metadata $epoch, expected epoch 2"; fi
    # Below the checkpoint's epoch: nothing to train, its weights evaluated, nothing changed.
    cp "$tmp/resumed/history.csv" "$tmp/two.csv"
    run "${rs[@]}" --model_dir="$tmp/resumed" --train_epochs=1 --resume
    if [[ $rc -eq 0 ]]; then pass "--resume --train_epochs=1: exit status 0"; else fail "--resume --train_epochs=1: exit status $rc"; fi
    if grep -qxF "Nothing to train (the checkpoint is at epoch 2, --train_epochs=1): evaluating its weights" <<<"$out"; then
      pass "nothing to train, said once"
    else
      fail "no 'Nothing to train (the checkpoint is at epoch 2, --train_epochs=1): evaluating its weights'"
    fi
    if grep -Eq '^Evaluation: top-1 accuracy [0-9.]+, .* \(8 images, after 4 training steps, 2 ranks\)$' <<<"$out"; then
      pass "the checkpoint's weights evaluated"
    else
      fail "no 'Evaluation: ... (8 images, after 4 training steps, 2 ranks)'"
    fi
    if cmp -s "$tmp/resumed/history.csv" "$tmp/two.csv"; then pass "history.csv left as it was"; else fail "history.csv changed"; fi
    # At --train_steps already (the checkpoint is at step 4): the same, said with the steps
    # (before, fit stopped at once and the run ended without a word or an evaluation).
    run "${rs[@]}" --model_dir="$tmp/resumed" --train_epochs=5 --train_steps=4 --resume
    if [[ $rc -eq 0 ]]; then pass "--resume --train_steps=4: exit status 0"; else fail "--resume --train_steps=4: exit status $rc"; fi
    if grep -qxF "Nothing to train (the checkpoint is at step 4, --train_steps=4): evaluating its weights" <<<"$out"; then
      pass "nothing to train at --train_steps, said"
    else
      fail "no 'Nothing to train (the checkpoint is at step 4, --train_steps=4): evaluating its weights'"
    fi
    if grep -Eq '^Evaluation: top-1 accuracy [0-9.]+, .* \(8 images, after 4 training steps, 2 ranks\)$' <<<"$out"; then
      pass "the checkpoint's weights evaluated (--train_steps)"
    else
      fail "no 'Evaluation: ... (8 images, after 4 training steps, 2 ranks)' (--train_steps)"
    fi
    if cmp -s "$tmp/resumed/history.csv" "$tmp/two.csv"; then pass "history.csv left as it was (--train_steps)"; else fail "history.csv changed (--train_steps)"; fi
    ;;
  resume_mid_epoch)
    # 4 steps an epoch. --train_steps=3 cuts epoch 1: its checkpoint says so (epoch 0,
    # epoch_step 3), and --resume takes the epoch's last step, then epoch 2, cut again at
    # step 6 and finished by a third run. Before, the cut epoch was saved as done: the
    # resumed run skipped its last step, and --train_steps then found "nothing to train".
    rs=(--use_synthetic_data --image_size=32 --num_classes=10 --batch_size=8 --synthetic_samples=32
        --synthetic_eval_samples=8 --log_steps=0 --verbose=0 --enable_checkpoint_and_export --train_epochs=2)
    meta() { head -c 4096 "$tmp/cut/checkpoint.safetensors" | grep -ao "\"$1\":\"[0-9]*\""; }
    run "${rs[@]}" --model_dir="$tmp/cut" --train_steps=3
    if [[ $rc -eq 0 ]]; then pass "3 steps: exit status 0"; else fail "3 steps: exit status $rc"; fi
    if [[ $(meta epoch) == '"epoch":"0"' && $(meta epoch_step) == '"epoch_step":"3"' ]]; then
      pass "the checkpoint is inside epoch 1, after 3 steps"
    else
      fail "checkpoint metadata '$(meta epoch)' '$(meta epoch_step)', expected epoch 0 and epoch_step 3"
    fi
    run "${rs[@]}" --model_dir="$tmp/cut" --train_steps=6 --resume
    if [[ $rc -eq 0 ]]; then pass "to step 6: exit status 0"; else fail "to step 6: exit status $rc"; fi
    if grep -qxF "Resuming from $tmp/cut/checkpoint.safetensors inside epoch 1, after 3 of its steps" <<<"$out"; then
      pass "said where it resumes"
    else
      fail "no 'Resuming from $tmp/cut/checkpoint.safetensors inside epoch 1, after 3 of its steps'"
    fi
    if [[ $(meta epoch) == '"epoch":"1"' && $(meta epoch_step) == '"epoch_step":"2"' && $(meta step) == '"step":"6"' ]]; then
      pass "the checkpoint is at step 6, inside epoch 2"
    else
      fail "checkpoint metadata '$(meta epoch)' '$(meta epoch_step)' '$(meta step)', expected epoch 1, epoch_step 2, step 6"
    fi
    run "${rs[@]}" --model_dir="$tmp/cut" --resume
    if [[ $rc -eq 0 ]]; then pass "the rest: exit status 0"; else fail "the rest: exit status $rc"; fi
    if [[ $(meta epoch) == '"epoch":"2"' && -z $(meta epoch_step) && $(meta step) == '"step":"8"' ]]; then
      pass "the checkpoint is at the end of epoch 2, step 8"
    else
      fail "checkpoint metadata '$(meta epoch)' '$(meta epoch_step)' '$(meta step)', expected epoch 2, step 8"
    fi
    run "${rs[@]}" --model_dir="$tmp/straight"
    if [[ $rc -eq 0 ]]; then pass "2 epochs straight: exit status 0"; else fail "2 epochs straight: exit status $rc"; fi
    if cmp -s "$tmp/cut/model.safetensors" "$tmp/straight/model.safetensors"; then
      pass "the same weights as 2 epochs straight"
    else
      fail "the weights differ from 2 epochs straight"
    fi
    # One row an epoch: a resumed run replaces the rows from its checkpoint's epoch on.
    got=$(cut -d, -f1 "$tmp/cut/history.csv" 2>/dev/null | tail -n +2 | tr '\n' ' ')
    if [[ $got == "1 2 " ]]; then pass "history.csv: one row an epoch"; else fail "history.csv epochs '$got', expected '1 2 '"; fi
    ;;
  resume_refused)
    rs=(--use_synthetic_data --image_size=32 --num_classes=10 --batch_size=8 --synthetic_samples=16
        --synthetic_eval_samples=8 --log_steps=0 --verbose=0)
    run "${rs[@]}" --model_dir="$tmp/model" --train_epochs=1 --enable_checkpoint_and_export
    if [[ $rc -eq 0 ]]; then pass "first run"; else fail "the first run failed (exit $rc)"; fi
    run "${rs[@]}" --model_dir="$tmp/model" --train_epochs=2 --resume
    expect_error "--resume: needs --enable_checkpoint_and_export" "--resume and the flag it needs"
    run "${rs[@]}" --model_dir="$tmp/model" --train_epochs=2 --resume --overwrite --enable_checkpoint_and_export
    expect_error "--resume and --overwrite: give one of them" "both flags"
    run "${rs[@]}" --model_dir="$tmp/absent/model" --train_epochs=2 --resume --enable_checkpoint_and_export
    expect_error "--model_dir=$tmp/absent/model: no such directory" "the directory"
    if [[ -e $tmp/absent ]]; then fail "$tmp/absent was created"; else pass "nothing created"; fi
    run "${rs[@]}" --model_dir="$tmp/model" --train_epochs=2 --resume --enable_checkpoint_and_export --num_classes=5
    # The checkpoint records --num_classes: another is refused by name (before: the tensors
    # of another shape were listed).
    expect_error "--num_classes=5: the run being resumed \\($tmp/model/checkpoint.safetensors\\) was trained with --num_classes=10" \
      "the flag, both values and the checkpoint"
    ;;
  existing_model_dir)
    run "${common[@]}" --train_steps=1
    if [[ $rc -eq 0 && -f $tmp/model/history.csv ]]; then pass "first run"; else fail "the first run failed (exit $rc)"; fi
    cp "$tmp/model/history.csv" "$tmp/first.csv"
    run "${common[@]}" --train_steps=1
    expect_error "--model_dir=$tmp/model already holds .*history.csv.*--overwrite" "the directory and --overwrite"
    if cmp -s "$tmp/model/history.csv" "$tmp/first.csv"; then pass "history.csv left as it was"; else fail "history.csv changed"; fi
    # Refused before the data and the model are made: a --data_dir that does not exist is
    # not what the refusal names.
    run --data_dir="$tmp/no_such_dir" --image_size=32 --num_classes=10 --batch_size=4 --model_dir="$tmp/model"
    expect_error "--model_dir=$tmp/model already holds " "the directory before the data"
    run "${common[@]}" --train_steps=1 --overwrite
    if [[ $rc -eq 0 ]]; then pass "--overwrite: exit status 0"; else fail "--overwrite: exit status $rc"; fi
    ;;
  profile_steps)
    synth=(--use_synthetic_data --image_size=32 --num_classes=10 --batch_size=4 --synthetic_eval_samples=8)
    # trace_of DIR: the one file under DIR/train/plugins/profile, or "" (with a failure) when
    # there is not exactly one.
    trace_of() {
      local files
      mapfile -t files < <(find "$1/train/plugins/profile" -type f 2>/dev/null)
      if [[ ${#files[@]} -eq 1 && ${files[0]} == "$1"/train/plugins/profile/*/timeline.trace.json ]]; then
        echo "${files[0]}"
      else
        echo "FAIL: expected one trace $1/train/plugins/profile/<run>/timeline.trace.json, found: ${files[*]:-none}" >&2
      fi
    }
    # steps_and_ranks FILE: "<steps of the spans> <ranks>" ("2 0,1"), or why it is no trace.
    steps_and_ranks() {
      python3 - "$1" <<'EOF'
import json, sys
spans = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
print(",".join(map(str, sorted({e["args"]["step"] for e in spans}))), ",".join(map(str, sorted({e["pid"] for e in spans}))))
EOF
    }
    run "${synth[@]}" --model_dir="$tmp/p2" --train_steps=3 --log_steps=1 --enable_tensorboard --profile_steps=2
    if [[ $rc -eq 0 ]]; then pass "exit status 0"; else fail "exit status $rc"; fi
    trace=$(trace_of "$tmp/p2")
    if [[ -n $trace ]]; then
      got=$(steps_and_ranks "$trace" 2>&1)
      if [[ $got == "2 0,1" ]]; then pass "the trace holds spans of step 2 alone, from ranks 0 and 1"; else fail "trace spans (steps ranks): '$got', expected '2 0,1'"; fi
      n=$(grep -cFx "TensorBoard: the timeline of step 2 is in $trace (open it in https://ui.perfetto.dev or chrome://tracing)" <<<"$out")
      if [[ $n -eq 1 ]]; then pass "the master names the trace once"; else fail "the line naming $trace appears $n times, expected once"; fi
    else
      fail "--profile_steps=2: no trace"
    fi
    run "${synth[@]}" --model_dir="$tmp/p0" --train_steps=3 --log_steps=1 --enable_tensorboard --profile_steps=0
    if [[ $rc -eq 0 ]]; then pass "--profile_steps=0: exit status 0"; else fail "--profile_steps=0: exit status $rc"; fi
    if [[ -d $tmp/p0/train && ! -e $tmp/p0/train/plugins ]]; then pass "--profile_steps=0: event files, no profile"; else fail "--profile_steps=0: no train/ or a train/plugins/ left"; fi
    if grep -q 'TensorBoard: the timeline' <<<"$out"; then fail "--profile_steps=0: a trace announced"; else pass "--profile_steps=0: no trace announced"; fi
    run "${synth[@]}" --model_dir="$tmp/pd" --train_steps=3 --log_steps=1 --enable_tensorboard --enable_time_history
    if [[ $rc -eq 0 ]]; then pass "default: exit status 0"; else fail "default: exit status $rc"; fi
    trace=$(trace_of "$tmp/pd")
    if [[ -n $trace && $(steps_and_ranks "$trace" 2>&1) == "2 0,1" ]]; then pass "default: step 2 profiled"; else fail "default: no trace of step 2"; fi
    lines=$(grep -E '^TimeHistory: ' <<<"$out" | sed -E 's/[0-9]+\.[0-9]+ images\/s/R images\/s/; s/in [0-9.]+ s/in S s/')
    want=$'TimeHistory: steps 1-1: R images/s (4 images in S s)\nTimeHistory: steps 2-2: R images/s (4 images in S s)\nTimeHistory: steps 3-3: R images/s (4 images in S s)\nTimeHistory: R images/s on average over steps 2-3 (8 images in S s; steps 1-1 left out as warm-up)'
    if [[ $lines == "$want" ]]; then pass "TimeHistory: a line per step and the average without step 1, once"; else fail "TimeHistory lines: '$lines', expected '$want'"; fi
    if grep -Eq '^images/s: |^step [0-9]+: .* images/s' <<<"$out"; then fail "the program's own images/s lines beside TimeHistory's"; else pass "no second images/s line"; fi
    ;;
  *)
    echo "unknown case $case_name" >&2
    exit 2
    ;;
esac
if [[ $failures -gt 0 ]]; then echo "$failures check(s) failed"; exit 1; fi
echo "all checks passed"
