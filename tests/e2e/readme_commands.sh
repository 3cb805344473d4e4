#!/usr/bin/env bash
# The commands of the README and of the docs pages it leads to, as a user pastes them, in
# order, in a fresh directory that looks like a checkout (the source tree's folders and
# build/ linked in). A command that fails fails the test.
#
#   readme_commands.sh SOURCE_DIR BUILD_DIR
#
# Each fenced block of commands carries a marker on the line before it that says how it is
# checked (a block of another language, such as text, cpp or cmake, is not a command):
#
#   <!-- readme-test: run -->      run each line, with the small-data adaptations below
#   <!-- readme-test: dry-run -->  needs hosts or GPUs: each tarantella line runs with
#                                  --dry-run (the plan and the mpirun command must come out)
#   <!-- readme-test: help -->     too long to run here: each program named runs with --help
#   <!-- readme-test: slurm -->    needs a SLURM cluster: each batch script named must exist
#                                  and parse (bash -n); an sbatch --wrap command runs as
#                                  dry-run; the cluster tests run the scripts on a test bed
#   <!-- readme-test: build -->    builds or installs (scripts/demo, scripts/test, cmake):
#                                  the build is not run again, this test runs on its result.
#                                  scripts/demo runs with scripts/setup made a no-op (its
#                                  training, on small data, and its PATH line are checked);
#                                  scripts/test is the suite itself, which CI runs (.ci/run):
#                                  it must exist and parse, as every script named; each other
#                                  tool must be installed.
#   <!-- readme-test: skip: WHY --> not run, for the reason given
#
# A ```sh block (or one without a language) without a marker fails the test, so that a new
# command cannot go unchecked.
set -uo pipefail
[[ $# -eq 2 ]] || { echo "usage: $0 SOURCE_DIR BUILD_DIR" >&2; exit 2; }
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)

# ---- the one place that adapts the documented commands to a test --------------------------
# Files checked, in the order a reader meets them.
pages=(README.md docs/launcher.md docs/programs.md docs/configuration.md docs/library.md docs/building.md
       docs/monitoring.md)
# Appended to a run-mode command of each program (a later flag wins over one the page gives):
# a few seconds of training instead of minutes.
declare -A small_data=(
  [fashion_mnist]="--model=mlp --num_train_samples=512"
  [resnet50]="--image_size=32 --train_steps=2 --synthetic_eval_samples=32 --log_steps=0"
  [pi]="--samples=4000000"
)
# Files the examples assume a user has: a hostfile of two hosts under the names they use.
# scripts/setup (packages and the build, which this test runs on) does nothing here, so that
# scripts/demo runs as it is otherwise, with the small data of fashion_mnist.
make_fixtures() {
  printf 'node01\nnode02\n' >hosts
  printf 'node01\nnode02\n' >hostfile
  rm scripts/setup
  printf '#!/bin/sh\nexit 0\n' >scripts/setup
  chmod +x scripts/setup
}
demo_args=${small_data[fashion_mnist]}
# A run of a command longer than this is a hang (the slowest, resnet50's 2 steps, takes
# about 15 s on a busy 2-core machine).
limit=${TNT_E2E_TIMEOUT:-180}
# ---------------------------------------------------------------------------------------------

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tnt_readme.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
for entry in "$src"/*; do
  name=$(basename "$entry")
  [[ $name == build* || $name == scripts ]] && continue
  ln -s "$entry" "$name"
done
mkdir scripts
for entry in "$src"/scripts/*; do ln -s "$entry" "scripts/$(basename "$entry")"; done
ln -s "$build" build
make_fixtures

failures=0
checked=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; checked=$((checked + 1)); }

# Commands of the pages: "PAGE:LINE<TAB>MODE<TAB>COMMAND" (continued lines joined, comments
# after the command removed); "PAGE:LINE<TAB>unmarked<TAB>" for a block without a marker.
extract() {
  local page
  for page in "${pages[@]}"; do
    awk -v page="$page" '
      function flush() { if (cmd != "") { print page ":" start "\t" mode "\t" cmd }; cmd = "" }
      /^```/ {
        if (!inside) {
          inside = 1
          lang = substr($0, 4)
          mode = ""
          if (prev ~ /^<!-- readme-test: .* -->$/) { mode = prev; sub(/^<!-- readme-test: /, "", mode); sub(/ -->$/, "", mode) }
          commands = (lang == "" || lang == "sh")
          if (commands && mode == "") print page ":" NR "\tunmarked\t"
          cmd = ""
          next
        }
        inside = 0
        flush()
        next
      }
      {
        if (inside && commands && mode != "") {
          line = $0
          if (cmd == "") start = NR
          sub(/[ \t]+#[ \t].*$/, "", line)  # a comment after the command
          if (line ~ /\\$/) { sub(/\\$/, "", line); cmd = cmd line; next }
          cmd = cmd line
          gsub(/[ \t]+/, " ", cmd); sub(/^ /, "", cmd); sub(/ $/, "", cmd)
          if (cmd != "") flush()
        }
        prev = $0
      }' "$src/$page"
  done
}

# run WHERE COMMAND: runs it (bash, this directory, this environment), shows its output's tail.
# The output goes to a dot file: every visible name here is a link into the checkout (out/ is
# the GPU kit's folder once scripts/gpu-bundle has run).
run() {
  local where=$1 cmd=$2
  echo "+ $cmd"
  timeout -k 10 "$limit" bash -c "$cmd" </dev/null >"$tmp/.command-output" 2>&1
  local rc=$?
  tail -n 15 "$tmp/.command-output"
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    fail "$where: did not finish within ${limit}s: $cmd"
  elif [[ $rc -ne 0 ]]; then
    fail "$where: exit status $rc: $cmd"
  else
    pass "$where: $cmd"
  fi
}

# The program a command line runs: the word after "--" of a tarantella line, else the first.
program_of() {
  local -a words
  read -r -a words <<<"$1"
  local i
  if [[ ${words[0]} == tarantella || ${words[0]} == */tarantella ]]; then
    for ((i = 0; i < ${#words[@]}; i++)); do
      if [[ ${words[i]} == -- ]]; then echo "${words[i + 1]:-}"; return; fi
    done
  fi
  echo "${words[0]}"
}

check_script() {  # WHERE PATH: a script a page names must exist, be executable and parse
  if [[ ! -x $2 ]]; then
    fail "$1: $2 is not an executable file"
  elif head -1 "$2" | grep -q bash && ! bash -n "$2"; then
    fail "$1: $2 does not parse (bash -n)"
  else
    pass "$1: $2 exists and parses"
  fi
}

dry_run() {  # WHERE COMMAND
  local cmd=$2
  if [[ $cmd != tarantella* ]]; then fail "$1: a dry-run block holds a command that is not tarantella's: $cmd"; return; fi
  [[ " $cmd " == *" --dry-run "* ]] || cmd="tarantella --dry-run${cmd#tarantella}"
  run "$1" "$cmd"
}

while IFS=$'\t' read -r where mode cmd; do
  case $mode in
    unmarked)
      fail "$where: a block of commands without a <!-- readme-test: ... --> marker (or give it a language: text, cpp, ...)"
      ;;
    run)
      case $cmd in
        export\ * | cd\ *)
          echo "+ $cmd"
          eval "$cmd"
          pass "$where: $cmd"
          ;;
        scripts/test*) check_script "$where" "${cmd%% *}" ;;
        *)
          prog=$(basename "$(program_of "$cmd")")
          [[ -n ${small_data[$prog]:-} && $cmd != *--dry-run* ]] && cmd="$cmd ${small_data[$prog]}"
          run "$where" "$cmd"
          ;;
      esac
      ;;
    dry-run)
      if [[ $cmd == sbatch* ]]; then
        wrapped=$(sed -nE "s/.*--wrap '([^']*)'.*/\\1/p" <<<"$cmd")
        if [[ -n $wrapped ]]; then dry_run "$where" "$wrapped"; else fail "$where: sbatch without a script or --wrap: $cmd"; fi
      else
        dry_run "$where" "$cmd"
      fi
      ;;
    help)
      case $cmd in
        scripts/demo* | scripts/test*) check_script "$where" "${cmd%% *}" ;;
        *)
          prog=$(program_of "$cmd")
          run "$where" "$prog --help"
          ;;
      esac
      ;;
    slurm)
      script=$(grep -oE '[^ ]+\.sbatch' <<<"$cmd" | head -1)
      wrapped=$(sed -nE "s/.*--wrap '([^']*)'.*/\\1/p" <<<"$cmd")
      if [[ -n $script ]]; then
        check_script "$where" "$script"
      elif [[ -n $wrapped ]]; then
        dry_run "$where" "$wrapped"
      else
        fail "$where: no batch script or --wrap in: $cmd"
      fi
      ;;
    build)
      first=${cmd%% *}
      if [[ $cmd == scripts/demo ]]; then
        # Its build is this test's input; its training and what it says at the end run here.
        run "$where" "scripts/demo $demo_args"
        if grep -q '^  export PATH=.*build/bin:\$PATH$' "$tmp/.command-output"; then
          pass "$where: scripts/demo ends with the line that puts build/bin on PATH"
        else
          fail "$where: scripts/demo does not end with an 'export PATH=.../build/bin:\$PATH' line"
        fi
      elif [[ $first == scripts/* ]]; then
        check_script "$where" "$first"
      elif command -v "$first" >/dev/null; then
        pass "$where: $first is installed (not run again: $cmd)"
      else
        fail "$where: $first is not installed: $cmd"
      fi
      ;;
    skip:*)
      echo "skipped: $where: $cmd (${mode#skip: })"
      ;;
    *)
      fail "$where: unknown readme-test marker '$mode'"
      ;;
  esac
done < <(extract)

if [[ $checked -lt 20 ]]; then fail "only $checked commands checked: the pages' blocks were not found"; fi
if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all $checked checks passed"
