#!/usr/bin/env python3
"""The PyTorch peer of bench/bench_cuda.cu: the same expressions at the same size, in eager mode and under
torch.compile, float32 and bfloat16, timed the same way (median of CUDA-event-timed runs after warm-up), printed
in the same format (GB/s counting the same arrays moved, and the fraction of the measured device-to-device copy
bandwidth). Run both on the same device:

    build/bench/bench_cuda [n]      # ember
    python3 bench/torch_cuda_peer.py [n]

  chain         y = a*b + c*d - e          6 arrays
  gelu forward  y = gelu(x*w + b)          4 arrays
  gelu fwd+bwd  forward, then dx, dw, db   11 arrays
"""
import sys

import torch
import torch.nn.functional as F


def median_ms(f, runs=20, warmup=3):
    for _ in range(warmup):
        f()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        f()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


COPY_GBS = 0.0


def report(what, dtype, n, arrays, elem, ms):
    gbs = arrays * n * elem / (ms * 1e-3) / 1e9
    frac = gbs / COPY_GBS if COPY_GBS > 0 else 0.0
    print(f"{what:<28} {dtype:<9} n={n:<10} {ms:9.3f} ms {gbs:8.1f} GB/s  {frac:5.3f} of copy", flush=True)


def chain(a, b, c, d, e):
    return a * b + c * d - e


def gelu_affine(x, w, b):
    return F.gelu(x * w + b)


def bench_dtype(n, dtype, name, compiled):
    dev = "cuda"
    elem = torch.tensor([], dtype=dtype).element_size()
    a, b, c, d, e = (torch.randn(n, device=dev, dtype=dtype) for _ in range(5))
    fns = [("eager", chain, gelu_affine)]
    if compiled:
        fns.append(("compile", torch.compile(chain), torch.compile(gelu_affine)))
    for mode, ch, ga in fns:
        try:
            report(f"chain a*b + c*d - e [{mode}]", name, n, 6, elem, median_ms(lambda: ch(a, b, c, d, e)))
            x, w, bb, dy = (torch.randn(n, device=dev, dtype=dtype) for _ in range(4))
            with torch.no_grad():
                report(f"gelu(x*w + b) fwd [{mode}]", name, n, 4, elem, median_ms(lambda: ga(x, w, bb)))
            xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, bb))

            def fwd_bwd():
                xs.grad = ws.grad = bs.grad = None
                ga(xs, ws, bs).backward(dy)

            report(f"gelu fwd + bwd [{mode}]", name, n, 11, elem, median_ms(fwd_bwd))
        except Exception as ex:  # torch.compile needs a working Triton; say so instead of failing the eager run
            print(f"{mode} {name}: failed ({type(ex).__name__}: {ex})", flush=True)


def main():
    global COPY_GBS
    if not torch.cuda.is_available():
        print("torch_cuda_peer: no CUDA device, nothing measured")
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 64 << 20
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    COPY_GBS = 2 * n * 4 / (ms * 1e-3) / 1e9
    report("copy D2D (reference)", "float32", n, 2, 4, ms)
    compiled = hasattr(torch, "compile")
    for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
        bench_dtype(n, dtype, name, compiled)


if __name__ == "__main__":
    main()
