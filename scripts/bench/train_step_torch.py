#!/usr/bin/env python3
"""The PyTorch side of scripts/bench/train_step: one training step (forward, loss,
backward, Adam) of the Fashion-MNIST CNN at batch 128 on the CPU, synthetic data.
Prints the same RESULT line as tnt_train_step_bench."""
import argparse
import time

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    net = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.rand(a.batch, 1, 28, 28)
    y = torch.arange(a.batch) % 10

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    seconds = time.perf_counter() - t0
    ms = 1e3 * seconds / a.steps
    sps = a.batch * a.steps / seconds
    print(f"torch {torch.__version__}, loss after {a.warmup + a.steps} steps: {loss:.4f}")
    print(f"RESULT framework=pytorch threads={torch.get_num_threads()} batch={a.batch} "
          f"steps={a.steps} ms_per_step={ms:.3f} samples_per_s={sps:.1f}")


if __name__ == "__main__":
    main()
