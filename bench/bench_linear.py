"""PackedLinear vs PyTorch: median latency, ratio, packed and original bytes.

    .venv/bin/python bench/bench_linear.py [--threads 1 2] [--min-time 0.3]

Ratio = torch time / qpack time (> 1: qpack is faster). Every pair is
measured side by side in one run.
"""
import argparse
import os
import sys
import warnings

import numpy as np
import torch

import qpack

sys.path.insert(0, os.path.dirname(__file__))
from _timing import fmt_table, median_us  # noqa: E402

warnings.filterwarnings("ignore")
SHAPES = [(1, 512, 512), (32, 1024, 4096), (256, 4096, 1024)]


def torch_static(engine, w_int8, scale, bias):
    torch.backends.quantized.engine = engine
    qw = torch._make_per_tensor_quantized_tensor(torch.from_numpy(w_int8), scale, 0)
    return torch.ops.quantized.linear_prepack(qw, torch.from_numpy(bias))


def torch_dynamic(engine, w_int8, scale, bias):
    torch.backends.quantized.engine = engine
    n, k = w_int8.shape
    lin = torch.ao.nn.quantized.dynamic.Linear(k, n)
    lin.set_weight_bias(torch._make_per_tensor_quantized_tensor(torch.from_numpy(w_int8), scale, 0),
                        torch.from_numpy(bias))
    return lin


def run(threads, min_time):
    rows = []
    rng = np.random.default_rng(0)
    torch.set_num_threads(threads)
    qpack.set_num_threads(threads)
    for m, k, n in SHAPES:
        w = rng.standard_normal((n, k)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        x = rng.standard_normal((m, k)).astype(np.float32)
        wt, bt, xt = map(torch.from_numpy, (w, b, x))
        shape = f"{m}x{k}->{n}"

        # fp32
        lin = qpack.PackedLinear(w, b, backend="onednn", retain=False)
        tq = median_us(lambda: lin(x), min_time=min_time)
        with torch.no_grad():
            tt = median_us(lambda: torch.nn.functional.linear(xt, wt, bt), min_time=min_time)
        rows.append([shape, threads, "fp32", "onednn", "F.linear", f"{tq:.1f}", f"{tt:.1f}", f"{tt / tq:.2f}",
                     lin.nbytes_packed, w.nbytes + b.nbytes])

        # int8 weights
        w8 = np.clip(np.round(w / 0.02), -127, 127).astype(np.int8)
        xq = rng.integers(0, 256, size=(m, k), dtype=np.uint8)
        for backend in ("qnnpack", "onednn"):
            lin = qpack.PackedLinear(w8, b, backend=backend, weight_scale=0.02, input_scale=0.05,
                                     input_zero_point=128, output_scale=0.5, output_zero_point=128,
                                     retain=False)
            tq = median_us(lambda: lin(xq), min_time=min_time)
            for engine in ("qnnpack", "x86"):
                packed = torch_static(engine, w8, 0.02, b)
                qx = torch._make_per_tensor_quantized_tensor(torch.from_numpy(xq), 0.05, 128)
                tt = median_us(lambda: torch.ops.quantized.linear(qx, packed, 0.5, 128), min_time=min_time)
                rows.append([shape, threads, "int8 static", backend, f"quantized.linear[{engine}]",
                             f"{tq:.1f}", f"{tt:.1f}", f"{tt / tq:.2f}", lin.nbytes_packed, w8.nbytes + b.nbytes])
            dyn = qpack.PackedLinear(w8, b, backend=backend, weight_scale=0.02, dynamic=True, retain=False)
            tq = median_us(lambda: dyn(x), min_time=min_time)
            for engine in ("qnnpack", "x86"):
                tl = torch_dynamic(engine, w8, 0.02, b)
                with torch.no_grad():
                    tt = median_us(lambda: tl(xt), min_time=min_time)
                rows.append([shape, threads, "int8 dynamic", backend, f"dynamic.Linear[{engine}]",
                             f"{tq:.1f}", f"{tt:.1f}", f"{tt / tq:.2f}", dyn.nbytes_packed, w8.nbytes + b.nbytes])
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--min-time", type=float, default=0.3)
    args = ap.parse_args()
    rows = []
    for t in args.threads:
        rows += run(t, args.min_time)
    print(fmt_table(["shape MxK->N", "thr", "op", "qpack backend", "torch peer", "qpack us", "torch us",
                     "speedup", "packed B", "original B"], rows))


if __name__ == "__main__":
    main()
