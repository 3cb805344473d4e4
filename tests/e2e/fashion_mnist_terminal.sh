#!/usr/bin/env bash
# fashion_mnist on 2 ranks through the launcher on a terminal (a pseudo-terminal from
# script(1), 60 columns, COLUMNS not set): the progress bar is redrawn in place and never
# wider than the terminal (the launcher passes its width to the ranks), the evaluation is
# announced with its own bar; then a second run gets SIGINT while its bar is drawn: the bar's
# line is ended (no prompt glued to it), and the launcher stops the job as it does without a
# bar (exit status 130, no process left behind).
#
#   fashion_mnist_terminal.sh LAUNCHER PROGRAM
source "$(dirname "${BASH_SOURCE[0]}")/fashion_mnist_common.sh" "$@"
fm_need_data
command -v script >/dev/null || { fm_fail "script(1) (util-linux) is not installed"; fm_finish; }
unset COLUMNS

# on_terminal NAME COMMAND: runs COMMAND on a 60-column pseudo-terminal, its output (as the
# terminal received it, then "<end of run>") in $fm_tmp/NAME.tty, its exit status in
# $fm_tmp/NAME.rc.
on_terminal() {
  local name=$1 command=$2
  timeout -k 10 "$fm_limit" script -qefc "stty cols 60 rows 24; $command; echo \$? >$fm_tmp/$name.rc; printf '<end of run>'" \
    "$fm_tmp/$name.tty" </dev/null >/dev/null 2>&1
  echo "--- $name (as the terminal got it, control characters shown):"
  cat -v "$fm_tmp/$name.tty" | head -c 4000
  echo
  echo "---"
}

train=("$fm_launcher" -n 2 -x TNT_NUM_THREADS=1 -- "$fm_program" --model=mlp --num_train_samples=2560
       --batch_size=64 --train_epochs=1 --verbose=1 --model_dir="$fm_tmp/model" --overwrite)

on_terminal bar "${train[*]}"
tty_out=$fm_tmp/bar.tty
if [[ $(cat "$fm_tmp/bar.rc" 2>/dev/null) == 0 ]]; then fm_pass "bar: exit status 0"; else fm_fail "bar: exit status $(cat "$fm_tmp/bar.rc" 2>/dev/null)"; fi
# Every redraw: the text between carriage returns, without the erase-line sequence.
widest=$(tr '\r' '\n' <"$tty_out" | sed 's/\x1b\[K//g' | grep -E '^ *[0-9]+/[0-9]+ \[' | awk '{ if (length($0) > m) m = length($0) } END { print m + 0 }')
redraws=$(tr '\r' '\n' <"$tty_out" | grep -cE '^ *[0-9]+/40 \[')
if [[ $redraws -ge 1 ]]; then fm_pass "bar: $redraws redraws of the training bar"; else fm_fail "bar: no training bar drawn ('N/40 [')"; fi
if [[ $widest -ge 40 && $widest -le 59 ]]; then
  fm_pass "bar: the widest redraw has $widest characters (60 columns)"
else
  fm_fail "bar: the widest redraw has $widest characters; expected at most 59 on 60 columns"
fi
if grep -q 'Evaluating on 10000 samples (157 steps, global batch 64)' "$tty_out"; then
  fm_pass "bar: the evaluation is announced"
else
  fm_fail "bar: no 'Evaluating on 10000 samples (157 steps, global batch 64)'"
fi
if tr '\r' '\n' <"$tty_out" | grep -qE '^ *[0-9]+/157 \['; then fm_pass "bar: the evaluation has its bar"; else fm_fail "bar: no evaluation bar ('N/157 [')"; fi
if grep -qE '40/40 - [0-9:]+s? [0-9]+ms/step - .*val_loss: .* - evaluation: ' "$tty_out"; then
  fm_pass "bar: the epoch line has the training time per step and the evaluation's time apart"
else
  fm_fail "bar: no epoch line '40/40 - ... ms/step - ... - evaluation: ...'"
fi

# SIGINT to the launcher (as from kill; Ctrl-C would reach mpirun too) a second into the
# first epoch's bar (938 steps of 64 samples, several seconds).
long=("$fm_launcher" -n 2 -x TNT_NUM_THREADS=1 -- "$fm_program" --model=mlp --batch_size=64 --train_epochs=2
      --verbose=1 --model_dir="$fm_tmp/model" --overwrite)
on_terminal interrupted "${long[*]} & pid=\$!; for i in \$(seq 300); do sleep 0.1; grep -q '/938 \\[' $fm_tmp/interrupted.tty && break; done; sleep 1; kill -INT \$pid; wait \$pid"
rc=$(cat "$fm_tmp/interrupted.rc" 2>/dev/null)
if [[ $rc == 130 ]]; then fm_pass "interrupted: exit status 130"; else fm_fail "interrupted: exit status '$rc', expected 130"; fi
# The last redraw of a bar is followed by a line end before the shell's next output (what a
# prompt would be glued to otherwise).
last_bar=$(tr '\r' '\n' <"$fm_tmp/interrupted.tty" | grep -nE '^ *[0-9]+/938 \[' | tail -n 1)
if [[ -z $last_bar ]]; then
  fm_fail "interrupted: no bar was drawn before the signal"
elif /usr/bin/python3 - "$fm_tmp/interrupted.tty" <<'PY'
import re, sys
text = open(sys.argv[1], 'rb').read().decode('utf-8', 'replace')
bars = [m for m in re.finditer(r'\r *\d+/\d+ \[[^\r\n]*', text)]
end = bars[-1].end()
# The bar's own erase-line sequence may follow; then a newline (\n or \r\n from the pty).
rest = text[end:text.rindex('<end of run>')]  # the last: script's header has the command
sys.exit(0 if re.match(r'(\x1b\[K)?\r?\n', rest) else 1)
PY
then
  fm_pass "interrupted: the bar's line was ended"
else
  fm_fail "interrupted: the last bar is not followed by a line end"
fi
fm_check_no_strays interrupted
fm_finish
