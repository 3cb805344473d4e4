#!/usr/bin/env python3
"""The PyTorch side of scripts/bench/fashion_mnist: the same CNN, global batch, optimizer
and data as build/bin/fashion_mnist, trained on the CPU by 1 process or by N processes
with DistributedDataParallel over gloo.

An epoch is timed the way tarantella's history.csv times it: from the first training step
to the end of the validation pass over the 10000 test images that follows (data loading
and model construction excluded). Every global batch of B samples is cut into contiguous
per-rank slices, as tarantella's distributed dataset does, and DDP averages the ranks'
mean losses, which equals the mean over the global batch when the slices are equal.

Prints, from rank 0, one line per epoch and a machine-readable line:
  RESULT framework=pytorch ranks=R threads=T samples=S epochs=E epoch_seconds=...
         samples_per_s=... test_accuracy=... best_test_accuracy=... (of the first 10 epochs)
"""
import argparse
import gzip
import os
import struct
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def read_idx(path):
    """An IDX file (gzip or plain) as a uint8 tensor of its shape."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        sys.exit(f"{path}: not a u8 IDX file")
    ndim = raw[3]
    shape = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    data = torch.frombuffer(bytearray(raw[4 + 4 * ndim:]), dtype=torch.uint8)
    return data.reshape(shape)


def load_split(data_dir, split):
    def find(base):
        for name in (base, base + ".gz"):
            path = os.path.join(data_dir, name)
            if os.path.isfile(path):
                return path
        sys.exit(f"--data_dir={data_dir}: neither {base} nor {base}.gz exists")

    images = read_idx(find(f"{split}-images-idx3-ubyte"))  # (N, H, W) u8
    labels = read_idx(find(f"{split}-labels-idx1-ubyte"))  # (N,) u8
    x = images.unsqueeze(1).float().div_(255.0)  # (N, 1, H, W) in [0, 1]
    return x, labels.long()


def make_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def rank_slice(batch, rank, ranks):
    """[begin, end) of this rank's part of a global batch: sizes differ by at most one."""
    base, extra = divmod(batch, ranks)
    begin = rank * base + min(rank, extra)
    return begin, begin + base + (1 if rank < extra else 0)


def evaluate(net, x, y, batch, rank, ranks):
    """Test accuracy over all of x, each rank taking its slice of every batch."""
    net.eval()
    correct = torch.zeros(2, dtype=torch.float64)  # (correct, seen)
    with torch.no_grad():
        for start in range(0, x.shape[0], batch):
            n = min(batch, x.shape[0] - start)
            b, e = rank_slice(n, rank, ranks)
            if e > b:
                pred = net(x[start + b:start + e]).argmax(1)
                correct[0] += (pred == y[start + b:start + e]).sum().item()
                correct[1] += e - b
    if ranks > 1:
        dist.all_reduce(correct)
    net.train()
    return (correct[0] / correct[1]).item()


def worker(rank, a, init_file):
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    if a.ranks > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=a.ranks)
    x_train, y_train = load_split(a.data_dir, "train")
    x_test, y_test = load_split(a.data_dir, "t10k")
    if a.samples > 0:
        x_train, y_train = x_train[:a.samples], y_train[:a.samples]
    n = x_train.shape[0]

    torch.manual_seed(a.seed)  # the same initial weights on every rank (DDP broadcasts anyway)
    net = make_cnn()
    model = nn.parallel.DistributedDataParallel(net) if a.ranks > 1 else net
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(a.seed)  # the same shuffle on every rank

    epoch_seconds = []
    accuracy = []
    for epoch in range(a.epochs):
        perm = torch.randperm(n, generator=gen)
        if a.ranks > 1:
            dist.barrier()
        t0 = time.perf_counter()
        loss_sum = torch.zeros(2, dtype=torch.float64)  # (sum of losses, samples) of this rank
        for start in range(0, n, a.batch):
            idx = perm[start:start + a.batch]
            b, e = rank_slice(idx.shape[0], rank, a.ranks)
            xb, yb = x_train[idx[b:e]], y_train[idx[b:e]]  # (b, 1, 28, 28), (b,)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            loss_sum[0] += loss.item() * (e - b)
            loss_sum[1] += e - b
        acc = evaluate(net, x_test, y_test, a.batch, rank, a.ranks)
        if a.ranks > 1:
            dist.all_reduce(loss_sum)
            dist.barrier()
        seconds = time.perf_counter() - t0
        epoch_seconds.append(seconds)
        accuracy.append(acc)
        if rank == 0:
            print(f"epoch {epoch + 1}/{a.epochs}: {seconds:.1f} s, {n / seconds:.1f} samples/s, "
                  f"loss {loss_sum[0] / loss_sum[1]:.4f}, test accuracy {acc:.4f}", flush=True)
    if rank == 0:
        mean_s = sum(epoch_seconds) / len(epoch_seconds)
        print(f"RESULT framework=pytorch ranks={a.ranks} threads={torch.get_num_threads()} samples={n} "
              f"epochs={a.epochs} epoch_seconds={mean_s:.3f} samples_per_s={n / mean_s:.1f} "
              f"test_accuracy={accuracy[-1]:.4f} best_test_accuracy={max(accuracy[:10]):.4f}", flush=True)
    if a.ranks > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--ranks", type=int, default=1, help="processes (DistributedDataParallel over gloo when > 1)")
    ap.add_argument("--threads", type=int, required=True, help="torch threads per process")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--samples", type=int, default=0, help="first N training samples (0 = all)")
    ap.add_argument("--batch", type=int, default=128, help="GLOBAL batch size")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()
    if a.ranks < 1 or a.threads < 1 or a.epochs < 1 or a.batch < a.ranks:
        ap.error("--ranks, --threads and --epochs must be positive and --batch at least --ranks")
    print(f"torch {torch.__version__}", flush=True)
    if a.ranks == 1:
        worker(0, a, None)
        return
    with tempfile.TemporaryDirectory() as tmp:
        # The rendezvous file must not exist beforehand; gloo then talks over loopback TCP.
        mp.spawn(worker, args=(a, os.path.join(tmp, "rendezvous")), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    main()
