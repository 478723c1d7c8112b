"""Models of other packages (torchvision, timm) frozen fp32 and int8, against the peers.

    .venv/bin/python bench/bench_zoo.py --lib DIR tv:mobilenet_v3_large timm:mixnet_s ...

For each model (random weights given trained-like BatchNorm statistics,
bench/models.py), 1 thread (--threads N: N for every configuration), one run:
how many core graphs it freezes to, the fp32 error against eager, medians of
qpack fp32 / int8 (oneDNN, calibrated on 4 batches) against ONNX Runtime fp32 /
static QDQ int8 and PyTorch FX PTQ (x86),
the int8 errors against fp32 on 2 held-out batches (qpack vs FX PTQ), and the
threads that worked in each timed block (bench/_timing.py).

torchvision and timm are not qpack's dependencies, and PyPI's torchvision wheel
does not import beside the CPU build of torch 2.13 ("operator torchvision::nms
does not exist": its compiled ops are for another build). The models are plain
Python, so install them apart and let this script import them with
torchvision's fake-op registrations skipped:

    .venv/bin/python -m pip install --no-deps --target DIR torchvision==0.28.0 timm==1.0.29 pillow
"""
import argparse
import sys
import tempfile
import time
import warnings

import torch

import qpack
from _timing import timed
from bench_models import OrtFiles, OrtModel, fx_ptq, set_threads
from models import trained_like


def import_zoo(lib):
    if lib:
        sys.path.insert(0, lib)
    import torch.library as library
    register_fake = library.register_fake
    library.register_fake = lambda *a, **k: (lambda f: f)  # torchvision's ops: not used by the models
    try:
        import timm
        import torchvision
    finally:
        library.register_fake = register_fake
    return torchvision, timm


def rel(a, b):
    if isinstance(b, dict):  # segmentation models' {"out": ..., "aux": ...}: the worst entry
        return max(rel(a[k], b[k]) for k in b)
    return float((a - b).norm() / b.norm())


def ms(fn, x):
    """(median ms, threads that worked) of fn(x), after the process idled SETTLE_S seconds:
    the pools of the configuration timed before (ONNX Runtime's and OpenMP's workers spin
    for a while after their last task) neither take a core from it nor count as its threads
    (at 2 threads, ORT fp32's spinning workers had made qpack int8's block count 3)."""
    time.sleep(SETTLE_S)
    with torch.inference_mode():
        r = timed(lambda: fn(x), min_time=1.0, min_runs=10, max_runs=200, warmup=3)
    return r.median_ms, r.threads_used


SETTLE_S = 0.5


def graphs(f):
    """How many core graphs a frozen model runs: "N graph(s)", or "N graph(s) in P parts"
    when it runs as graphs of its submodules (its own forward did not trace)."""
    report = qpack.graph_report(f)
    if not report:
        return "no graph"
    totals = [ln for ln in report.splitlines() if " nodes in " in ln and " graph(s);" in ln]
    n = sum(int(ln.split(" nodes in ")[1].split(" graph(s)")[0]) for ln in totals)
    parts = report.count("(PyTorch around it):")
    return f"{n} graph(s)" + (f" in {parts} parts" if report.startswith("submodule ") else "")


def zoo_args(doc, batch=False, threads=False):
    """(arguments: .models, .lib, with ``batch`` .batch and .backend, with ``threads``
    .threads; torchvision, timm) from the command line of a zoo script."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("models", nargs="+", help="tv:NAME (torchvision) or timm:NAME")
    p.add_argument("--lib", default=None, help="where torchvision and timm were installed (--target)")
    if threads:
        p.add_argument("--threads", type=int, default=1, help="threads of every configuration")
    if batch:
        p.add_argument("--batch", type=int, default=1, help="images per call")
        p.add_argument("--backend", default="onednn", choices=("onednn", "qnnpack"),
                       help="the int8 graphs' backend")
    args = p.parse_args()
    torchvision, timm = import_zoo(args.lib)
    warnings.filterwarnings("ignore")
    return args, torchvision, timm


def zoo_model(spec, torchvision, timm):
    """(model with trained-like BatchNorm statistics, eval; its input size) for tv:NAME / timm:NAME."""
    src, name = spec.split(":")
    if src == "tv":
        try:  # segmentation / detection models: no pretrained backbone either (no download)
            model = torchvision.models.get_model(name, weights=None, weights_backbone=None)
        except TypeError:
            model = torchvision.models.get_model(name)
    else:
        model = timm.create_model(name, pretrained=False)
    size = 299 if "inception" in name else 224
    if src == "timm":  # the size it was made for (MaxViT-nano: 256)
        size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size", (3, size, size))[-1]
    return trained_like(model.eval(), (2, 3, size, size)), size


def main():
    args, torchvision, timm = zoo_args(__doc__, threads=True)
    head = ["model", "graphs", "fp32 err", "qpack fp32", "ORT fp32", "qpack int8", "ORT int8", "FX x86",
            "int8 err qpack", "int8 err FX", "threads"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for spec in args.models:
        model, size = zoo_model(spec, torchvision, timm)
        g = torch.Generator().manual_seed(5)
        x = torch.randn(1, 3, size, size, generator=g)
        calib = [torch.randn(1, 3, size, size, generator=g) for _ in range(4)]
        held = [torch.randn(2, 3, size, size, generator=g) for _ in range(2)]
        set_threads(args.threads)  # before any configuration is built (bench_models.set_threads)
        with torch.inference_mode():
            ref = model(x)
            refs = [model(h) for h in held]
        # (the example input as ORT's export has it: a forward that reads its input's sizes is
        # traced on that shape, MobileViT's and Twins')
        fp32 = qpack.freeze(model, example_inputs=x, progress=False)
        int8 = qpack.freeze(model, dtype="int8", backend="onednn", example_inputs=calib, progress=False)
        try:
            fx = fx_ptq(model, calib, "x86")
        except Exception as e:  # noqa: BLE001 - a model prepare_fx cannot trace (MobileViT): no FX cells
            print(f"FX PTQ x86 of {spec}: {type(e).__name__}", file=sys.stderr)
            fx = None
        with torch.inference_mode():
            err = rel(fp32(x), ref)
            e8 = sum(rel(int8(h), r) for h, r in zip(held, refs)) / len(held)
            efx = sum(rel(fx(h), r) for h, r in zip(held, refs)) / len(held) if fx is not None else float("nan")
        t, used = {}, {}
        with tempfile.TemporaryDirectory(prefix="qpack-zoo-") as d:
            onnx = OrtFiles(model, x, calib, d)
            k = args.threads
            for label, m in (("qpack fp32", fp32), ("ORT fp32", OrtModel(onnx.fp32(), k)), ("qpack int8", int8),
                             ("ORT int8", OrtModel(onnx.int8(), k)), ("FX x86", fx)):
                if m is None:
                    t[label] = float("nan")
                    continue
                t[label], used[label] = ms(m, x)
        # the threads that worked: one count for every configuration, else each one's
        counts = set(used.values())
        threads = str(counts.pop()) if len(counts) == 1 else ", ".join(f"{k} {n}" for k, n in used.items())
        cells = [spec, graphs(fp32), f"{err:.1e}"] + [f"{t[k]:.2f}" for k in head[3:8]] + [
            f"{e8:.3f}", f"{efx:.3f}", threads]
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
