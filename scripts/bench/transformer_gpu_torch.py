#!/usr/bin/env python3
"""Training steps of scripts/transformer_torch.py's Transformer on one GPU, for
scripts/bench/transformer_gpu: the same structure, batch (sentences x max_length, padded),
optimizer (Adam 0.9/0.997/1e-9) and loss (label smoothing 0.1 over non-padding tokens) as
build/bin/transformer. --dtype bf16 is autocast to bf16 with fp32 parameters (the recipe of
our --dtype=bf16). Prints "RESULT framework=pytorch ... tokens_per_s=X" (padded tokens per
second) over --steps steps after --warmup untimed ones, timed between two device
synchronisations.
"""
import argparse
import contextlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from transformer_torch import PARAM_SETS, Transformer, random_batch, smoothed_loss  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--param_set", default="big", choices=sorted(PARAM_SETS))
    ap.add_argument("--num_hidden_layers", type=int, default=6)
    ap.add_argument("--vocab_size", type=int, default=33708)
    ap.add_argument("--sentences", type=int, default=64)
    ap.add_argument("--max_length", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to try the script without a GPU")
    a = ap.parse_args()
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    model = Transformer(vocab_size=a.vocab_size, num_hidden_layers=a.num_hidden_layers, **PARAM_SETS[a.param_set])
    model.to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.997), eps=1e-9)
    b, t = a.sentences, a.max_length


    batches = [random_batch(b, t, a.vocab_size, dev) for _ in range(4)]

    def step(k):
        src, dec, tgt = batches[k % len(batches)]
        opt.zero_grad(set_to_none=True)
        amp = torch.autocast(dev.type, dtype=torch.bfloat16) if a.dtype == "bf16" else contextlib.nullcontext()
        with amp:
            logits = model(src, dec)
        loss = smoothed_loss(logits, tgt)
        loss.backward()
        opt.step()
        return loss

    for k in range(a.warmup):
        step(k)
    sync()
    start = time.perf_counter()
    for k in range(a.steps):
        loss = step(k)
    sync()
    seconds = time.perf_counter() - start
    print(f"RESULT framework=pytorch dtype={a.dtype} sentences={b} max_length={t} steps={a.steps} "
          f"ms_per_step={1e3 * seconds / a.steps:.1f} tokens_per_s={b * t * a.steps / seconds:.1f} "
          f"loss={loss.item():.4f}"
          + (f" peak_mib={torch.cuda.max_memory_allocated() / 2**20:.0f}" if dev.type == "cuda" else ""))


if __name__ == "__main__":
    main()
