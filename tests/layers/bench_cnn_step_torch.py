#!/usr/bin/env python3
"""The PyTorch reference for bench_cnn_step: the same CNN, loss and Adam step on the CPU.
Usage: bench_cnn_step_torch.py [--batch 128] [--steps 30] [--threads N]"""
import argparse
import time

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=128)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--threads", type=int, default=0)
a = p.parse_args()
if a.threads:
    torch.set_num_threads(a.threads)
torch.manual_seed(1)
model = nn.Sequential(
    nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.rand(a.batch, 1, 28, 28)
y = torch.randint(0, 10, (a.batch,))
lossf = nn.CrossEntropyLoss()


def step():
    opt.zero_grad()
    loss = lossf(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


for _ in range(3):
    step()
t0 = time.perf_counter()
for _ in range(a.steps):
    loss = step()
ms = (time.perf_counter() - t0) * 1000 / a.steps
print(f"torch {torch.__version__} batch={a.batch} threads={torch.get_num_threads()} steps={a.steps} "
      f"ms_per_step={ms:.2f} loss={loss:.4f}")
