#!/usr/bin/env python3
"""The PyTorch peer of examples/10_fashion_mnist_cuda.cu: the same CNN (conv 3x3 -> batch norm -> ReLU -> max-pool,
twice, then a linear head), the same recipe (SGD with Nesterov momentum 0.9, weight decay 5e-4, one-cycle schedule
to lr 0.1 stepped per batch, batch 128, random horizontal flips and normalisation in a 2-worker loader with pinned
memory, cudnn.benchmark on), and each epoch's wall time measured the same way (the training pass and the test pass
with batches of 1000, from a synchronised start to a synchronised end). bf16 runs under autocast, as ember's
bf16_mixed runs 16-bit activations on fp32 master weights. Run both on the same device:

    build/examples/10_fashion_mnist_cuda --data DIR [--precision bf16]
    python3 bench/torch_cuda_cnn_peer.py DIR [fp32|bf16] [epochs]

DIR holds the four gzip'd IDX files of Fashion-MNIST.
"""
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


class Images(torch.utils.data.Dataset):
    def __init__(self, images, labels, flip):
        self.x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
        self.y = torch.from_numpy(labels.astype(np.int64))
        self.flip = flip

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = (self.x[i] - 0.2860) / 0.3530
        if self.flip and torch.rand(()) < 0.5:
            x = x.flip(-1)
        return x, self.y[i]


def main():
    root = sys.argv[1]
    precision = sys.argv[2] if len(sys.argv) > 2 else "fp32"
    epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    load = lambda name: read_idx(os.path.join(root, name))
    train_set = Images(load("train-images-idx3-ubyte.gz"), load("train-labels-idx1-ubyte.gz"), True)
    test_set = Images(load("t10k-images-idx3-ubyte.gz"), load("t10k-labels-idx1-ubyte.gz"), False)
    train = torch.utils.data.DataLoader(train_set, batch_size=128, shuffle=True, num_workers=2, pin_memory=True,
                                        persistent_workers=True)
    test = torch.utils.data.DataLoader(test_set, batch_size=1000, num_workers=2, pin_memory=True,
                                       persistent_workers=True)
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 0.1, total_steps=epochs * len(train))
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16")
    print(f"{len(train_set)} training and {len(test_set)} test images on {torch.cuda.get_device_name()}, "
          f"precision {precision}, torch {torch.__version__}")
    for epoch in range(epochs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.train()
        for x, y in train:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            with amp:
                loss = F.cross_entropy(model(x).float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss.item()  # as ember's Trainer reads every step's loss
        model.eval()
        correct = 0
        with torch.inference_mode(), amp:
            for x, y in test:
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
                correct += int((model(x).argmax(1) == y).sum())
        torch.cuda.synchronize()
        s = time.perf_counter() - t0
        print(f"epoch {epoch + 1}: {len(train_set)} training and {len(test_set)} test images in {s:.2f} s "
              f"({(len(train_set) + len(test_set)) / s:.0f} images/s), test accuracy {100 * correct / len(test_set):.2f}%")


if __name__ == "__main__":
    main()
