#!/usr/bin/env bash
# The batch scripts of scripts/slurm on a real SLURM cluster that the test starts on the
# test bed (scripts/testbed slurm up: munged, slurmctld, one slurmd per host). The scripts
# are submitted as users would, with sbatch options on the command line and the program's
# arguments after the script; nothing in them is edited.
#
#   slurm.sh LAUNCHER FASHION_MNIST RESNET50 TRANSFORMER CASE
#
# CASE:
#   jobs: fashion_mnist.sbatch on 2 nodes (--ntasks-per-node=1) gives the weights of 2 ranks
#     on one host and prints the plan first; on 3 nodes with -n 5 (no --ntasks-per-node, so
#     no SLURM_NTASKS_PER_NODE; SLURM_TASKS_PER_NODE is "2(x2),1") it runs 2 + 2 + 1 ranks
#     and gives the weights of 5 ranks on one host. That job is submitted as from a checkout
#     whose build/bin has the programs, with none of them on PATH: the script finds them
#     there (SLURM_SUBMIT_DIR); submitted from elsewhere, it fails with a message naming
#     where it looked.
#   scaling: scaling.sbatch runs fashion_mnist on 1 and 2 nodes and prints the table; with
#     SCALING_TOOL=bench it runs scripts/bench/scaling on 1 and 2 nodes, whose scaling.csv
#     (nodes and ranks 1 and 2), scaling.md and scaling.png (a PNG) are checked;
#     resnet50.sbatch (GPU nodes; GPUs here in name only, so CPU ranks) runs a few steps;
#     transformer.sbatch, submitted from the checkout without PATH, plans 2 ranks on 2 nodes
#     and runs transformer --help there, and without arguments or WMT14_PATH it says so.
#   scancel: a 2-node fashion_mnist job cancelled mid-run leaves no process on any node.
#   requeue: a 2-node fashion_mnist job sent SLURM's warning signal stops with a checkpoint,
#     requeues itself (tarantella --requeue) and, run again with --resume=auto, ends with the
#     weights of a run never stopped.
source "$(dirname "${BASH_SOURCE[0]}")/cluster_common.sh" "$@"
[[ $# -eq 5 ]] || { echo "usage: $0 LAUNCHER FASHION_MNIST RESNET50 TRANSFORMER CASE" >&2; exit 2; }
cl_transformer=$4
case_name=$5
[[ -x $cl_resnet50 ]] || cl_abort "$cl_resnet50 is not an executable (build resnet50)"
[[ -x $cl_transformer ]] || cl_abort "$cl_transformer is not an executable (build transformer)"
cl_up 3
slurm_out=$("$cl_testbed" slurm up 2>&1) || { echo "$slurm_out"; cl_abort "cannot start SLURM on the test bed"; }
export SLURM_CONF
SLURM_CONF=$("$cl_testbed" slurm conf)
# What the jobs inherit (sbatch passes this environment on): the programs on PATH, one
# thread per rank.
bin_dirs=$(for f in "$cl_launcher" "$cl_program" "$cl_resnet50"; do cd "$(dirname "$f")" && pwd; done | tr '\n' :)
# PATH as it was, less any directory that has the programs: for jobs that must find them in
# the checkout they were submitted from.
bare_path=$(tr : '\n' <<<"$PATH" | while read -r d; do
  [[ -x $d/tarantella || -x $d/fashion_mnist || -x $d/resnet50 || -x $d/transformer ]] || echo "$d"
done | paste -sd: -)
# A checkout as a user has one: the programs in build/bin.
checkout=$cl_tmp/checkout
mkdir -p "$checkout/build/bin"
for f in "$cl_launcher" "$cl_program" "$cl_resnet50" "$cl_transformer"; do ln -s "$f" "$checkout/build/bin/"; done
export PATH="$bin_dirs$PATH"
export TNT_NUM_THREADS=1
scripts=$cl_root/scripts/slurm
small=(--model=mlp --num_train_samples=512 --batch_size=64 --train_epochs=1 --verbose=0)

# submit NAME SBATCH_ARGS... -- SCRIPT ARGS...: sbatch from $cl_tmp (or $submit_dir), the
# job id in $job.
submit() {
  local name=$1
  shift
  echo "+ (cd ${submit_dir:-$cl_tmp} && sbatch $*)"
  job=$(cd "${submit_dir:-$cl_tmp}" && timeout 30 sbatch --parsable -o "$cl_tmp/$name.out" "$@") ||
    cl_abort "$name: sbatch failed"
  job=${job%%;*}
}

# finish NAME LIMIT: waits for $job to leave the queue; $state and $cl_out then hold its end.
finish() {
  local name=$1 limit=$2
  local end=$((SECONDS + limit))
  while ((SECONDS < end)) && [[ -n $(timeout 10 squeue -h -j "$job" -o %T 2>/dev/null) ]]; do sleep 0.5; done
  state=$(timeout 10 scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
  if [[ -n $(timeout 10 squeue -h -j "$job" -o %T 2>/dev/null) ]]; then
    cl_fail "$name: job $job still in the queue after ${limit}s"
    timeout 10 scancel "$job"
  fi
  cl_out=$(cat "$cl_tmp/$name.out" 2>/dev/null)
  echo "--- $name: job $job ended $state; its output:"
  grep -v '^ *$' <<<"$cl_out" | tail -n 40
  if [[ $state != COMPLETED ]]; then
    echo "--- $name: what SLURM says"
    timeout 10 scontrol show job "$job" 2>&1 | grep -E 'JobState|ExitCode|Reason|WorkDir|StdOut'
    tail -n 8 "$(dirname "$SLURM_CONF")"/log/slurmctld.log "$(dirname "$SLURM_CONF")"/log/slurmd.h1.log 2>&1
  fi
  echo "---"
}

expect_completed() {
  if [[ $state == COMPLETED ]]; then cl_pass "$1: the job completed"; else cl_fail "$1: the job ended $state"; fi
}

case $case_name in
  jobs)
    # The references: the same ranks on one host.
    cl_run one_host_2 here 60 -n 2 -x TNT_NUM_THREADS=1 -- "${small[@]}" --model_dir="$cl_tmp/one2"
    cl_expect_exit one_host_2 0
    cl_run one_host_5 here 90 -n 5 -x TNT_NUM_THREADS=1 -- "${small[@]}" --model_dir="$cl_tmp/one5"
    cl_expect_exit one_host_5 0

    submit two_nodes -N 2 --ntasks-per-node=1 "$scripts/fashion_mnist.sbatch" "${small[@]}" --model_dir="$cl_tmp/two"
    finish two_nodes 60
    expect_completed two_nodes
    cl_expect_contains two_nodes "2 ranks on 2 hosts (hosts from SLURM job $job)" "the plan comes first"
    if grep -Eq '^ +1 +h2 +0 +cpu' <<<"$cl_out"; then cl_pass "two_nodes: the plan puts rank 1 on h2"; else cl_fail "two_nodes: no plan row for rank 1 on h2"; fi
    cl_expect_contains two_nodes "Test loss:" "the program ran"
    cl_same_weights two_nodes "$cl_tmp/one2" "$cl_tmp/two"

    # From the checkout, with nothing on PATH: the programs of its build/bin.
    PATH=$bare_path submit_dir=$checkout \
      submit uneven -N 3 -n 5 "$scripts/fashion_mnist.sbatch" "${small[@]}" --model_dir="$cl_tmp/uneven"
    finish uneven 90
    expect_completed uneven
    cl_expect_contains uneven "$checkout/build/bin/fashion_mnist" "the program of the checkout's build/bin ran"
    cl_expect_contains uneven "(tasks per node: 2(x2),1)" "SLURM_TASKS_PER_NODE has the run-length form"
    cl_expect_contains uneven "5 ranks on 3 hosts (hosts from SLURM job $job)" "5 ranks on 3 hosts"
    cl_expect_contains uneven "--host h1,h1,h2,h2,h3 -np 5 --map-by seq" "2 + 2 + 1 ranks, in order"
    cl_same_weights uneven "$cl_tmp/one5" "$cl_tmp/uneven"

    # From a directory without build/bin, with nothing on PATH: a message, not "command not found".
    PATH=$bare_path submit not_found -N 1 "$scripts/fashion_mnist.sbatch" "${small[@]}"
    finish not_found 30
    if [[ $state == FAILED ]]; then cl_pass "not_found: the job failed"; else cl_fail "not_found: the job ended $state"; fi
    cl_expect_contains not_found "fashion_mnist.sbatch: tarantella is neither on PATH nor in $cl_tmp/build/bin; submit from the checkout whose build/bin has it, put its directory on PATH, or set TARANTELLA=/path/to/tarantella" \
      "the message says where it looked and what to do"
    ;;

  scaling)
    SCALING_PROGRAM=fashion_mnist SCALING_DIR=$cl_tmp/scaling \
      submit scaling -N 2 "$scripts/scaling.sbatch" "${small[@]}"
    finish scaling 90
    expect_completed scaling
    cl_expect_contains scaling "=== 2 node(s), 2 rank(s): plan" "the plan before each run"
    if grep -Eq '^ +1 +1 +[0-9.]+ +- +0$' <<<"$cl_out" && grep -Eq '^ +2 +2 +[0-9.]+ +- +0$' <<<"$cl_out"; then
      cl_pass "scaling: the table has the 1-node and the 2-node run, both exit 0"
    else
      cl_fail "scaling: the table lacks a successful 1-node or 2-node row"
    fi

    # The same series through scripts/bench/scaling (one run per scale, 2 measured steps).
    SCALING_TOOL=bench SCALING_PROGRAM=fashion_mnist SCALING_DIR=$cl_tmp/bench \
      SCALING_BENCH_OPTIONS="--repeats 1 --warmup 1 --steps 2 --micro-batch 16 --timeout 60" \
      submit bench -N 2 "$scripts/scaling.sbatch" --model=mlp
    finish bench 90
    expect_completed bench
    cl_expect_contains bench "with $cl_root/scripts/slurm/../bench/scaling: nodes 1 2, ranks 1,2" \
      "the bench engine, found beside the submitted script, with ranks 1 and 2"
    if grep -Eq -- '^  run: .*/tarantella --timeline [^ ]+ -H [^ ,]+,[^ ,]+ -n 1 -- ' <<<"$cl_out"; then
      cl_pass "bench: the 2-rank run went to two hosts of the allocation, one rank each"
    else
      cl_fail "bench: no run on two hosts (-H A,B -n 1) in the output"
    fi
    if check=$(/usr/bin/python3 - "$cl_tmp/bench" <<'EOF2' 2>&1
import csv, math, os, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(os.path.join(out, "scaling.csv"))))
assert [(int(r["nodes"]), int(r["ranks"])) for r in rows] == [(1, 1), (2, 2)], rows
for r in rows:
    for n in ("samples_per_s_mean", "step_ms_mean", "speedup", "efficiency"):
        assert math.isfinite(float(r[n])) and float(r[n]) > 0, (n, r)
    assert int(r["steps"]) == 2 and int(r["global_batch"]) == 16 * int(r["ranks"]), r
md = open(os.path.join(out, "scaling.md")).read()
assert "\n| 1 | 16 |" in md and "\n| 2 | 32 |" in md, md
png = open(os.path.join(out, "scaling.png"), "rb").read()
assert len(png) > 1000 and png[:8] == b"\x89PNG\r\n\x1a\n", len(png)
print("rows", [(r["nodes"], r["ranks"], r["samples_per_s_mean"]) for r in rows], "png", len(png), "bytes")
EOF2
    ); then
      cl_pass "bench: scaling.csv has the 1-node and 2-node rows, scaling.md the table, scaling.png is a PNG ($check)"
    else
      cl_fail "bench: the output files do not check out: $check"
    fi

    # The GPU script as it is; only resources this cluster can give are changed.
    submit resnet50 -N 2 --ntasks-per-node=1 --gpus-per-node=1 --cpus-per-task=1 "$scripts/resnet50.sbatch" \
      --use_synthetic_data --image_size=32 --num_classes=10 --batch_size=4 --synthetic_samples=8 \
      --synthetic_eval_samples=4 --train_steps=2 --train_epochs=1 --log_steps=0 --model_dir="$cl_tmp/resnet50"
    finish resnet50 90
    expect_completed resnet50
    cl_expect_contains resnet50 "2 ranks on 2 hosts (hosts from SLURM job $job)" "the plan comes first"
    cl_expect_contains resnet50 "ResNet-50 v1.5" "resnet50 ran"

    # The Transformer's script as it is, from the checkout with nothing on PATH: the plan,
    # then the program's --help on 2 ranks (no data here for a training run).
    PATH=$bare_path submit_dir=$checkout submit transformer -N 2 --ntasks-per-node=1 --gpus-per-node=1 \
      --cpus-per-task=1 "$scripts/transformer.sbatch" --help
    finish transformer 60
    expect_completed transformer
    cl_expect_contains transformer "2 ranks on 2 hosts (hosts from SLURM job $job)" "the plan comes first"
    cl_expect_contains transformer "$checkout/build/bin/transformer --help" "the checkout's transformer"
    cl_expect_contains transformer "--param_set" "transformer ran and printed its help"
    PATH=$bare_path submit_dir=$checkout submit transformer_no_data -N 1 --ntasks-per-node=1 \
      --gpus-per-node=1 --cpus-per-task=1 "$scripts/transformer.sbatch"
    finish transformer_no_data 30
    if [[ $state == FAILED ]]; then cl_pass "transformer_no_data: the job failed"; else cl_fail "transformer_no_data: the job ended $state"; fi
    cl_expect_contains transformer_no_data "transformer.sbatch: no arguments and no WMT14_PATH" "it says what is missing"
    ;;

  scancel)
    submit cancelled -N 2 --ntasks-per-node=1 "$scripts/fashion_mnist.sbatch" --model=mlp --num_train_samples=16384 \
      --batch_size=64 --train_epochs=50 --verbose=0 --model_dir="$cl_tmp/cancelled"
    cl_wait_for_programs h1 40 1 && cl_wait_for_programs h2 20 1 || cl_abort "cancelled: the job's ranks never ran"
    sleep 1
    echo "+ scancel $job"
    timeout 30 scancel "$job" || cl_fail "cancelled: scancel failed"
    # SLURM sends SIGTERM, and SIGKILL KillWait (5 s) later.
    cl_expect_no_processes 15 cancelled
    finish cancelled 30
    if [[ $state == CANCELLED ]]; then cl_pass "cancelled: the job ended CANCELLED"; else cl_fail "cancelled: the job ended $state"; fi
    ;;

  requeue)
    # SLURM's warning before the time limit (sbatch --signal=B:USR1@T; sent here at once with
    # scancel --batch --signal=USR1): the job stops after a step with its checkpoint,
    # tarantella --requeue puts it back in the queue, and its second run, with --resume=auto,
    # ends with the weights of a run that was never stopped.
    long=(--model=mlp --num_train_samples=8192 --batch_size=64 --train_epochs=12 --verbose=0)
    cl_run straight here 120 -n 2 -x TNT_NUM_THREADS=1 -- "${long[@]}" --model_dir="$cl_tmp/straight"
    cl_expect_exit straight 0
    TARANTELLA_OPTIONS=--requeue submit requeued -N 2 --ntasks-per-node=1 --open-mode=append \
      "$scripts/fashion_mnist.sbatch" "${long[@]}" --model_dir="$cl_tmp/requeued" --resume=auto
    # The first epoch's checkpoint: the programs are training, their signal handlers set.
    end=$((SECONDS + 60))
    while ((SECONDS < end)) && [[ ! -f $cl_tmp/requeued/checkpoint.safetensors ]]; do sleep 0.1; done
    [[ -f $cl_tmp/requeued/checkpoint.safetensors ]] || cl_abort "requeued: no checkpoint after 60 s"
    echo "+ scancel --batch --signal=USR1 $job"
    timeout 30 scancel --batch --signal=USR1 "$job" || cl_fail "requeued: scancel --signal failed"
    # SLURM holds a requeued job back for a while (its begin time); that wait is not under
    # test: once the job is pending again, it may start soon. Not at once: each slurmd
    # revoked the job's credential when the requeue ended its first run, and it refuses a
    # launch whose credential was made in the same second as that revocation (times in
    # whole seconds): a start within the second failed 1 run in 4 here with "Job
    # credential revoked" in slurmctld's log and the job FAILED. 2 s puts the new
    # credential in a later second.
    end=$((SECONDS + 60))
    while ((SECONDS < end)) && [[ $(timeout 10 squeue -h -j "$job" -o %T 2>/dev/null) != PENDING ]]; do sleep 0.2; done
    sleep 2
    timeout 10 scontrol show job "$job" 2>/dev/null | grep -o 'Reason=[^ ]*\|StartTime=[^ ]*\|Restarts=[0-9]*' | paste -sd' '
    timeout 10 scontrol update JobId="$job" StartTime=now || echo "(scontrol update StartTime=now failed)"
    finish requeued 180
    expect_completed requeued
    restarts=$(timeout 10 scontrol show job "$job" 2>/dev/null | grep -o 'Restarts=[0-9]*' | cut -d= -f2)
    if [[ $restarts == 1 ]]; then
      cl_pass "requeued: the job ran twice (Restarts=1)"
    else
      cl_fail "requeued: the job ran other than twice (Restarts=${restarts:-?})"
    fi
    cl_expect_contains requeued "on SIGUSR1" "the program stopped after a step on the signal"
    cl_expect_contains requeued "requeueing SLURM job $job (scontrol requeue $job)" "the launcher requeued the job"
    cl_same_weights requeued "$cl_tmp/straight" "$cl_tmp/requeued"
    ;;

  *)
    echo "unknown case '$case_name'" >&2
    exit 2
    ;;
esac
cl_finish
