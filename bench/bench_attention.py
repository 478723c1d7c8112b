"""Scaled dot-product attention, fp32, batch 1: qpack's core kernel
(qpack.torch.attention.scaled_dot_product_attention) against PyTorch's
F.scaled_dot_product_attention on the same tensors, timed side by side in
alternating rounds (bench/_timing.py: medians, and the threads that worked in
each timed block), each row's GFLOP/s (4 L S D per head: the two products) as a
fraction of the peak of that many cores measured in the same run (bench/peak.c).

    .venv/bin/python bench/bench_attention.py [--threads 1]
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _peak  # noqa: E402
from _timing import fmt_table, timed_side_by_side  # noqa: E402

import qpack  # noqa: E402
from qpack.torch.attention import scaled_dot_product_attention as qpack_sdpa  # noqa: E402

SHAPES = [  # (name, heads, queries, keys, head dim)
    ("ViT-B/16 @224", 12, 197, 197, 64),
    ("DeiT-S @224", 6, 197, 197, 64),
    ("DeiT-Ti @224", 3, 197, 197, 64),
    ("ViT-L/16 @224", 16, 197, 197, 64),
    ("BERT-base, 128 tokens", 12, 128, 128, 64),
    ("MiniLM, 64 tokens", 12, 64, 64, 32),
    ("MobileViT-XS 28² (4 patches x 4 heads)", 16, 196, 196, 24),
    ("MobileViT-XS 14² (4 patches x 4 heads)", 16, 49, 49, 30),
]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    qpack.set_num_threads(args.threads)
    peak = _peak.measure()
    fp32_peak = peak.get("fp32_gflops")
    print(f"Peak of one core (bench/peak.c): {fp32_peak} GFLOP/s fp32 ({peak.get('error', peak.get('isa'))}); "
          f"{args.threads} thread(s) asked")

    def share(gflops, threads):
        return f"{gflops:.0f} ({100 * gflops / (fp32_peak * threads):.0f}%)" if fp32_peak else f"{gflops:.0f}"

    rows = []
    g = torch.Generator().manual_seed(0)
    for name, h, l, s, d in SHAPES:
        q, k, v = (torch.randn(1, h, n, d, generator=g) for n in (l, s, s))
        gflop = 4 * h * l * s * d / 1e9
        with torch.inference_mode():
            diff = (qpack_sdpa(q, k, v) - F.scaled_dot_product_attention(q, k, v)).abs().max().item()
            ours, theirs = timed_side_by_side([lambda: qpack_sdpa(q, k, v),
                                               lambda: F.scaled_dot_product_attention(q, k, v)])
        rows.append([name, f"{h} x {l} x {s} x {d}",
                     f"{ours.median_ms * 1e3:.0f}", f"{ours.threads_used} ({ours.cpu_per_wall:.2f})",
                     share(gflop / (ours.median_ms * 1e-3), ours.threads_used),
                     f"{theirs.median_ms * 1e3:.0f}", f"{theirs.threads_used} ({theirs.cpu_per_wall:.2f})",
                     share(gflop / (theirs.median_ms * 1e-3), theirs.threads_used),
                     f"{ours.median_ms / theirs.median_ms:.2f}", f"{diff:.1e}"])
    print(fmt_table(["shape", "heads x L x S x D", "qpack µs", "threads (CPU/wall)", "GFLOP/s (% peak)",
                     "PyTorch µs", "threads (CPU/wall)", "GFLOP/s (% peak)", "qpack / PyTorch",
                     "max abs diff"], rows))


if __name__ == "__main__":
    main()
