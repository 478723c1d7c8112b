"""Freeze coverage on models of other packages (torchvision, timm): no timing.

    .venv/bin/python bench/check_zoo.py --lib DIR [--backend qnnpack] tv:swin_t timm:cait_xxs24_224 ...

For each model (random weights given trained-like BatchNorm statistics,
bench/models.py), fp32 and static int8 (oneDNN, or QNNPACK with
``--backend qnnpack``; calibrated on 2 batches), one
line: how many core graphs it freezes to, its relative error against eager on
one batch (``--batch`` images, 1 by default), and how many segments ran their ops in PyTorch instead of the core
on that batch (graph_report's "ran its ops in PyTorch instead" lines, with the
first reason). A freeze that raises prints FAILED with the error. Install
torchvision and timm apart, as bench/bench_zoo.py says.
"""
import time

import torch

import qpack
from bench_models import set_threads
from bench_zoo import graphs, rel, zoo_args, zoo_model

FALLBACK = "ran its ops in PyTorch instead: "


def fallbacks(frozen):
    lines = [ln for ln in (qpack.graph_report(frozen) or "").splitlines() if FALLBACK in ln]
    if not lines:
        return "no fallback"
    return f"{len(lines)} fallback(s): {lines[0].split(FALLBACK, 1)[1].rstrip(')')[:160]}"


def main():
    args, torchvision, timm = zoo_args(__doc__, batch=True)
    batch = args.batch
    set_threads(1)
    for spec in args.models:
        start = time.time()
        try:
            model, size = zoo_model(spec, torchvision, timm)
            g = torch.Generator().manual_seed(5)
            x = torch.randn(batch, 3, size, size, generator=g)
            calib = [torch.randn(1, 3, size, size, generator=g) for _ in range(2)]
            cells = []
            with torch.inference_mode():
                ref = model(x)
            for label, kw in (("fp32", dict(example_inputs=x)),
                              ("int8", dict(dtype="int8", backend=args.backend, example_inputs=calib))):
                frozen = qpack.freeze(model, progress=False, **kw)
                with torch.inference_mode():
                    err = rel(frozen(x), ref)
                cells.append(f"{label} err {err:.1e} [{graphs(frozen)}, {fallbacks(frozen)}]")
            print(f"{spec:36s} " + "  ".join(cells) + f"  {time.time() - start:.0f} s", flush=True)
        except Exception as e:  # noqa: BLE001 - one line per model, whatever failed
            print(f"{spec:36s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    main()
