#!/usr/bin/env bash
# build/bin/transformer through the launcher, on a small corpus made by
# scripts/make_demo_corpus and build/bin/transformer_data.
#
#   transformer_program.sh LAUNCHER TRANSFORMER TRANSFORMER_DATA SOURCE_DIR CASE
#
# ranks_1_2_3: a global batch of 7 sentences (which 2 and 3 ranks do not divide), 3 Adam
#   steps with dropout: the weights of 2 and 3 ranks equal those of 1 rank within the
#   tolerance below; a run on another batch (6 sentences) differs by far more, so the
#   comparison can fail.
# manual_indivisible: --auto_data_dist=false with 7 sentences on 2 and 3 ranks takes 7 // p
#   sentences per rank (the tutorial's pipeline), says so once, and gives one rank's weights
#   on global batches of 6; 8 sentences on 2 ranks run without that message.
# micro_batch_size: --micro_batch_size (tokens per rank) on 2 and 3 ranks is --batch_size of
#   micro x ranks; disagreeing with --batch_size is refused naming both.
# bad_param_set, missing_vocab_file, batch_below_max_length: an error naming the flag and a
#   non-zero exit (batch_below_max_length also: one sentence per batch for 2 ranks).
# bleu_files_mismatch: --bleu_source and --bleu_ref of different line counts, or one
#   without the other, are refused before training.
# resume: a second run in the same --model_dir is refused without --resume or --overwrite,
#   before the data are read (a missing --data_dir is not what the refusal names);
#   with --resume it continues at the checkpoint's epoch, history.csv has every epoch once;
#   a restart of the same launch (TNT_RUN_ID, TNT_RESTART=1) continues without --resume.
# dtype: --dtype=bf16 (mixed precision on CPU ranks) trains, says so, and its first
#   epoch's loss is within 2% of fp32's while its weights differ from fp32's (bf16 was
#   used); --dtype=fp8 is refused naming the flag.
# decode_cache: a short training on 2 ranks translates the dev sentences with the key/value
#   cache (the default); the same checkpoint evaluated again with --decode_cache=false (the
#   uncached reference) writes the very same translations.txt, and the translations are not
#   all alike (else the comparison would mean little).
# empty_translation: an untrained model whose last translation is empty: BLEU is scored,
#   translations.txt has a line per source line, model.safetensors is written, and "Nothing
#   to train" says the initial weights are evaluated (there is no checkpoint).
# evaluation_fails: a failed evaluation after training (translations.txt cannot be written)
#   ends with an error naming --model_dir, and model.safetensors is there.
# data_tool_inputs: transformer_data refuses train or dev files of different lengths before
#   writing anything (no vocabulary left for a rerun to reuse); the corrected run builds it.
# time_history: --enable_time_history --log_steps=1 on 3 steps of 7 sentences of 24: a
#   TimeHistory line per step whose tokens are the real target tokens of the GLOBAL batch
#   (fewer than the 168 padded ones, and the same on 1 and 2 ranks, which split the batches
#   differently), the average without step 1, and no padded "tokens/s:" line beside it.
# long_source_line: a --bleu_source line of 2 MB is refused before training, naming the
#   file and the line (decoding it would need terabytes); --decode_max_length cuts it.
# epoch_count: --train_epochs=3 --epochs_between_evals=2 counts Epoch 1/3, 2/3, 3/3 over the
#   fit() calls of the loop.
# learns_demo: a few epochs of a small model on 400 sentence pairs: the loss falls clearly,
#   both BLEU lines are printed, translations.txt has one line per source line, and
#   model.safetensors loads strictly into scripts/transformer_torch.py (Python with torch).
set -uo pipefail
[[ $# -eq 5 ]] || { echo "usage: $0 LAUNCHER TRANSFORMER TRANSFORMER_DATA SOURCE_DIR CASE" >&2; exit 2; }
launcher=$1
program=$2
data_tool=$3
src_dir=$4
case_name=$5
for f in "$launcher" "$program" "$data_tool"; do
  [[ -x "$f" ]] || { echo "FAIL: $f is not an executable" >&2; exit 1; }
done
# Each run takes 3 to 20 s on a busy 2-core machine; longer is a hang.
limit=${TNT_E2E_TIMEOUT:-90}
# make_demo_corpus needs only the standard library: any Python 3.
python=${PYTHON:-python3}
command -v "$python" >/dev/null || python=/usr/bin/python3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tnt_transformer_e2e.XXXXXX")
source "$(dirname "${BASH_SOURCE[0]}")/strays.sh"
trap 'kill -9 $(e2e_strays "$tmp") 2>/dev/null; rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# corpus TRAIN DEV: text in $tmp/corpus, shards and vocabulary in $tmp/corpus/data (the
# shards go beside no text file: the reader takes every file whose name contains "train").
corpus() {
  "$python" "$src_dir/scripts/make_demo_corpus" "$tmp/corpus" --train "$1" --dev "$2" >"$tmp/corpus.log" 2>&1 &&
    "$data_tool" --data_dir="$tmp/corpus/data" --train_source="$tmp/corpus/train.en" \
      --train_target="$tmp/corpus/train.de" --dev_source="$tmp/corpus/dev.en" --dev_target="$tmp/corpus/dev.de" \
      --target_vocab_size=1000 --train_shards=2 >>"$tmp/corpus.log" 2>&1 ||
    { cat "$tmp/corpus.log"; echo "FAIL: making the corpus"; exit 1; }
  vocab=$tmp/corpus/data/vocab.ende.1000
}

# run NP ARGS...: the program on NP ranks (one compute thread each).
run() {
  local np=$1
  shift
  echo "+ $launcher -n $np -x TNT_NUM_THREADS=1 -- $program $*"
  timeout -k 10 "$limit" "$launcher" -n "$np" -x TNT_NUM_THREADS=1 -- "$program" "$@" \
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

# max_abs_diff A B: the largest |a - b| over the tensors of two safetensors files (f32).
max_abs_diff() {
  "$python" - "$1" "$2" <<'EOF'
import json, struct, sys
from array import array
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        a = array("f")
        a.frombytes(data[t["data_offsets"][0]:t["data_offsets"][1]])
        out[name] = a
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
if sorted(a) != sorted(b) or not a:
    sys.exit("the files hold different tensors")
print(max(abs(x - y) for name in a for x, y in zip(a[name], b[name])))
EOF
}

# A small model (2 + 2 layers of the tiny set) for speed; dropout stays on (0.1).
small=(--param_set=tiny --num_hidden_layers=2 --max_length=24 --verbose=2)
case $case_name in
  ranks_1_2_3)
    corpus 100 10
    # 7 sentences per global batch (168 // 24), 21 sentences: 3 steps; warmup 10 steps.
    common=(--data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --train_epochs=1
            --learning_rate_warmup_steps=10)
    for np in 1 2 3; do
      run "$np" "${common[@]}" --batch_size=168 --num_sentences=21 --model_dir="$tmp/np$np"
      if [[ $rc -eq 0 && -s $tmp/np$np/model.safetensors ]]; then pass "$np ranks: exit 0, weights written"; else fail "$np ranks: exit $rc or no model.safetensors"; fi
      if [[ $(head -c 1000000 "$tmp/np$np/model.safetensors" | grep -ac '"architecture"') -gt 0 ]]; then
        pass "$np ranks: model.safetensors is a model file (the architecture in its metadata)"
      else
        fail "$np ranks: model.safetensors has no architecture"
      fi
      if grep -q "global batch 168 tokens = 7 sentences of 24, 21 training sentences" <<<"$out"; then pass "$np ranks: 7 sentences per batch"; else fail "$np ranks: no '7 sentences of 24, 21 training sentences' line"; fi
    done
    # Another global batch (6 sentences, 18 in all: 3 steps): the control.
    run 1 "${common[@]}" --batch_size=144 --num_sentences=18 --model_dir="$tmp/control"
    # Tolerance: the ranks sum their gradients in another order than one rank (and the
    # attention's products see other batch sizes), so gradients differ in the last float
    # bits; Adam's first steps are about lr * sign(g) with lr about 0.01 here, so a weight
    # whose gradient is within rounding of 0 can move differently by up to 2 lr = 0.02 in
    # principle; the largest difference seen is 4e-7 (no gradient is that close to 0 here).
    # 1e-5 leaves room for other machines' rounding; the control (one sentence less per
    # batch) differs by 0.07.
    tol=1e-5
    for np in 2 3; do
      d=$(max_abs_diff "$tmp/np1/model.safetensors" "$tmp/np$np/model.safetensors")
      if awk -v d="$d" -v t="$tol" 'BEGIN { exit !(d != "" && d <= t) }'; then pass "1 vs $np ranks: max |dw| = $d <= $tol"; else fail "1 vs $np ranks: max |dw| = $d > $tol"; fi
    done
    d=$(max_abs_diff "$tmp/np1/model.safetensors" "$tmp/control/model.safetensors")
    if awk -v d="$d" 'BEGIN { exit !(d != "" && d > 1e-3) }'; then pass "control (another batch): max |dw| = $d > 1e-3"; else fail "control: max |dw| = $d, expected > 1e-3 (the comparison could not fail)"; fi
    ;;
  manual_indivisible)
    corpus 100 10
    # The tutorial's manual pipeline: 7 sentences per global batch (168 // 24) on 2 and 3
    # ranks give each rank 7 // p sentences a step (3 and 2), so global batches of 6, said
    # once with the numbers; 21 sentences make 3 steps. The result is one rank's on global
    # batches of 6 (144 // 24) with automatic distribution, within ranks_1_2_3's tolerance
    # (the same samples in every step; the control there shows 6 against 7 sentences
    # differ by 0.07).
    common=(--data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --train_epochs=1
            --learning_rate_warmup_steps=10 --num_sentences=21)
    run 1 "${common[@]}" --batch_size=144 --model_dir="$tmp/np1"
    if [[ $rc -eq 0 ]]; then pass "1 rank, 6 sentences: exit 0"; else fail "1 rank, 6 sentences: exit $rc"; fi
    tol=1e-5
    for np in 2 3; do
      run "$np" "${common[@]}" --batch_size=168 --auto_data_dist=false --model_dir="$tmp/np$np"
      if [[ $rc -eq 0 && -s $tmp/np$np/model.safetensors ]]; then pass "$np ranks, manual, 7 sentences: exit 0"; else fail "$np ranks, manual: exit $rc or no model.safetensors"; fi
      micro=$((7 / np))
      msg="--auto_data_dist=false: 7 sentences per global batch (--batch_size=168 // --max_length=24) do not split evenly over $np ranks: each rank takes 7 // $np = $micro sentences a step, so a global batch is 6 sentences, not 7 (as the tutorial's manual pipeline; --auto_data_dist=true splits all 7 unevenly over the ranks)"
      n=$(grep -cxF -- "$msg" <<<"$out")
      if [[ $n -eq 1 ]]; then pass "$np ranks: the floor is said once"; else fail "$np ranks: '$msg' printed $n times, expected once"; fi
      d=$(max_abs_diff "$tmp/np1/model.safetensors" "$tmp/np$np/model.safetensors")
      if awk -v d="$d" -v t="$tol" 'BEGIN { exit !(d != "" && d <= t) }'; then pass "$np ranks manual vs 1 rank on 6 sentences: max |dw| = $d <= $tol"; else fail "$np ranks manual vs 1 rank on 6 sentences: max |dw| = $d > $tol"; fi
    done
    # Sentences the ranks divide: nothing to say.
    run 2 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --batch_size=192 --num_sentences=16 \
      --auto_data_dist=false --model_dir="$tmp/m2"
    if [[ $rc -eq 0 ]] && grep -q "manual data distribution" <<<"$out"; then pass "8 sentences on 2 ranks, manual: exit 0"; else fail "manual mode with 8 sentences: exit $rc"; fi
    if ! grep -q "do not split evenly" <<<"$out"; then pass "8 sentences on 2 ranks: no floor message"; else fail "a floor message for 8 sentences on 2 ranks"; fi
    ;;
  micro_batch_size)
    corpus 100 10
    # --micro_batch_size counts tokens per rank: 84 on 2 ranks and 56 on 3 are --batch_size=168,
    # 7 sentences. On 2 ranks the very run of --batch_size=168 (the same weights bitwise); on
    # 3 ranks its weights within ranks_1_2_3's tolerance.
    common=(--data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --train_epochs=1
            --learning_rate_warmup_steps=10 --num_sentences=21)
    run 2 "${common[@]}" --batch_size=168 --model_dir="$tmp/global"
    if [[ $rc -eq 0 ]]; then pass "--batch_size=168 on 2 ranks: exit 0"; else fail "--batch_size=168: exit $rc"; fi
    for np in 2 3; do
      micro=$((168 / np))
      run "$np" "${common[@]}" --micro_batch_size=$micro --model_dir="$tmp/micro$np"
      if [[ $rc -eq 0 && -s $tmp/micro$np/model.safetensors ]]; then pass "--micro_batch_size=$micro on $np ranks: exit 0"; else fail "--micro_batch_size=$micro on $np ranks: exit $rc"; fi
      if grep -q "^$np ranks, global batch 168 tokens = 7 sentences of 24" <<<"$out"; then pass "$np ranks: global batch 168 tokens"; else fail "$np ranks: no '$np ranks, global batch 168 tokens = 7 sentences of 24' line"; fi
      d=$(max_abs_diff "$tmp/global/model.safetensors" "$tmp/micro$np/model.safetensors")
      want=1e-5
      [[ $np -eq 2 ]] && want=0
      if awk -v d="$d" -v t="$want" 'BEGIN { exit !(d != "" && d <= t) }'; then pass "$np ranks: max |dw| = $d <= $want against --batch_size=168"; else fail "$np ranks: max |dw| = $d > $want against --batch_size=168"; fi
    done
    run 2 "${common[@]}" --batch_size=100 --micro_batch_size=84 --model_dir="$tmp/refused"
    expect_error "--batch_size=100 and --micro_batch_size=84 disagree: on 2 ranks the global batch is --micro_batch_size x ranks = 168; give one of the two" "both flags"
    if [[ $rc -eq 2 ]]; then pass "exit status 2"; else fail "exit status $rc, expected 2"; fi
    help=$("$program" --help 2>&1)
    if grep -q -- "--micro_batch_size" <<<"$help"; then pass "--help lists --micro_batch_size"; else fail "--help has no --micro_batch_size"; fi
    ;;
  bad_param_set)
    corpus 20 5
    run 2 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" --param_set=huge --model_dir="$tmp/m"
    expect_error "--param_set=huge: expected tiny, base or big" "--param_set and the choices"
    ;;
  missing_vocab_file)
    corpus 20 5
    run 2 --data_dir="$tmp/corpus/data" --vocab_file="$tmp/no_such_vocab" "${small[@]}" --model_dir="$tmp/m"
    expect_error "--vocab_file=$tmp/no_such_vocab: no such file" "--vocab_file and the path"
    run 2 --data_dir="$tmp/corpus/data" "${small[@]}" --model_dir="$tmp/m"
    expect_error "--vocab_file is missing" "the missing --vocab_file"
    ;;
  model_too_big)
    corpus 20 5
    # A model whose weights alone (hidden 65536: 3e11 parameters, 4.6 TiB with gradients and
    # Adam) exceed any machine, and one whose step does (max_length 65536: attention weights
    # of 65536^2 per head); both refused before anything is allocated, on both ranks.
    run 2 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --hidden_size=65536 --model_dir="$tmp/m"
    expect_error "the model and one training step need at least [0-9.]+ GiB per rank, more than the [0-9.]+ GiB of this host's memory shared by its 2 rank\(s\): [0-9]+ parameters \(--hidden_size=65536" "the size, the memory and --hidden_size"
    run 2 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" --param_set=tiny --max_length=65536 \
      --batch_size=131072 --model_dir="$tmp/m"
    expect_error "need at least .* for 1 sentence of --max_length=65536 tokens \(--batch_size=131072 over 2 ranks\)" "--max_length and --batch_size"
    if [[ ! -e $tmp/m/history.csv ]]; then pass "no history.csv"; else fail "history.csv written by a refused run"; fi
    # Sizes beyond the flags' bounds are refused by name.
    run 2 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --num_hidden_layers=100000 --model_dir="$tmp/m"
    expect_error "--num_hidden_layers=100000: must be in \[1, 1024\]" "--num_hidden_layers and its bounds"
    run 2 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --beam_size=5000 --model_dir="$tmp/m"
    expect_error "--beam_size=5000: must be in \[1, 1024\]" "--beam_size and its bounds"
    ;;
  batch_below_max_length)
    corpus 20 5
    run 2 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" --param_set=tiny --batch_size=100 --max_length=256 \
      --model_dir="$tmp/m"
    expect_error "--batch_size=100: fewer tokens than --max_length=256" "--batch_size and --max_length"
    # One sentence per global batch, for 2 ranks.
    run 2 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" --param_set=tiny --batch_size=24 --max_length=24 \
      --model_dir="$tmp/m"
    expect_error "--batch_size=24: 1 sentence per global batch \(batch_size // max_length = 24 // 24\), fewer than the 2 ranks" "the sentences per batch and the ranks"
    ;;
  bleu_files_mismatch)
    corpus 20 5
    run 2 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --bleu_source="$tmp/corpus/dev.en" \
      --bleu_ref="$tmp/corpus/train.de" --model_dir="$tmp/m"
    expect_error "--bleu_source=$tmp/corpus/dev.en has 5 lines, --bleu_ref=$tmp/corpus/train.de has 20" "both files and their line counts"
    run 2 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --bleu_source="$tmp/corpus/dev.en" \
      --model_dir="$tmp/m"
    expect_error "--bleu_source and --bleu_ref: give both" "the missing --bleu_ref"
    ;;
  long_source_line)
    # A --bleu_source line of 2 MB (a document without newlines): decoding it would need
    # terabytes (attention over its length squared), so it is refused before training,
    # naming the file and the line, rather than failing after training in the allocation.
    corpus 20 5
    { head -n 2 "$tmp/corpus/dev.en"; "$python" -c 'print("the dog " * 250000)'; } >"$tmp/long.en"
    head -n 3 "$tmp/corpus/dev.de" >"$tmp/long.de"
    run 1 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --bleu_source="$tmp/long.en" \
      --bleu_ref="$tmp/long.de" --model_dir="$tmp/m"
    expect_error "--bleu_source=$tmp/long.en line 3: [0-9]+ subtokens; decoding it .* needs at least [0-9.]+ GiB .* --decode_max_length" "the file, the line and the way out"
    if grep -q '^Epoch 1' <<<"$out"; then fail "training started"; else pass "refused before training"; fi
    if grep -Eq 'failed first: exit code 2\b|exit status 2' <<<"$out" || [[ $rc -eq 2 ]]; then pass "exit code 2"; else fail "not an input error's exit code 2"; fi
    # With --decode_max_length the line is cut and the run goes on past that check.
    run 1 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --bleu_source="$tmp/long.en" \
      --bleu_ref="$tmp/long.de" --model_dir="$tmp/m2" --decode_max_length=24 --train_epochs=0 --batch_size=168
    if [[ $rc -eq 0 ]]; then pass "--decode_max_length=24: runs"; else fail "--decode_max_length=24: exit status $rc"; fi
    ;;
  epoch_count)
    # fit() runs in pieces of --epochs_between_evals epochs: one count over the whole run.
    corpus 20 5
    run 1 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --batch_size=168 --num_sentences=21 \
      --train_epochs=3 --epochs_between_evals=2 --model_dir="$tmp/m"
    if [[ $rc -eq 0 ]]; then pass "exit status 0"; else fail "exit status $rc"; fi
    epochs=$(grep -E '^Epoch [0-9]+/[0-9]+' <<<"$out" | tr '\n' ' ')
    if [[ $epochs == "Epoch 1/3 Epoch 2/3 Epoch 3/3 " ]]; then pass "Epoch 1/3 2/3 3/3"; else fail "epoch lines '$epochs', expected 'Epoch 1/3 Epoch 2/3 Epoch 3/3'"; fi
    ;;
  time_history)
    corpus 100 10
    common=(--data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --train_epochs=1 --batch_size=168
            --num_sentences=21 --learning_rate_warmup_steps=10 --enable_time_history --log_steps=1)
    for np in 1 2; do
      run "$np" "${common[@]}" --model_dir="$tmp/th$np"
      if [[ $rc -eq 0 ]]; then pass "$np rank(s): exit status 0"; else fail "$np rank(s): exit status $rc"; fi
      # "TimeHistory: steps K-K: R tokens/s (N tokens in S s)" -> "K N"
      steps=$(sed -nE 's/^TimeHistory: steps ([0-9]+)-[0-9]+: [0-9.]+ tokens\/s \(([0-9]+) tokens in [0-9.]+ s\)$/\1 \2/p' <<<"$out")
      if [[ $(cut -d' ' -f1 <<<"$steps" | tr '\n' ' ') == "1 2 3 " ]]; then pass "$np rank(s): a line for each of steps 1, 2, 3"; else fail "$np rank(s): TimeHistory step lines: '$steps'"; fi
      if awk '{ if (!($2 > 0 && $2 < 168)) bad = 1 } END { exit bad || NR != 3 }' <<<"$steps"; then
        pass "$np rank(s): each step's tokens are real ones, fewer than the 168 padded: $(cut -d' ' -f2 <<<"$steps" | tr '\n' ' ')"
      else
        fail "$np rank(s): step tokens not in (0, 168): '$steps'"
      fi
      tokens[$np]=$steps
      n=$(grep -Ec '^TimeHistory: [0-9.]+ tokens/s on average over steps 2-3 \([0-9]+ tokens in [0-9.]+ s; steps 1-1 left out as warm-up\)$' <<<"$out")
      if [[ $n -eq 1 ]]; then pass "$np rank(s): the average over steps 2-3, once"; else fail "$np rank(s): the average line appears $n times, expected once"; fi
      if grep -q '^tokens/s: ' <<<"$out"; then fail "$np rank(s): the padded tokens/s line beside TimeHistory's"; else pass "$np rank(s): no second tokens/s line"; fi
    done
    if [[ -n ${tokens[1]} && ${tokens[1]} == "${tokens[2]}" ]]; then pass "1 and 2 ranks count the same global tokens"; else fail "tokens per step: 1 rank '${tokens[1]}', 2 ranks '${tokens[2]}'"; fi
    ;;
  learns_demo)
    corpus 400 20
    # 32 sentences per global batch: 12 steps an epoch; evaluation after epochs 3 and 6.
    run 2 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --batch_size=768 --num_sentences=400 \
      --train_epochs=6 --epochs_between_evals=3 --learning_rate_warmup_steps=30 --decode_batch_size=8 \
      --bleu_source="$tmp/corpus/dev.en" --bleu_ref="$tmp/corpus/dev.de" --model_dir="$tmp/m"
    if [[ $rc -eq 0 ]]; then pass "exit status 0"; else fail "exit status $rc"; fi
    csv=$tmp/m/history.csv
    if [[ -f $csv && $(wc -l <"$csv") -eq 7 ]]; then pass "history.csv has 6 epochs"; else fail "history.csv missing or not 6 rows:"; cat "$csv" 2>/dev/null; fi
    # The first epoch's mean loss per token is about 4.6 (ln of the vocabulary is 6); a model
    # that learns nothing stays there, this one reaches about 60% of it in 6 epochs.
    if awk -F, 'NR == 2 { first = $2 } NR == 7 { last = $2 } END { exit !(first > 0 && last < 0.7 * first) }' "$csv"; then
      pass "the loss falls below 70% of the first epoch's: $(cut -d, -f2 "$csv" | tr '\n' ' ')"
    else
      fail "the loss does not fall clearly: $(cut -d, -f2 "$csv" | tr '\n' ' ')"
    fi
    for kind in uncased cased; do
      n=$(grep -Ec "^Bleu score \($kind\): [0-9]+\.[0-9]+" <<<"$out")
      if [[ $n -eq 2 ]]; then pass "'Bleu score ($kind)' printed twice (2 evaluations, master only)"; else fail "'Bleu score ($kind): X' appears $n times, expected 2"; fi
    done
    if [[ -f $tmp/m/translations.txt && $(wc -l <"$tmp/m/translations.txt") -eq 20 ]]; then
      pass "translations.txt has 20 lines"
    else
      fail "translations.txt missing or not 20 lines"
    fi
    if ! compgen -G "$tmp/m/.translations.txt.tmp*" >/dev/null; then pass "no temporary left"; else fail "a translations.txt temporary left behind"; fi
    # The exported weights load strictly into the PyTorch module of the same structure.
    torch_python=""
    for p in ${PYTHON:-} python3 /usr/bin/python3; do
      if command -v "$p" >/dev/null && "$p" -c "import torch" 2>/dev/null; then torch_python=$p; break; fi
    done
    v=$(sed -n 's/^Transformer (tiny): .* parameters, vocabulary \([0-9]*\),.*/\1/p' <<<"$out")
    if [[ -z $torch_python ]]; then
      fail "no Python with torch (set PYTHON=, or apt install python3-torch)"
    elif "$torch_python" "$src_dir/scripts/transformer_torch.py" --checkpoint "$tmp/m/model.safetensors" \
        --param_set tiny --num_hidden_layers 2 --vocab_size "$v" >"$tmp/torch.out" 2>&1; then
      pass "model.safetensors loads into scripts/transformer_torch.py ($(tail -1 "$tmp/torch.out"))"
    else
      cat "$tmp/torch.out"
      fail "model.safetensors does not load into scripts/transformer_torch.py"
    fi
    ;;
  resume)
    corpus 100 5
    common=(--data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --batch_size=192 --num_sentences=32
            --learning_rate_warmup_steps=10 --model_dir="$tmp/m")
    run 2 "${common[@]}" --train_epochs=2
    if [[ $rc -eq 0 && -s $tmp/m/checkpoint.safetensors ]]; then pass "first run: exit 0, checkpoint"; else fail "first run: exit $rc or no checkpoint"; fi
    run 2 "${common[@]}" --train_epochs=3
    expect_error "--model_dir=$tmp/m already holds .*--resume.*--overwrite" "the directory, --resume and --overwrite"
    # Refused before the data are read: a --data_dir that does not exist is not what it names.
    run 2 "${common[@]/--data_dir=*/--data_dir=$tmp/no_such_dir}" --train_epochs=3
    expect_error "--model_dir=$tmp/m already holds " "the directory before the data"
    run 2 "${common[@]}" --train_epochs=3 --resume
    if [[ $rc -eq 0 ]] && grep -q "Resuming from $tmp/m/checkpoint.safetensors at epoch 2" <<<"$out"; then pass "--resume continues at epoch 2"; else fail "--resume: exit $rc or no 'Resuming ... at epoch 2'"; fi
    if [[ $(cut -d, -f1 "$tmp/m/history.csv" | tr '\n' ' ') == "epoch 1 2 3 " ]]; then pass "history.csv has epochs 1, 2, 3 once each"; else fail "history.csv: $(cut -d, -f1 "$tmp/m/history.csv" | tr '\n' ' ')"; fi
    # Another number of heads computes something else with the same weights: refused, naming
    # the flag (before: accepted silently). A new learning rate is taken, and said.
    run 2 "${common[@]}" --train_epochs=4 --resume --num_heads=2
    expect_error "--num_heads=2: the run being resumed \\($tmp/m/checkpoint.safetensors\\) was trained with --num_heads=4, and that flag decides .* give --num_heads=4 to continue it" \
      "the flag, both values and the checkpoint"
    # A vocabulary of the same size whose ids mean other subtokens (two lines swapped):
    # refused (before: trained on, and its translations were garbage); the same file
    # elsewhere is the same vocabulary.
    awk 'NR == 10 { held = $0; next } NR == 11 { print; print held; next } { print }' "$vocab" >"$tmp/swapped.vocab"
    run 2 "${common[@]/--vocab_file=*/--vocab_file=$tmp/swapped.vocab}" --train_epochs=4 --resume
    expect_error "--vocab_file: its contents are not those the run being resumed \\($tmp/m/checkpoint.safetensors\\) was trained with" \
      "the flag and the checkpoint"
    cp "$vocab" "$tmp/copy.vocab"
    run 2 "${common[@]/--vocab_file=*/--vocab_file=$tmp/copy.vocab}" --train_epochs=4 --resume --learning_rate=1.5
    if [[ $rc -eq 0 ]] && grep -qF -- "--learning_rate=1.5: the run being resumed was trained with --learning_rate=2; it goes on with 1.5" <<<"$out"; then pass "a new --learning_rate is taken and said (the vocabulary copied elsewhere)"; else fail "--learning_rate=1.5 on resume: exit $rc or no line saying so"; fi
    # A restart of the same launch (what tarantella --max-restarts sets for each attempt)
    # continues from the checkpoint without --resume; the first attempt starts fresh.
    export TNT_RUN_ID=transformer-e2e-launch
    common=("${common[@]/--model_dir=*/--model_dir=$tmp/r}")
    TNT_RESTART=0 run 2 "${common[@]}" --train_epochs=2
    if [[ $rc -eq 0 && -s $tmp/r/checkpoint.safetensors ]]; then pass "attempt 0: exit 0, checkpoint"; else fail "attempt 0: exit $rc or no checkpoint"; fi
    TNT_RESTART=1 run 2 "${common[@]}" --train_epochs=3
    if [[ $rc -eq 0 ]] && grep -q "Resuming from $tmp/r/checkpoint.safetensors at epoch 2" <<<"$out"; then pass "restart 1 continues at epoch 2"; else fail "restart 1: exit $rc or no 'Resuming ... at epoch 2'"; fi
    unset TNT_RUN_ID
    ;;
  dtype)
    corpus 64 5
    common=(--data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --batch_size=192 --num_sentences=64
            --learning_rate_warmup_steps=10 --train_epochs=1)
    run 2 "${common[@]}" --model_dir="$tmp/fp32"
    if [[ $rc -eq 0 ]]; then pass "fp32: exit 0"; else fail "fp32: exit $rc"; fi
    run 2 "${common[@]}" --model_dir="$tmp/bf16" --dtype=bf16
    if [[ $rc -eq 0 ]] && grep -q "^precision: bf16 compute, fp32 master weights" <<<"$out"; then pass "bf16: exit 0, mixed precision announced"; else fail "bf16: exit $rc or no 'precision: bf16 compute' line"; fi
    # bf16 keeps 8 significant bits (relative rounding 2^-9 = 0.2% per stored activation):
    # the first epoch's mean loss (about 4.7) moves by far less than that in practice
    # (0.01% seen); 2% allows for other machines while still catching a model that is not
    # the same one (an untrained or broken bf16 path differs by tens of percent).
    l32=$(awk -F, 'NR == 2 {print $2}' "$tmp/fp32/history.csv" 2>/dev/null)
    l16=$(awk -F, 'NR == 2 {print $2}' "$tmp/bf16/history.csv" 2>/dev/null)
    if awk -v a="$l32" -v b="$l16" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 0.02 * a) }'; then
      pass "epoch-1 loss fp32 $l32, bf16 $l16 (within 2%)"
    else
      fail "epoch-1 loss fp32 '$l32', bf16 '$l16': more than 2% apart"
    fi
    # ... but not equal: two fp32 runs with one seed give bitwise-equal weights on CPU, so a
    # --dtype=bf16 that is silently ignored would leave the weights identical. Rounding the
    # activations to bf16 moves some weight by far more than 1e-5 after this epoch.
    d=$(max_abs_diff "$tmp/fp32/model.safetensors" "$tmp/bf16/model.safetensors" 2>&1)
    if awk -v d="$d" 'BEGIN { exit !(d + 0 > 1e-5) }' 2>/dev/null && [[ $d =~ ^[0-9.e+-]+$ ]]; then
      pass "bf16 weights differ from fp32's (largest difference $d)"
    else
      fail "bf16 weights do not differ from fp32's by more than 1e-5 (largest difference: $d): was bf16 used?"
    fi
    run 2 "${common[@]}" --model_dir="$tmp/bad" --dtype=fp8
    expect_error "--dtype=fp8: expected fp32, bf16 or fp16" "--dtype and the choices"
    # A run is continued in the precision it was trained in (its history's columns alone do
    # not tell bf16 from fp32).
    run 2 "${common[@]/--train_epochs=*/--train_epochs=2}" --model_dir="$tmp/fp32" --resume --dtype=bf16
    expect_error "--dtype=bf16: the run being resumed \\($tmp/fp32/checkpoint.safetensors\\) was trained with --dtype=fp32; give --dtype=fp32" \
      "the precision of the run and the flag"
    ;;
  decode_cache)
    corpus 400 20
    common=(--data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --batch_size=768 --num_sentences=400
            --train_epochs=8 --epochs_between_evals=8 --learning_rate_warmup_steps=30 --decode_batch_size=8
            --bleu_source="$tmp/corpus/dev.en" --bleu_ref="$tmp/corpus/dev.de" --model_dir="$tmp/m")
    run 2 "${common[@]}"
    if [[ $rc -eq 0 && -s $tmp/m/translations.txt ]]; then pass "with the cache: exit 0, translations.txt"; else fail "with the cache: exit $rc or no translations.txt"; fi
    cp "$tmp/m/translations.txt" "$tmp/cached.txt" 2>/dev/null
    # The checkpoint is at epoch 8 = --train_epochs: nothing to train, only the evaluation.
    run 2 "${common[@]}" --resume --decode_cache=false
    if [[ $rc -eq 0 ]] && grep -q "Nothing to train" <<<"$out"; then pass "without the cache: evaluation only, exit 0"; else fail "without the cache: exit $rc or no 'Nothing to train' line"; fi
    if [[ -s $tmp/m/translations.txt ]] && cmp -s "$tmp/cached.txt" "$tmp/m/translations.txt"; then
      pass "translations.txt is the same with and without the cache"
    else
      fail "translations.txt differs with and without the cache:"
      diff "$tmp/cached.txt" "$tmp/m/translations.txt" | head -20
    fi
    n=$(grep -v '^$' "$tmp/cached.txt" 2>/dev/null | sort -u | wc -l)
    if [[ $n -ge 5 ]]; then pass "$n distinct non-empty translations of 20"; else fail "only $n distinct non-empty translations"; fi
    run 2 "${common[@]}" --resume --decode_cache=maybe
    if [[ $rc -ne 0 && $rc -ne 124 && $rc -ne 137 ]] && grep -q -- "--decode_cache=maybe: expected true or false" <<<"$out"; then
      pass "--decode_cache=maybe is refused, naming the flag"
    else
      fail "--decode_cache=maybe: exit $rc, or no '--decode_cache=maybe: expected true or false' line"
    fi
    ;;
  empty_translation)
    # The demo's corpus (600 pairs, 20 dev) and model (tiny, 6 + 6 layers) untrained: its
    # translation of the last dev sentence is empty. That is a line scoring nothing, not a
    # reason to fail after training: compute_bleu.py on the file would drop the blank last
    # line and find 19 lines against 20.
    corpus 600 20
    run 2 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" --bleu_source="$tmp/corpus/dev.en" \
      --bleu_ref="$tmp/corpus/dev.de" --param_set=tiny --max_length=24 --batch_size=1536 --train_epochs=0 \
      --model_dir="$tmp/m"
    t=$tmp/m/translations.txt
    # The premise: an empty translation at the file's start or end (else this case tests
    # nothing and needs another corpus or seed).
    if [[ -f $t ]] && { [[ -z $(head -n 1 "$t") ]] || [[ -z $(tail -n 1 "$t") ]]; }; then
      pass "an empty translation at the start or end of translations.txt"
    else
      fail "premise: no empty first or last translation (the case needs another corpus or seed)"
    fi
    if [[ $rc -eq 0 ]]; then pass "exit status 0"; else fail "exit status $rc"; fi
    if [[ -f $t && $(wc -l <"$t") -eq 20 ]]; then pass "translations.txt has 20 lines, one per source line"; else fail "translations.txt missing or not 20 lines"; fi
    for kind in uncased cased; do
      if grep -Eq "^Bleu score \($kind\): [0-9]+\.[0-9]+" <<<"$out"; then pass "Bleu score ($kind) printed"; else fail "no 'Bleu score ($kind)'"; fi
    done
    if [[ -s $tmp/m/model.safetensors ]]; then pass "model.safetensors written"; else fail "no model.safetensors"; fi
    # No checkpoint: the weights evaluated are the initial ones, not a checkpoint's.
    if grep -q '^Nothing to train (--train_epochs=0): evaluating the initial weights$' <<<"$out"; then
      pass "'Nothing to train' says what is evaluated"
    else
      fail "no 'Nothing to train (--train_epochs=0): evaluating the initial weights'"
    fi
    ;;
  evaluation_fails)
    # An evaluation that fails (translations.txt cannot be written: a directory stands in its
    # place, made between a first run and its resumed second) ends the run with an error
    # naming --model_dir, and the trained weights are in model.safetensors all the same.
    corpus 64 5
    run 2 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --batch_size=192 --num_sentences=64 \
      --train_epochs=1 --bleu_source="$tmp/corpus/dev.en" --bleu_ref="$tmp/corpus/dev.de" --model_dir="$tmp/m"
    rm -f "$tmp/m/translations.txt" "$tmp/m/model.safetensors"
    mkdir "$tmp/m/translations.txt"
    run 2 --data_dir="$tmp/corpus/data" --vocab_file="$vocab" "${small[@]}" --batch_size=192 --num_sentences=64 \
      --train_epochs=2 --resume --bleu_source="$tmp/corpus/dev.en" --bleu_ref="$tmp/corpus/dev.de" --model_dir="$tmp/m"
    expect_error "--model_dir=$tmp/m: translations '$tmp/m/translations.txt': cannot rename the temporary file to it: Is a directory" "--model_dir and the file"
    if [[ -s $tmp/m/model.safetensors ]]; then pass "model.safetensors written before the evaluation"; else fail "no model.safetensors after a failed evaluation"; fi
    if grep -q '^tokens/s: [0-9]* (8 sentences x 24 tokens per global batch, 2 ranks, 7 timed steps, ' <<<"$out"; then
      pass "tokens/s line"
    else
      fail "no 'tokens/s: N (8 sentences x 24 tokens per global batch, 2 ranks, 7 timed steps, ...'"
    fi
    ;;
  data_tool_inputs)
    # transformer_data checks its inputs before it writes anything: a target file one line
    # short (train, then dev) is refused naming both files, and leaves no vocabulary and no
    # shard; the corrected rerun builds the vocabulary from the right files instead of
    # reusing one made from the wrong ones.
    "$python" "$src_dir/scripts/make_demo_corpus" "$tmp/corpus" --train 100 --dev 5 >"$tmp/corpus.log" 2>&1 ||
      { cat "$tmp/corpus.log"; echo "FAIL: making the corpus"; exit 1; }
    c=$tmp/corpus
    head -n 99 "$c/train.de" >"$c/short.de"
    head -n 4 "$c/dev.de" >"$c/short_dev.de"
    data_run() {  # ARGS...: transformer_data into $tmp/d
      echo "+ $data_tool $*"
      "$data_tool" --data_dir="$tmp/d" --target_vocab_size=1000 --train_shards=2 "$@" >"$tmp/stdout" 2>&1
      rc=$?
      out=$(cat "$tmp/stdout")
      echo "--- exit status $rc:"
      echo "$out"
      echo "---"
    }
    nothing_written() {  # WHAT
      if [[ ! -e $tmp/d/vocab.ende.1000 && -z $(ls "$tmp/d" 2>/dev/null) ]]; then pass "$1: nothing written"; else fail "$1: left $(ls "$tmp/d" 2>/dev/null | tr '\n' ' ')"; fi
    }
    data_run --train_source="$c/train.en" --train_target="$c/short.de" --dev_source="$c/dev.en" --dev_target="$c/dev.de"
    if [[ $rc -ne 0 ]] && grep -q -- "the train files differ in length: '$c/short.de' ends after 99 lines (--train_target), '$c/train.en' has 100 lines (--train_source)" <<<"$out"; then
      pass "train: refused, naming both files and their lengths"
    else
      fail "train: exit $rc, or no 'the train files differ in length: '.../short.de' ends after 99 lines (--train_target), ... has 100 lines (--train_source)'"
    fi
    nothing_written train
    data_run --train_source="$c/train.en" --train_target="$c/train.de" --dev_source="$c/dev.en" --dev_target="$c/short_dev.de"
    if [[ $rc -ne 0 ]] && grep -q -- "the dev files differ in length: '$c/short_dev.de' ends after 4 lines (--dev_target), '$c/dev.en' has 5 lines (--dev_source)" <<<"$out"; then
      pass "dev: refused, naming both files and their lengths"
    else
      fail "dev: exit $rc, or no 'the dev files differ in length: ...'"
    fi
    nothing_written dev
    data_run --train_source="$c/train.en" --train_target="$c/train.de" --dev_source="$c/dev.en" --dev_target="$c/dev.de" \
      --dev_shards=1
    if [[ $rc -eq 0 ]]; then pass "corrected: exit 0"; else fail "corrected: exit $rc"; fi
    if grep -q "^vocabulary: building it from $c/train.en and $c/train.de" <<<"$out" && [[ -s $tmp/d/vocab.ende.1000 ]]; then
      pass "corrected: the vocabulary is built, not reused"
    else
      fail "corrected: no 'vocabulary: building it from ...', or no vocabulary file"
    fi
    if grep -Eq '^dev: 5 sentence pairs \(.*\) in 1 shard wmt32k-dev-\*$' <<<"$out"; then pass "'in 1 shard'"; else fail "no 'dev: 5 sentence pairs (...) in 1 shard wmt32k-dev-*'"; fi
    if ls "$tmp/d" | grep -q incomplete; then fail "an .incomplete file left"; else pass "no .incomplete file left"; fi
    # A pair with an empty side is left out and counted (before: written, teaching the model
    # to translate a sentence into nothing); a NUL byte is refused, naming file and line.
    { head -n 2 "$c/dev.de"; echo "   "; tail -n +4 "$c/dev.de"; } >"$c/gap_dev.de"
    rm -rf "$tmp/d"
    data_run --train_source="$c/train.en" --train_target="$c/train.de" --dev_source="$c/dev.en" --dev_target="$c/gap_dev.de" \
      --dev_shards=1
    if [[ $rc -eq 0 ]] && grep -Eq '^dev: 4 sentence pairs \(.*\) in 1 shard wmt32k-dev-\*; 1 pair left out: an empty source or target line$' <<<"$out"; then
      pass "an empty target line: the pair left out and counted"
    else
      fail "an empty target line: exit $rc, or no 'dev: 4 sentence pairs ...; 1 pair left out'"
    fi
    { head -n 2 "$c/dev.en"; printf 'a\0b\n'; tail -n +4 "$c/dev.en"; } >"$c/nul_dev.en"
    rm -rf "$tmp/d"
    data_run --train_source="$c/train.en" --train_target="$c/train.de" --dev_source="$c/nul_dev.en" --dev_target="$c/dev.de"
    if [[ $rc -ne 0 ]] && grep -q -- "'$c/nul_dev.en' line 3: a NUL byte at column 2" <<<"$out"; then
      pass "a NUL byte: refused, naming the file, line and column"
    else
      fail "a NUL byte: exit $rc, or no \"'.../nul_dev.en' line 3: a NUL byte at column 2\""
    fi
    if ls "$tmp/d" 2>/dev/null | grep -q incomplete; then fail "an .incomplete file left after the NUL"; else pass "nothing incomplete left after the NUL"; fi
    ;;
  *)
    echo "unknown case $case_name" >&2
    exit 2
    ;;
esac
if [[ $failures -gt 0 ]]; then echo "$failures check(s) failed"; exit 1; fi
echo "all checks passed"
