"""Frozen graphs: a frozen model's whole forward planned once and run by the core.

``qpack.freeze`` first swaps layers (BatchNorm folded, activations fused); then
it traces the result with ``torch.fx`` and lowers every run of ops the core
runs to a qpack graph (``_core.GraphHandle``): activations stay in the core
between ops, NHWC, in uint8 between quantized ops for int8 models. A trace the
core runs entirely is one graph; otherwise segments run on the core with
PyTorch between them. The model keeps its class and layers (saving,
``unfreeze`` and ``memory_report`` work as before); its ``forward`` becomes a
``GraphRunner``. Inputs the graph cannot take (other dtypes or ranks) run the
layers one by one as before.
"""
import copy
import operator

import torch
import torch.nn.functional as F
from torch import nn

from qpack import _core
from qpack.torch import quantize as _q
from qpack.torch.modules import FrozenConv1d, FrozenConv2d, FrozenLinear


class Unsupported(Exception):
    """An fx node the graph cannot run (the model then runs layer by layer)."""


_ACT_MODULES = {nn.ReLU: "relu", nn.Hardswish: "hardswish", nn.Sigmoid: "sigmoid", nn.SiLU: "silu",
                nn.Hardsigmoid: "hardsigmoid"}
_ACT_FUNCS = {F.relu: "relu", torch.relu: "relu", F.hardswish: "hardswish", torch.sigmoid: "sigmoid",
              F.sigmoid if hasattr(F, "sigmoid") else torch.sigmoid: "sigmoid", F.silu: "silu",
              F.hardsigmoid: "hardsigmoid"}
_ACT_METHODS = {"relu": "relu", "sigmoid": "sigmoid"}
_IDENTITY_MODULES = (nn.Identity, nn.Dropout, nn.Dropout2d)


def _activation(node, modules):
    """(activation, act_min, act_max) of an elementwise node, or None."""
    if node.op == "call_module":
        m = modules[node.target]
        if type(m) in _ACT_MODULES:
            return _ACT_MODULES[type(m)], 0.0, 0.0
        if type(m) is nn.ReLU6:
            return "clamp", 0.0, 6.0
        if type(m) is nn.Hardtanh:
            return "clamp", float(m.min_val), float(m.max_val)
        if type(m) is nn.GELU and m.approximate == "none":
            return "gelu", 0.0, 0.0
        return None
    if (node.op == "call_method" and node.target in ("clamp", "clamp_")) or (
            node.op == "call_function" and node.target is torch.clamp):
        lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
        hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo < hi:
            return "clamp", float(lo), float(hi)
        if isinstance(lo, (int, float)) and hi is None and float(lo) == 0.0:
            return "relu", 0.0, 0.0
        return None
    if node.op == "call_function":
        if node.target not in (F.hardtanh, F.hardtanh_) and (
                len(node.args) != 1 or set(node.kwargs) - {"inplace", "approximate"}):
            return None
        if node.target in _ACT_FUNCS and "approximate" not in node.kwargs:
            return _ACT_FUNCS[node.target], 0.0, 0.0
        if node.target is F.relu6:
            return "clamp", 0.0, 6.0
        if node.target in (F.hardtanh, F.hardtanh_):
            lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min_val", -1.0)
            hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max_val", 1.0)
            if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo < hi:
                return "clamp", float(lo), float(hi)
            return None
        if node.target is F.gelu and node.kwargs.get("approximate", "none") == "none":
            return "gelu", 0.0, 0.0
        return None
    if node.op == "call_method" and node.target in _ACT_METHODS and len(node.args) == 1:
        return _ACT_METHODS[node.target], 0.0, 0.0
    return None


def _covers(layer_activation, act):
    """True when an output already clamped by ``layer_activation`` is unchanged by ``act``."""
    name, lo, hi = act
    if layer_activation is None or name not in ("relu", "clamp"):
        return False
    if layer_activation == "relu":
        bounds = (0.0, float("inf"))
    elif layer_activation == "relu6":
        bounds = (0.0, 6.0)
    else:
        bounds = tuple(layer_activation[1:])
    want = (0.0, float("inf")) if name == "relu" else (lo, hi)
    return want[0] <= bounds[0] and bounds[1] <= want[1]


def _ints(v, n):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n


def _is_spatial_mean(node):
    """x.mean((2, 3)) / torch.mean(x, [2, 3], keepdim=...) -> keepdim, else None.
    (Negative dims are left to PyTorch: without shapes, (-2, -1) of a rank-3
    value would be read as the spatial dims of a rank-4 one.)"""
    if not ((node.op == "call_method" and node.target == "mean") or
            (node.op == "call_function" and node.target is torch.mean)):
        return None
    args = list(node.args[1:])
    dims = args[0] if args else node.kwargs.get("dim")
    keepdim = args[1] if len(args) > 1 else node.kwargs.get("keepdim", False)
    if not isinstance(dims, (tuple, list)) or sorted(dims) != [2, 3]:
        return None
    if "dtype" in node.kwargs:
        return None
    return bool(keepdim)


class _Lowering:
    """fx nodes of a layer-frozen model -> the core's values and nodes (f32), one
    segment at a time (segments() feeds it; values from outside become inputs)."""

    def __init__(self, gm, modules=None, open_inputs=False):
        self.gm = gm
        self.modules = modules if modules is not None else dict(gm.named_modules())
        self.open_inputs = open_inputs  # a segment: values from outside become inputs
        self.value_of = {}   # fx node -> value index
        self.values = []     # fx node producing each value (for calibration and qparams)
        self.nodes = []      # dicts for _core.GraphHandle
        self.inputs, self.outputs = [], []
        self.input_nodes = []  # fx nodes feeding the inputs (segments)
        self.members = []      # fx nodes this lowering took over (segments)
        self.layers = []     # the frozen layers the graph holds, in node order
        self.qp = {}         # value -> (scale, zero_point) of the u8 values a torch.ao model defines
        self.output_is_tuple = False

    def new_value(self, fx_node):
        self.values.append(fx_node)
        self.value_of[fx_node] = len(self.values) - 1
        return len(self.values) - 1

    def arg(self, a):
        if isinstance(a, torch.fx.Node) and a not in self.value_of and self.open_inputs:
            self.inputs.append(self.new_value(a))
            self.input_nodes.append(a)
        if not isinstance(a, torch.fx.Node) or a not in self.value_of:
            raise Unsupported(f"argument {a!r}")
        return self.value_of[a]

    def snapshot(self):
        return (len(self.values), len(self.nodes), len(self.inputs), len(self.layers), dict(self.value_of),
                [dict(n) for n in self.nodes[-1:]], dict(self.qp))

    def rollback(self, snap):
        nv, nn_, ni, nl, value_of, last, qp = snap
        del self.values[nv:], self.nodes[nn_:], self.inputs[ni:], self.input_nodes[ni:], self.layers[nl:]
        self.value_of = value_of
        self.qp = qp
        if last:  # an activation fused into the last add is undone too
            self.nodes[-1] = last[0]

    def emit(self, fx_node, kind, inputs, **params):
        out = self.new_value(fx_node)
        self.nodes.append(dict(kind=kind, inputs=[self.arg(i) for i in inputs], output=out, fx=fx_node, **params))
        return out

    def lower_node(self, node):
        m = self.modules.get(node.target) if node.op == "call_module" else None
        if (m is not None and isinstance(m, _IDENTITY_MODULES)) or self.is_eval_dropout(node):
            self.value_of[node] = self.arg(node.args[0])
            return
        if isinstance(m, (FrozenConv1d, FrozenConv2d, FrozenLinear)):
            if len(node.args) != 1:
                raise Unsupported("a layer called with more than its input")
            legacy = m._spec["io"] == "legacy"
            if legacy != (self.value_of.get(node.args[0]) in self.qp):
                raise Unsupported("a torch.ao layer outside its quantized region, or the reverse")
            self.layers.append(m)
            out = self.emit(node, "linear" if isinstance(m, FrozenLinear) else "conv2d", [node.args[0]], layer=m)
            if legacy:
                self.qp[out] = (float(m._spec["output_scale"]), int(m._spec["output_zero_point"]))
            return
        if self.lower_torch_ao(node, m):
            return
        act = _activation(node, self.modules)
        if act is not None:
            name, lo, hi = act
            producer = self.producer(node.args[0])
            if producer is not None and "layer" in producer and _covers(producer["layer"].activation, act):
                # a shared ReLU module after a layer that already fused it: a no-op
                self.value_of[node] = producer["output"]
                return
            src = self.nodes[-1] if self.nodes else None
            # An activation right after an add that nothing else reads is fused into it.
            if (src is not None and src["kind"] == "add" and src.get("activation") is None
                    and src["fx"] is node.args[0] and len(node.args[0].users) == 1):
                src.update(activation=name, act_min=lo, act_max=hi)
                self.value_of[node] = src["output"]
                return
            self.emit_checked(node, "activation", [node.args[0]], activation=name, act_min=lo, act_max=hi)
            return
        if ((node.op == "call_function" and node.target in (operator.add, torch.add, operator.iadd))
                or (node.op == "call_method" and node.target in ("add", "add_"))):
            if len(node.args) != 2 or node.kwargs:
                raise Unsupported("add with alpha or a scalar")
            self.emit_checked(node, "add", list(node.args))
            return
        if ((node.op == "call_function" and node.target in (operator.mul, torch.mul, operator.imul))
                or (node.op == "call_method" and node.target in ("mul", "mul_"))):
            if len(node.args) != 2 or node.kwargs or not all(isinstance(a, torch.fx.Node) for a in node.args):
                raise Unsupported("mul by a scalar")
            self.emit_checked(node, "mul", list(node.args))
            return
        if node.op == "call_function" and node.target in (F.max_pool2d, F.avg_pool2d):
            m = self.functional_pool(node)
        if isinstance(m, nn.MaxPool2d):
            if m.return_indices or _ints(m.dilation, 2) != (1, 1):
                raise Unsupported("dilated or indexed max pooling")
            k, s, p = _ints(m.kernel_size, 2), _ints(m.stride or m.kernel_size, 2), _ints(m.padding, 2)
            self.emit_checked(node, "maxpool2d", [node.args[0]], kernel=k, stride=s, padding=(p[0], p[1], p[0], p[1]),
                      ceil_mode=m.ceil_mode)
            return
        if isinstance(m, nn.AvgPool2d):
            if m.divisor_override is not None:
                raise Unsupported("avg pooling divisor_override")
            k, s, p = _ints(m.kernel_size, 2), _ints(m.stride or m.kernel_size, 2), _ints(m.padding, 2)
            self.emit_checked(node, "avgpool2d", [node.args[0]], kernel=k, stride=s, padding=(p[0], p[1], p[0], p[1]),
                      ceil_mode=m.ceil_mode, count_include_pad=m.count_include_pad)
            return
        if isinstance(m, nn.AdaptiveAvgPool2d) and _ints(m.output_size, 2) == (1, 1):
            self.emit_checked(node, "global_avgpool", [node.args[0]], keepdim=True)
            return
        if ((isinstance(m, nn.AdaptiveAvgPool1d) and _ints(m.output_size, 1) == (1,)) or
                (node.op == "call_function" and node.target is F.adaptive_avg_pool1d
                 and _ints(node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size"), 1) == (1,))):
            self.emit_checked(node, "global_avgpool", [node.args[0]], keepdim=True)
            return
        if (node.op == "call_function" and node.target is F.adaptive_avg_pool2d
                and _ints(node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size"), 2) == (1, 1)):
            self.emit_checked(node, "global_avgpool", [node.args[0]], keepdim=True)
            return
        keep = _is_spatial_mean(node)
        if keep is not None:
            self.emit_checked(node, "global_avgpool", [node.args[0]], keepdim=keep)
            return
        if self.is_flatten(node, m):
            self.emit_checked(node, "flatten", [node.args[0]])
            return
        if node.op == "call_function" and node.target is torch.cat:
            tensors = node.args[0]
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
            if dim != 1 or not isinstance(tensors, (list, tuple)) or not 1 <= len(tensors) <= 8:
                raise Unsupported("concat other than along dim 1")
            self.emit_checked(node, "concat", list(tensors))
            return
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)) and not m.training and m.track_running_stats:
            var, mean = m.running_var.double(), m.running_mean.double()
            g = m.weight.detach().double() if m.weight is not None else torch.ones_like(var)
            b = m.bias.detach().double() if m.bias is not None else torch.zeros_like(var)
            scale = g / torch.sqrt(var + m.eps)
            self.emit_checked(node, "affine", [node.args[0]], scale=scale.float().numpy(),
                      shift=(b - mean * scale).float().numpy())
            return
        raise Unsupported(f"{node.op} {node.target}")

    # ops that keep their input's torch.ao qparams (what PyTorch's quantized kernels do)
    _KEEPS_QPARAMS = ("activation", "maxpool2d", "avgpool2d", "global_avgpool", "flatten")

    def lower_torch_ao(self, node, m):
        """A torch.ao eager-mode quantized model's own ops: Quantize / DeQuantize
        modules and quantized add (their qparams become the values'). True when lowered."""
        try:
            import torch.ao.nn.quantized as nnq
        except ImportError:
            return False
        if isinstance(m, nnq.Quantize):
            if m.dtype != torch.quint8:
                raise Unsupported("Quantize to a dtype other than quint8")
            out = self.emit(node, "quantize", [node.args[0]])
            self.qp[out] = (float(m.scale), int(m.zero_point))
            return True
        if isinstance(m, nnq.DeQuantize):
            self.emit(node, "dequantize", [node.args[0]])
            return True
        q_add = getattr(torch.ops.quantized, "add", None), getattr(torch.ops.quantized, "add_relu", None)
        if node.op == "call_function" and node.target in q_add and node.target is not None:
            a, b, scale, zp = (list(node.args) + [node.kwargs.get("scale"), node.kwargs.get("zero_point")])[:4]
            if not isinstance(scale, (int, float)) or not isinstance(zp, int):
                raise Unsupported("quantized add without constant scale and zero point")
            out = self.emit(node, "add", [a, b],
                            **({"activation": "relu"} if node.target is q_add[1] else {}))
            self.qp[out] = (float(scale), int(zp))
            return True
        return False

    def emit_checked(self, node, kind, inputs, **params):
        """emit() with the torch.ao rule: u8 inputs only where the op keeps qparams."""
        quantized = [self.value_of.get(i) in self.qp for i in inputs if isinstance(i, torch.fx.Node)]
        if any(quantized) and kind not in self._KEEPS_QPARAMS:
            raise Unsupported(f"{kind} on torch.ao quantized values")
        if kind == "activation" and any(quantized) and params.get("activation") not in ("relu", "clamp"):
            raise Unsupported("a quantized activation with its own output qparams")
        out = self.emit(node, kind, inputs, **params)
        if any(quantized):
            self.qp[out] = self.qp[self.value_of[inputs[0]]]
        return out

    def producer(self, fx_node):
        v = self.value_of.get(fx_node) if isinstance(fx_node, torch.fx.Node) else None
        for n in reversed(self.nodes):
            if n["output"] == v:
                return n
        return None

    @staticmethod
    def functional_pool(node):
        """F.max_pool2d / F.avg_pool2d with constant arguments as the module they equal."""
        names = {F.max_pool2d: ["kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"],
                 F.avg_pool2d: ["kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                                "divisor_override"]}[node.target]
        kw = dict(zip(names, node.args[1:]))
        kw.update(node.kwargs)
        if any(isinstance(v, torch.fx.Node) for v in kw.values()):
            raise Unsupported("pooling with traced arguments")
        return (nn.MaxPool2d if node.target is F.max_pool2d else nn.AvgPool2d)(**kw)

    @staticmethod
    def is_eval_dropout(node):
        """F.dropout(x, p, training=False) (fx records a module's self.training as a constant)."""
        if node.op != "call_function" or node.target not in (F.dropout, F.dropout2d):
            return False
        training = node.args[2] if len(node.args) > 2 else node.kwargs.get("training", True)
        return training is False

    @staticmethod
    def is_flatten(node, m):
        if isinstance(m, nn.Flatten):
            return m.start_dim == 1 and m.end_dim == -1
        if node.op == "call_function" and node.target is torch.flatten:
            start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
            end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
            return start == 1 and end == -1
        if node.op == "call_method" and node.target == "flatten":
            start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
            end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
            return start == 1 and end == -1
        return False


def trace(model):
    """fx trace of a layer-frozen model, frozen layers as leaves."""
    class Tracer(torch.fx.Tracer):
        def is_leaf_module(self, m, qualname):
            return isinstance(m, (FrozenConv1d, FrozenConv2d, FrozenLinear)) or super().is_leaf_module(m, qualname)

    graph = Tracer().trace(model)
    try:
        return torch.fx.GraphModule(model, graph)
    except Exception as e:  # noqa: BLE001 - e.g. a submodule named like a GraphModule attribute
        raise Unsupported(f"the traced model cannot become a GraphModule ({type(e).__name__}: {e})") from None


# ---- segments: the parts of a trace the core runs ------------------------------------------

_MIN_SEGMENT_NODES = 2  # a lone elementwise op is cheaper in PyTorch than crossing into the core


def segments(gm):
    """Maximal runs of fx nodes (in trace order) the core runs, each a lowering
    with its own inputs (values from before it) and outputs (values read after
    it). Nodes it cannot run stay in PyTorch between segments."""
    modules = dict(gm.named_modules())
    out, cur = [], None

    def close():
        if cur is None or not cur.nodes:
            return
        members = set(cur.members)
        outs = []
        cur.exported = []  # (member read after the segment, index of its value in outputs)
        for m in cur.members:
            if any(u not in members for u in m.users):
                if cur.value_of[m] not in outs:
                    outs.append(cur.value_of[m])
                cur.exported.append((m, outs.index(cur.value_of[m])))
        cur.outputs = outs
        if outs and (cur.layers or len(cur.nodes) >= _MIN_SEGMENT_NODES):
            out.append(cur)

    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            close()
            cur = None
            continue
        if cur is None:
            cur = _Lowering(gm, modules, open_inputs=True)
        snap = cur.snapshot()
        try:
            cur.lower_node(node)
            cur.members.append(node)
        except Unsupported:
            cur.rollback(snap)
            close()
            cur = None
    close()
    return out


def whole(gm, segs):
    """The single segment that is the whole trace (inputs = placeholders in
    order, outputs = the output node's), or None."""
    if len(segs) != 1:
        return None
    seg = segs[0]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = out_node.args[0]
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    if not all(isinstance(o, torch.fx.Node) for o in outs):
        return None  # dicts, nested or constant outputs: the rewritten trace builds them
    if seg.input_nodes != placeholders or len(outs) != len(seg.outputs):
        return None
    if [seg.value_of.get(o) for o in outs] != seg.outputs:
        return None
    seg.output_is_tuple = isinstance(out_node.args[0], (tuple, list))
    return seg


# ---- per-edge calibration (static int8 graphs) ----------------------------------------

def calibrate(gm, batches, show_progress=None):
    """(min, max) of every float tensor an fx node produces, by node name."""
    ranges = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if torch.is_tensor(out) and out.is_floating_point() and out.numel():
                lo, hi = float(out.min()), float(out.max())
                old = ranges.get(n.name)
                ranges[n.name] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
            return out

    rec = Recorder(gm)
    with torch.no_grad():
        for batch in progress(batches, len(batches), "qpack calibrate", show_progress):
            rec.run(*(batch if isinstance(batch, tuple) else (batch,)))
    return ranges


def value_qparams(seg, ranges):
    """u8 (scale, zero_point) per value of a segment: its own calibrated range,
    except where the op keeps its input's (max pooling, flatten)."""
    qp = {}
    producer = {n["output"]: n for n in seg.nodes}
    for v, fx in enumerate(seg.values):
        n = producer.get(v)
        if n is not None and n["kind"] in ("maxpool2d", "flatten"):
            qp[v] = qp[n["inputs"][0]]
            continue
        if fx.name not in ranges:
            raise Unsupported(f"{fx.name} was not seen in calibration")
        qp[v] = _q.uint8_qparams(*ranges[fx.name])
    return qp


def qparams_by_name(segs, ranges):
    """{fx node name: (scale, zero_point)} for every value of the segments."""
    out = {}
    for seg in segs:
        for v, qp in value_qparams(seg, ranges).items():
            out[seg.values[v].name] = qp
    return out


# ---- running -------------------------------------------------------------------------

def _to_array(t):
    """(physical C-contiguous array, layout) of a CPU float32/uint8 tensor, or None."""
    if not torch.is_tensor(t) or t.device.type != "cpu" or t.dtype not in (torch.float32, torch.uint8) \
            or t.is_quantized or not 1 <= t.dim() <= 4:
        return None
    t = t.detach()
    if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
        return t.permute(0, 2, 3, 1).numpy(), "nhwc"
    return t.contiguous().numpy(), "nchw"


class Segment:
    """One lowered segment: its core graph over the model's layers (by
    reference), f32 at its edges. With per-edge ``qparams`` (qpack's int8) every
    value inside is u8 (quantize after each input, dequantize before each
    output); a torch.ao model's values are u8 where its own Quantize and
    quantized ops put them (``low.qp``)."""

    def __init__(self, low, model, qparams=None):
        names = {id(m): name for name, m in model.named_modules()}
        self.layers = []
        if qparams is not None:
            values = [("u8",) + tuple(qparams[fx.name]) for fx in low.values]
        else:
            values = [("u8",) + tuple(low.qp[v]) if v in low.qp else ("f32", 0.0, 0)
                      for v in range(len(low.values))]
        nodes = []
        for n in low.nodes:
            n = {k: v for k, v in n.items() if k != "fx"}
            if "layer" in n:
                layer = n.pop("layer")
                if layer not in self.layers:
                    self.layers.append(layer)
                n["layer"] = names[id(layer)]
                n["layer_index"] = self.layers.index(layer)
            nodes.append(n)
        inputs, outputs = list(low.inputs), list(low.outputs)
        if qparams is not None:
            f32_in = []
            for v in inputs:
                values.append(("f32", 0.0, 0))
                f32_in.append(len(values) - 1)
                nodes.insert(0, dict(kind="quantize", inputs=[len(values) - 1], output=v))
            f32_out = []
            for v in outputs:
                values.append(("f32", 0.0, 0))
                f32_out.append(len(values) - 1)
                nodes.append(dict(kind="dequantize", inputs=[v], output=len(values) - 1))
            inputs, outputs = f32_in, f32_out
        self.spec = dict(values=values, nodes=nodes, inputs=inputs, outputs=outputs,
                         output_is_tuple=low.output_is_tuple)
        self.handle = None
        self.packed_ids = None

    def graph(self):
        ids = [id(layer._packed) for layer in self.layers]
        if self.handle is None or ids != self.packed_ids:
            nodes = []
            for src in self.spec["nodes"]:
                n = {k: v for k, v in src.items() if k not in ("layer", "layer_index")}
                if "layer_index" in src:
                    n["op"] = self.layers[src["layer_index"]]._packed._h
                nodes.append(n)
            self.handle = _core.GraphHandle(self.spec["values"], nodes, self.spec["inputs"], self.spec["outputs"])
            self.packed_ids = ids
        return self.handle

    def run_arrays(self, arrays):
        outs = self.graph().run([a for a, _ in arrays], [layout for _, layout in arrays])
        return [torch.from_numpy(o).permute(0, 3, 1, 2) if o.ndim == 4 else torch.from_numpy(o) for o in outs]

    def __call__(self, *args):
        arrays = [_to_array(a) for a in args]
        if any(a is None for a in arrays):
            raise _core.InvalidTypeError("a graph segment takes float32 CPU tensors of rank 1 to 4")
        return tuple(self.run_arrays(arrays))


class GraphRunner:
    """The forward of a graph-frozen model.

    The whole trace as one core graph when it lowers entirely; otherwise the
    trace itself with each run of supported ops replaced by a core graph
    (segments) and PyTorch in between. Held in the model instance's
    ``__dict__`` as ``forward`` (the model keeps its class); not a submodule,
    so ``state_dict`` is the layers'. Graphs follow re-packed layers
    (``load_state_dict``); pickling keeps only the model and the per-value
    qparams, and the trace is redone on first use."""

    def __init__(self, model, qparams=None):
        self._model_ref = model
        self._qparams = qparams  # {fx node name: (scale, zero_point)} for int8 graphs
        self._segments = None
        self._gm = None          # the rewritten trace when there are several segments

    def build(self):
        try:
            gm = trace(self._model_ref)
        except Unsupported:
            raise
        except Exception as e:  # noqa: BLE001 - anything fx cannot trace is not a graph
            raise Unsupported(f"trace: {type(e).__name__}") from None
        segs = segments(gm)
        if not segs:
            raise Unsupported("no op the core runs")
        full = whole(gm, segs)
        self._segments = [Segment(seg, self._model_ref, self._qparams) for seg in segs]
        for s in self._segments:
            s.graph()  # validate now
        if full is not None:
            self._gm = None
            return self
        replaced = {}  # a node an earlier segment took over -> its getitem
        for seg, runner in zip(segs, self._segments):
            def qpack_segment(*xs, _run=runner):
                return _run(*xs)
            args = tuple(replaced.get(n, n) for n in seg.input_nodes)
            with gm.graph.inserting_before(seg.members[0]):
                call = gm.graph.call_function(qpack_segment, args)
            items = {}
            for k in reversed(range(len(seg.outputs))):
                with gm.graph.inserting_after(call):
                    items[k] = gm.graph.call_function(operator.getitem, (call, k))
            for node, k in seg.exported:
                node.replace_all_uses_with(items[k])
                replaced[node] = items[k]
            for node in reversed(seg.members):
                gm.graph.erase_node(node)
        gm.recompile()
        self._gm = gm
        return self

    def _ready(self):
        if self._segments is None:
            self.build()

    # single-graph views (tests and reports)
    @property
    def _spec(self):
        self._ready()
        return self._segments[0].spec

    def _graph(self):
        self._ready()
        return self._segments[0].graph()

    @property
    def _handle(self):
        return self._segments[0].handle if self._segments else None

    @_handle.setter
    def _handle(self, value):
        self._ready()
        self._segments[0].handle = value

    @property
    def num_segments(self):
        self._ready()
        return len(self._segments)

    def __call__(self, *args, **kwargs):
        self._ready()
        model = self._model_ref
        if kwargs:
            return type(model).forward(model, *args, **kwargs)
        if self._gm is not None:
            return self._gm(*args)
        seg = self._segments[0]
        arrays = [_to_array(a) for a in args]
        if len(args) != len(seg.spec["inputs"]) or any(a is None for a in arrays):
            return type(model).forward(model, *args)
        try:
            result = seg.run_arrays(arrays)
        except _core.InvalidArgumentError:
            # shapes this graph cannot plan (other ranks): the layers one by one
            return type(model).forward(model, *args)
        return tuple(result) if seg.spec["output_is_tuple"] else result[0]

    def info(self):
        self._ready()
        infos = [s.graph().info() for s in self._segments]
        out = dict(infos[0])
        for k in ("nbytes_packed", "nbytes_workspace", "plans_built", "runs", "num_nodes", "num_values"):
            out[k] = sum(i[k] for i in infos)
        out["segments"] = len(infos)
        return out

    def report(self):
        """One line per node: op, dtype and qparams of its output, layer, what was fused."""
        self._ready()
        lines = []
        for si, seg in enumerate(self._segments):
            if len(self._segments) > 1:
                lines.append(f"segment {si}: {len(seg.spec['inputs'])} input(s), {len(seg.spec['outputs'])} "
                             "output(s), PyTorch around it")
            values = seg.spec["values"]
            runs_on = seg.graph().node_backends()
            for ni, n in enumerate(seg.spec["nodes"]):
                dt, sc, zp = values[n["output"]]
                q = f" scale={sc:.6g} zp={zp}" if dt == "u8" else ""
                extra = ""
                if "layer_index" in n:
                    layer = seg.layers[n["layer_index"]]
                    spec = layer._spec
                    extra = f" {n['layer']} backend={layer.backend}"
                    if spec.get("folded_bn"):
                        extra += " +bn"
                    if spec.get("activation") is not None:
                        extra += f" +{spec['activation']}"
                    extra += f" packed={layer.nbytes_packed}B"
                elif n.get("activation"):
                    extra = f" +{n['activation']}"
                if "layer_index" not in n:  # a backend's own operator, or qpack's C++ code
                    extra += f" backend={runs_on[ni]}"
                ins = ",".join(str(i) for i in n["inputs"])
                lines.append(f"{n['kind']:<15} ({ins}) -> {n['output']} {dt}{q} NHWC/NC{extra}")
        info = self.info()
        lines.append(f"{info['num_nodes']} nodes in {info['segments']} graph(s); packed {info['nbytes_packed']} B, "
                     f"workspace {info['nbytes_workspace']} B (largest plan so far)")
        return "\n".join(lines)

    def __reduce__(self):
        return (GraphRunner, (self._model_ref, self._qparams))

    def __qpk_reduce__(self):
        # qpack.save: a one-graph forward keeps its lowered segment (spec and
        # layers), so a loaded model skips the trace; several segments live
        # in a rewritten trace (closures), which is redone on first use.
        self._ready()
        if self._gm is not None:
            return self.__reduce__()
        return (_restore_runner, (self._model_ref, self._qparams,
                                  [(s.spec, s.layers) for s in self._segments]))

    def __qpk_graphs__(self):
        """The core graphs this forward runs (qpack.save writes them to the file)."""
        self._ready()
        return [s.graph() for s in self._segments]

    def __deepcopy__(self, memo):
        return GraphRunner(copy.deepcopy(self._model_ref, memo), copy.deepcopy(self._qparams, memo))


def _restore_runner(model, qparams, segments):
    """A one-graph GraphRunner from qpack.load (no trace; the graph is made on first use)."""
    runner = GraphRunner(model, qparams)
    runner._segments = []
    for spec, layers in segments:
        seg = Segment.__new__(Segment)
        seg.spec, seg.layers, seg.handle, seg.packed_ids = spec, layers, None, None
        runner._segments.append(seg)
    return runner


def attach(model, qparams=None):
    """Makes ``model`` run on core graphs (f32, or u8 with ``qparams`` by fx node
    name); raises Unsupported when no part of it lowers."""
    runner = GraphRunner(model, qparams).build()
    object.__setattr__(model, "forward", runner)
    if isinstance(model, torch.fx.GraphModule):
        # A GraphModule pickles its __dict__ as its reduce arguments, so the
        # runner (which points back at it) would recurse: pickle it without
        # the runner and attach a new one on load. fx makes a class per
        # GraphModule instance, so this changes this model only.
        type(model).__reduce__ = _graph_module_reduce
        type(model).__deepcopy__ = _graph_module_deepcopy
    return runner


def _without_runner(gm, make):
    """make() with gm's GraphRunner out of its __dict__ (put back after), and
    the runner (None when there was none)."""
    runner = gm.__dict__.pop("forward", None)
    try:
        return make(), runner if isinstance(runner, GraphRunner) else None
    finally:
        if runner is not None:
            gm.__dict__["forward"] = runner


def _reattach(gm, qparams):
    try:
        attach(gm, qparams)
    except Unsupported:
        pass  # layer by layer, as it ran before it was frozen to a graph


def _graph_module_reduce(self):
    (fn, args), runner = _without_runner(self, lambda: torch.fx.GraphModule.__reduce__(self))
    return (_restore_graph_module, (fn, args, runner is not None, runner._qparams if runner is not None else None))


def _graph_module_deepcopy(self, memo):
    new, runner = _without_runner(self, lambda: torch.fx.GraphModule.__deepcopy__(self, memo))
    if runner is not None:
        _reattach(new, copy.deepcopy(runner._qparams, memo))
    return new


def _restore_graph_module(fn, args, had_runner, qparams):
    gm = fn(*args)
    if had_runner:
        _reattach(gm, qparams)
    return gm


def detach(model):
    """Back to the model's own forward (unfreeze)."""
    model.__dict__.pop("forward", None)


def runner_of(model):
    r = model.__dict__.get("forward")
    return r if isinstance(r, GraphRunner) else None


def graph_report(model):
    """The plan of a graph-frozen model, a line per node (op, dtype, qparams,
    layer, backend, what was fused, packed bytes) and the totals; None when the
    model runs layer by layer."""
    r = runner_of(model)
    return None if r is None else r.report()


def progress(iterable, total, desc, enabled):
    """tqdm over ``iterable`` when enabled (None: when stderr is a terminal) and installed."""
    import sys
    if enabled is None:
        enabled = sys.stderr.isatty()
    if enabled:
        try:
            from tqdm import tqdm
        except ImportError:
            return iterable
        return tqdm(iterable, total=total, desc=desc, leave=False)
    return iterable


__all__ = ["GraphRunner", "Segment", "Unsupported", "attach", "calibrate", "detach", "graph_report",
           "progress", "qparams_by_name", "runner_of", "segments", "value_qparams"]
