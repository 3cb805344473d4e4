#!/usr/bin/env python3
"""Training steps of scripts/transformer_torch.py's Transformer on one GPU, for
scripts/bench/transformer_gpu: the same structure, batch (sentences x max_length, padded),
optimizer (Adam 0.9/0.997/1e-9) and loss (label smoothing 0.1 over non-padding tokens) as
build/bin/transformer. --dtype bf16 is autocast to bf16 with fp32 parameters (the recipe of
our --dtype=bf16). The strongest PyTorch setup by default (--mode compile): attention by
F.scaled_dot_product_attention (flash or memory-efficient kernels), Adam with fused=True, and
the step's forward and loss under torch.compile (default mode; compiled during the untimed
warm-up, whose seconds are printed as warmup_s); --mode eager drops torch.compile, --no_sdpa
uses the module's own attention. Prints "warmup done warmup_s=X" (flushed) when the warm-up
ends, then "RESULT framework=pytorch ... tokens_per_s=X" (padded tokens per second) over
--steps steps after --warmup untimed ones, timed between two device synchronisations, with
the peak memory of those steps (peak_mib) and the share of real (not padding) tokens in the
rows (real_token_share, source and target together). TNT_TORCH_KERNEL_TABLE=FILE: after the
RESULT line, a kernel table of TNT_TORCH_KERNEL_STEPS (default 2) more steps by PyTorch's
profiler (kernel_table.py); a failure there is reported and leaves the RESULT line standing.

Sentence lengths: --lengths_from DIR takes them from the train shards of our program's
--data_dir (TFRecord files of tf.train.Example with the int64 features "inputs" and
"targets", as build/bin/transformer_data writes them: EOS included), row i of batch k the
(k * sentences + i)-th sentence, cut to max_length; without it each row's lengths are drawn
in [max_length/4, max_length]. --corpus_stats DIR prints those shards' lengths
("CORPUS sentences=N source_mean=S target_mean=T max_length=L real_token_share=R") and
exits without PyTorch (what scripts/bench/transformer_gpu says of ours).
"""
import argparse
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kernel_table  # noqa: E402  (scripts/bench/kernel_table.py, beside this file)

PARAM_SET_NAMES = ["base", "big", "tiny"]  # transformer_torch.PARAM_SETS, checked in main()


# --- the train shards' sentence lengths, without TensorFlow or PyTorch --------------------
def _varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf):
    """(field number, wire type, value) of each field of a protobuf message: value is an int
    (varint) or bytes (length-delimited; fixed-size fields as their bytes)."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value = buf[i:i + n]
            i += n
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"protobuf wire type {wire} not expected")
        yield field, wire, value


def example_counts(record):
    """{feature name: number of int64 values} of a serialized tf.train.Example."""
    counts = {}
    for f, w, features in _fields(record):  # Example.features = 1
        if f != 1 or w != 2:
            continue
        for f2, w2, entry in _fields(features):  # Features.feature = 1: map<string, Feature>
            if f2 != 1 or w2 != 2:
                continue
            name, n = None, 0
            for f3, w3, v in _fields(entry):  # the entry's key = 1, value = 2 (a Feature)
                if f3 == 1 and w3 == 2:
                    name = bytes(v).decode("utf-8", "replace")
                elif f3 == 2 and w3 == 2:
                    for f4, w4, int64_list in _fields(v):  # Feature.int64_list = 3
                        if f4 != 3 or w4 != 2:
                            continue
                        for f5, w5, vals in _fields(int64_list):  # Int64List.value = 1
                            if w5 == 2:  # packed: one value per byte without the high bit
                                n += sum(1 for b in vals if b < 0x80)
                            elif w5 == 0:
                                n += 1
            if name is not None:
                counts[name] = n
    return counts


def corpus_lengths(data_dir):
    """(source, target) lengths of every sentence of the train shards in data_dir (the files
    whose names contain "train", in name order, as our program's reader takes them)."""
    names = sorted(f for f in os.listdir(data_dir) if "train" in f and os.path.isfile(os.path.join(data_dir, f)))
    if not names:
        raise ValueError(f"no train shard in {data_dir}")
    lengths = []
    for name in names:
        with open(os.path.join(data_dir, name), "rb") as f:
            data = f.read()
        i = 0
        while i + 12 <= len(data):  # length (8 bytes), its CRC (4), the record, its CRC (4)
            n = int.from_bytes(data[i:i + 8], "little")
            record = memoryview(data)[i + 12:i + 12 + n]
            if len(record) != n:
                raise ValueError(f"{name}: a record runs past the end of the file")
            counts = example_counts(record)
            if "inputs" not in counts or "targets" not in counts:
                raise ValueError(f"{name}: a record without int64 features 'inputs' and 'targets'")
            lengths.append((counts["inputs"], counts["targets"]))
            i += 12 + n + 4
    if not lengths:
        raise ValueError(f"no sentence in the train shards of {data_dir}")
    return lengths


def length_stats(lengths, max_length):
    """(mean source length, mean target length, real-token share of max_length-token rows)."""
    src = [min(max(s, 1), max_length) for s, _ in lengths]
    tgt = [min(max(t, 1), max_length) for _, t in lengths]
    n = len(lengths)
    return sum(src) / n, sum(tgt) / n, (sum(src) + sum(tgt)) / (2.0 * n * max_length)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--param_set", default="big", choices=PARAM_SET_NAMES)
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
    ap.add_argument("--lengths_from", metavar="DIR", help="sentence lengths from the train shards of our --data_dir")
    ap.add_argument("--corpus_stats", metavar="DIR", help="print the train shards' lengths (CORPUS line) and exit")
    a = ap.parse_args()
    if a.corpus_stats:
        try:
            lengths = corpus_lengths(a.corpus_stats)
            s, t, share = length_stats(lengths, a.max_length)
        except (OSError, ValueError, IndexError) as e:
            sys.exit(f"transformer_gpu_torch: --corpus_stats {a.corpus_stats}: {e}")
        print(f"CORPUS sentences={len(lengths)} source_mean={s:.2f} target_mean={t:.2f} max_length={a.max_length} "
              f"real_token_share={share:.4f}")
        return
    if a.warmup < 1 or a.steps < 1:
        sys.exit("transformer_gpu_torch: need --warmup >= 1 (it compiles) and --steps >= 1")
    lengths = None
    if a.lengths_from:
        try:
            lengths = corpus_lengths(a.lengths_from)
        except (OSError, ValueError, IndexError) as e:
            sys.exit(f"transformer_gpu_torch: --lengths_from {a.lengths_from}: {e}")

    import torch
    from transformer_torch import PARAM_SETS, Transformer, random_batch, smoothed_loss

    if a.param_set not in PARAM_SETS:
        sys.exit(f"transformer_gpu_torch: --param_set {a.param_set}: not one of {sorted(PARAM_SETS)}")
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

    def rows(k):
        if lengths is None:
            return None
        return [lengths[(k * b + i) % len(lengths)] for i in range(b)]

    batches = [random_batch(b, t, a.vocab_size, dev, lengths=rows(k)) for k in range(4)]
    real = sum(int((src != 0).sum()) + int((tgt != 0).sum()) for src, _, tgt in batches)
    real_share = real / (2.0 * b * t * len(batches))
    lengths_from = "corpus" if lengths is not None else "random"

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
    print(f"warmup done warmup_s={compile_s:.1f} steps={a.warmup} mode={a.mode}", flush=True)
    if dev.type == "cuda":
        # Peak over the timed steps only, as resnet50_gpu_torch.py's.
        torch.cuda.reset_peak_memory_stats(dev)
    start = time.perf_counter()
    for k in range(a.steps):
        loss = step(k)
    sync()
    seconds = time.perf_counter() - start
    print(f"RESULT framework=pytorch mode={a.mode} sdpa={int(not a.no_sdpa)} dtype={a.dtype} sentences={b} max_length={t} steps={a.steps} "
          f"ms_per_step={1e3 * seconds / a.steps:.1f} tokens_per_s={b * t * a.steps / seconds:.1f} "
          f"loss={loss.item():.4f} warmup_s={compile_s:.1f} lengths={lengths_from} real_token_share={real_share:.4f} "
          f"torch={torch.__version__}"
          + (f" peak_mib={torch.cuda.max_memory_allocated(dev) / 2**20:.0f}" if dev.type == "cuda" else ""), flush=True)
    try:
        kernel_table.torch_table_from_env(step, sync)  # untimed, after the RESULT line
    except Exception as e:  # the profiler's pass must not cost the measured number
        print(f"transformer_gpu_torch: the kernel table failed: {e.__class__.__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
