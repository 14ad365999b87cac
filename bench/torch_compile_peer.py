#!/usr/bin/env python3
"""The torch.compile peer of bench/vs_libtorch: one case per run, written as a PyTorch user writes it and compiled
with torch.compile (default mode, Inductor's C++/OpenMP code on the CPU), timed as vs_libtorch times its children:
warm-up (which compiles), repetitions calibrated so that one rep set takes >= 0.3 s (--quick: 0.03 s), 5 rep sets
(--quick: 3), the median seconds per repetition printed as `case=<name> seconds=<s>`. 2 threads.
vs_libtorch --python=PYTHON runs it in its rounds, under the same allocator settings and wait policies as LibTorch;
it needs a torch that imports (scripts/deps.sh --bench-python). --eager times the same code without compiling.

    python3 bench/torch_compile_peer.py --case=NAME [--quick] [--eager]

  chain_16M     a * b + c * d - e over 16M floats
  gelu_bwd_16M  gelu(x * w + b) over 16M floats, forward and backward to x, w, b
  sum_sq_16M    (a * a).sum() over 16M floats
  mlp_train     one training step of the 784-256-128-10 MLP, batch 128, SGD lr 0.05 Nesterov 0.9 (the model
                compiled, the optimizer step eager)
  cnn_train     the same for two conv-BN-ReLU-maxpool blocks and a linear head
The training cases use random images of the same shape as vs_libtorch's (speed does not depend on the pixels).
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from torch_autocast_peer import model  # the examples' MLP and CNN, as the autocast peer builds them

BIG = 16 << 20


def measure(name, fn, quick):
    target, sets = (0.03, 3) if quick else (0.3, 5)
    for _ in range(1 if quick else 2):
        fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        el = time.perf_counter() - t0
        if el >= target / 4:
            break
    reps = max(1, int(-(-target // (el / n))))
    times = []
    for _ in range(sets):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t0) / reps)
    print(f"case={name} seconds={statistics.median(times):.9g}", flush=True)


def big():
    return torch.rand(BIG) * 4 - 2


def main():
    args = sys.argv[1:]
    quick, eager = "--quick" in args, "--eager" in args
    names = [a[len("--case="):] for a in args if a.startswith("--case=")]
    known = ["chain_16M", "gelu_bwd_16M", "sum_sq_16M", "mlp_train", "cnn_train"]
    if len(names) != 1 or names[0] not in known or any(
            a not in ("--quick", "--eager") and not a.startswith("--case=") for a in args):
        sys.exit(f"usage: {sys.argv[0]} --case={'|'.join(known)} [--quick] [--eager]")
    name = names[0]
    torch.set_num_threads(2)
    torch.manual_seed(0)
    compile_ = (lambda f: f) if eager else torch.compile

    if name == "chain_16M":
        a, b, c, d, e = (big() for _ in range(5))
        f = compile_(lambda a, b, c, d, e: a * b + c * d - e)
        measure(name, lambda: f(a, b, c, d, e), quick)
    elif name == "gelu_bwd_16M":
        x, w, b = (big().requires_grad_() for _ in range(3))
        g = torch.ones(BIG)
        f = compile_(lambda x, w, b: F.gelu(x * w + b))

        def step():
            f(x, w, b).backward(g)
            x.grad = w.grad = b.grad = None
        measure(name, step, quick)
    elif name == "sum_sq_16M":
        a = big()
        f = compile_(lambda a: (a * a).sum())
        measure(name, lambda: f(a), quick)
    else:
        m = model(name == "cnn_train")
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True)
        cm = compile_(m)
        xs = torch.randn(8, 128, 1, 28, 28)
        ys = torch.randint(0, 10, (8, 128))
        i = [0]

        def step():
            k = i[0] % 8
            i[0] += 1
            loss = F.cross_entropy(cm(xs[k]), ys[k])
            opt.zero_grad()
            loss.backward()
            opt.step()
        m.train()
        measure(name, step, quick)


if __name__ == "__main__":
    main()
