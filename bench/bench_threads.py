"""Throughput of Python threads sharing one packed object (1 internal thread each).

    .venv/bin/python bench/bench_threads.py [--seconds 1.0]

qpack runs take no lock and release the GIL; PyTorch's QNNPACK packed params
take a mutex on every call. Reports runs/s with 1 and 2 threads and the
scaling ratio (2-thread / 1-thread throughput) for each.
"""
import argparse
import os
import sys
import threading
import time
import warnings

import numpy as np
import torch

import qpack

sys.path.insert(0, os.path.dirname(__file__))
from _timing import fmt_table  # noqa: E402

warnings.filterwarnings("ignore")


def throughput(fn, n_threads, seconds):
    for _ in range(3):  # warm up: primitive creation, state building
        fn()
    counts = [0] * n_threads
    stop = threading.Event()

    def worker(i):
        while not stop.is_set():
            fn()
            counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def cases(m, k, n):
    rng = np.random.default_rng(0)
    w8 = rng.integers(-127, 128, size=(n, k), dtype=np.int8)
    b = rng.standard_normal(n).astype(np.float32)
    xq = rng.integers(0, 256, size=(m, k), dtype=np.uint8)
    x = rng.standard_normal((m, k)).astype(np.float32)
    out = []
    for backend in ("qnnpack", "onednn"):
        lin = qpack.PackedLinear(w8, b, backend=backend, weight_scale=0.02, input_scale=0.05,
                                 input_zero_point=128, output_scale=0.5, output_zero_point=128)
        out.append((f"qpack {backend} static", lambda lin=lin: lin(xq)))
    for engine in ("qnnpack", "x86"):
        torch.backends.quantized.engine = engine
        qw = torch._make_per_tensor_quantized_tensor(torch.from_numpy(w8), 0.02, 0)
        packed = torch.ops.quantized.linear_prepack(qw, torch.from_numpy(b))
        qx = torch._make_per_tensor_quantized_tensor(torch.from_numpy(xq), 0.05, 128)

        def run(packed=packed, qx=qx, engine=engine):
            torch.backends.quantized.engine = engine
            torch.ops.quantized.linear(qx, packed, 0.5, 128)
        out.append((f"torch quantized.linear [{engine}]", run))
    fp = qpack.PackedLinear(rng.standard_normal((n, k)).astype(np.float32), b)
    wt, bt, xt = torch.from_numpy(fp.unpack()[0]), torch.from_numpy(b), torch.from_numpy(x)
    out.append(("qpack onednn fp32", lambda: fp(x)))
    out.append(("torch F.linear fp32", lambda: torch.nn.functional.linear(xt, wt, bt)))
    return out


def conv_cases():
    rng = np.random.default_rng(1)
    w8 = rng.integers(-127, 128, size=(64, 64, 3, 3), dtype=np.int8)
    b = rng.standard_normal(64).astype(np.float32)
    xq = np.ascontiguousarray(rng.integers(0, 256, size=(1, 28, 28, 64), dtype=np.uint8).transpose(0, 3, 1, 2))
    out = []
    for backend in ("qnnpack", "onednn"):
        conv = qpack.PackedConv2d(w8, b, padding=1, backend=backend, weight_scale=0.02, input_scale=0.05,
                                  input_zero_point=128, output_scale=0.5, output_zero_point=128)
        out.append((f"qpack {backend} static conv", lambda conv=conv: conv(xq)))
    for engine in ("qnnpack", "x86"):
        torch.backends.quantized.engine = engine
        qw = torch._make_per_tensor_quantized_tensor(torch.from_numpy(w8), 0.02, 0)
        packed = torch.ops.quantized.conv2d_prepack(qw, torch.from_numpy(b), [1, 1], [1, 1], [1, 1], 1)
        qx = torch._make_per_tensor_quantized_tensor(torch.from_numpy(xq), 0.05, 128)

        def run(packed=packed, qx=qx, engine=engine):
            torch.backends.quantized.engine = engine
            torch.ops.quantized.conv2d(qx, packed, 0.5, 128)
        out.append((f"torch quantized.conv2d [{engine}]", run))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    qpack.set_num_threads(1)
    torch.set_num_threads(1)
    rows = []
    for m, k, n in [(1, 512, 512), (32, 1024, 1024)]:
        for name, fn in cases(m, k, n):
            t1 = throughput(fn, 1, args.seconds)
            t2 = throughput(fn, 2, args.seconds)
            rows.append([f"{m}x{k}->{n}", name, f"{t1:.0f}", f"{t2:.0f}", f"{t2 / t1:.2f}"])
    for name, fn in conv_cases():
        t1 = throughput(fn, 1, args.seconds)
        t2 = throughput(fn, 2, args.seconds)
        rows.append(["3x3 64->64 28x28", name, f"{t1:.0f}", f"{t2:.0f}", f"{t2 / t1:.2f}"])
    print(fmt_table(["shape", "op", "runs/s 1 thread", "runs/s 2 threads", "scaling"], rows))


if __name__ == "__main__":
    main()
