# Sourced by the CPU benchmarks that run PyTorch beside us. torch_python NAME sets $python to
# the first of $PYTHON, python3 and /usr/bin/python3 that imports torch, and $torch_blas to
# the BLAS it runs on; it exits with a message naming what to install when there is no such
# Python, or when its BLAS is the reference one (not the strongest PyTorch on a CPU: about
# 2-3x slower on these models) unless REFERENCE_BLAS=1.
torch_python() {
  local me=$1 p here
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  python=""
  for p in ${PYTHON:-} python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c "import torch" 2>/dev/null; then python=$p; break; fi
  done
  if [[ -z $python ]]; then
    echo "$me: no Python with torch found (apt install python3-torch, or set PYTHON=)" >&2
    exit 1
  fi
  torch_blas=$("$python" "$here/torch_blas.py" 2>/dev/null) || torch_blas=unknown
  if [[ $torch_blas != openblas && ${REFERENCE_BLAS:-0} != 1 ]]; then
    echo "$me: PyTorch ($python) runs on the $torch_blas BLAS here, not OpenBLAS: that is not the strongest" \
      "PyTorch on a CPU. Install OpenBLAS (TNT_SETUP_BENCH=1 scripts/setup, or apt install libopenblas0-pthread)," \
      "or set REFERENCE_BLAS=1 to compare anyway." >&2
    exit 1
  fi
}
