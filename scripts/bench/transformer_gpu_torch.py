#!/usr/bin/env python3
"""Training steps of scripts/transformer_torch.py's Transformer on one GPU, for
scripts/bench/transformer_gpu: the same structure, batch (sentences x max_length, padded),
optimizer (Adam 0.9/0.997/1e-9) and loss (label smoothing 0.1 over non-padding tokens) as
build/bin/transformer. --dtype bf16 is autocast to bf16 with fp32 parameters (the recipe of
our --dtype=bf16). The strongest PyTorch setup by default (--mode compile): attention by
F.scaled_dot_product_attention (flash or memory-efficient kernels), Adam with fused=True, and
the step's forward and loss under torch.compile (default mode; compiled during the untimed
warm-up, whose seconds are printed as compile_s); --mode eager drops torch.compile, --no_sdpa
uses the module's own attention. Prints "RESULT framework=pytorch ... tokens_per_s=X" (padded tokens per
second) over --steps steps after --warmup untimed ones, timed between two device
synchronisations. TNT_TORCH_KERNEL_TABLE=FILE: after them, a kernel table of
TNT_TORCH_KERNEL_STEPS (default 2) more steps by PyTorch's profiler (kernel_table.py).
"""
import argparse
import contextlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from transformer_torch import PARAM_SETS, Transformer, random_batch, smoothed_loss  # noqa: E402

import kernel_table  # noqa: E402  (scripts/bench/kernel_table.py, beside this file)


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
    ap.add_argument("--mode", default="compile", choices=["compile", "eager"])
    ap.add_argument("--no_sdpa", action="store_true", help="the module's own attention, not F.scaled_dot_product_attention")
    a = ap.parse_args()
    if a.warmup < 1 or a.steps < 1:
        sys.exit("transformer_gpu_torch: need --warmup >= 1 (it compiles) and --steps >= 1")
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
    model = Transformer(vocab_size=a.vocab_size, num_hidden_layers=a.num_hidden_layers, sdpa=not a.no_sdpa,
                        **PARAM_SETS[a.param_set])
    model.to(dev).train()
    fused = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.997), eps=1e-9, **fused)
    b, t = a.sentences, a.max_length

    def forward_loss(src, dec, tgt):
        amp = torch.autocast(dev.type, dtype=torch.bfloat16) if a.dtype == "bf16" else contextlib.nullcontext()
        with amp:
            logits = model(src, dec)
        return smoothed_loss(logits, tgt)

    if a.mode == "compile":
        forward_loss = torch.compile(forward_loss)

    batches = [random_batch(b, t, a.vocab_size, dev) for _ in range(4)]

    def step(k):
        src, dec, tgt = batches[k % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = forward_loss(src, dec, tgt)
        loss.backward()
        opt.step()
        return loss

    warm = time.perf_counter()
    for k in range(a.warmup):
        step(k)
    sync()
    compile_s = time.perf_counter() - warm
    start = time.perf_counter()
    for k in range(a.steps):
        loss = step(k)
    sync()
    seconds = time.perf_counter() - start
    kernel_table.torch_table_from_env(step, sync)  # untimed
    print(f"RESULT framework=pytorch mode={a.mode} sdpa={int(not a.no_sdpa)} dtype={a.dtype} sentences={b} max_length={t} steps={a.steps} "
          f"ms_per_step={1e3 * seconds / a.steps:.1f} tokens_per_s={b * t * a.steps / seconds:.1f} "
          f"loss={loss.item():.4f} warmup_s={compile_s:.1f} torch={torch.__version__}"
          + (f" peak_mib={torch.cuda.max_memory_allocated() / 2**20:.0f}" if dev.type == "cuda" else ""))


if __name__ == "__main__":
    main()
