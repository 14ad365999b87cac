#!/usr/bin/env python3
"""The Python peer of `vs_libtorch --precision=bf16`: PyTorch's own CPU autocast (torch.autocast("cpu",
dtype=torch.bfloat16)) on the same cases, as a PyTorch user writes them, to check that the LibTorch C++ autocast
figures of vs_libtorch are what Python users get. Same thread count (2), same models, batch, optimizer and
pre-normalised images as vs_libtorch's training cases (random images of the same shape: speed does not depend on
the pixels), fp32 and bf16 in one run.

    python3 bench/torch_autocast_peer.py [--quick]

  matmul_N     torch.mm of two N x N matrices already in the dtype (GFLOP/s, median of 7 timed sets)
  mlp_train    784-256-128-10 MLP, batch 128, SGD lr 0.05 Nesterov 0.9 (training images/s)
  cnn_train    two conv-BN-ReLU-maxpool blocks and a linear head, same optimizer (training images/s)
"""
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def median_s(fn, reps, sets=7, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(sets):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def matmul(n, dtype, sets):
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    s = median_s(lambda: torch.mm(a, b), reps=3 if n <= 1024 else 1, sets=sets)
    return 2.0 * n ** 3 / s / 1e9


def model(cnn):
    if not cnn:
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 10))


def train(cnn, bf16, steps):
    torch.manual_seed(0)
    m = model(cnn)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    bs = 128
    xs = torch.randn(16, bs, 1, 28, 28)
    ys = torch.randint(0, 10, (16, bs))
    m.train()

    def step(i):
        x, y = xs[i % 16], ys[i % 16]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for i in range(5):
        step(i)
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    return steps * bs / (time.perf_counter() - t0)


def main():
    quick = "--quick" in sys.argv[1:]
    torch.set_num_threads(2)
    torch.set_num_interop_threads(1)
    sets = 3 if quick else 7
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{'mkldnn bf16 supported' if torch.backends.mkldnn.is_available() else 'no mkldnn'}")
    for n in (1024, 2048):
        f32 = matmul(n, torch.float32, sets)
        b16 = matmul(n, torch.bfloat16, sets)
        print(f"case=matmul_{n} fp32={f32:.1f}GFLOP/s bf16={b16:.1f}GFLOP/s bf16/fp32={b16 / f32:.2f}", flush=True)
    steps = 60 if quick else 200
    for name, cnn in (("mlp_train", False), ("cnn_train", True)):
        runs = {False: [], True: []}
        for _ in range(3):  # alternate fp32 and bf16, medians of three
            for bf16 in (False, True):
                runs[bf16].append(train(cnn, bf16, steps))
        f32, b16 = statistics.median(runs[False]), statistics.median(runs[True])
        print(f"case={name} fp32={f32:.0f}images/s autocast_bf16={b16:.0f}images/s bf16/fp32={b16 / f32:.2f}",
              flush=True)


if __name__ == "__main__":
    main()
