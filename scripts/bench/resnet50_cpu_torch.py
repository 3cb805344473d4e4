#!/usr/bin/env python3
"""The PyTorch side of scripts/bench/resnet50_cpu: ResNet-50 v1.5 training steps on the CPU
in one process, with the recipe of build/bin/resnet50 (SGD momentum 0.9, weight decay 1e-4
on everything but BatchNorm, softmax cross-entropy), on one synthetic batch made once
(random images in [-1, 1), random labels), float32 or (--dtype bf16) under
torch.autocast("cpu", dtype=torch.bfloat16), PyTorch's CPU mixed precision (convolutions and
linear layers in bf16 through oneDNN, parameters f32), --threads intra-op threads, in
--memory_format channels_last (model and input .to(memory_format=torch.channels_last), as
ours by default) or channels_first (NCHW).

The model is torchvision's resnet50 when torchvision imports, else the ResNet-50 v1.5 of
resnet50_gpu_torch.py beside this file (same layers and parameter count). The first
--warmup steps are not timed. Prints one line:
  RESULT framework=pytorch threads=2 image_size=64 batch=32 steps=5 images_per_s=... ms_per_step=...
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resnet50_gpu_torch import RESNET50_PARAMETERS, make_model, ours_sgd  # noqa: E402
from torch_blas import blas_library  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--image_size", type=int, default=64)
    ap.add_argument("--num_classes", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--memory_format", choices=["channels_last", "channels_first"], default="channels_last")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0 or a.batch < 1 or a.threads < 1 or a.image_size < 32:
        sys.exit("resnet50_cpu_torch: need --steps >= 1, --warmup >= 0, --batch >= 1, --threads >= 1, "
                 "--image_size >= 32")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    model, which = make_model(a.num_classes)
    if a.num_classes == 1000:
        n = sum(p.numel() for p in model.parameters())
        if n != RESNET50_PARAMETERS:
            sys.exit(f"resnet50_cpu_torch: the {which} model has {n} parameters, expected {RESNET50_PARAMETERS}")
    fmt = torch.channels_last if a.memory_format == "channels_last" else torch.contiguous_format
    model = model.to(memory_format=fmt).train()
    opt = ours_sgd(model, a.lr)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(a.seed)
    x = torch.rand(a.batch, 3, a.image_size, a.image_size, generator=g) * 2 - 1  # (N, 3, S, S)
    x = x.contiguous(memory_format=fmt)
    y = torch.randint(0, a.num_classes, (a.batch,), generator=g)  # (N,)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    seconds = time.perf_counter() - t0
    if loss.item() != loss.item():
        sys.exit("resnet50_cpu_torch: the loss is NaN")
    print(f"RESULT framework=pytorch model={which} format={a.memory_format} dtype={a.dtype} threads={a.threads} image_size={a.image_size} batch={a.batch} "
          f"steps={a.steps} images_per_s={a.batch * a.steps / seconds:.1f} ms_per_step={1e3 * seconds / a.steps:.1f} "
          f"torch={torch.__version__} blas={blas_library()}")


if __name__ == "__main__":
    main()
