#!/usr/bin/env bash
# The training programs' command lines through the launcher on 2 ranks: a bad flag ends the
# job with exit status 2 (also a value refused once training is set up: an input error, which
# the launcher does not restart), a message that names the flag and says what it expects,
# printed once for the job (not once per rank),
# without Open MPI's banners, source paths or cxxopts' own wording; no hang.
#
#   program_flags.sh LAUNCHER FASHION_MNIST RESNET50 TRANSFORMER CASE
#
# not_a_value: values that are not of the flag's kind (nan, inf, words, 1.5abc, a negative
#   seed, a number beyond the flag's range, a word for true/false), in all three programs.
# unknown_or_incomplete: an unknown flag, a flag without its value, a stray word, a flag
#   written with one dash as absl takes it (-batch_size=64).
# out_of_range: values that parse but make no sense: --verbose=7, resnet50's --image_size and
#   --data_workers beyond their documented limits (which would otherwise end in an
#   allocation or thread failure that names no flag).
# callback_flags: resnet50's and the transformer's --profile_steps and --enable_time_history:
#   --help documents both with an example; a window that is no step or range, a range
#   backwards, a window without --enable_tensorboard, and --enable_time_history with
#   --log_steps=0 are refused naming the flag.
set -uo pipefail
[[ $# -eq 5 ]] || { echo "usage: $0 LAUNCHER FASHION_MNIST RESNET50 TRANSFORMER CASE" >&2; exit 2; }
launcher=$1
case_name=$5
declare -A program=([fashion_mnist]=$2 [resnet50]=$3 [transformer]=$4)
for f in "$launcher" "$2" "$3" "$4"; do
  [[ -x "$f" ]] || { echo "FAIL: $f is not an executable" >&2; exit 1; }
done
# A refused command line ends within a second or two; longer is a hang.
limit=${TNT_E2E_TIMEOUT:-60}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tnt_flags_e2e.XXXXXX")
source "$(dirname "${BASH_SOURCE[0]}")/strays.sh"
trap 'kill -9 $(e2e_strays "$tmp") 2>/dev/null; rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# expect NAME STATUS MESSAGE ARGS...: NAME run with ARGS on 2 ranks exits with STATUS and
# its stderr holds MESSAGE (a whole line's text after the "error..." or "NAME: " prefix)
# exactly once, and nothing of Open MPI's banners, cxxopts' wording or source paths. With
# per_rank=1 (a value refused inside the program), every rank refuses it: MESSAGE from one
# rank and the launcher's line naming the other as repeating it.
per_rank=0
expect() {
  local name=$1 status=$2 message=$3
  shift 3
  echo "+ $launcher -n 2 -x TNT_NUM_THREADS=1 -- $name $*"
  timeout -k 10 "$limit" "$launcher" -n 2 -x TNT_NUM_THREADS=1 -- "${program[$name]}" --model_dir="$tmp/model" "$@" \
    </dev/null >"$tmp/stdout" 2>"$tmp/stderr"
  local rc=$?
  echo "--- exit status $rc; stderr:"
  cat "$tmp/stderr"
  echo "---"
  local what="$name $*"
  e2e_no_strays "$tmp" || fail "$what: ranks left running after the launcher returned"
  if [[ $rc -eq $status ]]; then pass "$what: exit status $rc"; else fail "$what: exit status $rc, expected $status"; fi
  local n
  n=$(grep -cFx -e "$name: $message (see --help)" -e "error (rank 0 of 2): $message" -e "error (rank 1 of 2): $message" \
    -e "error (rank 1 of 2): the same error as rank 0" -e "error (rank 0 of 2): the same error as rank 1" "$tmp/stderr")
  # A command line is refused before MPI starts: one line for the job. A value refused
  # inside the program: one line per rank, each naming its rank (the launcher shows the
  # message once and names the rank that repeated it).
  local want=1
  [[ $per_rank -eq 1 ]] && want=2
  if [[ $n -eq $want ]]; then
    pass "$what: '$message' printed $want time(s)"
  else
    fail "$what: '$message' printed $n times, expected $want"
  fi
  if grep -Eq "failed to parse|does not exist|MPI_ABORT|ORTE_ERROR_LOG|Primary job|\.(cpp|hpp|c|h):[0-9]+|‘" \
    "$tmp/stderr"; then
    fail "$what: cxxopts' or Open MPI's wording, or a source path, in the output"
  fi
}

case $case_name in
  not_a_value)
    expect fashion_mnist 2 "--learning_rate=nan: expected a finite decimal number (such as 0.5 or 1e-3)" --learning_rate=nan
    expect fashion_mnist 2 "--learning_rate=1.5abc: expected a finite decimal number (such as 0.5 or 1e-3)" \
      --learning_rate 1.5abc
    expect fashion_mnist 2 "--batch_size=abc: expected a whole number" --batch_size=abc
    # Hexadecimal passed strtod's check but was read as 0 (no warmup, no smoothing).
    expect fashion_mnist 2 "--warmup_epochs=0x10: expected a finite decimal number (such as 0.5 or 1e-3)" \
      --warmup_epochs=0x10
    expect fashion_mnist 2 "--seed=-1: expected a whole number from 0 to 18446744073709551615" --seed=-1
    expect fashion_mnist 2 "--train_epochs=99999999999: expected a whole number, at most 2147483647" \
      --train_epochs=99999999999
    expect fashion_mnist 2 "--train_epochs=1e3: expected a whole number" --train_epochs=1e3
    expect resnet50 2 "--batch_size=-99999999999999999999: expected a whole number, at least -9223372036854775808" \
      --use_synthetic_data \
      --batch_size=-99999999999999999999
    expect fashion_mnist 2 "--resume=maybe: expected true or false" --resume=maybe
    expect resnet50 2 "--base_learning_rate=inf: expected a finite decimal number (such as 0.5 or 1e-3)" \
      --use_synthetic_data --base_learning_rate=inf
    expect resnet50 2 "--image_size=abc: expected a whole number" --use_synthetic_data --image_size=abc
    expect transformer 2 "--label_smoothing=-nan: expected a finite decimal number (such as 0.5 or 1e-3)" \
      --label_smoothing=-nan
    expect transformer 2 "--hidden_size=x: expected a whole number" --hidden_size=x
    ;;
  unknown_or_incomplete)
    expect fashion_mnist 2 "--no_such_flag: no such flag" --no_such_flag=1
    expect fashion_mnist 2 "--data_dir: missing its value (write --data_dir=VALUE)" --data_dir
    expect fashion_mnist 2 "unexpected argument 'stray': flags are written --name=value" stray
    expect resnet50 2 "unexpected argument 'extra': flags are written --name=value" --use_synthetic_data extra
    expect transformer 2 "-q: no such flag" -q
    expect fashion_mnist 2 "-batch_size=64: flags take two dashes: --batch_size=64" -batch_size=64
    expect resnet50 2 "-use_synthetic_data: flags take two dashes: --use_synthetic_data" -use_synthetic_data
    expect transformer 2 "-help: flags take two dashes: --help" -help
    expect fashion_mnist 2 "-x: no such flag" -xbatch_size=64
    ;;
  out_of_range)
    per_rank=1
    expect fashion_mnist 2 "--verbose=7: expected 0 (silent), 1 (progress bar) or 2 (a line per epoch)" --verbose=7
    # The range says 0 is out (before: "must be in [0, 1e+30]", then 0 refused as "must be positive").
    expect transformer 2 "--learning_rate=-1: must be in (0, 1e+30]" --learning_rate=-1
    # 1e30 epochs of warmup wrapped to a negative step count: no warmup at all, silently.
    expect fashion_mnist 2 "--warmup_epochs=1e+30: must be from 0 to 1e6" --warmup_epochs=1e30
    expect resnet50 2 "--image_size=100000: must be at most 1024" --use_synthetic_data --image_size=100000
    expect resnet50 2 "--data_workers=100000: must be from 1 to 256" --use_synthetic_data --data_workers=100000
    expect resnet50 2 "--data_workers=many: expected auto or a number from 1 to 256" --use_synthetic_data --data_workers=many
    ;;
  callback_flags)
    for name in resnet50 transformer; do
      # cxxopts wraps the descriptions: one line, single spaces.
      help=$("${program[$name]}" --help 2>&1 | tr '\n' ' ' | tr -s ' ')
      for want in "--profile_steps" "Example: --enable_tensorboard --profile_steps=5,8" "--enable_time_history" \
        "Example: --enable_time_history --log_steps=50" "--log_steps"; do
        if grep -qF -- "$want" <<<"$help"; then pass "$name --help: '$want'"; else fail "$name --help lacks '$want'"; fi
      done
      # The examples at the top show both flags in a command line.
      if "${program[$name]}" --help 2>&1 | sed -n '/^Examples:/,/^Usage:/p' | grep -q -- "--enable_time_history"; then
        pass "$name --help: an example command line with --enable_time_history"
      else
        fail "$name --help: no example command line with --enable_time_history"
      fi
    done
    per_rank=1
    window="expected a step N or a range of steps N,M with 1 <= N <= M (steps count from 1), or 0 for none"
    expect resnet50 2 "--profile_steps=abc: $window" --use_synthetic_data --enable_tensorboard --profile_steps=abc
    expect resnet50 2 "--profile_steps=3,2: $window" --use_synthetic_data --enable_tensorboard --profile_steps=3,2
    expect transformer 2 "--profile_steps=0,4: $window" --enable_tensorboard --profile_steps=0,4
    expect transformer 2 "--profile_steps=2: needs --enable_tensorboard (the timeline goes into its directory, <model_dir>/train/plugins/profile/)" \
      --profile_steps=2
    expect transformer 2 "--log_steps=0: --enable_time_history prints every --log_steps steps; give at least 1" \
      --enable_time_history --log_steps=0
    expect resnet50 2 "--log_steps=0: --enable_time_history prints every --log_steps steps; give at least 1" \
      --use_synthetic_data --enable_time_history --log_steps=0
    ;;
  *)
    echo "unknown case '$case_name'" >&2
    exit 2
    ;;
esac
if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
