#!/usr/bin/env bash
# fashion_mnist on 2 ranks: progress and results appear once (from the master), not once
# per rank; history.csv has its header and one row per epoch; the checkpoint is a
# well-formed safetensors file with the model's tensors.
#
#   fashion_mnist_master_output.sh LAUNCHER PROGRAM VERBOSE EPOCHS
#
# stdout goes to a file, so with VERBOSE=1 the program must see that it is not writing to
# a terminal: no carriage-return progress bar.
source "$(dirname "${BASH_SOURCE[0]}")/fashion_mnist_common.sh" "$@"
[[ $# -eq 4 ]] || { echo "usage: $0 LAUNCHER PROGRAM VERBOSE EPOCHS" >&2; exit 2; }
verbose=$3
epochs=$4
fm_need_data
model_dir=$fm_tmp/model
name=verbose$verbose

fm_run "$name" -n 2 -x TNT_NUM_THREADS=1 -- --model=mlp --num_train_samples=256 --batch_size=64 \
  --train_epochs="$epochs" --verbose="$verbose" --model_dir="$model_dir"
if [[ $fm_rc -eq 0 ]]; then fm_pass "$name: exit status 0"; else fm_fail "$name: exit status $fm_rc"; fi

# count_lines REGEX: lines of the output matching it.
count_lines() { grep -Ec -- "$1" <<<"$fm_out"; }
expect_once() {
  local n
  n=$(count_lines "$1")
  if [[ $n -eq 1 ]]; then fm_pass "$name: '$2' appears once"; else fm_fail "$name: '$2' appears $n times, expected once"; fi
}

expect_once '^Model: ' "the model summary"
expect_once '^2 ranks, global batch 64, 256 training samples' "2 ranks, global batch 64, ..."
for ((e = 1; e <= epochs; e++)); do expect_once "^Epoch $e/$epochs\$" "Epoch $e/$epochs"; done
if [[ $epochs -eq 1 ]]; then epochs_word="1 epoch"; else epochs_word="$epochs epochs"; fi
expect_once "^Test loss: .*\($epochs_word, 2 ranks\)\$" "Test loss: ... ($epochs_word, 2 ranks)"
# The line printed at the end of each epoch ("4/4 - 1s 20ms/step - loss: ...").
n=$(count_lines "^4/4 - .*loss: ")
if [[ $n -eq $epochs ]]; then
  fm_pass "$name: $n end-of-epoch lines for $epochs epochs"
else
  fm_fail "$name: $n end-of-epoch lines ('N/N - ... loss: ...'), expected $epochs (one per epoch)"
fi
# Each epoch's validation is announced, and its time is reported apart from the training
# steps' time per step ("4/4 - 0s 20ms/step - ... - evaluation: 1s"). The last epoch's
# validation on the test set is the test result: the test set is not evaluated a second
# time (no line of a separate evaluation, "157/157 - ... - loss: ..."), and "Test loss"
# gives the last epoch's val_loss and val_accuracy.
n=$(count_lines '^Evaluating on 10000 samples \(157 steps, global batch 64\)$')
if [[ $n -eq $epochs ]]; then
  fm_pass "$name: $n evaluation announcements for $epochs epochs (the last one is the test result)"
else
  fm_fail "$name: $n lines 'Evaluating on 10000 samples (157 steps, global batch 64)', expected $epochs"
fi
n=$(count_lines '^157/157 - [0-9:]+s? [0-9]+ms/step - loss: [0-9.]+ - accuracy: [0-9.]+$')
if [[ $n -eq 0 ]]; then fm_pass "$name: no second evaluation of the test set"; else fm_fail "$name: the test set was evaluated again ($n result lines)"; fi
if [[ $verbose -eq 2 ]]; then
  val=$(grep -E '^4/4 - .*val_loss: ' <<<"$fm_out" | tail -1 | sed -E 's/.*val_loss: ([0-9.]+) - val_accuracy: ([0-9.]+).*/\1 \2/')
  test=$(sed -nE 's/^Test loss: ([0-9.]+)  test accuracy: ([0-9.]+) .*/\1 \2/p' <<<"$fm_out")
  if [[ -n $val && $val == "$test" ]]; then fm_pass "$name: Test loss and accuracy are the last validation's ($test)"; else fm_fail "$name: Test loss/accuracy '$test', the last validation's '$val'"; fi
fi

n=$(count_lines '^4/4 - [0-9:]+s? [0-9]+ms/step - loss: .*val_loss: [0-9.]+ - val_accuracy: [0-9.]+ - evaluation: [0-9:]+s?$')
if [[ $n -eq $epochs ]]; then
  fm_pass "$name: the epoch lines give the training time per step and the evaluation's time apart"
else
  fm_fail "$name: $n epoch lines '4/4 - ... ms/step - ... - evaluation: ...', expected $epochs"
fi
if grep -q $'\r' "$fm_stdout"; then
  fm_fail "$name: stdout is not a terminal, yet the output contains carriage returns (a progress bar)"
else
  fm_pass "$name: no carriage returns in the output"
fi

# history.csv: the header, then rows 1..epochs with numbers in range.
csv=$model_dir/history.csv
if [[ ! -f $csv ]]; then
  fm_fail "$name: $csv does not exist"
else
  echo "--- $csv:"
  cat "$csv"
  echo "---"
  header="epoch,loss,accuracy,val_loss,val_accuracy,learning_rate,seconds"
  if [[ $(head -n 1 "$csv") == "$header" ]]; then
    fm_pass "$name: history.csv header"
  else
    fm_fail "$name: history.csv header is '$(head -n 1 "$csv")', expected '$header'"
  fi
  if problems=$(awk -F, -v epochs="$epochs" '
      NR == 1 { next }
      {
        rows++
        if (NF != 7) print "row " NR - 1 ": " NF " fields, expected 7"
        if ($1 != rows) print "row " NR - 1 ": epoch " $1 ", expected " rows
        for (i = 2; i <= NF; i++) if ($i !~ /^-?[0-9.]+([eE][-+]?[0-9]+)?$/) print "row " NR - 1 ": field " i " is not a number: " $i
        if ($3 < 0 || $3 > 1 || $5 < 0 || $5 > 1) print "row " NR - 1 ": an accuracy outside [0, 1]"
        if ($2 <= 0 || $4 <= 0) print "row " NR - 1 ": a loss that is not positive"
        if ($7 <= 0) print "row " NR - 1 ": seconds " $7 " is not positive"
      }
      END { if (rows != epochs) print rows + 0 " rows, expected " epochs " (one per epoch)" }' "$csv") &&
     [[ -z $problems ]]; then
    fm_pass "$name: history.csv has one well-formed row per epoch"
  else
    fm_fail "$name: history.csv: $problems"
  fi
fi

# The checkpoint, parsed by hand: 8-byte little-endian header length, a JSON header, then
# the data; every tensor's byte range must fit its dtype and shape and the ranges must
# tile the data exactly.
ckpt=$model_dir/checkpoint.safetensors
if [[ ! -f $ckpt ]]; then
  fm_fail "$name: $ckpt does not exist"
elif python3 - "$ckpt" "$epochs" <<'EOF'; then
import json, struct, sys

path, epochs = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
(n,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + n])
body = len(data) - 8 - n
sizes = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
problems = []
ranges = []
for name, t in header.items():
    if name == "__metadata__":
        continue
    count = 1
    for d in t["shape"]:
        count *= d
    begin, end = t["data_offsets"]
    if end - begin != count * sizes[t["dtype"]]:
        problems.append(f"{name}: {end - begin} bytes for {t['dtype']} {t['shape']}")
    ranges.append((begin, end))
ranges.sort()
pos = 0
for begin, end in ranges:
    if begin != pos:
        problems.append(f"the data ranges leave a gap or overlap at byte {pos}")
        break
    pos = end
if pos != body:
    problems.append(f"the tensors cover {pos} bytes, the file has {body} after the header")
# The MLP's parameters under PyTorch's names and layouts ([out, in] for a linear weight).
want = {"fc1.weight": [256, 784], "fc1.bias": [256], "fc2.weight": [128, 256], "fc2.bias": [128],
        "fc3.weight": [10, 128], "fc3.bias": [10]}
for name, shape in want.items():
    if name not in header:
        problems.append(f"no tensor {name}")
    elif header[name]["shape"] != shape or header[name]["dtype"] != "F32":
        problems.append(f"{name} is {header[name]['dtype']} {header[name]['shape']}, expected F32 {shape}")
meta = header.get("__metadata__", {})
if meta.get("epoch") != epochs:
    problems.append(f"metadata epoch is {meta.get('epoch')!r}, expected {epochs!r}")
print(f"checkpoint: {len(ranges)} tensors, {body} data bytes, metadata {meta}")
for p in problems:
    print("  " + p)
sys.exit(1 if problems else 0)
EOF
  fm_pass "$name: checkpoint.safetensors parses and holds the MLP's tensors"
else
  fm_fail "$name: checkpoint.safetensors: the problems are listed above"
fi

fm_finish
