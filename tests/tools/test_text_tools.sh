#!/usr/bin/env bash
# The text tools as a user runs them: subtokenizer and compute_bleu on small files, their
# outputs against values worked out by hand, and their bad-input exits.
#   test_text_tools.sh BIN_DIR
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() {  # check NAME EXPECTED ACTUAL
  if [[ "$2" == "$3" ]]; then echo "ok   $1"; else
    echo "FAIL $1"; echo "  expected: $2"; echo "  actual:   $3"; fails=$((fails + 1)); fi
}
contains() {  # contains NAME NEEDLE HAYSTACK
  if [[ "$3" == *"$2"* ]]; then echo "ok   $1"; else
    echo "FAIL $1"; echo "  expected to contain: $2"; echo "  actual: $3"; fails=$((fails + 1)); fi
}
# Python's repr of float32(x) * 100, the way the reference turns a BLEU into its score.
score() { python3 -c "import math, struct; print(repr(struct.unpack('f', struct.pack('f', $1))[0] * 100))"; }

# ---- subtokenizer: the vocabulary of tests/data/test_text.cpp's hand-worked encodings
printf "%s\n" "'<pad>'" "'<EOS>'" "'the_'" "'cat_'" "'c'" "'a'" "'t'" "'h'" "'e'" "'_'" "' '" "'!_'" \
  "'\\'" "'u'" "';'" "'0'" "'1'" "'2'" "'3'" "'4'" "'5'" "'6'" "'7'" "'8'" "'9'" "'ca'" > "$tmp/vocab"
# "the cat!" -> the_ cat_ !_ ; "cat hat" -> cat_ h a t _ ; "cab" -> ca \ 9 8 ; _ (b is 98)
printf 'the cat!\ncat hat\ncab\n' > "$tmp/text"
out=$("$bin/subtokenizer" --vocab_file="$tmp/vocab" encode < "$tmp/text")
check "subtokenizer encode" $'2 3 11\n3 7 5 6 9\n25 12 24 23 14 9' "$out"
out=$("$bin/subtokenizer" --vocab_file="$tmp/vocab" --add_eos encode < "$tmp/text" | head -1)
check "subtokenizer encode --add_eos" "2 3 11 1" "$out"
out=$(printf '2 3 11\n3 7 5 6 9\n25 12 24 23 14 9\n' | "$bin/subtokenizer" --vocab_file="$tmp/vocab" decode)
check "subtokenizer decode" $'the cat!\ncat hat\ncab' "$out"
# decoding stops at EOS unless --keep_eos
check "subtokenizer decode stops at EOS" "the cat" "$(echo '2 3 1 2' | "$bin/subtokenizer" --vocab_file="$tmp/vocab" decode)"
check "subtokenizer decode --keep_eos" "the cat<EOS>the" \
  "$(echo '2 3 1 2' | "$bin/subtokenizer" --vocab_file="$tmp/vocab" --keep_eos decode)"
err=$(printf '2 3\n2 x\n' | "$bin/subtokenizer" --vocab_file="$tmp/vocab" decode 2>&1 >/dev/null); rc=$?
check "subtokenizer bad id: exit 1" 1 "$rc"
contains "subtokenizer bad id: names the line" 'stdin line 2: "x" is not a subtoken id' "$err"
err=$(echo '26' | "$bin/subtokenizer" --vocab_file="$tmp/vocab" decode 2>&1 >/dev/null); rc=$?
check "subtokenizer id past the vocabulary: exit 1" 1 "$rc"
contains "subtokenizer id past the vocabulary: message" "id 26 is outside the vocabulary's [0, 26)" "$err"
printf "'a'\nb\n" > "$tmp/badvocab"
err=$(echo x | "$bin/subtokenizer" --vocab_file="$tmp/badvocab" encode 2>&1); rc=$?
check "subtokenizer bad vocabulary: exit 1" 1 "$rc"
contains "subtokenizer bad vocabulary: names file and line" "vocabulary file '$tmp/badvocab' line 2" "$err"
err=$(printf 'cat\n\xff\n' | "$bin/subtokenizer" --vocab_file="$tmp/vocab" encode 2>&1 >/dev/null); rc=$?
check "subtokenizer invalid UTF-8: exit 1" 1 "$rc"
contains "subtokenizer invalid UTF-8: names the line" "stdin line 2" "$err"
"$bin/subtokenizer" --vocab_file="$tmp/vocab" transmogrify < /dev/null 2>/dev/null; check "subtokenizer bad mode: exit 2" 2 $?
"$bin/subtokenizer" encode < /dev/null 2>/dev/null; check "subtokenizer without --vocab_file: exit 2" 2 $?
"$bin/subtokenizer" --help | grep -q "Examples:"; check "subtokenizer --help has examples" 0 $?

# ---- compute_bleu
# Uncased, "The cat." and "the cat." are identical: 100. Cased, tokens The|cat|. against
# the|cat|.: unigrams 2/3, bigrams 1/2 ("cat ."), the trigram 0 of 1 -> 1/(2*1), no
# 4-gram: BLEU = (2/3 * 1/2 * 1/2)^(1/4) = 6^(-1/4).
printf 'The cat.\n' > "$tmp/ref"
printf 'the cat.\n' > "$tmp/hyp"
out=$("$bin/compute_bleu" --reference="$tmp/ref" --translation="$tmp/hyp")
check "compute_bleu" "Bleu score (uncased): 100.0
Bleu score (cased): $(score '6 ** -0.25')" "$out"
# Brevity: 3 of 6 tokens, every precision 1 (no 4-gram): exp(1 - 6/3) = exp(-1), both ways.
printf 'a b c d e f\n\n' > "$tmp/ref2"
printf '\na b c\n' > "$tmp/hyp2"
out=$("$bin/compute_bleu" --reference="$tmp/ref2" --translation="$tmp/hyp2")
check "compute_bleu brevity penalty" "Bleu score (uncased): $(score 'math.exp(-1)')
Bleu score (cased): $(score 'math.exp(-1)')" "$out"
printf 'one\ntwo\n' > "$tmp/two"
err=$("$bin/compute_bleu" --reference="$tmp/two" --translation="$tmp/hyp" 2>&1); rc=$?
check "compute_bleu line counts differ: exit 1" 1 "$rc"
contains "compute_bleu line counts differ: message" "the reference '$tmp/two' has 2 lines and the translation '$tmp/hyp' has 1" "$err"
err=$("$bin/compute_bleu" --reference="$tmp/missing" --translation="$tmp/hyp" 2>&1); rc=$?
check "compute_bleu missing file: exit 1" 1 "$rc"
contains "compute_bleu missing file: names it" "$tmp/missing" "$err"
"$bin/compute_bleu" --reference="$tmp/ref" 2>/dev/null; check "compute_bleu without --translation: exit 2" 2 $?
"$bin/compute_bleu" --reference="$tmp/ref" --translation="$tmp/hyp" --bogus 2>/dev/null; check "compute_bleu unknown flag: exit 2" 2 $?

# ---- the tools' flags as the programs' flags: named values, mode mix-ups, stray words
err=$("$bin/compute_bleu" "$tmp/ref" "$tmp/hyp" 2>&1); rc=$?
check "compute_bleu files without flags: exit 2" 2 "$rc"
contains "compute_bleu files without flags: says so" "unexpected argument '$tmp/ref': give the files as --reference=FILE" "$err"
err=$("$bin/subtokenizer" --vocab_file="$tmp/vocab" --add_eos decode </dev/null 2>&1); rc=$?
check "subtokenizer --add_eos decode: exit 2" 2 "$rc"
contains "subtokenizer --add_eos decode: says so" "--add_eos is for encode, not decode" "$err"
err=$("$bin/subtokenizer" --vocab_file="$tmp/vocab" --keep_eos=true encode </dev/null 2>&1); rc=$?
check "subtokenizer --keep_eos encode: exit 2" 2 "$rc"
"$bin/subtokenizer" --vocab_file="$tmp/vocab" --add_eos=false decode </dev/null >/dev/null 2>&1
check "subtokenizer --add_eos=false decode: accepted" 0 $?
contains "subtokenizer --add_eos=maybe: the flag named" "--add_eos=maybe: expected true or false" \
  "$("$bin/subtokenizer" --vocab_file="$tmp/vocab" --add_eos=maybe encode </dev/null 2>&1)"
printf 'a b\n' >"$tmp/s.en"; printf 'c d\n' >"$tmp/s.de"
td=("$bin/transformer_data" --data_dir="$tmp/td" --train_source="$tmp/s.en" --train_target="$tmp/s.de" --min_count=1)
err=$("${td[@]}" --train_shards=abc 2>&1); rc=$?
check "transformer_data --train_shards=abc: exit 2" 2 "$rc"
contains "transformer_data --train_shards=abc: the flag named" "--train_shards=abc: expected a whole number" "$err"
# cxxopts read 0x10 as 16 here while every program refuses it.
contains "transformer_data --train_shards=0x10: refused" "--train_shards=0x10: expected a whole number" \
  "$("${td[@]}" --train_shards=0x10 2>&1)"
contains "transformer_data --seed=-3: the range named" "--seed=-3: expected a whole number from 0 to 18446744073709551615" \
  "$("${td[@]}" --seed=-3 2>&1)"
# An empty --vocab_file left every shard in place and no vocabulary ("cannot rename").
err=$("${td[@]}" --train_shards=2 --vocab_file= 2>&1); rc=$?
check "transformer_data --vocab_file=: exit 1" 1 "$rc"
contains "transformer_data --vocab_file=: says so" "--vocab_file is empty" "$err"
check "transformer_data --vocab_file=: nothing written" "" "$(ls -A "$tmp/td" 2>/dev/null)"
err=$("${td[@]}" --train_shards=2 --vocab_file="$tmp/no/such/v" 2>&1); rc=$?
check "transformer_data --vocab_file in a missing directory: exit 1" 1 "$rc"
contains "transformer_data --vocab_file in a missing directory: before the search" "and '$tmp/no/such' does not exist" "$err"
check "transformer_data --vocab_file in a missing directory: nothing written" "" "$(ls -A "$tmp/td" 2>/dev/null)"

echo "$fails failed"
[[ $fails -eq 0 ]]
