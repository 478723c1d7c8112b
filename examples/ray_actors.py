"""Frozen models served by Ray actors that all map one packed model file.

    .venv/bin/python examples/ray_actors.py [--actors 2] [--dtype int8|fp32] [--requests 8]

1. Freezes a small convolutional network (static int8, calibrated on random
   batches, or fp32) and writes it with ``qpack.save`` (a .qpk file).
2. Starts a local Ray instance (2 CPUs, no dashboard) and N actors; each
   actor ``qpack.load``s the same file. The packed weights are used in place
   from a read-only shared mapping of the file, so N actors hold one copy of
   them: each actor reports the PSS of its mapping of the file (its share of
   the pages, about the file's size / N) beside its RSS.
3. Sends requests round-robin to the actors and compares every answer with the
   in-process model, bit for bit (actors and driver run one thread each).

What crosses the process boundary is the file's path; the model is never
pickled through Ray's object store. The network is an ``nn.Sequential`` of
torch modules, so unpickling it in a worker needs no code from this script.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch
from torch import nn

import qpack

try:
    import ray
except ImportError:
    sys.exit("this example needs Ray: pip install 'ray>=2.40'")


def make_model(seed=0):
    """A small CNN (about 1.2 M parameters) in plain torch modules."""
    torch.manual_seed(seed)

    def block(cin, cout, stride):
        return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    model = nn.Sequential(*block(3, 32, 2), *block(32, 64, 1), *block(64, 128, 2), *block(128, 256, 2),
                          *block(256, 256, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 100))
    with torch.no_grad():  # give the BatchNorms statistics, as training would
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
    return model.eval()


def file_mapping_kb(path):
    """(RSS, PSS) in kB of this process's mappings of `path` (Linux /proc/self/smaps)."""
    real, rss, pss, mine = os.path.realpath(path), 0, 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                fields = line.split(None, 5)
                if "-" in fields[0] and not fields[0].endswith(":"):
                    mine = len(fields) > 5 and fields[5].strip().removesuffix(" (deleted)") == real
                elif mine and fields[0] in ("Rss:", "Pss:"):
                    if fields[0] == "Rss:":
                        rss += int(fields[1])
                    else:
                        pss += int(fields[1])
    except OSError:  # not Linux
        return None, None
    return rss, pss


def process_kb(field):
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


@ray.remote
class ModelServer:
    """One actor: the model loaded from the shared file, served one request at a time."""

    def __init__(self, path, threads=1):
        torch.set_num_threads(threads)
        qpack.set_num_threads(threads)
        self.path = path
        t = time.perf_counter()
        self.model = qpack.load(path)  # mapped: the packed weights stay pages of the file
        self.load_ms = (time.perf_counter() - t) * 1e3

    def infer(self, x):
        # Ray hands numpy arrays over read-only (zero copy from the object store): copy before torch
        with torch.inference_mode():
            return self.model(torch.from_numpy(np.array(x))).numpy()

    def info(self):
        rss, pss = file_mapping_kb(self.path)
        return {"pid": os.getpid(), "load_ms": self.load_ms, "file_rss_kb": rss, "file_pss_kb": pss,
                "process_rss_kb": process_kb("Rss"), "process_pss_kb": process_kb("Pss")}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--dtype", choices=["int8", "fp32"], default="int8")
    p.add_argument("--requests", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(1)
    qpack.set_num_threads(1)

    gen = torch.Generator().manual_seed(1)
    model = make_model()
    calib = [torch.randn(4, 3, 64, 64, generator=gen) for _ in range(4)]
    if args.dtype == "int8":
        frozen = qpack.freeze(model, dtype="int8", example_inputs=calib, retain=False)
    else:
        frozen = qpack.freeze(model, retain=False)
    requests = [torch.randn(2, 3, 64, 64, generator=gen).numpy() for _ in range(args.requests)]
    with torch.inference_mode():
        expected = [frozen(torch.from_numpy(x)).numpy() for x in requests]

    with tempfile.TemporaryDirectory(prefix="qpack-ray-") as d:
        path = os.path.join(d, "model.qpk")
        qpack.save(frozen, path)
        packed = qpack.memory_report(frozen).nbytes_packed
        print(f"{args.dtype} model: {packed / 2**20:.2f} MB packed, file {os.path.getsize(path) / 2**20:.2f} MB")

        # Ray puts the driver's current directory first on its workers' sys.path; from a checkout of
        # qpack that is not built in place (the repository's root) the source tree would shadow the
        # installed package in the actors. Start Ray from the model's folder instead.
        cwd = os.getcwd()
        os.chdir(d)
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        finally:
            os.chdir(cwd)
        try:
            # 2 CPUs between the actors, so that any number of them can be placed
            actors = [ModelServer.options(num_cpus=min(1.0, 2 / args.actors)).remote(path)
                      for _ in range(args.actors)]
            futures = [actors[i % len(actors)].infer.remote(x) for i, x in enumerate(requests)]
            answers = ray.get(futures, timeout=300)
            infos = ray.get([a.info.remote() for a in actors], timeout=60)
        finally:
            ray.shutdown()

    same = [np.array_equal(a, e) for a, e in zip(answers, expected)]
    print(f"{len(answers)} requests over {len(actors)} actors: {sum(same)} bit-identical to the in-process "
          f"model" + ("" if all(same) else f", {len(same) - sum(same)} DIFFERENT"))
    print("\nactor pid   load ms   file mapped RSS kB   its PSS kB (share)   process RSS MB   process PSS MB")
    for i in infos:
        def mb(kb):
            return "-" if kb is None else f"{kb / 1024:.1f}"
        print(f"{i['pid']:>9}   {i['load_ms']:7.1f}   {i['file_rss_kb'] or '-':>18}   "
              f"{i['file_pss_kb'] or '-':>18}   {mb(i['process_rss_kb']):>14}   {mb(i['process_pss_kb']):>14}")
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
