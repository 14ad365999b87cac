#!/usr/bin/env python3
"""PyTorch's side of bench/bench_cuda_libs.cu: the same matmul (torch.mm, 4096^3 in bf16 and fp32 with TF32, and
fp32 without) and the same ResNet-like conv layer's forward + backward (N=64, C=K=128, 56x56, 3x3, padding 1; input
and weight gradients) with cudnn.benchmark off and on. Prints lines in bench_cuda_libs's format; each figure is the
median of several runs timed with CUDA events.

    python3 bench/torch_cuda_libs_peer.py [--n 4096] [--reps 20]
"""
import argparse
import statistics
import sys


def median_ms(torch, fn, reps, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def bench_matmul(torch, name, dtype, n, reps):
    a = torch.randn(n, n, device="cuda", dtype=torch.float32).to(dtype)
    b = torch.randn(n, n, device="cuda", dtype=torch.float32).to(dtype)
    c = torch.empty(n, n, device="cuda", dtype=dtype)
    ms = median_ms(torch, lambda: torch.mm(a, b, out=c), reps)
    print(f"case=matmul_{name}_{n} ms={ms:.3f} tflops={2.0 * n ** 3 / (ms * 1e-3) / 1e12:.1f}")


def bench_conv(torch, name, dtype, reps):
    F = torch.nn.functional
    x = torch.randn(64, 128, 56, 56, device="cuda").to(dtype).requires_grad_()
    w = (torch.randn(128, 128, 3, 3, device="cuda") * 0.03).to(dtype).requires_grad_()
    gy = torch.randn(64, 128, 56, 56, device="cuda").to(dtype)
    for bench in (False, True):
        torch.backends.cudnn.benchmark = bench

        def fwd():
            with torch.no_grad():
                F.conv2d(x, w, padding=1)

        def fwd_bwd():
            y = F.conv2d(x, w, padding=1)
            torch.autograd.grad(y, (x, w), gy)

        f = median_ms(torch, fwd, reps)
        fb = median_ms(torch, fwd_bwd, reps)
        print(f"case=conv_{name}_n64_c128_56x56_3x3 benchmark={int(bench)} fwd_ms={f:.3f} fwd_bwd_ms={fb:.3f}")
    torch.backends.cudnn.benchmark = False


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("torch_cuda_libs_peer: no CUDA device, nothing measured")
        return 0
    print(f"device {torch.cuda.get_device_name(0)} torch {torch.__version__}")
    bench_matmul(torch, "bf16", torch.bfloat16, args.n, args.reps)
    torch.backends.cuda.matmul.allow_tf32 = True
    bench_matmul(torch, "fp32_tf32", torch.float32, args.n, args.reps)
    torch.backends.cuda.matmul.allow_tf32 = False
    bench_matmul(torch, "fp32", torch.float32, args.n, args.reps)
    torch.backends.cudnn.allow_tf32 = True
    bench_conv(torch, "fp32_tf32", torch.float32, args.reps)
    bench_conv(torch, "bf16", torch.bfloat16, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
