"""Cost of exact oneDNN int8 on ISAs without VNNI: median latency per ISA.

    .venv/bin/python bench/bench_no_vnni.py [--isa native AVX512_CORE AVX2] [--threads 1]

Each ISA runs in a fresh process with ONEDNN_MAX_CPU_ISA set (oneDNN reads it
once). With VNNI qpack runs one fused int8 primitive; without, it splits the
input into halves and runs one u8 x s8 -> s32 primitive over both (twice the
rows or images) plus a C++ epilogue. Compare a column with the native one, or
the same column across builds (PYTHONPATH=<other build> ...).
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _timing import fmt_table, median_us  # noqa: E402

LINEAR = [(1, 512, 512), (32, 1024, 4096), (256, 4096, 1024)]
CONV = [("3x3 64->64 56x56", 64, 64, 3, 1, 1, 56), ("dw3x3 144 56x56", 144, 144, 3, 1, 144, 56),
        ("1x1 96->576 14x14", 96, 576, 1, 0, 1, 14)]


def measure(threads, min_time):
    import qpack

    qpack.set_num_threads(threads)
    rng = np.random.default_rng(0)
    isa = qpack.backends()["onednn"]["version"].split("isa=")[1]
    out = {"isa": isa}
    for m, k, n in LINEAR:
        w = rng.integers(-127, 128, (n, k), dtype=np.int8)
        b = rng.standard_normal(n).astype(np.float32)
        x = rng.integers(0, 256, (m, k), dtype=np.uint8)
        lin = qpack.PackedLinear(w, b, backend="onednn", weight_scale=0.01, output_scale=0.5,
                                 output_zero_point=128)
        out[f"linear static {m}x{k}->{n}"] = median_us(lambda: lin(x, scale=0.04, zero_point=117),
                                                       min_time=min_time)
        xf = rng.standard_normal((m, k)).astype(np.float32)
        dyn = qpack.PackedLinear(w, b, backend="onednn", weight_scale=0.01, dynamic=True)
        out[f"linear dynamic {m}x{k}->{n}"] = median_us(lambda: dyn(xf), min_time=min_time)
    for name, cin, cout, k, pad, groups, hw in CONV:
        w = rng.integers(-127, 128, (cout, cin // groups, k, k), dtype=np.int8)
        b = rng.standard_normal(cout).astype(np.float32)
        x = rng.integers(0, 256, (1, hw, hw, cin), dtype=np.uint8).transpose(0, 3, 1, 2)  # NHWC
        conv = qpack.PackedConv2d(w, b, 1, pad, 1, groups, backend="onednn", weight_scale=0.01,
                                  output_scale=0.5, output_zero_point=128)
        out[f"conv {name} nhwc"] = median_us(lambda: conv(x, scale=0.04, zero_point=117),
                                             min_time=min_time)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--isa", nargs="+", default=["native", "AVX512_CORE", "AVX2"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.threads, args.min_time)))
        return
    results = []
    for isa in args.isa:
        env = dict(os.environ)
        env.pop("ONEDNN_MAX_CPU_ISA", None)
        if isa != "native":
            env["ONEDNN_MAX_CPU_ISA"] = isa
        cmd = [sys.executable, __file__, "--child", "--threads", str(args.threads),
               "--min-time", str(args.min_time)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    cases = [c for c in results[0] if c != "isa"]
    base = results[0]
    headers = ["case"] + [f"{r['isa']} us" for r in results] + \
        [f"{r['isa']} / {base['isa']}" for r in results[1:]]
    rows = [[c] + [f"{r[c]:.1f}" for r in results] + [f"{r[c] / base[c]:.2f}" for r in results[1:]]
            for c in cases]
    print(f"threads={args.threads}")
    print(fmt_table(headers, rows))


if __name__ == "__main__":
    main()
