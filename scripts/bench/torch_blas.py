#!/usr/bin/env python3
"""Which BLAS this Python's torch runs on: prints openblas, reference, none or unknown.

Debian's python3-torch calls the libblas.so.3 alternative: OpenBLAS when libopenblas0-pthread
is installed, else the reference BLAS, several times slower on the matrix products. The CPU
benchmarks compare against the strongest PyTorch, so they refuse the reference BLAS
(scripts/bench/torch_cpu.sh). Imported by the benchmarks' PyTorch sides to name it in their
result lines.
"""
import os


def blas_library():
    """The BLAS library this process has loaded, by name."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "blas" in line and "/" in line}
    except OSError:
        return "unknown"
    real = sorted({os.path.realpath(p) for p in paths})
    if any("openblas" in p for p in real):
        return "openblas"
    return "reference" if real else "none"


if __name__ == "__main__":
    import torch

    torch.ones(4, 4) @ torch.ones(4, 4)  # the BLAS is loaded by now whichever way torch links it
    print(blas_library())
