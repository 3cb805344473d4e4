#!/usr/bin/env bash
# The CPU benchmarks compare against the strongest PyTorch: one on the reference BLAS (a
# Debian machine without libopenblas0-pthread) is refused with a message naming what to
# install, before anything runs; REFERENCE_BLAS=1 lets it through; OpenBLAS passes. A fake
# Python stands in for torch (it "imports" torch and reports the BLAS FAKE_BLAS names).
#   test_bench_blas.sh SOURCE_DIR
set -uo pipefail
src=$1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tnt_bench_blas.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

mkdir -p "$tmp/build/bin"
cat >"$tmp/python" <<'PY'
#!/bin/sh
case "$*" in
  *torch_blas.py*) echo "$FAKE_BLAS" ;;
  "-c import torch") exit 0 ;;
  *) echo "fake python: $*" >&2; exit 3 ;;
esac
PY
chmod +x "$tmp/python"
for b in tnt_train_step_bench tnt_transformer_block_bench tarantella fashion_mnist resnet50 transformer transformer_data; do
  printf '#!/bin/sh\necho "fake %s: $*" >&2\nexit 3\n' "$b" >"$tmp/build/bin/$b"
  chmod +x "$tmp/build/bin/$b"
done

refused="runs on the reference BLAS here, not OpenBLAS"
for bench in train_step transformer_block transformer_cpu fashion_mnist resnet50_cpu; do
  out=$(FAKE_BLAS=reference PYTHON="$tmp/python" BUILD_DIR="$tmp/build" timeout 60 "$src/scripts/bench/$bench" 2>&1)
  rc=$?
  [[ $rc -eq 1 ]] || fail "$bench on the reference BLAS: exit $rc, expected 1"
  grep -q "$refused" <<<"$out" || fail "$bench on the reference BLAS: no refusal in: $out"
  grep -q "TNT_SETUP_BENCH=1 scripts/setup" <<<"$out" || fail "$bench: the refusal does not say what to install"
  grep -q "^fake " <<<"$out" && fail "$bench on the reference BLAS ran something before refusing"
  for ok in "FAKE_BLAS=reference REFERENCE_BLAS=1" "FAKE_BLAS=openblas"; do
    out=$(env $ok PYTHON="$tmp/python" BUILD_DIR="$tmp/build" timeout 60 "$src/scripts/bench/$bench" 2>&1)
    grep -q "$refused" <<<"$out" && fail "$bench with $ok: refused"
    grep -q "^fake " <<<"$out" || fail "$bench with $ok: ran nothing after the check: $out"
  done
done
((fails == 0)) && echo "bench BLAS check: all passed"
exit $((fails > 0))
