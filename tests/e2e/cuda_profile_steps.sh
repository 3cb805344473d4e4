#!/usr/bin/env bash
# TNT_CUDA_PROFILE_STEPS (docs/gpu.md) where it cannot apply: on a CPU rank it warns and the
# run trains as usual; a window that is no window is refused before training, naming the
# variable, with exit status 2.
#   cuda_profile_steps.sh FASHION_MNIST
set -u
prog=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
run=(--model=mlp --num_train_samples=256 --batch_size=64 --train_epochs=1 --verbose=0)

out=$(TNT_DEVICE=cpu TNT_CUDA_PROFILE_STEPS=2 timeout 120 "$prog" "${run[@]}" --model_dir="$tmp/cpu" 2>&1)
rc=$?
if [[ $rc != 0 ]]; then echo "FAIL: a CPU run with TNT_CUDA_PROFILE_STEPS=2 exited $rc"; fail=1; fi
if ! grep -qF "TNT_CUDA_PROFILE_STEPS=2 has no effect: this rank trains on cpu, not a GPU" <<<"$out"; then
  echo "FAIL: the CPU run did not say the window has no effect"
  fail=1
fi
((fail)) && echo "$out"

out=$(TNT_DEVICE=cpu TNT_CUDA_PROFILE_STEPS=3-1 timeout 120 "$prog" "${run[@]}" --model_dir="$tmp/bad" 2>&1)
rc=$?
if [[ $rc != 2 ]]; then echo "FAIL: TNT_CUDA_PROFILE_STEPS=3-1 exited $rc, expected 2"; fail=1; fi
if ! grep -qF "TNT_CUDA_PROFILE_STEPS='3-1'" <<<"$out"; then
  echo "FAIL: the refusal does not name TNT_CUDA_PROFILE_STEPS='3-1'"
  echo "$out"
  fail=1
fi
((fail)) || echo "ok: a CPU rank warns and trains; a bad window is refused with exit status 2"
exit "$fail"
