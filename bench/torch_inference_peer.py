#!/usr/bin/env python3
"""The PyTorch peer of bench_conv's BM_CnnInference: the same CNN (examples/04: conv(1->32)-BN-ReLU-maxpool,
conv(32->64)-BN-ReLU-maxpool, linear 3136->10) in eval mode under torch.inference_mode, with PyTorch's own
folding (torch.ao.quantization.fuse_modules of conv+bn+relu) beside the plain model, and PyTorch's own int8 model
(eager-mode static quantization, torch.ao.quantization with the x86 backend (fbgemm) and its default qconfig,
calibrated on 8 batches of 64 as bench_conv calibrates ember's), at batch 1 and 64, the same thread count as ember
(2). Images/s, the median of 7 timed sets.

    python3 bench/torch_inference_peer.py [--threads N]
"""
import statistics
import sys
import time

import torch
import torch.nn as nn


def median_s(fn, reps, sets=7, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(sets):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def model():
    torch.manual_seed(3)
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 10)).eval()


class Quantizable(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.m = m
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        return self.dequant(self.m(self.quant(x)))


def int8_model():
    torch.backends.quantized.engine = "x86"
    q = Quantizable(torch.ao.quantization.fuse_modules(model(), [["0", "1", "2"], ["4", "5", "6"]])).eval()
    q.qconfig = torch.ao.quantization.get_default_qconfig("x86")
    torch.ao.quantization.prepare(q, inplace=True)
    with torch.inference_mode():
        for _ in range(8):
            q(torch.randn(64, 1, 28, 28))
    torch.ao.quantization.convert(q, inplace=True)
    return q


def main():
    threads = 2
    if "--threads" in sys.argv:
        threads = int(sys.argv[sys.argv.index("--threads") + 1])
    torch.set_num_threads(threads)
    plain = model()
    fused = torch.ao.quantization.fuse_modules(model(), [["0", "1", "2"], ["4", "5", "6"]])
    quantized = int8_model()
    print(f"torch {torch.__version__}, {threads} threads")
    for batch in (1, 64):
        x = torch.randn(batch, 1, 28, 28)
        for name, m in (("eval", plain), ("fused eval", fused), ("int8", quantized)):
            with torch.inference_mode():
                s = median_s(lambda: m(x), reps=200 if batch == 1 else 10)
            print(f"batch {batch:3d}  {name:11s} {batch / s:9.0f} images/s  ({s * 1e6:8.0f} us)")


if __name__ == "__main__":
    main()
