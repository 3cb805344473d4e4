#!/usr/bin/env bash
# scripts/bench/resnet50_gpu and transformer_gpu without a GPU: a fake nvidia-smi, fake
# programs (bin/resnet50, bin/transformer, bin/transformer_data) and a fake PYTHON whose
# PyTorch side prints a RESULT line. Each fake "process" registers its pid and a footprint
# in MiB, which the fake nvidia-smi reports while it lives, beside a process of someone else
# (pid 1, 5000 MiB) that no run may count. Checks that the tables carry each run's own
# allocator peak and nvidia-smi peak (summed over the run's process tree: a fake launcher
# with its rank as a child), and the Transformer's memory ratio line; then, with nvidia-smi
# listing no process (a PID namespace), the device-level "(dev)" fallback. Takes seconds
# (about 100 s where starting a process is slow: tests/bench/CMakeLists.txt).
#   test_gpu_bench_memory.sh SOURCE_DIR
set -euo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fake=$tmp/fake
mkdir -p "$fake/path" "$fake/build/bin" "$fake/apps"
failed=0

# Registers this process ($1 MiB) for the fake nvidia-smi until it exits; the run lasts
# long enough for several samples at SAMPLE_S=0.05.
cat >"$fake/register.sh" <<'EOF'
echo "$1" >"$FAKE_GPU_APPS/$$"
trap 'rm -f "$FAKE_GPU_APPS/$$"' EXIT
sleep 0.6
EOF

cat >"$fake/path/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
# The live registered processes: "pid MiB".
live() {
  local f
  for f in "$FAKE_GPU_APPS"/*; do
    [[ -e $f ]] && kill -0 "${f##*/}" 2>/dev/null && echo "${f##*/} $(cat "$f")"
  done
  return 0
}
case "$*" in
  -L) echo "GPU 0: Fake GPU (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  *--query-gpu=name*) echo "Fake GPU" ;;
  # Idle: 1000 MiB, plus pid 1's 5000.
  *--query-gpu=memory.used*) live | awk '{s += $2} END {print 6000 + s}' ;;
  *--query-compute-apps=pid,used_memory*)
    if [[ ${FAKE_SMI_APPS:-1} == 1 ]]; then
      echo "1, 5000"
      live | awk '{print $1 ", " $2}'
    fi ;;
  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 9 ;;
esac
EOF

cat >"$fake/build/bin/transformer" <<'EOF'
#!/usr/bin/env bash
# The other attention engine (ATTENTION_COMPARE=1) has other numbers: the ratios must come
# from the main run. cuDNN's (TNT_CUDNN_ATTENTION=1) is faster; auto (the default) prints
# its verdict at INFO, which the bench must ask for and pass on.
if [[ ${TNT_FUSED_ATTENTION:-1} == 0 ]]; then mib=950 alloc=750 tps=20000; else mib=900 alloc=700 tps=40000; fi
[[ ${TNT_CUDNN_ATTENTION:-auto} == 1 ]] && tps=60000
# FAKE_FAIL=auto: cuDNN's attention "crashes" wherever it may run (auto or 1); =fused: the
# fused attention crashes as well; =gemm_pad: the padded output projection crashes wherever
# it may run (auto or 1).
if [[ (${FAKE_FAIL:-} == auto || ${FAKE_FAIL:-} == fused) && ${TNT_CUDNN_ATTENTION:-auto} != 0 ]] ||
  [[ ${FAKE_FAIL:-} == fused && ${TNT_FUSED_ATTENTION:-1} != 0 ]] ||
  [[ ${FAKE_FAIL:-} == gemm_pad && ${TNT_GEMM_PAD:-auto} != 0 ]]; then
  echo "CUDA error: an illegal memory access was encountered (fake)" >&2
  exit 134
fi
if [[ ${TNT_CUDNN_ATTENTION:-auto} == auto && ${TNT_LOG_LEVEL:-} == INFO ]]; then
  echo "[I] MultiHeadAttention: TNT_CUDNN_ATTENTION=auto: B=2 Tq=4 runs the cuDNN engine (fake)" >&2
fi
source "$(dirname "$0")/../../register.sh" "$mib"
echo "tokens/s: $tps (fake)"
echo "peak GPU memory: $alloc MiB"
EOF
printf '#!/usr/bin/env bash\nexit 0\n' >"$fake/build/bin/transformer_data"

cat >"$fake/build/bin/resnet50" <<'EOF'
#!/usr/bin/env bash
# FAKE_FAIL=conv: the default-on convolution paths "crash".
if [[ ${FAKE_FAIL:-} == conv && ${TNT_CUDNN_CONV_GRAPH:-1} != 0 ]]; then
  echo "CUDA error: an illegal memory access was encountered (fake)" >&2
  exit 134
fi
source "$(dirname "$0")/../../register.sh" 2000
echo "step 11: 500.0 images/s over the last 10 steps, loss 6.9"
echo "step 21: 500.0 images/s over the last 10 steps, loss 6.9"
echo "images/s: 500.0 (fake)"
echo "peak GPU memory: 1500 MiB"
EOF

# The launcher holds GPU memory of its own beside its rank (a child): a run's figure is the
# sum over its process tree.
cat >"$fake/build/bin/tarantella" <<'EOF'
#!/usr/bin/env bash
[[ "$1 $2 $3" == "-n 1 --" ]] || { echo "fake tarantella: expected -n 1 -- CMD, got $*" >&2; exit 2; }
shift 3
echo 300 >"$FAKE_GPU_APPS/$$"
trap 'rm -f "$FAKE_GPU_APPS/$$"' EXIT
"$@"
EOF

# torch is "importable" with CUDA (-c ...); the PyTorch sides print their RESULT lines; anything
# else (make_demo_corpus) goes to the real Python.
cat >"$fake/python" <<EOF
#!/usr/bin/env bash
real_python=$(command -v python3)
EOF
cat >>"$fake/python" <<'EOF'
case "${1:-}" in
  -c) exit 0 ;;
  *transformer_gpu_torch.py)
    source "$(dirname "$0")/register.sh" 1200
    echo "RESULT framework=pytorch mode=eager tokens_per_s=50000.0 warmup_s=1.0 peak_mib=1100" ;;
  *resnet50_gpu_torch.py)
    source "$(dirname "$0")/register.sh" 2500
    echo "RESULT framework=pytorch model=torchvision images_per_s=1000.0 peak_allocated_mib=1800" ;;
  *) exec "$real_python" "$@" ;;
esac
EOF
chmod +x "$fake/path/nvidia-smi" "$fake/build/bin/"* "$fake/python"

export PATH="$fake/path:$PATH" FAKE_GPU_APPS=$fake/apps BUILD_DIR=$fake/build PYTHON=$fake/python SAMPLE_S=0.05

# expect FILE REGEX WHAT: FILE has a line matching the extended REGEX.
expect() {
  if ! grep -qE "$2" "$1"; then
    echo "FAIL: $3: no line matching /$2/ in:" >&2
    sed 's/^/  | /' "$1" >&2
    failed=1
  fi
}
run() {  # run NAME SCRIPT [VAR=VALUE...]
  local name=$1 script=$2
  shift 2
  if ! env "$@" "$src/scripts/bench/$script" >"$tmp/$name.log" 2>&1; then
    echo "FAIL: $name: $script exited non-zero:" >&2
    sed 's/^/  | /' "$tmp/$name.log" >&2
    failed=1
  fi
}

# --- Transformer: per-process figures, both engines, against PyTorch ------------------
run transformer transformer_gpu SHAPES=2x4 DTYPES=bf16 STEPS=2 WARMUP=1 TORCH_MODES=eager ATTENTION_COMPARE=1
log=$tmp/transformer.log
expect "$log" '^framework .* tokens_per_s +alloc_peak_mib +smi_peak_mib$' "transformer: the header's columns"
expect "$log" '^tarantella auto +bf16 .* 40000\.0 +700 +900$' "transformer: ours, allocator 700 and nvidia-smi 900 MiB"
expect "$log" '^transformer_gpu: ours \(ours_2x4_bf16\): TNT_CUDNN_ATTENTION=auto: B=2 Tq=4 runs the cuDNN engine' \
  "transformer: auto's verdict passed on"
expect "$log" '^tarantella unfused +bf16 .* 20000\.0 +750 +950$' "transformer: the other engine's own figures"
expect "$log" '^pytorch eager +bf16 .* 50000\.0 +1100 +1200$' "transformer: PyTorch, its peak_mib 1100 and nvidia-smi 1200 MiB"
expect "$log" '^Transformer bf16 2x4 on Fake GPU: ratio \(tarantella / pytorch eager tokens per second\): 0\.800$' \
  "transformer: the speed ratio line, unchanged"
expect "$log" '^Transformer bf16 2x4: ratio fused / unfused attention \(ours, tokens per second\): 2\.000$' \
  "transformer: the attention ratio line, unchanged"
expect "$log" '^Transformer bf16 2x4 on Fake GPU: memory ratio \(tarantella / pytorch eager, nvidia-smi MiB\): 0\.750 \(target <= 1\.0: met\)$' \
  "transformer: the memory ratio line (900 / 1200)"

# --- Transformer where nvidia-smi sees no process: the device's level above idle ------
run transformer_dev transformer_gpu SHAPES=2x4 DTYPES=bf16 STEPS=2 WARMUP=1 TORCH_MODES=eager FAKE_SMI_APPS=0
log=$tmp/transformer_dev.log
expect "$log" '^tarantella auto +bf16 .* 700 +900\(dev\)$' "transformer (dev): ours, 900 MiB above idle"
expect "$log" '^pytorch eager +bf16 .* 1100 +1200\(dev\)$' "transformer (dev): PyTorch, 1200 MiB above idle"
expect "$log" 'memory ratio \(tarantella / pytorch eager, nvidia-smi MiB\): 0\.750 \(target <= 1\.0: met\) \(device level' \
  "transformer (dev): the memory ratio line, said to be the device's level"

# --- Transformer, ours only (no torch in the Python) -------------------------------------
run transformer_ours transformer_gpu SHAPES=2x4 DTYPES=bf16 STEPS=2 SKIP_TORCH=1 PYTHON="$(command -v python3)"
expect "$tmp/transformer_ours.log" '^tarantella auto +bf16 .* 40000\.0 +700 +900$' "transformer (SKIP_TORCH=1): ours"

# --- Transformer, ours with the fused engine alone and with cuDNN's (ATTENTION_COMPARE=cudnn) ---
run transformer_cudnn transformer_gpu SHAPES=2x4 DTYPES=bf16 STEPS=2 SKIP_TORCH=1 ATTENTION_COMPARE=cudnn \
  PYTHON="$(command -v python3)"
log=$tmp/transformer_cudnn.log
expect "$log" '^tarantella auto +bf16 .* 40000\.0 +700 +900$' "transformer (cudnn): ours first, as configured (auto)"
expect "$log" '^tarantella fused +bf16 .* 40000\.0 +700 +900$' "transformer (cudnn): the fused engine alone"
expect "$log" '^tarantella cudnn +bf16 .* 60000\.0 +700 +900$' "transformer (cudnn): cuDNN's, a row of its own"
expect "$log" '^Transformer bf16 2x4: ratio cudnn / auto \(default\) attention \(ours, tokens per second\): 1\.500$' \
  "transformer (cudnn): its ratio line"
expect "$log" '^Transformer bf16 2x4: ratio fused / auto \(default\) attention \(ours, tokens per second\): 1\.000$' \
  "transformer (cudnn): the fused engine's ratio line"
# With TNT_CUDNN_ATTENTION=1 set, the default is cuDNN's, and only the fused run is added.
run transformer_cudnn1 transformer_gpu SHAPES=2x4 DTYPES=bf16 STEPS=2 SKIP_TORCH=1 ATTENTION_COMPARE=cudnn \
  TNT_CUDNN_ATTENTION=1 PYTHON="$(command -v python3)"
log=$tmp/transformer_cudnn1.log
expect "$log" '^tarantella cudnn +bf16 .* 60000\.0 ' "transformer (TNT_CUDNN_ATTENTION=1): the default row is cuDNN's"
expect "$log" '^Transformer bf16 2x4: ratio fused / cudnn \(default\) attention \(ours, tokens per second\): 0\.667$' \
  "transformer (TNT_CUDNN_ATTENTION=1): fused against it"
if [[ $(grep -c '^tarantella ' "$log") != 2 ]]; then
  echo "FAIL: transformer (TNT_CUDNN_ATTENTION=1): expected 2 rows of ours" >&2
  sed 's/^/  | /' "$log" >&2
  failed=1
fi

# --- A default path that crashes: once more without it (FALLBACK=1, the default) ----------
run transformer_fallback transformer_gpu SHAPES=2x4 DTYPES=bf16 STEPS=2 SKIP_TORCH=1 ATTENTION_COMPARE=cudnn \
  FAKE_FAIL=auto PYTHON="$(command -v python3)"
log=$tmp/transformer_fallback.log
expect "$log" '^transformer_gpu: ours, bf16, 2x4 failed \(exit 134; .*with TNT_CUDNN_ATTENTION=0 TNT_GEMM_PAD=0$' \
  "transformer (fallback): the failure said, and the retry"
expect "$log" '^transformer_gpu:   \| CUDA error: an illegal memory access' "transformer (fallback): the failure's lines"
expect "$log" '^tarantella fused +bf16 .* 40000\.0 ' "transformer (fallback): the row, labelled with what ran"
expect "$log" '^transformer_gpu: ours, bf16, 2x4 with TNT_CUDNN_ATTENTION=1 failed \(exit 134.*no row for it$' \
  "transformer (fallback): a failed comparison run loses its row only"
if grep -q '^tarantella cudnn' "$log"; then
  echo "FAIL: transformer (fallback): a row for the failed cuDNN run" >&2
  failed=1
fi
# Both steps of fallbacks: the row is the unfused engine's.
run transformer_fallback2 transformer_gpu SHAPES=2x4 DTYPES=bf16 STEPS=2 SKIP_TORCH=1 FAKE_FAIL=fused \
  PYTHON="$(command -v python3)"
log=$tmp/transformer_fallback2.log
expect "$log" 'once more, and every later default run of ours, with TNT_CUDNN_ATTENTION=0 TNT_GEMM_PAD=0$' \
  "transformer (fallback 2): the first step"
expect "$log" 'with TNT_CUDNN_ATTENTION=0 TNT_GEMM_PAD=0 TNT_FUSED_ATTENTION=0 TNT_LAYER_FUSION=0 TNT_CUDA_EARLY_READBACK=0 TNT_CUDA_BATCHED_SPANS=0 TNT_LOSS_GRAD_IN_PLACE=0$' \
  "transformer (fallback 2): the second step"
expect "$log" '^tarantella unfused +bf16 .* 20000\.0 ' "transformer (fallback 2): the row, labelled unfused"
# A padded projection that crashes: the first step of fallbacks leaves it out too.
run transformer_fallback_pad transformer_gpu SHAPES=2x4 DTYPES=bf16 STEPS=2 SKIP_TORCH=1 FAKE_FAIL=gemm_pad \
  PYTHON="$(command -v python3)"
log=$tmp/transformer_fallback_pad.log
expect "$log" 'once more, and every later default run of ours, with TNT_CUDNN_ATTENTION=0 TNT_GEMM_PAD=0$' \
  "transformer (fallback, padded projection): the first step"
expect "$log" '^tarantella fused +bf16 .* 40000\.0 ' "transformer (fallback, padded projection): the row"
if env SHAPES=2x4 DTYPES=bf16 STEPS=2 SKIP_TORCH=1 FAKE_FAIL=auto FALLBACK=0 PYTHON="$(command -v python3)" \
  "$src/scripts/bench/transformer_gpu" >"$tmp/nofallback.log" 2>&1; then
  echo "FAIL: transformer (FALLBACK=0): a failed run did not end the benchmark" >&2
  failed=1
fi
run resnet50_fallback resnet50_gpu DTYPES=fp32 FORMATS=channels_last SKIP_TORCH=1 FUSION_COMPARE=0 BATCH=8 WARMUP=10 \
  STEPS=10 LOG_STEPS=10 FAKE_FAIL=conv
log=$tmp/resnet50_fallback.log
expect "$log" '^resnet50_gpu: ours, channels_last, fp32 failed \(exit 134; .*TNT_CUDNN_CONV_GRAPH=0 TNT_CONV_PAD_CHANNELS=0$' \
  "resnet50 (fallback): the failure said, and the retry"
expect "$log" '^tarantella +channels_last +fp32 +8 +500\.0 ' "resnet50 (fallback): the row of the retry"

# --- ResNet-50: the same sampling, from the shared file ---------------------------------
run resnet50 resnet50_gpu DTYPES=fp32 FORMATS=channels_last TORCH_MODES=eager FUSION_COMPARE=0 BATCH=8 WARMUP=10 \
  STEPS=10 LOG_STEPS=10
log=$tmp/resnet50.log
expect "$log" '^tarantella +channels_last +fp32 +8 +500\.0 +1500 +2000 *$' "resnet50: ours, allocator 1500 and nvidia-smi 2000 MiB"
expect "$log" '^pytorch eager \(torchvision\) +channels_last +fp32 +8 +1000\.0 +1800 +2500 +0\.500 \(< 1\.0\)$' \
  "resnet50: PyTorch, 1800 and 2500 MiB, the ratio"

run resnet50_launcher resnet50_gpu DTYPES=fp32 FORMATS=channels_last SKIP_TORCH=1 FUSION_COMPARE=0 BATCH=8 \
  WARMUP=10 STEPS=10 LOG_STEPS=10 LAUNCH=tarantella
expect "$tmp/resnet50_launcher.log" '^tarantella +channels_last +fp32 +8 +500\.0 +1500 +2300 *$' \
  "resnet50 (LAUNCH=tarantella): nvidia-smi, the launcher's 300 and the rank's 2000 MiB"

# A bad sampling interval is named, not slept on.
if env SAMPLE_S=soon "$src/scripts/bench/transformer_gpu" >"$tmp/bad.log" 2>&1; then
  echo "FAIL: transformer_gpu accepted SAMPLE_S=soon" >&2
  failed=1
fi
expect "$tmp/bad.log" '^transformer_gpu: SAMPLE_S=soon: expected seconds' "transformer: SAMPLE_S=soon refused"

# A run that ends at once: the sampler is killed as it starts, and may run the caller's EXIT
# trap there; only the script itself may remove its folder. With bash's BASHPID as the test
# of that, the folder went within the first 10 of these runs on a 2-core machine.
cat >"$tmp/quick_runs.sh" <<'EOF'
set -euo pipefail
tmp=$(mktemp -d "$1/quick.XXXXXX")
sample_s=0.05
source "$2/scripts/bench/gpu_memory.sh"
cleanup() { gpu_memory_cleanup || return 0; rm -rf "$tmp"; }
trap cleanup EXIT
for i in $(seq 1 200); do
  run_measured "run$i" false
  [[ -d $tmp ]] || { echo "the folder was removed during run $i" >&2; exit 1; }
done
EOF
if ! bash "$tmp/quick_runs.sh" "$tmp" "$src" >"$tmp/quick_runs.log" 2>&1; then
  echo "FAIL: 200 runs that end at once: the run's folder did not stay:" >&2
  sed 's/^/  | /' "$tmp/quick_runs.log" >&2
  failed=1
fi
if compgen -G "$tmp/quick.*" >/dev/null; then
  echo "FAIL: 200 runs that end at once: the script's EXIT trap left its folder" >&2
  failed=1
fi

if ((failed)); then exit 1; fi
echo "resnet50_gpu and transformer_gpu: memory columns and ratio lines as the fakes say"
