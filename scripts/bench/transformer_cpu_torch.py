#!/usr/bin/env python3
"""Training steps of scripts/transformer_torch.py's Transformer on the CPU, for
scripts/bench/transformer_cpu: the same structure, batch (sentences x max_length, padded),
optimizer (Adam 0.9/0.997/1e-9) and loss (label smoothing 0.1 over non-padding tokens) as
build/bin/transformer. Sentence lengths are drawn uniformly in [max_length/4, max_length]
(the compute is that of the padded batch either way). Prints
"RESULT framework=pytorch ... tokens_per_s=X" (padded tokens per second, as the program's
"tokens/s"), timed over the steps after the first.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from transformer_torch import PARAM_SETS, Transformer, random_batch, smoothed_loss  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--param_set", default="base", choices=sorted(PARAM_SETS))
    ap.add_argument("--num_hidden_layers", type=int, default=6)
    ap.add_argument("--vocab_size", type=int, default=33708)
    ap.add_argument("--sentences", type=int, default=16)
    ap.add_argument("--max_length", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Transformer(vocab_size=a.vocab_size, num_hidden_layers=a.num_hidden_layers, **PARAM_SETS[a.param_set])
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.997), eps=1e-9)
    b, t = a.sentences, a.max_length


    times = []
    for _ in range(a.steps):
        src, dec, tgt = random_batch(b, t, a.vocab_size)
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = smoothed_loss(model(src, dec), tgt)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    timed = times[1:] if len(times) > 1 else times
    tps = b * t * len(timed) / sum(timed)
    print(f"RESULT framework=pytorch threads={a.threads} sentences={b} max_length={t} steps={len(timed)} "
          f"ms_per_step={1e3 * sum(timed) / len(timed):.1f} tokens_per_s={tps:.1f} loss={loss.item():.4f}")


if __name__ == "__main__":
    main()
