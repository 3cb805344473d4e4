#!/usr/bin/env bash
# The training programs' flags that name a file or a directory, run as a user runs them (one
# process, no launcher): a path of the other kind is called what it is ("is a directory,
# expected a file", "is a file, expected a directory"), not missing.
#   test_path_flags.sh BIN_DIR
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
# expect NAME NEEDLE PROGRAM ARGS...: a non-zero exit and NEEDLE in its output.
expect() {
  local name=$1 needle=$2
  shift 2
  local out rc
  out=$(cd "$tmp" && timeout 60 "$@" 2>&1 </dev/null); rc=$?
  if [[ $rc -ne 0 && $rc -lt 124 && $out == *"$needle"* ]]; then
    echo "ok   $name"
  else
    echo "FAIL $name"; echo "  expected a non-zero exit and: $needle"; echo "  exit $rc, output: $out"
    fails=$((fails + 1))
  fi
}

mkdir "$tmp/dir"
: >"$tmp/file"
printf "%s\n" "'<pad>'" "'<EOS>'" "'a'" "'b'" "'_'" >"$tmp/vocab"

expect "fashion_mnist --data_dir=<file>" "--data_dir=$tmp/file: is a file, expected a directory" \
  "$bin/fashion_mnist" --data_dir="$tmp/file" --model_dir="$tmp/fm"
expect "fashion_mnist --data_dir=<missing>" "--data_dir=$tmp/none: no such directory" \
  "$bin/fashion_mnist" --data_dir="$tmp/none" --model_dir="$tmp/fm"
expect "resnet50 --data_dir=<file>" "--data_dir=$tmp/file: is a file, expected a directory" \
  "$bin/resnet50" --data_dir="$tmp/file" --model_dir="$tmp/rn" --image_size=32 --batch_size=2
expect "transformer --vocab_file=<directory>" "--vocab_file=$tmp/dir: is a directory, expected a file" \
  "$bin/transformer" --param_set=tiny --vocab_file="$tmp/dir" --model_dir="$tmp/tr"
expect "transformer --vocab_file=<missing>" "--vocab_file=$tmp/none: no such file" \
  "$bin/transformer" --param_set=tiny --vocab_file="$tmp/none" --model_dir="$tmp/tr"
expect "transformer --bleu_source=<directory>" "--bleu_source=$tmp/dir: is a directory, expected a file" \
  "$bin/transformer" --param_set=tiny --vocab_file="$tmp/vocab" --bleu_source="$tmp/dir" --bleu_ref="$tmp/file" \
  --model_dir="$tmp/tr"
expect "transformer --bleu_ref=<directory>" "--bleu_ref=$tmp/dir: is a directory, expected a file" \
  "$bin/transformer" --param_set=tiny --vocab_file="$tmp/vocab" --bleu_source="$tmp/file" --bleu_ref="$tmp/dir" \
  --model_dir="$tmp/tr"
expect "transformer --data_dir=<file>" "--data_dir=$tmp/file: is a file, expected a directory" \
  "$bin/transformer" --param_set=tiny --vocab_file="$tmp/vocab" --data_dir="$tmp/file" --model_dir="$tmp/tr"

if [[ $fails -gt 0 ]]; then echo "$fails check(s) failed"; exit 1; fi
echo "all checks passed"
