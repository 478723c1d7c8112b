"""Per-node times of the u8 graph nodes QNNPACK can run with its own operators
(add, pools, activations), on QNNPACK's operators and in qpack's C++ code
(QPACK_GRAPH_BACKEND_OPS=0), from QPACK_GRAPH_PROFILE=1's per-node lines.

    python bench/bench_graph_ops.py [--model mobilenet_v2|pools] [--threads N] [--runs R] [--rounds K]

Each (model, where) runs in its own process (the switch is read when a graph
is made); per node the median over the runs after 5 warm-up runs, summed per
node kind. On a loaded machine multi-threaded numbers measure the scheduler:
compare one thread first."""
import argparse
import collections
import os
import re
import subprocess
import sys

KINDS = ("add", "maxpool2d", "avgpool2d", "global_avgpool", "activation")
LINE = re.compile(r"qpack graph node (\d+) (\S+) (\[.*\])(?: on (\w+))? ([\d.]+) us")


def child(model, threads, runs):
    import torch
    from torch import nn
    import qpack
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from models import MobileNetV2, trained_like

    class Pools(nn.Module):
        """ResNet's stem and max pool, an average pool, hardswish, a global mean."""

        def __init__(self):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 64, 7, 2, 3), nn.Conv2d(64, 96, 1)
            self.mp, self.ap, self.hs = nn.MaxPool2d(3, 2, 1), nn.AvgPool2d(3, 1, 1), nn.Hardswish()

        def forward(self, x):
            return self.hs(self.ap(self.c2(self.mp(self.c1(x))))).mean((2, 3))

    torch.manual_seed(0)
    m = trained_like((Pools() if model == "pools" else MobileNetV2()).eval(), (1, 3, 224, 224)).eval()
    f = qpack.freeze(m, dtype="int8", backend="qnnpack", progress=False,
                     example_inputs=[torch.randn(1, 3, 224, 224) for _ in range(2)])
    qpack.set_num_threads(threads)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        for _ in range(runs):
            f(x)


def measure(model, threads, runs, backend_ops):
    env = dict(os.environ, QPACK_GRAPH_PROFILE="1", QPACK_GRAPH_BACKEND_OPS="1" if backend_ops else "0")
    p = subprocess.run([sys.executable, __file__, "--child", "--model", model, "--threads", str(threads),
                        "--runs", str(runs)], env=env, capture_output=True, text=True, check=True)
    per = collections.defaultdict(list)
    for line in p.stderr.splitlines():
        m = LINE.match(line)
        if m:
            per[(int(m.group(1)), m.group(2), m.group(4) or "qpack")].append(float(m.group(5)))
    sums, counts = collections.defaultdict(float), collections.Counter()
    for (_, kind, where), times in per.items():
        if kind in KINDS:
            times = sorted(times[5:])
            sums[(kind, where)] += times[len(times) // 2]
            counts[(kind, where)] += 1
    return sums, counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mobilenet_v2", choices=["mobilenet_v2", "pools"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        return child(a.model, a.threads, a.runs)
    print(f"{a.model}, int8, backend=qnnpack, {a.threads} thread(s): per node kind, sum of per-node medians (us)")
    for r in range(a.rounds):
        for backend_ops in (True, False):
            sums, counts = measure(a.model, a.threads, a.runs, backend_ops)
            for kind, where in sorted(sums):
                print(f"  round {r}  {kind:15s} {counts[(kind, where)]:3d} node(s) on {where:8s} "
                      f"{sums[(kind, where)]:9.1f}")


if __name__ == "__main__":
    main()
