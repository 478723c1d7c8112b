"""A model with LeakyReLU, PReLU, nearest / bilinear resizes and GELU (a YOLO-like neck
and a segmentation head), frozen fp32 and int8 (both backends): graphs per model (1 =
the whole forward in the core), median time per forward on one thread beside eager,
end-to-end int8 error; and the f32 GELU node in ns per element.

    python bench/bench_graph_ops_more.py [--runs R]

Run it with another build of qpack on PYTHONPATH (an older commit) for the "before"
column: ops that build does not lower split its graph into segments."""
import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import qpack
from qpack import _core
from qpack.torch import graph as G

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import median_us  # noqa: E402
from models import trained_like  # noqa: E402


def cbl(cin, cout, k=3, s=1, act=None):
    return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout),
                         act if act is not None else nn.LeakyReLU(0.1))


class NeckAndHead(nn.Module):
    """Backbone of conv-BN-LeakyReLU (YOLO's) and PReLU stages, a top-down neck (nearest x2
    upsample + concat / add), a bilinear segmentation head, a GELU 1x1 MLP on the top level."""

    def __init__(self):
        super().__init__()
        self.s1, self.s2 = cbl(3, 16, 3, 2), cbl(16, 32, 3, 2)
        self.s3 = cbl(32, 64, 3, 2, nn.PReLU(64))
        self.s4 = cbl(64, 128, 3, 2, nn.PReLU())
        self.lat4, self.lat3 = cbl(128, 64, 1), cbl(64, 64, 1)
        self.mix3 = cbl(128, 64, 3)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.mlp = nn.Sequential(nn.Conv2d(64, 128, 1), nn.GELU(), nn.Conv2d(128, 64, 1))
        self.cls = nn.Conv2d(64, 8, 1)

    def forward(self, x):
        c2 = self.s2(self.s1(x))
        c3 = self.s3(c2)
        c4 = self.s4(c3)
        p4 = self.lat4(c4)
        p3 = self.mix3(torch.cat([self.lat3(c3), self.up(p4)], 1))
        p3 = p3 + self.mlp(p3)
        return F.interpolate(self.cls(p3), size=x.shape[-2:], mode="bilinear", align_corners=False)


def graphs(f):
    r = G.runner_of(f)
    return 0 if r is None else (1 if r._gm is None else r.num_segments)


def rel_err(a, b):
    return float((a - b).norm() / b.norm())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    qpack.set_num_threads(1)
    torch.manual_seed(0)
    shape = (1, 3, 256, 256)
    model = trained_like(NeckAndHead().eval(), shape).eval()
    x = torch.randn(shape)
    print(f"qpack from {os.path.dirname(qpack.__file__)}; NeckAndHead {shape}, 1 thread, median of "
          f"{args.runs}+ runs (us)")
    with torch.no_grad():
        ref = model(x)
        eager = median_us(lambda: model(x), min_iters=args.runs)
        print(f"{'eager fp32':<24} {eager:10.0f}")
        rows = [("fp32", qpack.freeze(model, progress=False))]
        for backend in ("onednn", "qnnpack"):
            calib = [torch.randn(shape) for _ in range(3)] + [x]
            rows.append((f"int8 {backend}", qpack.freeze(model, dtype="int8", example_inputs=calib,
                                                          backend=backend, progress=False)))
        for name, f in rows:
            t = median_us(lambda: f(x), min_iters=args.runs)
            print(f"{name:<24} {t:10.0f}  graphs={graphs(f)}  eager/qpack={eager / t:5.2f}  "
                  f"rel err vs eager={rel_err(f(x), ref):.2e}")
    n = 1 << 20
    xs = np.linspace(-8, 8, n, dtype=np.float32).reshape(n // 256, 256)  # rank 2: no layout work
    g = _core.GraphHandle([("f32", 0, 0)] * 2, [dict(kind="activation", inputs=[0], output=1, activation="gelu")],
                          [0], [1])
    t = median_us(lambda: g.run([xs], ["nchw"]), min_iters=args.runs)
    tt = median_us(lambda: F.gelu(torch.from_numpy(xs)), min_iters=args.runs)
    print(f"GELU f32 node, {n} values: {1e3 * t / n:.2f} ns/elem (torch F.gelu {1e3 * tt / n:.2f} ns/elem)")


if __name__ == "__main__":
    main()
