#!/usr/bin/env python3
"""Per-kernel GPU time of a few training steps, ours against PyTorch's, where ncu cannot read
the GPU's counters (docs/gpu.md, "A kernel table without ncu").

Tables are CSV files with the header
    kind,name,calls,total_us,mean_us,min_us,max_us
and two summary rows, "window" (first start to last end on the GPU) and "busy" (the union of
the rows' intervals). Ours come from build/bin/libtnt_kernel_table.so (CUDA_INJECTION64_PATH,
TNT_CUDA_PROFILE_STEPS); PyTorch's from its profiler's trace (table_from_chrome_trace, used
by scripts/bench/*_gpu_torch.py when TNT_TORCH_KERNEL_TABLE names a file).

    kernel_table.py OURS.csv --steps 2
    kernel_table.py OURS.csv --steps 2 --against THEIRS.csv --against-steps 2 --top 30

prints, per step: the window, the GPU's busy and idle time, the time per category (GEMM,
convolution, attention, normalization, softmax/loss, element-wise, ...; a kernel's category
comes from its name, first rule that matches) and the kernels that take the most time; with
--against, the two side by side and their difference per category.
"""
import argparse
import csv
import json
import math
import os
import re
import sys

HEADER = ["kind", "name", "calls", "total_us", "mean_us", "min_us", "max_us"]

# First match wins; names are lower-cased. cuDNN's convolution kernels carry "gemm" and
# "xmma" too, so convolution comes before GEMM; torch.compile's fused Triton kernels are
# named after the operations they hold (triton_per_fused_native_layer_norm_...), and fall
# into those operations' categories.
CATEGORIES = [
    ("communication", r"nccl"),
    ("attention", r"attention|flash|fmha|sdpa|attn|\bmha"),
    ("convolution", r"conv|implicit_gemm|implicit_convolve|wgrad|dgrad|fprop|winograd"),
    ("gemm", r"gemm|cutlass|xmma|nvjet|matmul|cublas|splitk|sm90_|sm80_"),
    ("normalization", r"norm|\bbn_|batchnorm|welford"),
    ("softmax / loss", r"softmax|xent|cross_entropy|smooth|loss|nll"),
    ("optimizer", r"adam|sgd|optim|multi_tensor|foreach|mt_clip|mt_squares|clip"),
    ("dropout", r"dropout|philox|bernoulli"),
    ("embedding", r"embedding|lookup_kernel|scatter|index_put|gather|index_select"),
    ("pooling", r"pool|gap_"),
    ("layout / copy", r"transpose|permute|layout|split_heads|merge_heads|copy|cat_|concat|pack_kernel"),
    ("reduction", r"reduce|sum_|column_|channel_sum"),
]
_COMPILED = [(c, re.compile(p)) for c, p in CATEGORIES]

# Tensor-core GEMM and convolution kernels are named after the GPU generation they were built
# for. On a Hopper GPU a product on an older generation's kernel (sm80/ampere, mma.sync) means
# cuBLAS or cuDNN had no Hopper (TMA/wgmma) kernel for it: often an operand whose rows are
# not 16-byte aligned (a 33,708-wide bf16 row), or a shape without one (cuDNN runs some
# convolutions on sm80 kernels by choice). CUTLASS-built names also give the operands'
# alignment in elements ("align2"); below 8 for a 16-bit type means rows off 16 bytes.
_OLDER = re.compile(r"sm80_|sm86_|sm75_|sm70_|ampere_|turing_|volta_|cutlass_80|s16816|s1688")
_ALIGN = re.compile(r"align(\d+)")


def older_generation(name):
    """Whether a kernel's name says it was built for a GPU before Hopper (sm80 and older)."""
    low = name.lower()
    return bool(_OLDER.search(low)) and "sm90" not in low


def category(kind, name):
    if kind == "memcpy":
        return "memcpy"
    if kind == "memset":
        return "memset"
    low = name.lower()
    for c, rx in _COMPILED:
        if rx.search(low):
            return c
    return "element-wise / other"


def union_us(intervals):
    busy, cur = 0.0, None
    for s, e in sorted(intervals):
        if cur is None or s > cur[1]:
            if cur:
                busy += cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return busy + (cur[1] - cur[0] if cur else 0.0)


def rows_from_intervals(records):
    """records: (kind, name, start_us, end_us) -> table rows (dicts), summary rows first."""
    agg, intervals = {}, []
    for kind, name, s, e in records:
        if e < s:
            continue
        r = agg.setdefault((kind, name), [0, 0.0, math.inf, 0.0])
        d = e - s
        r[0] += 1
        r[1] += d
        r[2] = min(r[2], d)
        r[3] = max(r[3], d)
        intervals.append((s, e))
    window = (max(e for _, e in intervals) - min(s for s, _ in intervals)) if intervals else 0.0
    busy = union_us(intervals)
    rows = [dict(kind="window", name="window", calls=1, total_us=window, mean_us=window, min_us=window, max_us=window),
            dict(kind="busy", name="busy", calls=1, total_us=busy, mean_us=busy, min_us=busy, max_us=busy)]
    for (kind, name), (n, tot, mn, mx) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        rows.append(dict(kind=kind, name=name, calls=n, total_us=tot, mean_us=tot / n, min_us=mn, max_us=mx))
    return rows


def table_from_chrome_trace(path):
    """PyTorch profiler's Chrome trace (prof.export_chrome_trace) -> table rows."""
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    kinds = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
    records = []
    for ev in events:
        kind = kinds.get(str(ev.get("cat", "")).lower())
        if kind is None or ev.get("ph") != "X":
            continue
        s, d = float(ev["ts"]), float(ev.get("dur", 0.0))
        name = ev.get("name", "?")
        if kind == "memcpy":
            name = {"memcpy htod": "host to device", "memcpy dtoh": "device to host",
                    "memcpy dtod": "device to device", "memcpy ptop": "peer to peer"}.get(
                        name.lower().split(" (")[0], "other")
        elif kind == "memset":
            name = "memset"
        records.append((kind, name, s, s + d))
    return rows_from_intervals(records)


def torch_table_from_env(run_step, synchronize):
    """TNT_TORCH_KERNEL_TABLE=FILE (for scripts/bench/*_gpu_torch.py): after the timed steps,
    run TNT_TORCH_KERNEL_STEPS (default 2) more steps, run_step(k) each, under PyTorch's
    profiler and write their kernel table to FILE ("%p": the process id). Returns the
    number of steps profiled (0: not asked for)."""
    path = os.environ.get("TNT_TORCH_KERNEL_TABLE", "")
    if not path:
        return 0
    steps = os.environ.get("TNT_TORCH_KERNEL_STEPS", "2")
    if not steps.isdigit() or int(steps) < 1:
        sys.exit(f"TNT_TORCH_KERNEL_STEPS='{steps}': expected a whole number >= 1")
    steps = int(steps)
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for k in range(steps):
            run_step(k)
        synchronize()
    path = path.replace("%p", str(os.getpid()))
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "trace.json")
        prof.export_chrome_trace(trace)
        rows = table_from_chrome_trace(trace)
    write_csv(rows, path)
    print(f"kernel table: {len(rows) - 2} rows over {steps} steps -> {path}", file=sys.stderr)
    return steps


def write_csv(rows, path):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for r in rows:
            w.writerow([r["kind"], r["name"], r["calls"]] + [f"{r[k]:.3f}" for k in HEADER[3:]])
    os.replace(tmp, path)


def read_csv(path):
    with open(path, newline="") as f:
        rd = csv.reader(f)
        header = next(rd, None)
        if header != HEADER:
            raise ValueError(f"{path}: not a kernel table (header {header!r}, expected {','.join(HEADER)})")
        rows = []
        for i, rec in enumerate(rd, start=2):
            if len(rec) != len(HEADER):
                raise ValueError(f"{path}, line {i}: {len(rec)} fields, expected {len(HEADER)}")
            try:
                r = dict(kind=rec[0], name=rec[1], calls=int(rec[2]),
                         **{k: float(v) for k, v in zip(HEADER[3:], rec[3:])})
            except ValueError as e:
                raise ValueError(f"{path}, line {i}: {e}") from None
            rows.append(r)
    kinds = {r["kind"] for r in rows}
    if not {"window", "busy"} <= kinds:
        raise ValueError(f"{path}: no window/busy rows (was the profiled window empty?)")
    return rows


def summary(rows, steps):
    """-> (window_ms, busy_ms, {category: ms}, [(ms, calls, name, category)]) per step; the
    category lines "gemm, older kernels" and "convolution, older kernels" hold the part of
    their category on pre-Hopper kernels (older_generation)."""
    per = 1e-3 / steps
    window = next(r["total_us"] for r in rows if r["kind"] == "window") * per
    busy = next(r["total_us"] for r in rows if r["kind"] == "busy") * per
    cats, kernels = {}, []
    for r in rows:
        if r["kind"] in ("window", "busy"):
            continue
        c = category(r["kind"], r["name"])
        cats[c] = cats.get(c, 0.0) + r["total_us"] * per
        if c in ("gemm", "convolution") and older_generation(r["name"]):
            k = f"{c}, older kernels"
            cats[k] = cats.get(k, 0.0) + r["total_us"] * per
        kernels.append((r["total_us"] * per, r["calls"] / steps, r["name"], c))
    kernels.sort(key=lambda k: -k[0])
    return window, busy, cats, kernels


def short(name, width):
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= width else name[:width - 3] + "..."


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("table", help="a kernel table (CSV)")
    ap.add_argument("--steps", type=int, default=1, help="training steps the table holds (default 1)")
    ap.add_argument("--against", help="a second table to compare with (e.g. PyTorch's)")
    ap.add_argument("--against-steps", type=int, default=None, help="steps in --against (default: --steps)")
    ap.add_argument("--labels", default="ours,pytorch", help="names of the two columns (default ours,pytorch)")
    ap.add_argument("--top", type=int, default=25, help="kernels listed per table (default 25)")
    a = ap.parse_args(argv)
    a.against_steps = a.against_steps or a.steps
    if a.steps < 1 or a.against_steps < 1 or a.top < 0:
        ap.error("--steps and --against-steps must be >= 1, --top >= 0")
    labels = a.labels.split(",")
    if len(labels) != 2 or not all(labels):
        ap.error(f"--labels '{a.labels}': expected two names, e.g. ours,pytorch")
    try:
        tables = [(labels[0], read_csv(a.table), a.steps)]
        if a.against:
            tables.append((labels[1], read_csv(a.against), a.against_steps))
    except (OSError, ValueError) as e:
        print(f"kernel_table: {e}", file=sys.stderr)
        return 2
    sums = [(lab, summary(rows, st)) for lab, rows, st in tables]
    older = [c for c in ("gemm, older kernels", "convolution, older kernels") if any(c in s[2] for _, s in sums)]
    cats = sorted({c for _, s in sums for c in s[2]} - set(older),
                  key=lambda c: -max(s[2].get(c, 0.0) for _, s in sums))
    head = f"{'per step, ms':<24}" + "".join(f"{lab:>12}" for lab, _ in sums)
    if len(sums) == 2:
        head += f"{'difference':>12}"
    print(head)

    def line(label, vals):
        text = f"{label:<24}" + "".join(f"{v:12.3f}" for v in vals)
        if len(vals) == 2:
            text += f"{vals[0] - vals[1]:+12.3f}"
        print(text)

    line("GPU window", [s[0] for _, s in sums])
    line("GPU busy", [s[1] for _, s in sums])
    line("GPU idle (window-busy)", [s[0] - s[1] for _, s in sums])
    for c in cats:
        line("  " + c, [s[2].get(c, 0.0) for _, s in sums])
        for o in older:
            if o.startswith(c + ","):
                line("    on older kernels", [s[2].get(o, 0.0) for _, s in sums])
    for lab, s in sums:
        old = [k for k in s[3] if k[3] in ("gemm", "convolution") and older_generation(k[2])]
        if not old:
            continue
        print(f"\n{lab}: GEMM and convolution kernels built for GPUs before Hopper (on a Hopper GPU: no "
              f"Hopper kernel for these products, often rows off 16 bytes; 'align' = operand alignment "
              f"in elements)")
        for ms, calls, name, c in old[:10]:
            al = _ALIGN.search(name.lower())
            hint = f" [align {al.group(1)}]" if al else ""
            print(f"{ms:9.3f} ms {calls:7.1f} calls  {c:<12} {short(name, 100)}{hint}")
    for lab, s in sums:
        print(f"\n{lab}: the {min(a.top, len(s[3]))} kernels with the most GPU time per step")
        print(f"{'ms':>9} {'share':>6} {'calls':>7}  {'category':<22} name")
        for ms, calls, name, c in s[3][:a.top]:
            share = 100.0 * ms / s[1] if s[1] > 0 else 0.0
            print(f"{ms:9.3f} {share:5.1f}% {calls:7.1f}  {c:<22} {short(name, 110)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
