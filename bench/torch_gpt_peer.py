#!/usr/bin/env python3
"""The PyTorch eager peer of examples/09_char_gpt: the same character-level GPT (token and position embeddings,
pre-norm nn.TransformerEncoderLayer blocks run causally, GELU, dropout 0.1, final LayerNorm, a bias-free head),
the same corpus, batch, accumulation, AdamW groups, warm-up + cosine schedule and clipping, on the CPU with the
same thread count. It prints the training tokens per second of each --log window, as the example does, and the
median over the windows after the first.

    python3 bench/torch_gpt_peer.py [--steps N] [--threads N] ...   (a Python with the PyPI torch wheel)
bench/gpt_vs_torch.sh runs it and the example in turns. Not part of CI.
"""
import argparse
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--data", default="/usr/share/common-licenses")
for name, default in (("steps", 60), ("batch", 16), ("accum", 2), ("ctx", 128), ("dim", 128), ("heads", 4),
                      ("layers", 4), ("log", 10), ("threads", 2)):
    p.add_argument("--" + name, type=int, default=default)
p.add_argument("--lr", type=float, default=1e-3)
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(1337)

if os.path.isdir(a.data):
    files = sorted(os.path.join(a.data, f) for f in os.listdir(a.data))
    files = [f for f in files if os.path.isfile(f) and not os.path.islink(f)]
else:
    files = [a.data]
text = b"".join(open(f, "rb").read() for f in files)
chars = sorted(set(text))
code = {c: i for i, c in enumerate(chars)}
data = torch.tensor([code[c] for c in text], dtype=torch.long)
n_train = len(data) * 9 // 10
vocab = len(chars)


class CharGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab, a.dim)
        self.wpe = nn.Embedding(a.ctx, a.dim)
        self.drop = nn.Dropout(0.1)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(a.dim, a.heads, 4 * a.dim, 0.1, activation="gelu", batch_first=True,
                                       norm_first=True) for _ in range(a.layers))
        self.ln_f = nn.LayerNorm(a.dim)
        self.head = nn.Linear(a.dim, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(a.ctx), persistent=False)

    def forward(self, idx):
        t = idx.size(1)
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(t)))
        for b in self.blocks:
            x = b(x, src_mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.ln_f(x))


model = CharGPT()
decay = [q for q in model.parameters() if q.dim() >= 2]
no_decay = [q for q in model.parameters() if q.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=a.lr, betas=(0.9, 0.95))
warmup, total, min_lr = max(1, a.steps // 10), a.steps + 1, a.lr / 10


def lr_at(s):
    if s < warmup:
        return a.lr * s / warmup
    prog = min(1.0, (s - warmup) / (total - warmup))
    return min_lr + (a.lr - min_lr) * 0.5 * (1 + math.cos(math.pi * prog))


def batch():
    at = torch.randint(0, n_train - a.ctx - 1, (a.batch,))
    x = torch.stack([data[i:i + a.ctx] for i in at])
    y = torch.stack([data[i + 1:i + 1 + a.ctx] for i in at])
    return x, y


model.train()
rates = []
t0 = time.perf_counter()
window = 0
for step in range(a.steps):
    for g in opt.param_groups:
        g["lr"] = lr_at(step)
    opt.zero_grad(set_to_none=True)
    total_loss = 0.0
    for _ in range(a.accum):
        x, y = batch()
        loss = F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        (loss / a.accum).backward()
        total_loss += loss.item() / a.accum
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    window += 1
    if (step + 1) % a.log == 0:
        secs = time.perf_counter() - t0
        rate = window * a.accum * a.batch * a.ctx / secs
        rates.append(rate)
        print(f"step {step + 1:5d}  loss {total_loss:.4f}  {rate:.0f} tokens/s", flush=True)
        window = 0
        t0 = time.perf_counter()
print(f"median tokens/s {statistics.median(rates[1:] if len(rates) > 1 else rates):.0f} (torch {torch.__version__}, "
      f"{a.threads} threads)")
