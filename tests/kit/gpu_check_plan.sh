#!/usr/bin/env bash
# scripts/gpu-check --plan with a fake nvidia-smi on PATH: with 1 GPU, part 2 plans no
# multi-GPU step and --part multi skips; with 4, part 2 ends with the multi-GPU checks
# (topology, every multi_gpu test of the kit at 4 ranks, the NCCL allreduce and the
# Reducer sweep at 4 ranks, ResNet-50 and the Transformer at 1, 2 and 4 ranks, the scaling
# prediction from profiles at 1 and 4 ranks), and
# --part 1 plans none of them but the sanitizers' runs (FIRST_TESTS's tests first; a
# sanitizer step without 30 s left is SKIP). No GPU, no kit build: a kit folder with a tests.tsv only.
# --gpus above the machine's count is a usage error (exit 2).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

mkdir -p "$tmp/bin" "$tmp/kit/bin"
cat >"$tmp/bin/nvidia-smi" <<'SMI'
#!/bin/sh
[ "$1" = "-L" ] || exit 0
i=0
while [ "$i" -lt "$FAKE_GPUS" ]; do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000$i)"; i=$((i + 1)); done
SMI
chmod +x "$tmp/bin/nvidia-smi"
printf 'tarantella GPU kit\ncommit: test\ncuda_arch: sm_90\n' >"$tmp/kit/KIT.txt"
: >"$tmp/kit/cuda-libs.txt"
{
  printf '# set\tname\ttimeout_s\tenvironment\tcommand\n'
  printf 'gpu\tlayers_cuda\t300\t-\t@KIT@/bin/test_layers_cuda\n'
  printf 'gpu\tlayers_attention_fused_cuda\t300\t-\t@KIT@/bin/test_layers_attention_fused_cuda\n'
  printf 'gpu\tlayers_attention_fused_cuda_stored_ds\t120\tTNT_FUSED_ATTENTION_STORED_DS=1\t@KIT@/bin/test_layers_attention_fused_cuda\n'
  printf 'gpu\tlayers_attention_fused_cuda_rows32\t180\tTNT_FUSED_ATTENTION_ROWS=32\t@KIT@/bin/test_layers_attention_fused_cuda\n'
  printf 'gpu\tlayers_attention_fused_cuda_off\t120\tTNT_FUSED_ATTENTION=0\t@KIT@/bin/test_layers_attention_fused_cuda\n'
  printf 'gpu\tlayers_losses_cuda\t120\t-\t@KIT@/bin/test_layers_losses_cuda\n'
  printf 'gpu\toptim_multi_tensor_cuda\t120\t-\t@KIT@/bin/test_optim_multi_tensor_cuda\n'
  printf 'gpu\ttrain_timeline_cuda.np1\t120\t-\t@MPIRUN@\t--oversubscribe\t-np\t1\t@KIT@/bin/test_train_timeline_cuda\n'
  printf 'multi\ttrain_timeline_cuda.np1\t120\t-\t@MPIRUN@\t--oversubscribe\t-np\t1\t@KIT@/bin/test_train_timeline_cuda\n'
} >"$tmp/kit/tests.tsv"

plan() {  # plan GPUS PART -> the plan's output in $tmp/out
  env PATH="$tmp/bin:$PATH" FAKE_GPUS="$1" "$root/scripts/gpu-check" --part "$2" --plan --kit "$tmp/kit" \
    --out "$tmp/o" >"$tmp/out" 2>&1
}
has() { grep -qE -- "$1" "$tmp/out" || fail "$2: no line matching '$1'"; }
hasnt() { ! grep -qE -- "$1" "$tmp/out" || fail "$2: a line matching '$1': $(grep -m1 -E -- "$1" "$tmp/out")"; }

plan 1 2 || fail "--part 2 --plan with 1 GPU: exit $?"
has '^plan: gpu: nvidia-smi -L lists 1 GPU' "1 GPU, part 2"
has '^plan: allreduce 1 rank \(nccl\)' "1 GPU, part 2"
has 'multi-GPU checks: not run \(1 GPU' "1 GPU, part 2"
hasnt 'ranks \(nccl\)|at [0-9]+ ranks|^plan: (topology|resnet50 [0-9]|transformer [0-9])' "1 GPU, part 2"
plan 1 multi || fail "--part multi --plan with 1 GPU: exit $?"
has 'SKIP .*multi-GPU +nvidia-smi -L lists 1 GPU' "1 GPU, part multi"

plan 4 2 || fail "--part 2 --plan with 4 GPUs: exit $?"
has '^plan: gpu: nvidia-smi -L lists 4 GPU' "4 GPUs, part 2"
has '^plan: allreduce 1 rank \(nccl\)' "4 GPUs, part 2"
has '^plan: topology .*nvidia-smi topo -m' "4 GPUs, part 2"
has '^plan: test train_timeline_cuda at 4 ranks .*mpirun --oversubscribe -np 4 .*test_train_timeline_cuda' "4 GPUs, part 2"
hasnt 'test layers_cuda at' "4 GPUs, part 2 (not a multi_gpu test)"
has '^plan: allreduce 4 ranks \(nccl\).*-np 4 .*tnt_allreduce_bench -b 1M -e 1G .*--algo nccl --device gpu' "4 GPUs, part 2"
has '^plan: reducer fusion thresholds 4 ranks \(nccl\).*-np 4 .*--mode reducer --algo nccl' "4 GPUs, part 2"
for k in 1 2 4; do
  has "^plan: resnet50 $k ranks .*tarantella .* -n $k -- .*resnet50 " "4 GPUs, part 2"
  has "^plan: transformer $k ranks .*tarantella .* -n $k -- .*transformer " "4 GPUs, part 2"
done
hasnt '^plan: (resnet50|transformer) (3|8) ranks' "4 GPUs, part 2"
# The multi-GPU steps come after part 2's own.
last_own=$(grep -n '^plan: allreduce 2 ranks (cpu)' "$tmp/out" | cut -d: -f1)
first_multi=$(grep -n '^plan: topology' "$tmp/out" | cut -d: -f1)
[[ -n "$last_own" && -n "$first_multi" && $last_own -lt $first_multi ]] || fail "4 GPUs, part 2: the multi-GPU steps do not follow part 2's"
has 'result: plan of [0-9]+ steps \(nothing ran\)' "4 GPUs, part 2"

plan 4 1 || fail "--part 1 --plan with 4 GPUs: exit $?"
hasnt 'ranks \(nccl\)|at 4 ranks|^plan: topology' "4 GPUs, part 1"
# The sanitizers: memcheck over SANITIZE's tests, racecheck over the hand-written kernels'.
has '^plan: memcheck layers_cuda' "part 1"
has '^plan: memcheck layers_attention_fused_cuda' "part 1"
has '^plan: racecheck layers_attention_fused_cuda' "part 1"
# Each variant of the fused attention runs other kernels; the optimizers' and losses' block
# reductions share memory too. Tests of layers without such kernels are left out.
has '^plan: racecheck layers_attention_fused_cuda_stored_ds' "part 1"
has '^plan: racecheck layers_attention_fused_cuda_rows32' "part 1"
has '^plan: racecheck optim_multi_tensor_cuda' "part 1"
has '^plan: racecheck layers_losses_cuda' "part 1"
hasnt '^plan: racecheck layers_cuda' "part 1"
hasnt '^plan: racecheck layers_attention_fused_cuda_off' "part 1"
# FIRST_TESTS: those tests first, in tests.tsv's order, then the others, each once.
env PATH="$tmp/bin:$PATH" FAKE_GPUS=1 FIRST_TESTS='^(optim_multi_tensor_cuda|layers_losses_cuda)$' \
  "$root/scripts/gpu-check" --part 1 --plan --kit "$tmp/kit" --out "$tmp/o" >"$tmp/out" 2>&1 ||
  fail "--part 1 --plan with FIRST_TESTS: exit $?"
order=$(grep -E '^plan: test ' "$tmp/out" | awk '{print $3}' | tr '\n' ' ')
[[ "$order" == "layers_losses_cuda optim_multi_tensor_cuda layers_cuda layers_attention_fused_cuda "* ]] ||
  fail "FIRST_TESTS: the tests' order is '$order'"
[[ $(grep -c '^plan: test layers_losses_cuda ' "$tmp/out") == 1 ]] || fail "FIRST_TESTS: layers_losses_cuda not planned once"
# A sanitizer step whose share of what is left is under 30 s is not started: SKIP.
env PATH="$tmp/bin:$PATH" FAKE_GPUS=1 "$root/scripts/gpu-check" --part 1 --plan --budget 100 --kit "$tmp/kit" \
  --out "$tmp/o" >"$tmp/out" 2>&1 || fail "--part 1 --plan --budget 100: exit $?"
has '^plan: memcheck layers_cuda: SKIP \(no time left: [0-9]+s for [0-9]+ steps\)' "part 1, --budget 100"
has 'SKIP +0s +memcheck layers_cuda +no time left' "part 1, --budget 100 (the summary)"
hasnt 'TIMEOUT' "part 1, --budget 100"
plan 4 multi || fail "--part multi --plan with 4 GPUs: exit $?"
has '^plan: test train_timeline_cuda at 4 ranks' "4 GPUs, part multi"
has '^plan: transformer 4 ranks' "4 GPUs, part multi"
# The scaling prediction: profiles at 1 and 4 ranks, predictions for 2 and 4 GPUs from the
# first, the second's own check.
has '^plan: resnet50 scaling profile 1 rank\(s\) .*--profile-scaling' "4 GPUs, part multi"
has '^plan: resnet50 scaling profile 4 rank\(s\)' "4 GPUs, part multi"
has '^plan: scaling prediction for 2 GPUs .*predict .*--devices-per-node 2' "4 GPUs, part multi"
has '^plan: scaling prediction for 4 GPUs' "4 GPUs, part multi"
has '^plan: scaling prediction from the 4-rank profile' "4 GPUs, part multi"

env PATH="$tmp/bin:$PATH" FAKE_GPUS=2 "$root/scripts/gpu-check" --part multi --plan --gpus 3 --kit "$tmp/kit" \
  --out "$tmp/o" >"$tmp/out" 2>&1
rc=$?
[[ $rc == 2 ]] || fail "--gpus 3 with 2 GPUs: exit $rc, expected 2"
has '--gpus 3, but nvidia-smi -L lists 2 GPU' "--gpus 3 with 2 GPUs"

if ((fails)); then
  echo "$fails check(s) failed; the last plan:"
  cat "$tmp/out"
  exit 1
fi
echo "gpu-check plans: all checks passed"
