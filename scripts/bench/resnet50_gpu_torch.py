#!/usr/bin/env python3
"""The PyTorch side of scripts/bench/resnet50_gpu: ResNet-50 v1.5 training steps on one GPU
with synthetic data generated once on the device, the same recipe as build/bin/resnet50
(SGD momentum 0.9, weight decay 1e-4 on everything but BatchNorm, softmax cross-entropy
with the same label smoothing), batch 256, in either memory format: channels_last (the model
and the input .to(memory_format=torch.channels_last): NHWC activations and filters, what
ours does with --data_format=channels_last) or channels_first (NCHW).

TNT_TORCH_KERNEL_TABLE=FILE: after the timed steps and the RESULT line, a kernel table of
TNT_TORCH_KERNEL_STEPS (default 2) more, by PyTorch's profiler (scripts/bench/kernel_table.py);
a failure there is reported and leaves the RESULT line standing.

Precision as ours: fp32 lets cuDNN convolutions use TF32 (our convolutions ask cuDNN for
its default math, which allows TF32 on Ampere and newer) but keeps matrix products (the
Dense layer) in full FP32, as our cuBLAS handle does. bf16 is autocast (fp32 master
weights), the usual PyTorch mixed precision.

--mode compile (the default) is PyTorch's strongest setup without hand-written kernels:
cuDNN's algorithm search (torch.backends.cudnn.benchmark), SGD with fused=True, and the
model's forward and loss under torch.compile (default mode), compiled during the untimed
warm-up (its seconds are printed as warmup_s). --mode eager is the same without
torch.compile; --mode plain is eager with cuDNN's heuristics and the for-each SGD (the
defaults a script gets without tuning).

The model is torchvision.models.resnet50 when torchvision imports, else the ResNet-50 v1.5
below (same layers, names and parameter count). Warm-up steps are not timed; the timed
steps run back to back and are timed between two device synchronisations. Prints
"warmup done warmup_s=X" (flushed) when the warm-up ends, then one line:
  RESULT framework=pytorch model=torchvision dtype=fp32 format=channels_last batch=256 steps=50 images_per_s=...
         peak_allocated_mib=... peak_reserved_mib=... gpu="..."
"""
import argparse
import sys
import time

import torch
import torch.nn as nn

import kernel_table  # scripts/bench/kernel_table.py, beside this file

RESNET50_PARAMETERS = 25_557_032  # with 1000 classes (the number, and torchvision's)


# --- ResNet-50 v1.5, for machines without torchvision ---------------------------------
# The stride of a downsampling bottleneck is on its 3x3 convolution (v1.5); the shortcut
# is a strided 1x1 convolution and a batch norm. Names follow torchvision.
class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch, width, stride):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out_ch))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_ch = 64
        for i, (width, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]):
            layers = []
            for b in range(blocks):
                layers.append(Bottleneck(in_ch, width, stride if b == 0 else 1))
                in_ch = width * Bottleneck.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*layers))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def make_model(num_classes):
    try:
        import torchvision
        try:
            return torchvision.models.resnet50(weights=None, num_classes=num_classes), "torchvision"
        except TypeError:  # torchvision older than 0.13 has no weights= argument
            return torchvision.models.resnet50(pretrained=False, num_classes=num_classes), "torchvision"
    except Exception as e:  # not installed, or a torch/torchvision version mismatch
        print(f"resnet50_gpu_torch: torchvision.models.resnet50 unavailable ({e}); "
              "using the ResNet-50 v1.5 of this file", file=sys.stderr)
        return ResNet50(num_classes), "handwritten"


def ours_sgd(model, lr, fused=False):
    """SGD as models/resnet50 trains: momentum 0.9, weight decay 1e-4 on everything but BatchNorm."""
    bn_params = {id(p) for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                 for p in m.parameters()}
    decay = [p for p in model.parameters() if id(p) not in bn_params]
    no_decay = [p for p in model.parameters() if id(p) in bn_params]
    return torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}],
                           lr=lr, momentum=0.9, **({"fused": True} if fused else {}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--image_size", type=int, default=224)
    ap.add_argument("--num_classes", type=int, default=1000)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--memory_format", choices=["channels_last", "channels_first"], default="channels_last")
    ap.add_argument("--steps", type=int, default=50, help="timed steps")
    ap.add_argument("--warmup", type=int, default=11, help="untimed steps before them")
    ap.add_argument("--label_smoothing", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--mode", choices=["compile", "eager", "plain"], default="compile")
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 1 or a.batch < 1:
        sys.exit("resnet50_gpu_torch: need --steps >= 1, --warmup >= 1 (it compiles), --batch >= 1")
    if not torch.cuda.is_available():
        sys.exit("resnet50_gpu_torch: torch.cuda.is_available() is False: no CUDA device for PyTorch "
                 f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = a.mode != "plain"
    torch.manual_seed(a.seed)

    model, which = make_model(a.num_classes)
    if a.num_classes == 1000:
        n = sum(p.numel() for p in model.parameters())
        if n != RESNET50_PARAMETERS:
            sys.exit(f"resnet50_gpu_torch: the {which} model has {n} parameters, expected {RESNET50_PARAMETERS}")
    memory_format = torch.channels_last if a.memory_format == "channels_last" else torch.contiguous_format
    model = model.to(dev, memory_format=memory_format).train()  # as ours with --data_format

    opt = ours_sgd(model, a.lr, fused=a.mode != "plain")
    loss_fn = nn.CrossEntropyLoss(label_smoothing=a.label_smoothing)

    # One batch generated once on the device: random images in [-1, 1), random labels.
    g = torch.Generator(device=dev).manual_seed(a.seed)
    x = torch.rand(a.batch, 3, a.image_size, a.image_size, device=dev, generator=g) * 2 - 1  # (N, 3, S, S)
    x = x.contiguous(memory_format=memory_format)
    y = torch.randint(0, a.num_classes, (a.batch,), device=dev, generator=g)  # (N,)

    use_bf16 = a.dtype == "bf16"

    def forward_loss(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16):
            return loss_fn(model(x), y)

    if a.mode == "compile":
        forward_loss = torch.compile(forward_loss)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = forward_loss(x, y)
        loss.backward()
        opt.step()
        return loss

    warm = time.perf_counter()
    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - warm
    print(f"warmup done warmup_s={warmup_s:.1f} steps={a.warmup} mode={a.mode}", flush=True)
    # Peak over the timed steps only; warm-up allocations (cuDNN workspaces) are the same
    # size in every step, so the peak is a steady-state training step's.
    torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    final_loss = loss.item()
    if final_loss != final_loss:
        sys.exit("resnet50_gpu_torch: the loss is NaN")

    mib = 1024.0 * 1024.0
    name = torch.cuda.get_device_name(dev).replace('"', "'")
    print(f"RESULT framework=pytorch mode={a.mode} model={which} dtype={a.dtype} format={a.memory_format} batch={a.batch} "
          f"steps={a.steps} "
          f"warmup={a.warmup} images_per_s={a.batch * a.steps / seconds:.1f} "
          f"ms_per_step={1e3 * seconds / a.steps:.2f} "
          f"peak_allocated_mib={torch.cuda.max_memory_allocated(dev) / mib:.0f} "
          f"peak_reserved_mib={torch.cuda.max_memory_reserved(dev) / mib:.0f} "
          f"loss={final_loss:.4f} warmup_s={warmup_s:.1f} torch={torch.__version__} gpu=\"{name}\"", flush=True)
    try:
        kernel_table.torch_table_from_env(lambda k: step(), torch.cuda.synchronize)  # untimed, after the RESULT line
    except Exception as e:  # the profiler's pass must not cost the measured number
        print(f"resnet50_gpu_torch: the kernel table failed: {e.__class__.__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
