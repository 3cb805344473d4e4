#!/usr/bin/env bash
# scripts/make_demo_corpus: the same seed gives the same files, dev pairs are not training
# pairs, and --convert makes a data directory with the vocabulary and shards, on which the
# transformer trains (and writes TensorBoard event files with --enable_tensorboard).
#   test_demo_corpus.sh REPO_ROOT BUILD_DIR
set -uo pipefail
root=$1
export BUILD_DIR=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() { if [[ "$2" == "$3" ]]; then echo "ok   $1"; else echo "FAIL $1: expected '$2', got '$3'"; fails=$((fails + 1)); fi; }

python3 "$root/scripts/make_demo_corpus" "$tmp/a" --train 300 --dev 30 --seed 4 > /dev/null; check "first run" 0 $?
python3 "$root/scripts/make_demo_corpus" "$tmp/b" --train 300 --dev 30 --seed 4 --convert > "$tmp/log" 2>&1
check "second run with --convert" 0 $?
for f in train.en train.de dev.en dev.de; do
  check "$f is the same for the same seed" "$(md5sum < "$tmp/a/$f")" "$(md5sum < "$tmp/b/$f")"
done
python3 "$root/scripts/make_demo_corpus" "$tmp/c" --train 300 --dev 30 --seed 5 > /dev/null
[[ "$(md5sum < "$tmp/a/train.en")" != "$(md5sum < "$tmp/c/train.en")" ]]; check "another seed, other sentences" 0 $?
check "train lines" 300 "$(wc -l < "$tmp/a/train.en")"
check "parallel lines" 300 "$(wc -l < "$tmp/a/train.de")"
check "dev lines" 30 "$(wc -l < "$tmp/a/dev.de")"
check "no dev sentence in train" 0 "$(grep -cxFf "$tmp/a/dev.en" "$tmp/a/train.en")"
check "converted" "vocab.ende.1000 wmt32k-dev-00001-of-00001 wmt32k-train-00001-of-00004 wmt32k-train-00002-of-00004 wmt32k-train-00003-of-00004 wmt32k-train-00004-of-00004" \
  "$(cd "$tmp/b/data" && ls vocab* wmt32k* | tr '\n' ' ' | sed 's/ $//')"
# The demo's text has fewer subtokens than --target_vocab_size=1000 even at min_count 1: the
# tool says what the file holds, beside its name (vocab.ende.1000, what was asked for).
check "the vocabulary's shortfall is said" 1 \
  "$(grep -cE '^vocabulary: [0-9]+ subtokens written to .*vocab\.ende\.1000 \(short of --target_vocab_size=1000 by more than --threshold=327: the training text holds no more subtokens' "$tmp/log")"
# The converted corpus trains the transformer (one process, a small model, 3 steps), whose
# --enable_tensorboard writes the event files there as in the other programs.
"$BUILD_DIR/bin/transformer" --data_dir="$tmp/b/data" --vocab_file="$tmp/b/data/vocab.ende.1000" --param_set=tiny \
  --num_hidden_layers=2 --max_length=24 --batch_size=168 --num_sentences=21 --train_epochs=1 --verbose=0 \
  --enable_tensorboard --model_dir="$tmp/model" > "$tmp/train.log" 2>&1
check "the transformer trains on it" 0 $?
check "--enable_tensorboard: event files in train/ and validation/" "1 1" \
  "$(ls "$tmp/model/train" 2>/dev/null | grep -c '^events.out.tfevents') $(ls "$tmp/model/validation" 2>/dev/null | grep -c '^events.out.tfevents')"
echo "$fails failed"
[[ $fails -eq 0 ]]
