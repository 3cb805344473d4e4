#!/usr/bin/env python3
"""The Transformer of models/transformer/model.hpp as a PyTorch nn.Module of the same
structure and parameter names, so a checkpoint written by the runtime (safetensors) loads
into it with load_state_dict(strict=True).

    python3 scripts/transformer_torch.py --checkpoint model.safetensors --param_set tiny \\
        --vocab_size 8000          # loads the weights, prints names and parameter count
    python3 scripts/transformer_torch.py --check FILE
        # FILE holds weights plus "check.inputs", "check.decoder_inputs" (i64) and
        # "check.logits" (f32) and the params in its metadata; exits 1 unless this module's
        # logits (inference: no dropout) match within the tolerance printed

Semantics (TensorFlow Model Garden's transformer v2, pre-norm): embeddings scaled by
sqrt(hidden) and zeroed at padding (id 0); sinusoidal position encoding (sin half, then
cos half); attention with bias-free q/k/v/out projections, queries scaled by depth^-0.5,
-1e9 added to masked logits (padding keys; the future in the decoder's self-attention);
LayerNorm eps 1e-6; the output projection is the embedding matrix (logits = x W^T).
"""
import argparse
import json
import math
import struct
import sys

import numpy as np
import torch
import torch.nn as nn

PARAM_SETS = {
    "tiny": dict(hidden_size=32, num_heads=4, filter_size=256),
    "base": dict(hidden_size=512, num_heads=8, filter_size=2048),
    "big": dict(hidden_size=1024, num_heads=16, filter_size=4096),
}
MASK_BIAS = -1e9


def position_encoding(length, hidden, min_timescale=1.0, max_timescale=1.0e4):
    n = hidden // 2
    inc = math.log(max_timescale / min_timescale) / max(n - 1, 1)
    inv = min_timescale * torch.exp(torch.arange(n, dtype=torch.float64) * -inc)
    t = torch.arange(length, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1).float()  # (T, D)


class Attention(nn.Module):
    def __init__(self, hidden, heads, dropout, causal, sdpa=False):
        super().__init__()
        self.heads, self.dropout, self.causal, self.sdpa = heads, dropout, causal, sdpa
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.out_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x, memory, key_ids=None):  # x (B, Tq, D), memory (B, Tk, D), key_ids (B, Tk)
        b, tq, d = x.shape
        tk, h = memory.shape[1], self.heads

        def split(z, t):  # (B, T, D) -> (B, H, T, d)
            return z.view(b, t, h, d // h).transpose(1, 2)

        q = split(self.q_proj(x), tq) * (d // h) ** -0.5
        k, v = split(self.k_proj(memory), tk), split(self.v_proj(memory), tk)
        if self.sdpa:
            # PyTorch's fused attention (flash or memory-efficient kernels): the same
            # function; a boolean mask keeps the keys that take part (every row keeps one).
            keep = None
            if key_ids is not None:
                keep = (key_ids != 0)[:, None, None, :]
            if self.causal and (keep is not None or tq != tk):
                i = torch.arange(tq, device=x.device)[:, None]
                j = torch.arange(tk, device=x.device)[None, :]
                future = (j <= i + (tk - tq))[None, None]
                keep = future if keep is None else keep & future
            o = nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=keep, dropout_p=self.dropout if self.training else 0.0,
                is_causal=self.causal and keep is None, scale=1.0)
            return self.out_proj(o.transpose(1, 2).reshape(b, tq, d))
        logits = q @ k.transpose(-1, -2)  # (B, H, Tq, Tk)
        masked = torch.zeros(b, 1, tq, tk, dtype=torch.bool, device=x.device)
        if key_ids is not None:
            masked = masked | (key_ids == 0)[:, None, None, :]
        if self.causal:
            i = torch.arange(tq, device=x.device)[:, None]
            j = torch.arange(tk, device=x.device)[None, :]
            masked = masked | (j > i + (tk - tq))[None, None]
        logits = logits + masked.float() * MASK_BIAS
        p = nn.functional.dropout(torch.softmax(logits, dim=-1), self.dropout, self.training)
        return self.out_proj((p @ v).transpose(1, 2).reshape(b, tq, d))


class FeedForward(nn.Module):
    def __init__(self, hidden, filt, dropout):
        super().__init__()
        self.linear1 = nn.Linear(hidden, filt)
        self.linear2 = nn.Linear(filt, hidden)
        self.dropout = dropout

    def forward(self, x):
        return self.linear2(nn.functional.dropout(torch.relu(self.linear1(x)), self.dropout, self.training))


class EncoderLayer(nn.Module):
    def __init__(self, p):
        super().__init__()
        d = p["hidden_size"]
        self.post = p["layer_postprocess_dropout"]
        self.self_attn_norm = nn.LayerNorm(d, eps=1e-6)
        self.self_attn = Attention(d, p["num_heads"], p["attention_dropout"], causal=False, sdpa=p["sdpa"])
        self.ffn_norm = nn.LayerNorm(d, eps=1e-6)
        self.ffn = FeedForward(d, p["filter_size"], p["relu_dropout"])

    def forward(self, x, src_ids):
        drop = lambda z: nn.functional.dropout(z, self.post, self.training)
        y = self.self_attn_norm(x)
        x = x + drop(self.self_attn(y, y, src_ids))
        return x + drop(self.ffn(self.ffn_norm(x)))


class DecoderLayer(nn.Module):
    def __init__(self, p):
        super().__init__()
        d = p["hidden_size"]
        self.post = p["layer_postprocess_dropout"]
        self.self_attn_norm = nn.LayerNorm(d, eps=1e-6)
        self.self_attn = Attention(d, p["num_heads"], p["attention_dropout"], causal=True, sdpa=p["sdpa"])
        self.cross_attn_norm = nn.LayerNorm(d, eps=1e-6)
        self.cross_attn = Attention(d, p["num_heads"], p["attention_dropout"], causal=False, sdpa=p["sdpa"])
        self.ffn_norm = nn.LayerNorm(d, eps=1e-6)
        self.ffn = FeedForward(d, p["filter_size"], p["relu_dropout"])

    def forward(self, y, memory, src_ids):
        drop = lambda z: nn.functional.dropout(z, self.post, self.training)
        h = self.self_attn_norm(y)
        y = y + drop(self.self_attn(h, h))
        y = y + drop(self.cross_attn(self.cross_attn_norm(y), memory, src_ids))
        return y + drop(self.ffn(self.ffn_norm(y)))


class Stack(nn.Module):
    def __init__(self, layer, p):
        super().__init__()
        self.layers = nn.ModuleList([layer(p) for _ in range(p["num_hidden_layers"])])
        self.norm = nn.LayerNorm(p["hidden_size"], eps=1e-6)


class Transformer(nn.Module):
    def __init__(self, vocab_size, hidden_size=512, num_hidden_layers=6, num_heads=8, filter_size=2048,
                 layer_postprocess_dropout=0.1, attention_dropout=0.1, relu_dropout=0.1, sdpa=False):
        super().__init__()
        p = dict(hidden_size=hidden_size, num_hidden_layers=num_hidden_layers, num_heads=num_heads,
                 filter_size=filter_size, layer_postprocess_dropout=layer_postprocess_dropout,
                 attention_dropout=attention_dropout, relu_dropout=relu_dropout, sdpa=sdpa)
        self.hidden, self.post = hidden_size, layer_postprocess_dropout
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        nn.init.normal_(self.embedding.weight, 0.0, hidden_size ** -0.5)
        self.encoder = Stack(EncoderLayer, p)
        self.decoder = Stack(DecoderLayer, p)

    def embed(self, ids):  # (B, T) -> (B, T, D)
        e = self.embedding(ids) * math.sqrt(self.hidden) * (ids != 0).unsqueeze(-1).float()
        e = e + position_encoding(ids.shape[1], self.hidden).to(e.device)
        return nn.functional.dropout(e, self.post, self.training)

    def encode(self, src_ids):
        x = self.embed(src_ids)
        for layer in self.encoder.layers:
            x = layer(x, src_ids)
        return self.encoder.norm(x)

    def decode(self, decoder_ids, memory, src_ids):
        y = self.embed(decoder_ids)
        for layer in self.decoder.layers:
            y = layer(y, memory, src_ids)
        return self.decoder.norm(y) @ self.embedding.weight.t()  # (B, T, V)

    def forward(self, src_ids, decoder_ids):
        return self.decode(decoder_ids, self.encode(src_ids), src_ids)


DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8,
          "F16": np.float16}


def smoothed_loss(logits, labels, smoothing=0.1):
    """The program's training loss, for the benchmarks: -sum_j q_j log p_j with q = 1 - s on
    the label and s / (V - 1) elsewhere, over non-padding tokens (label 0), per token. The
    constant minimum entropy changes no gradient and is left out; computed in fp32."""
    v = logits.shape[-1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    conf = 1.0 - smoothing
    low = smoothing / (v - 1)
    xent = -(conf - low) * logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - low * logp.sum(-1)
    mask = (labels != 0).float()
    return (xent * mask).sum() / mask.sum()


def random_batch(sentences, max_length, vocab_size, device="cpu", lengths=None):
    """(source, decoder input, target) ids of `sentences` sentences padded to max_length, each
    of a length drawn in [max_length/4, max_length] ending in EOS (1); the decoder input is the
    target shifted right. For the benchmarks: the compute is that of the padded batch.
    lengths: (source, target) lengths of the rows (EOS included; each cut to [1, max_length]),
    one pair per sentence, instead of the drawn ones (e.g. a corpus's)."""
    b, t = sentences, max_length
    src = torch.zeros(b, t, dtype=torch.long)
    tgt = torch.zeros(b, t, dtype=torch.long)
    for i in range(b):
        for side, ids in enumerate((src, tgt)):
            if lengths is not None:
                n = min(max(int(lengths[i][side]), 1), t)
            else:
                n = int(torch.randint(max(2, t // 4), t + 1, ()))
            ids[i, : n - 1] = torch.randint(2, vocab_size, (n - 1,))
            ids[i, n - 1] = 1
    dec = torch.zeros_like(tgt)
    dec[:, 1:] = tgt[:, :-1]
    return src.to(device), dec.to(device), tgt.to(device)


def read_safetensors(path):
    """(tensors by name, metadata) of a safetensors file (the format of checkpoint.hpp)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    buf = data[8 + n:]
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        if info["dtype"] == "BF16":
            raw = np.frombuffer(buf[begin:end], dtype=np.uint16).astype(np.uint32) << 16
            arr = raw.view(np.float32)
        else:
            arr = np.frombuffer(buf[begin:end], dtype=DTYPES[info["dtype"]])
        tensors[name] = torch.from_numpy(arr.copy().reshape(info["shape"]))
    return tensors, meta


def load_checkpoint(model, path):
    """Loads the weights of a runtime checkpoint (optimizer state and other entries are
    left out) into model, strictly: every parameter must be there with its shape."""
    tensors, meta = read_safetensors(path)
    names = set(model.state_dict().keys())
    model.load_state_dict({k: v for k, v in tensors.items() if k in names}, strict=True)
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint")
    ap.add_argument("--param_set", default="base", choices=sorted(PARAM_SETS))
    ap.add_argument("--vocab_size", type=int, default=33708)
    ap.add_argument("--num_hidden_layers", type=int, default=6)
    ap.add_argument("--check")
    a = ap.parse_args()
    if a.check:
        tensors, meta = read_safetensors(a.check)
        p = {k: int(meta[k]) for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "filter_size")}
        model = Transformer(**p)
        load_checkpoint(model, a.check)
        model.eval()
        with torch.no_grad():
            logits = model(tensors["check.inputs"], tensors["check.decoder_inputs"])
        ref = tensors["check.logits"]
        diff = (logits - ref).abs().max().item()
        # Both compute in float32 with different summation orders and exp implementations;
        # logits are O(1): 1e-4 is ~1000 ulps, far below any structural difference.
        tol = 1e-4 + 1e-4 * ref.abs().max().item()
        print(f"logits {tuple(ref.shape)}: max |torch - tarantella| = {diff:.3g} (tolerance {tol:.3g})")
        sys.exit(0 if diff <= tol else 1)
    p = dict(PARAM_SETS[a.param_set], vocab_size=a.vocab_size, num_hidden_layers=a.num_hidden_layers)
    model = Transformer(**p)
    if a.checkpoint:
        meta = load_checkpoint(model, a.checkpoint)
        print(f"loaded {a.checkpoint} (epoch {meta.get('epoch', '?')}, step {meta.get('step', '?')})")
    for name, t in model.state_dict().items():
        print(f"{name} {tuple(t.shape)}")
    print(f"{sum(t.numel() for t in model.parameters())} parameters")


if __name__ == "__main__":
    main()
