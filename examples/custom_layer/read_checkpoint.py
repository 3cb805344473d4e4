#!/usr/bin/env python3
"""Reads a tarantella checkpoint (safetensors) with the standard library and numpy, loads it
into the PyTorch twin of the example's model with strict=True, and checks its predictions
against the ones the C++ program wrote.  Usage: read_checkpoint.py OUT_DIR"""
import json, struct, sys

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32, "U8": np.uint8}


def read_safetensors(path):
    """{name: numpy array}, and the metadata (epoch, step, seed, ...)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))  # little-endian header length
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        tensors[name] = np.frombuffer(data[begin:end], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    return tensors, meta


def main(out_dir):
    import torch

    class ScaledTanh(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.alpha = torch.nn.Parameter(torch.ones(1))

        def forward(self, x):
            return self.alpha * torch.tanh(x)

    # The same names as the C++ layers: fc1.weight [out, in], act.alpha, ...
    net = torch.nn.Sequential()
    net.add_module("fc1", torch.nn.Linear(3, 16))
    net.add_module("act", ScaledTanh())
    net.add_module("fc2", torch.nn.Linear(16, 1))
    tensors, meta = read_safetensors(f"{out_dir}/weights.safetensors")
    net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in tensors.items()}, strict=True)

    i = np.arange(16, dtype=np.float32)[:, None]
    x = np.sin(np.float32(0.37) * (i * np.arange(1, 4, dtype=np.float32))).astype(np.float32)
    ours = np.loadtxt(f"{out_dir}/predictions.txt", dtype=np.float32)
    theirs = net(torch.from_numpy(x)).detach().numpy().ravel()
    # f32 throughout; the two sides sum the 16-term dot products in different orders and
    # compute sin/tanh with different libraries: a few ulps of values of order 1.
    err = float(np.max(np.abs(ours - theirs)))
    print(f"{len(tensors)} tensors, metadata {sorted(meta)}; max |ours - torch| = {err:.2e}")
    return 0 if err < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
