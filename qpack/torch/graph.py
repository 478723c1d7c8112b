"""Frozen graphs: a frozen model's whole forward planned once and run by the core.

``qpack.freeze`` first swaps layers (BatchNorm folded, activations fused); then,
when a ``torch.fx`` trace of the result holds only ops the core runs, it lowers
the trace to a qpack graph (``_core.GraphHandle``): activations stay in the
core between ops, NHWC, in uint8 between quantized ops for int8 models. The
model keeps its class and layers (saving, ``unfreeze`` and ``memory_report``
work as before); its ``forward`` becomes a ``GraphRunner`` that feeds the
graph. Inputs the graph cannot take (other dtypes or ranks) run the layers
one by one as before.
"""
import operator

import torch
import torch.nn.functional as F
from torch import nn

from qpack import _core
from qpack.torch import quantize as _q
from qpack.torch.modules import FrozenConv2d, FrozenLinear


class Unsupported(Exception):
    """An fx node the graph cannot run (the model then runs layer by layer)."""


_ACT_MODULES = {nn.ReLU: "relu", nn.Hardswish: "hardswish", nn.Sigmoid: "sigmoid", nn.SiLU: "silu"}
_ACT_FUNCS = {F.relu: "relu", torch.relu: "relu", F.hardswish: "hardswish", torch.sigmoid: "sigmoid",
              F.sigmoid if hasattr(F, "sigmoid") else torch.sigmoid: "sigmoid", F.silu: "silu"}
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
    if node.op == "call_function":
        if len(node.args) != 1 or set(node.kwargs) - {"inplace", "approximate"}:
            return None
        if node.target in _ACT_FUNCS and "approximate" not in node.kwargs:
            return _ACT_FUNCS[node.target], 0.0, 0.0
        if node.target is F.relu6:
            return "clamp", 0.0, 6.0
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
    """x.mean((2, 3)) / torch.mean(x, [-2, -1], keepdim=...) -> keepdim, else None."""
    if not ((node.op == "call_method" and node.target == "mean") or
            (node.op == "call_function" and node.target is torch.mean)):
        return None
    args = list(node.args[1:])
    dims = args[0] if args else node.kwargs.get("dim")
    keepdim = args[1] if len(args) > 1 else node.kwargs.get("keepdim", False)
    if not isinstance(dims, (tuple, list)) or sorted(d % 4 for d in dims) != [2, 3]:
        return None
    if "dtype" in node.kwargs:
        return None
    return bool(keepdim)


class _Lowering:
    """fx graph of a layer-frozen model -> the core's values and nodes (f32)."""

    def __init__(self, gm):
        self.gm = gm
        self.modules = dict(gm.named_modules())
        self.value_of = {}   # fx node -> value index
        self.values = []     # fx node producing each value (for calibration and qparams)
        self.nodes = []      # dicts for _core.GraphHandle
        self.inputs, self.outputs = [], []
        self.layers = []     # the frozen layers the graph holds, in node order

    def new_value(self, fx_node):
        self.values.append(fx_node)
        self.value_of[fx_node] = len(self.values) - 1
        return len(self.values) - 1

    def arg(self, a):
        if not isinstance(a, torch.fx.Node) or a not in self.value_of:
            raise Unsupported(f"argument {a!r}")
        return self.value_of[a]

    def emit(self, fx_node, kind, inputs, **params):
        out = self.new_value(fx_node)
        self.nodes.append(dict(kind=kind, inputs=[self.arg(i) for i in inputs], output=out, fx=fx_node, **params))
        return out

    def lower(self):
        for node in self.gm.graph.nodes:
            self.lower_node(node)
        if not self.outputs:
            raise Unsupported("no output")
        return self

    def lower_node(self, node):
        m = self.modules.get(node.target) if node.op == "call_module" else None
        if node.op == "placeholder":
            if node.args or node.kwargs:
                raise Unsupported(f"input {node.name} has a default value")
            self.inputs.append(self.new_value(node))
            return
        if node.op == "output":
            outs = node.args[0]
            outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
            self.outputs = [self.arg(o) for o in outs]
            self.output_is_tuple = isinstance(node.args[0], (tuple, list))
            return
        if m is not None and isinstance(m, _IDENTITY_MODULES):
            self.value_of[node] = self.arg(node.args[0])
            return
        if isinstance(m, FrozenConv2d):
            if m._spec["io"] == "legacy" or len(node.args) != 1:
                raise Unsupported("legacy quantized conv")
            self.layers.append(m)
            self.emit(node, "conv2d", [node.args[0]], layer=m)
            return
        if isinstance(m, FrozenLinear):
            if m._spec["io"] == "legacy" or len(node.args) != 1:
                raise Unsupported("legacy quantized linear")
            self.layers.append(m)
            self.emit(node, "linear", [node.args[0]], layer=m)
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
            self.emit(node, "activation", [node.args[0]], activation=name, act_min=lo, act_max=hi)
            return
        if ((node.op == "call_function" and node.target in (operator.add, torch.add, operator.iadd))
                or (node.op == "call_method" and node.target in ("add", "add_"))):
            if len(node.args) != 2 or node.kwargs:
                raise Unsupported("add with alpha or a scalar")
            self.emit(node, "add", list(node.args))
            return
        if isinstance(m, nn.MaxPool2d):
            if m.return_indices or _ints(m.dilation, 2) != (1, 1):
                raise Unsupported("dilated or indexed max pooling")
            k, s, p = _ints(m.kernel_size, 2), _ints(m.stride or m.kernel_size, 2), _ints(m.padding, 2)
            self.emit(node, "maxpool2d", [node.args[0]], kernel=k, stride=s, padding=(p[0], p[1], p[0], p[1]),
                      ceil_mode=m.ceil_mode)
            return
        if isinstance(m, nn.AvgPool2d):
            if m.divisor_override is not None:
                raise Unsupported("avg pooling divisor_override")
            k, s, p = _ints(m.kernel_size, 2), _ints(m.stride or m.kernel_size, 2), _ints(m.padding, 2)
            self.emit(node, "avgpool2d", [node.args[0]], kernel=k, stride=s, padding=(p[0], p[1], p[0], p[1]),
                      ceil_mode=m.ceil_mode, count_include_pad=m.count_include_pad)
            return
        if isinstance(m, nn.AdaptiveAvgPool2d) and _ints(m.output_size, 2) == (1, 1):
            self.emit(node, "global_avgpool", [node.args[0]], keepdim=True)
            return
        if (node.op == "call_function" and node.target is F.adaptive_avg_pool2d
                and _ints(node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size"), 2) == (1, 1)):
            self.emit(node, "global_avgpool", [node.args[0]], keepdim=True)
            return
        keep = _is_spatial_mean(node)
        if keep is not None:
            self.emit(node, "global_avgpool", [node.args[0]], keepdim=keep)
            return
        if self.is_flatten(node, m):
            self.emit(node, "flatten", [node.args[0]])
            return
        if node.op == "call_function" and node.target is torch.cat:
            tensors = node.args[0]
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
            if dim != 1 or not isinstance(tensors, (list, tuple)) or not 1 <= len(tensors) <= 8:
                raise Unsupported("concat other than along dim 1")
            self.emit(node, "concat", list(tensors))
            return
        if isinstance(m, nn.BatchNorm2d) and not m.training and m.track_running_stats:
            var, mean = m.running_var.double(), m.running_mean.double()
            g = m.weight.detach().double() if m.weight is not None else torch.ones_like(var)
            b = m.bias.detach().double() if m.bias is not None else torch.zeros_like(var)
            scale = g / torch.sqrt(var + m.eps)
            self.emit(node, "affine", [node.args[0]], scale=scale.float().numpy(),
                      shift=(b - mean * scale).float().numpy())
            return
        raise Unsupported(f"{node.op} {node.target}")

    def producer(self, fx_node):
        v = self.value_of.get(fx_node) if isinstance(fx_node, torch.fx.Node) else None
        for n in reversed(self.nodes):
            if n["output"] == v:
                return n
        return None

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
            return isinstance(m, (FrozenConv2d, FrozenLinear)) or super().is_leaf_module(m, qualname)

    graph = Tracer().trace(model)
    return torch.fx.GraphModule(model, graph)


def lower(model):
    """The lowering of a layer-frozen model, or raises Unsupported."""
    try:
        gm = trace(model)
    except Exception as e:  # noqa: BLE001 - anything fx cannot trace is not a graph
        raise Unsupported(f"trace: {type(e).__name__}") from None
    return _Lowering(gm).lower()


# ---- per-edge calibration (static int8 graphs) ----------------------------------------

def calibrate_values(low, batches, show_progress=None):
    """(min, max) of every value of the lowering over the calibration batches."""
    ranges = {}
    wanted = {fx: i for i, fx in enumerate(low.values)}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            i = wanted.get(n)
            if i is not None and torch.is_tensor(out) and out.is_floating_point() and out.numel():
                lo, hi = float(out.min()), float(out.max())
                old = ranges.get(i)
                ranges[i] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
            return out

    rec = Recorder(low.gm)
    with torch.no_grad():
        for batch in progress(batches, len(batches), "qpack calibrate", show_progress):
            rec.run(*(batch if isinstance(batch, tuple) else (batch,)))
    return ranges


def value_qparams(low, ranges):
    """u8 (scale, zero_point) per value: its own calibrated range, except where
    the op keeps its input's (max pooling, flatten: ranges can only shrink)."""
    qp = {}
    producer = {n["output"]: n for n in low.nodes}
    for v in range(len(low.values)):
        n = producer.get(v)
        if n is not None and n["kind"] in ("maxpool2d", "flatten"):
            qp[v] = qp[n["inputs"][0]]
            continue
        if v not in ranges:
            raise Unsupported(f"value {v} was not seen in calibration")
        qp[v] = _q.uint8_qparams(*ranges[v])
    return qp


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


class GraphRunner:
    """The forward of a graph-frozen model: the core runs the lowered graph.

    Held in the model instance's ``__dict__`` as ``forward`` (so the model
    keeps its class); not a submodule, so ``state_dict`` is the layers'. It
    rebuilds its graph when a layer was re-packed (``load_state_dict``), and
    pickles as the description that rebuilds it from the model's layers."""

    def __init__(self, model, spec, layer_names):
        self._model_ref = model
        self._spec = spec            # values, nodes (layers by name), inputs, outputs, output_is_tuple
        self._layer_names = layer_names
        self._handle = None
        self._packed_ids = None
        self._layer_objs = None

    # the model owns us; keep a plain reference without registering a submodule
    def _layers(self):
        if self._layer_objs is None:
            mods = dict(self._model_ref.named_modules())
            self._layer_objs = [mods[name] for name in self._layer_names]
        return self._layer_objs

    def _graph(self):
        layers = self._layers()
        ids = [id(l._packed) for l in layers]
        if self._handle is None or ids != self._packed_ids:
            by_name = dict(zip(self._layer_names, layers))
            nodes = []
            for n in self._spec["nodes"]:
                n = dict(n)
                if "layer" in n:
                    n["op"] = by_name[n.pop("layer")]._packed._h
                nodes.append(n)
            self._handle = _core.GraphHandle(self._spec["values"], nodes, self._spec["inputs"],
                                             self._spec["outputs"])
            self._packed_ids = ids
        return self._handle

    def __call__(self, *args, **kwargs):
        arrays = [_to_array(a) for a in args]
        if kwargs or len(args) != len(self._spec["inputs"]) or any(a is None for a in arrays):
            return type(self._model_ref).forward(self._model_ref, *args, **kwargs)
        try:
            outs = self._graph().run([a for a, _ in arrays], [l for _, l in arrays])
        except _core.InvalidArgumentError:
            # shapes this graph cannot plan (other ranks): the layers one by one
            return type(self._model_ref).forward(self._model_ref, *args, **kwargs)
        result = []
        for o in outs:
            t = torch.from_numpy(o)
            result.append(t.permute(0, 3, 1, 2) if o.ndim == 4 else t)
        if self._spec["output_is_tuple"]:
            return tuple(result)
        return result[0]

    def info(self):
        return self._graph().info()

    def report(self):
        """One line per node: op, dtype and qparams of its output, what was fused."""
        values = self._spec["values"]
        lines = []
        for n in self._spec["nodes"]:
            dt, s, zp = values[n["output"]]
            q = f" scale={s:.6g} zp={zp}" if dt == "u8" else ""
            extra = ""
            if "layer" in n:
                layer = dict(self._model_ref.named_modules())[n["layer"]]
                spec = layer._spec
                extra = f" {n['layer']} backend={layer.backend}"
                if spec.get("folded_bn"):
                    extra += " +bn"
                if spec.get("activation") is not None:
                    extra += f" +{spec['activation']}"
                extra += f" packed={layer.nbytes_packed}B"
            elif n.get("activation"):
                extra = f" +{n['activation']}"
            ins = ",".join(str(i) for i in n["inputs"])
            lines.append(f"{n['kind']:<15} ({ins}) -> {n['output']} {dt}{q} NHWC/NC{extra}")
        info = self.info()
        lines.append(f"{len(self._spec['nodes'])} nodes, {len(values)} values; packed {info['nbytes_packed']} B, "
                     f"workspace {info['nbytes_workspace']} B (largest plan so far)")
        return "\n".join(lines)

    def __reduce__(self):
        return (_rebuild_runner, (self._model_ref, self._spec, self._layer_names))

    def __deepcopy__(self, memo):
        import copy
        return GraphRunner(copy.deepcopy(self._model_ref, memo), copy.deepcopy(self._spec, memo),
                           list(self._layer_names))


def _rebuild_runner(model, spec, layer_names):
    return GraphRunner(model, spec, layer_names)


def attach(model, low, qparams=None):
    """Makes ``model`` run ``low`` as one graph: f32 values, or u8 with
    ``qparams`` (quantize after each input, dequantize before each output)."""
    names = {id(m): name for name, m in model.named_modules()}
    layer_names, values, nodes = [], [], []
    for v in range(len(low.values)):
        values.append(("f32", 0.0, 0) if qparams is None else ("u8",) + tuple(qparams[v]))
    for n in low.nodes:
        n = {k: v for k, v in n.items() if k != "fx"}
        if "layer" in n:
            name = names[id(n["layer"])]
            if name not in layer_names:
                layer_names.append(name)
            n["layer"] = name
        nodes.append(n)
    inputs, outputs = list(low.inputs), list(low.outputs)
    if qparams is not None:
        # float edges: f32 inputs quantized, outputs dequantized
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
    spec = dict(values=values, nodes=nodes, inputs=inputs, outputs=outputs,
                output_is_tuple=getattr(low, "output_is_tuple", False))
    runner = GraphRunner(model, spec, layer_names)
    runner._graph()  # validate now: a model whose graph the core refuses is not graph-frozen
    object.__setattr__(model, "forward", runner)
    return runner


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


__all__ = ["GraphRunner", "Unsupported", "attach", "calibrate_values", "detach", "graph_report", "lower",
           "progress", "runner_of", "value_qparams"]

