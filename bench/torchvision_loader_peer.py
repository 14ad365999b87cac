#!/usr/bin/env python3
"""The torchvision peer of bench_images' loader figures: ImageFolder + DataLoader(num_workers=2, batch_size=64) with
RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize on the training images of the photo set
(scripts/make_photo_set.sh), as users run it:

  pil          torchvision's default loader (PIL.Image.open(...).convert("RGB")) and transforms.v1 on PIL images
  decode_jpeg  torchvision.io.decode_jpeg on the file's bytes, then transforms.v2 on uint8 tensors (antialiased)

Prints images per second for each (after two warm-up batches), with the CPU model and the load average, to compare
with bench_images' "DataLoader" line on the same machine. Each worker runs one thread (torch.set_num_threads(1)),
as a worker of ember's loader does.
usage: ~/.cache/ember/torch-venv/bin/python bench/torchvision_loader_peer.py SET [--images N] [--workers N]
(scripts/deps.sh --bench-python installs torch, torchvision and Pillow into that environment)
"""
import argparse
import os
import time

import torch
import torchvision
from torchvision import transforms as T1
from torchvision.io import ImageReadMode, decode_jpeg, read_file
from torchvision.transforms import v2 as T2

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def decode_loader(path):
    return decode_jpeg(read_file(path), mode=ImageReadMode.RGB)


def worker_init(_):
    torch.set_num_threads(1)


def rate(dataset, workers, images):
    g = torch.Generator()
    g.manual_seed(1)
    loader = torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=workers,
                                         worker_init_fn=worker_init, generator=g, persistent_workers=False)
    n, t0, warm = 0, time.perf_counter(), False
    for x, _ in loader:
        n += x.shape[0]
        if not warm and n >= 128:
            warm, n, t0 = True, 0, time.perf_counter()
        if warm and n >= images:
            break
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("set")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    root = os.path.join(a.set, "train")
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"cpu: {model}\nload average at start: {open('/proc/loadavg').read().strip()}")
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}")
    pil = torchvision.datasets.ImageFolder(root, transform=T1.Compose([
        T1.RandomResizedCrop(224), T1.RandomHorizontalFlip(), T1.ToTensor(), T1.Normalize(MEAN, STD)]))
    dj = torchvision.datasets.ImageFolder(root, loader=decode_loader, transform=T2.Compose([
        T2.RandomResizedCrop(224, antialias=True), T2.RandomHorizontalFlip(), T2.ToDtype(torch.float32, scale=True),
        T2.Normalize(MEAN, STD)]))
    r_pil = rate(pil, a.workers, a.images)
    r_dj = rate(dj, a.workers, a.images)
    print(f"torchvision DataLoader({a.workers} workers), RandomResizedCrop(224) + flip + ToTensor + Normalize, "
          f"batches of 64: PIL {r_pil:.0f} img/s, decode_jpeg {r_dj:.0f} img/s")
    print(f"load average at end: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
