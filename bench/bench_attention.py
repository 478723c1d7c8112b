"""Scaled dot-product attention, fp32, batch 1: qpack's core kernel
(qpack.torch.attention.scaled_dot_product_attention) against PyTorch's
F.scaled_dot_product_attention on the same tensors, one thread, the two timed in
alternating rounds (medians, microseconds).

    .venv/bin/python bench/bench_attention.py [--reps 50] [--threads 1]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import qpack
from qpack.torch.attention import scaled_dot_product_attention as qpack_sdpa

SHAPES = [  # (name, heads, queries, keys, head dim)
    ("ViT-B/16 @224", 12, 197, 197, 64),
    ("DeiT-S @224", 6, 197, 197, 64),
    ("DeiT-Ti @224", 3, 197, 197, 64),
    ("ViT-L/16 @224", 16, 197, 197, 64),
    ("BERT-base, 128 tokens", 12, 128, 128, 64),
    ("MiniLM, 64 tokens", 12, 64, 64, 32),
]


def median_us(fn, reps):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    qpack.set_num_threads(args.threads)
    print(f"| shape | heads x L x S x D | qpack µs | PyTorch µs | qpack / PyTorch | max abs diff |  ({args.threads} thread(s))")
    print("|---|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for name, h, l, s, d in SHAPES:
        q, k, v = (torch.randn(1, h, n, d, generator=g) for n in (l, s, s))
        with torch.inference_mode():
            diff = (qpack_sdpa(q, k, v) - F.scaled_dot_product_attention(q, k, v)).abs().max().item()
            ours, theirs = [], []
            for _ in range(3):  # alternating rounds
                ours.append(median_us(lambda: qpack_sdpa(q, k, v), args.reps))
                theirs.append(median_us(lambda: F.scaled_dot_product_attention(q, k, v), args.reps))
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"| {name} | {h} x {l} x {s} x {d} | {a:.0f} | {b:.0f} | {a / b:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
