#!/usr/bin/env bash
# The command lines of the pages our users come from (Tarantella's tutorials and advanced
# topics, the ALCF Horovod tutorial), as they are written there, adapted only from Python to
# our programs and to small synthetic data: a hostfile of this machine instead of two nodes
# of four GPUs, and a few size flags (image size, classes, steps) after the tutorial's own.
# Each case fails when a tutorial's command stops working as written.
#
#   tutorials.sh BIN_DIR SOURCE_DIR CASE
#
# BIN_DIR holds tarantella, resnet50, transformer, transformer_data, fashion_mnist, pi and
# test_resnet50 (which writes the tiny ImageNet). CASE:
#   resnet50: `tarantella --hostfile ./hostfile --devices-per-node N -- resnet50
#     --data_dir=${TNT_DATASETS_PATH} --batch_size --train_epochs --epochs_between_evals` on
#     the layout `tensorflow_datasets ... download_and_prepare --datasets=imagenet2012
#     --data_dir=${TNT_DATASETS_PATH}` writes; with --enable_tensorboard the tutorial's
#     profile of step 2 is in the TensorBoard directory.
#   transformer: `tarantella --hostfile ./hostfile --devices-per-node N -- transformer
#     --data_dir=${WMT14_PATH} --vocab_file=${WMT14_PATH}/vocab.ende.NNN
#     --bleu_ref=${WMT14_PATH}/newstest2014.de --bleu_source=${WMT14_PATH}/newstest2014.en
#     --param_set --train_epochs --epochs_between_evals --batch_size`, with
#     --enable_time_history; BLEU is printed.
#   fusion_threshold: `tarantella --hostfile hostfile --fusion-threshold=KB -- model`: the
#     ranks run with that threshold.
#   pinning: `tarantella --hostfile hostfile --npernode 2 --pin-to-socket -- model`.
#   local_batch: the advanced topics' local batch size: `--micro_batch_size` gives the global
#     batch micro x ranks, the same run as that --batch_size.
#   horovod_np: the ALCF tutorial's `mpirun -np 2 python tensorflow2_mnist_hvd.py` as
#     `tarantella -np 2 -- fashion_mnist`.
#   pi: the ALCF tutorial's first program, `tarantella -np 4 -- pi`.
set -uo pipefail
[[ $# -eq 3 ]] || { echo "usage: $0 BIN_DIR SOURCE_DIR CASE" >&2; exit 2; }
bin=$1
src=$2
case_name=$3
for f in tarantella resnet50 transformer transformer_data fashion_mnist pi test_resnet50; do
  [[ -x "$bin/$f" ]] || { echo "FAIL: $bin/$f is not an executable (build it first)" >&2; exit 1; }
done
# Each run takes 5 to 30 s on a busy 2-core machine; longer is a hang.
limit=${TNT_E2E_TIMEOUT:-150}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tnt_tutorials.XXXXXX")
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
# Every process this test starts names $tmp on its command line: one still running after the
# launcher returned is a rank left behind.
strays() { pgrep -f -- "$tmp" || true; }
cleanup() {
  local pids
  pids=$(strays)
  [[ -n "$pids" ]] && kill -9 $pids 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
export PATH="$bin:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$tmp" || exit 1
# The tutorials' hostfile lists two nodes; here this machine, twice its ranks as slots.
echo "localhost slots=2" >hostfile

# run COMMAND...: the tutorial's command, its output in $out and its status in $rc.
run() {
  echo "+ $*"
  out=$(timeout -k 10 "$limit" "$@" 2>&1)
  rc=$?
  echo "$out" | tail -25
  local left
  left=$(strays)
  if [[ -n "$left" ]]; then
    fail "processes left running after '$1': $left"
    kill -9 $left 2>/dev/null
  fi
}
expect_ok() {
  if [[ $rc -eq 0 ]]; then pass "$1: exit status 0"; else fail "$1: exit status $rc"; fi
}
has() {
  if grep -qE -- "$1" <<<"$out"; then pass "$2"; else fail "$2: no line matching '$1'"; fi
}

fm_small=(--model=mlp --num_train_samples=512 --train_epochs=1 --batch_size=64)

case $case_name in
  resnet50)
    export TNT_DATASETS_PATH=$tmp/datasets
    TNT_TINY_IMAGENET_LAYOUT=tfds TNT_TINY_IMAGENET_DIR=$TNT_DATASETS_PATH "$bin/test_resnet50" \
      "[.write_tiny_imagenet]" >"$tmp/writer.out" 2>&1 || { cat "$tmp/writer.out"; fail "writing the tiny ImageNet"; exit 1; }
    run tarantella --hostfile ./hostfile --devices-per-node 2 \
      -- resnet50 --data_dir=${TNT_DATASETS_PATH} \
                  --batch_size=4 \
                  --train_epochs=2 \
                  --epochs_between_evals=1 \
                  --enable_tensorboard \
                  --model_dir="$tmp/resnet50_model" --image_size=32 --num_classes=2 --data_workers=2 --log_steps=0
    expect_ok "the ResNet-50 tutorial's command"
    has "train data: tensorflow_datasets version" "the tensorflow_datasets layout was read"
    csv=$tmp/resnet50_model/history.csv
    if [[ -f $csv ]] && [[ $(awk -F, 'NR > 1 && $6 != "" { n++ } END { print n + 0 }' "$csv") -eq 2 ]]; then
      pass "two epochs, each evaluated (--epochs_between_evals=1)"
    else
      fail "history.csv lacks two evaluated epochs:"; cat "$csv" 2>/dev/null
    fi
    trace=$(find "$tmp/resnet50_model" -path '*plugins/profile/*' -name '*.trace.json' | head -1)
    if [[ -n "$trace" ]] && python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$trace"; then
      pass "TensorBoard's profile of step 2 in $trace"
    else
      fail "no profile (valid JSON) under the TensorBoard directory"
    fi
    ;;
  transformer)
    python3 "$src/scripts/make_demo_corpus" "$tmp/corpus" --train 100 --dev 6 >"$tmp/corpus.log" 2>&1 &&
      transformer_data --data_dir="$tmp/wmt14" --train_source="$tmp/corpus/train.en" \
        --train_target="$tmp/corpus/train.de" --dev_source="$tmp/corpus/dev.en" --dev_target="$tmp/corpus/dev.de" \
        --target_vocab_size=1000 --train_shards=2 >>"$tmp/corpus.log" 2>&1 ||
      { cat "$tmp/corpus.log"; fail "making the corpus"; exit 1; }
    # The tutorial's test set keeps its WMT name.
    cp "$tmp/corpus/dev.en" "$tmp/wmt14/newstest2014.en"
    cp "$tmp/corpus/dev.de" "$tmp/wmt14/newstest2014.de"
    export WMT14_PATH=$tmp/wmt14
    run tarantella --hostfile ./hostfile --devices-per-node 2 \
      -- transformer --data_dir=${WMT14_PATH} \
                     --vocab_file=${WMT14_PATH}/vocab.ende.1000 \
                     --bleu_ref=${WMT14_PATH}/newstest2014.de \
                     --bleu_source=${WMT14_PATH}/newstest2014.en \
                     --param_set=tiny \
                     --train_epochs=1 \
                     --epochs_between_evals=1 \
                     --batch_size=192 \
                     --enable_time_history --log_steps=2 \
                     --model_dir="$tmp/transformer_model" --num_hidden_layers=2 --max_length=24
    expect_ok "the Transformer tutorial's command"
    has "Bleu score \(uncased\)" "BLEU printed after training"
    has "TimeHistory: steps" "--enable_time_history's rate lines"
    if [[ -s $tmp/transformer_model/model.safetensors ]]; then pass "weights written"; else fail "no model.safetensors"; fi
    ;;
  fusion_threshold)
    run tarantella --hostfile hostfile --fusion-threshold=64 -x TNT_LOG_LEVEL=INFO \
      -- fashion_mnist "${fm_small[@]}" --model_dir="$tmp/fm"
    expect_ok "--fusion-threshold=64"
    has "TNT_FUSION_THRESHOLD +64 KB" "the ranks use a fusion threshold of 64 KB (the resolved configuration)"
    ;;
  pinning)
    run tarantella --hostfile hostfile --npernode 2 --pin-to-socket --dry-run -- fashion_mnist
    expect_ok "--npernode 2 --pin-to-socket --dry-run"
    if [[ $(grep -cE '^ *[01] +localhost' <<<"$out") -eq 2 ]]; then pass "2 ranks planned on localhost"; else fail "the plan does not list ranks 0 and 1 on localhost"; fi
    run tarantella --hostfile hostfile --npernode 2 --pin-to-socket -- fashion_mnist "${fm_small[@]}" --model_dir="$tmp/fm"
    expect_ok "the advanced topics' pinning command"
    has "Epoch 1/1" "trained"
    ;;
  local_batch)
    common=(--use_synthetic_data --image_size=32 --num_classes=2 --train_steps=3 --log_steps=0 --verbose=1)
    run tarantella --hostfile hostfile --devices-per-node 2 -- resnet50 --micro_batch_size=2 "${common[@]}" \
      --model_dir="$tmp/micro"
    expect_ok "--micro_batch_size=2 on 2 ranks"
    run tarantella --hostfile hostfile --devices-per-node 2 -- resnet50 --batch_size=4 "${common[@]}" \
      --model_dir="$tmp/global"
    expect_ok "--batch_size=4 on 2 ranks"
    # history.csv without its last column (the epoch's seconds).
    strip() { awk -F, -v OFS=, '{ NF--; print }' "$1"; }
    if [[ -s $tmp/micro/history.csv ]] && [[ "$(strip "$tmp/micro/history.csv")" == "$(strip "$tmp/global/history.csv")" ]]; then
      pass "micro 2 x 2 ranks is the run of global batch 4 (history.csv identical but for the seconds)"
    else
      fail "history.csv of --micro_batch_size=2 differs from --batch_size=4's"
    fi
    ;;
  horovod_np)
    run tarantella -np 2 -- fashion_mnist "${fm_small[@]}" --model_dir="$tmp/fm"
    expect_ok "tarantella -np 2"
    has "2 ranks|ranks: 2|on 2 ranks" "2 ranks ran"
    ;;
  pi)
    run tarantella -np 4 -- pi --samples=400000
    expect_ok "tarantella -np 4 -- pi"
    has "pi.*3\.1[0-9]" "pi printed"
    has "4 ranks" "on 4 ranks"
    ;;
  *)
    echo "unknown case '$case_name'" >&2
    exit 2
    ;;
esac
if ((failures)); then
  echo "$case_name: $failures check(s) failed"
  exit 1
fi
echo "$case_name: all checks passed"
