#!/usr/bin/env python3
"""Loads a resnet50 checkpoint of ours into torchvision's resnet50 with strict=True.

  resnet50_torchvision.py CHECKPOINT [--num-classes K]
  resnet50_torchvision.py --check FILE      (tests/e2e: FILE also holds check.input and
                                             check.logits; the eval-mode logits must agree)

Needs Debian's python3-torch and python3-torchvision. The safetensors reader below is the
whole format: an 8-byte little-endian header length, a JSON header, the raw data."""
import argparse, json, struct, sys

import torch
import torchvision

DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=DTYPES[e["dtype"]]) if end > b else \
            torch.empty(0, dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).clone()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", nargs="?")
    ap.add_argument("--check", metavar="FILE")
    ap.add_argument("--num-classes", type=int)
    args = ap.parse_args()
    path = args.check or args.checkpoint
    if not path:
        ap.error("give a checkpoint, or --check FILE")
    tensors = read_safetensors(path)
    state = {k: v for k, v in tensors.items() if not k.startswith(("check.", "optimizer."))}
    classes = args.num_classes or state["fc.weight"].shape[0]
    model = torchvision.models.resnet50(num_classes=classes)
    model.load_state_dict(state, strict=True)  # raises, naming missing and unexpected keys
    print(f"{path}: {len(state)} tensors load strictly into torchvision.models.resnet50(num_classes={classes})")
    if not args.check:
        return 0
    model.eval()
    with torch.no_grad():
        logits = model(tensors["check.input"])
    ours = tensors["check.logits"]
    err = (logits - ours).abs().max().item()
    scale = ours.abs().max().item()
    # 50 f32 convolutions through different kernels (oneDNN here, PyTorch's there) differ in
    # summation order: about 1e-6 relative per layer, so 1e-4 of the largest logit is ample
    # while a wrong layer (a missing ReLU, the stride on the wrong conv, a BN buffer swapped)
    # changes the logits by tens of percent.
    tol = 1e-4 * max(scale, 1.0)
    print(f"logits: max |torchvision - ours| = {err:.3g} (largest logit {scale:.3g}, tolerance {tol:.3g})")
    return 0 if err <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
