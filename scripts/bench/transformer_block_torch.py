#!/usr/bin/env python3
"""The PyTorch side of scripts/bench/transformer_block: one pre-norm Transformer encoder
block (LayerNorm, multi-head attention with bias-free q/k/v/out projections, residual;
LayerNorm, Linear + ReLU + Linear, residual), forward and backward on the CPU with a
random input and output gradient. Prints the same RESULT line as
tnt_transformer_block_bench."""
import argparse
import time

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d, heads, filt):
        super().__init__()
        self.heads = heads
        self.self_attn_norm = nn.LayerNorm(d, eps=1e-6)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.out_proj = nn.Linear(d, d, bias=False)
        self.ffn_norm = nn.LayerNorm(d, eps=1e-6)
        self.linear1 = nn.Linear(d, filt)
        self.linear2 = nn.Linear(filt, d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads

        def split(z):  # (B, T, D) -> (B, H, T, d)
            return z.view(b, t, h, d // h).transpose(1, 2)

        y = self.self_attn_norm(x)
        q = split(self.q_proj(y)) * (d // h) ** -0.5
        k, v = split(self.k_proj(y)), split(self.v_proj(y))
        p = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
        o = (p @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.out_proj(o)
        return x + self.linear2(torch.relu(self.linear1(self.ffn_norm(x))))


def main():
    ap = argparse.ArgumentParser()
    for name, default in [("batch", 8), ("length", 64), ("hidden", 512), ("heads", 8), ("filter", 2048),
                          ("steps", 10), ("warmup", 2)]:
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--threads", type=int, required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    block = Block(a.hidden, a.heads, a.filter)
    x = torch.rand(a.batch, a.length, a.hidden) * 2 - 1
    x.requires_grad_(True)
    dy = torch.rand(a.batch, a.length, a.hidden) * 2 - 1

    def step():
        block.zero_grad(set_to_none=False)
        x.grad = None
        block(x).backward(dy)

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    seconds = time.perf_counter() - t0
    ms = 1e3 * seconds / a.steps
    tps = a.batch * a.length * a.steps / seconds
    print(f"torch {torch.__version__}")
    print(f"RESULT framework=pytorch threads={torch.get_num_threads()} batch={a.batch} length={a.length} "
          f"ms_per_step={ms:.3f} tokens_per_s={tps:.1f}")


if __name__ == "__main__":
    main()
