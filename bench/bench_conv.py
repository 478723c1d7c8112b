"""PackedConv2d vs PyTorch: median latency, ratios, packed vs original bytes.

    .venv/bin/python bench/bench_conv.py [--reps N] [--threads 1 2]

Shapes (batch 1): 3x3 conv 64->64 on 56x56 (pad 1); depthwise 3x3, 144
channels on 56x56 (pad 1); 1x1 conv 96->576 on 14x14. fp32 vs F.conv2d (NCHW
and channels_last) and torch.utils.mkldnn; int8 vs torch's quantized conv on
the qnnpack and x86 engines. Ratio = peer median / qpack median (> 1: qpack faster).
"""
import argparse
import statistics
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils.mkldnn

import qpack

warnings.filterwarnings("ignore", message=".*quantiz.*deprecated")

SHAPES = [
    ("3x3 64->64 56x56", 64, 64, 3, 1, 1, 56),
    ("dw3x3 144 56x56", 144, 144, 3, 1, 144, 56),
    ("1x1 96->576 14x14", 96, 576, 1, 0, 1, 14),
]


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def fp32_rows(shape, reps):
    name, cin, cout, k, pad, groups, hw = shape
    w = torch.randn(cout, cin // groups, k, k)
    b = torch.randn(cout)
    x = torch.randn(1, cin, hw, hw)
    xc = x.contiguous(memory_format=torch.channels_last)
    conv = qpack.PackedConv2d(w, b, 1, pad, 1, groups, retain=False)
    ours = {"nchw": median_ms(lambda: conv(x), reps), "channels_last": median_ms(lambda: conv(xc), reps)}
    mod = torch.nn.Conv2d(cin, cout, k, 1, pad, 1, groups).eval()
    with torch.no_grad():
        mod.weight.copy_(w)
        mod.bias.copy_(b)
        mk = torch.utils.mkldnn.to_mkldnn(mod)
        xm = x.to_mkldnn()
        peers = {
            "F.conv2d nchw": (median_ms(lambda: F.conv2d(x, w, b, 1, pad, 1, groups), reps), "nchw"),
            "F.conv2d channels_last": (median_ms(lambda: F.conv2d(xc, w, b, 1, pad, 1, groups), reps), "channels_last"),
            "torch.utils.mkldnn": (median_ms(lambda: mk(xm), reps), "channels_last"),
        }
    nbytes = (conv.nbytes_packed, w.numel() * 4)
    return [(name, "fp32", layout, ours[layout], peer, t, nbytes) for peer, (t, layout) in peers.items()]


def int8_rows(shape, reps):
    name, cin, cout, k, pad, groups, hw = shape
    w = torch.randint(-127, 128, (cout, cin // groups, k, k), dtype=torch.int8)
    b = torch.randn(cout)
    x = torch.randint(0, 256, (1, cin, hw, hw), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    rows = []
    for backend, engine in (("qnnpack", "qnnpack"), ("onednn", "x86")):
        conv = qpack.PackedConv2d(w, b, 1, pad, 1, groups, backend=backend, weight_scale=0.01,
                                  output_scale=0.5, output_zero_point=100, retain=False)
        ours = median_ms(lambda: conv(x, scale=0.05, zero_point=128), reps)
        torch.backends.quantized.engine = engine
        qx = torch._make_per_tensor_quantized_tensor(x, 0.05, 128)
        qw = torch._make_per_tensor_quantized_tensor(w, 0.01, 0)
        packed = torch.ops.quantized.conv2d_prepack(qw, b, [1, 1], [pad, pad], [1, 1], groups)
        peer = median_ms(lambda: torch.ops.quantized.conv2d(qx, packed, 0.5, 100), reps)
        rows.append((name, f"int8 {backend}", "channels_last", ours, f"torch quantized ({engine})", peer,
                     (conv.nbytes_packed, w.numel())))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    print(f"qpack {qpack.__version__}; torch {torch.__version__}; "
          f"{qpack.backends()['onednn']['version']}")
    print("| shape | mode | input | threads | qpack ms | peer | peer ms | ratio | packed / original bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for threads in args.threads:
        qpack.set_num_threads(threads)
        torch.set_num_threads(threads)
        for shape in SHAPES:
            for name, mode, layout, ours, peer, t, (packed, orig) in fp32_rows(shape, args.reps) + int8_rows(shape, args.reps):
                print(f"| {name} | {mode} | {layout} | {threads} | {ours:.3f} | {peer} | {t:.3f} | "
                      f"{t / ours:.2f} | {packed} / {orig} |", flush=True)


if __name__ == "__main__":
    main()
