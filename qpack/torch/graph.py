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
import collections
import copy
import functools
import inspect
import math
import operator
import re
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from qpack import _core
from qpack.torch import quantize as _q
from qpack.torch import attention as _attention
from qpack.torch.modules import FrozenConv1d, FrozenConv2d, FrozenLinear, FrozenMultiheadAttention, blocks_to_space


class Unsupported(Exception):
    """An fx node the graph cannot run (the model then runs layer by layer)."""


_ACT_MODULES = {nn.ReLU: "relu", nn.Hardswish: "hardswish", nn.Sigmoid: "sigmoid", nn.SiLU: "silu",
                nn.Hardsigmoid: "hardsigmoid", nn.Tanh: "tanh"}
_ACT_FUNCS = {F.relu: "relu", torch.relu: "relu", F.hardswish: "hardswish", torch.sigmoid: "sigmoid",
              F.sigmoid if hasattr(F, "sigmoid") else torch.sigmoid: "sigmoid", F.silu: "silu",
              F.hardsigmoid: "hardsigmoid", torch.tanh: "tanh", F.tanh: "tanh"}
_ACT_METHODS = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh"}
_IDENTITY_MODULES = (nn.Identity, nn.Dropout, nn.Dropout2d)
_MAX_NODE_INPUTS = 8  # qpack_graph_node.inputs
# torch.ao's quantized add and add + ReLU (None where this torch has none)
_Q_ADD, _Q_ADD_RELU = getattr(torch.ops.quantized, "add", None), getattr(torch.ops.quantized, "add_relu", None)
# functions of a convert_fx model that take its qparams as get_attr nodes
_QPARAM_READERS = tuple(f for f in (torch.quantize_per_tensor, _Q_ADD, _Q_ADD_RELU) if f is not None)


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
        if type(m) is nn.LeakyReLU:
            return "leaky_relu", float(m.negative_slope), 0.0
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
    if node.op == "call_function" and node.target in (F.leaky_relu, F.leaky_relu_):
        slope = _dim_arg(node, 1, "negative_slope", 0.01)
        if set(node.kwargs) - {"negative_slope", "inplace"} or len(node.args) > 3 or not isinstance(
                slope, (int, float)) or isinstance(slope, bool):
            return None
        return "leaky_relu", float(slope), 0.0
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
    """x.mean((2, 3)) / torch.mean(x, [2, 3], keepdim=...) of a rank-4 value (and
    the mean over L of a rank-3 one) -> keepdim, else None. Negative dims count
    only where canonicalize() knew the rank: without it, (-2, -1) of a rank-3
    value would be read as the spatial dims of a rank-4 one."""
    if node.op == "call_function" and node.target is _mean_last:
        return node.args[1]
    mean = _mean_dims(node)
    if mean is None:
        return None
    x, dims, keepdim = mean
    r = rank_of(x)
    if dims == [2, 3] and r in (4, None) or dims == [2] and r == 3:
        return keepdim
    return None


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
        self._order = None     # fx node -> position in the trace (write_is_seen)
        # fx nodes whose tensor is a rank-4 value permuted to [N, H, W, C]: the core's
        # NHWC value itself (see channels_last_region)
        self.channels_last = set()

    def new_value(self, fx_node):
        self.values.append(fx_node)
        self.value_of[fx_node] = len(self.values) - 1
        return len(self.values) - 1

    def arg(self, a):
        if isinstance(a, torch.fx.Node) and a.meta.get("qpack_shape_value"):
            raise Unsupported("shape arithmetic (a size, not a tensor): it stays in PyTorch")
        if isinstance(a, torch.fx.Node) and a not in self.value_of and self.open_inputs:
            self.inputs.append(self.new_value(a))
            self.input_nodes.append(a)
        if not isinstance(a, torch.fx.Node) or a not in self.value_of:
            raise Unsupported(f"argument {a!r}")
        return self.value_of[a]

    def write_is_seen(self, node):
        """True when an in-place ``node`` writes into a tensor (its first input, or what
        that input is a view or alias of) that an op after it reads: the core's
        functional version would not show the write there."""
        if self._order is None:
            self._order = {n: i for i, n in enumerate(self.gm.graph.nodes)}
        at = self._order[node]
        t = node.args[0] if node.args else None
        while isinstance(t, torch.fx.Node):
            if any(u is not node and self._order.get(u, -1) > at for u in t.users):
                return True
            t = t.args[0] if _is_alias(t, self.modules) and t.args else None
        return False

    def snapshot(self):
        last = [(dict(n), self.values[n["output"]]) for n in self.nodes[-1:]]
        return (len(self.values), len(self.nodes), len(self.inputs), len(self.layers), dict(self.value_of),
                last, dict(self.qp))

    def rollback(self, snap):
        nv, nn_, ni, nl, value_of, last, qp = snap
        del self.values[nv:], self.nodes[nn_:], self.inputs[ni:], self.input_nodes[ni:], self.layers[nl:]
        self.value_of = value_of
        self.qp = qp
        if last:  # an activation or affine fused into the last node is undone too, with the
            # fx node its value stood for
            self.nodes[-1], self.values[last[0][0]["output"]] = last[0]

    def emit(self, fx_node, kind, inputs, **params):
        ins = [self.arg(i) for i in inputs]  # a segment's inputs get their values before the output
        out = self.new_value(fx_node)
        self.nodes.append(dict(kind=kind, inputs=ins, output=out, fx=fx_node, **params))
        return out

    def emit_layer_norm(self, node, x, shape, weight, bias, eps, dim, groups=None):
        """A layer_norm node: over the channels of a rank-4 value (layer_norm2d: dim
        1), over the last dim (F.layer_norm / nn.LayerNorm of one dim: -1), or with
        ``groups`` a GroupNorm over dim 1 (shape: its channels)."""
        if len(shape) != 1 or not isinstance(shape[0], int):
            raise Unsupported("a LayerNorm over more than one dim, or of a size the trace computes")
        if not isinstance(eps, float) or not eps > 0:
            raise Unsupported("a LayerNorm with a traced or non-positive eps")
        c = shape[0]

        def constant(t, fill):
            if t is None:
                return np.full(c, fill, np.float32)
            t = _attr_tensor(self.gm, t) if isinstance(t, torch.fx.Node) else t
            if not isinstance(t, torch.Tensor) or t.shape != (c,):
                raise Unsupported("a LayerNorm whose weight or bias is not a constant of its size")
            return t.detach().float().numpy().copy()
        where = dict(groups=groups) if groups is not None else dict(dim=dim)
        self.emit_checked(node, "layer_norm", [x], weight=constant(weight, 1.0), bias=constant(bias, 0.0),
                          eps=float(eps), **where)

    def lower_last_dim_constant(self, node, kind):
        """x * t or x + t (either order) for a constant t of C values along the last dim
        ([C], [1, C], [1, 1, C]: a layer scale on tokens, CaiT's, BEiT's, ResMLP's Affine;
        or one value: StarReLU's) as an affine node over the last dim (one value: over every
        value); True when it did, False when neither operand is a constant. Another constant
        stays in PyTorch."""
        for x, k in (node.args, node.args[::-1]):
            t = _attr_tensor(self.gm, k)
            if t is None or not isinstance(x, torch.fx.Node) or _attr_tensor(self.gm, x) is not None:
                continue
            if not _last_dim_constant(t):  # ViT's position embedding [1, N, C]: broadcast over
                # the batch, which the core's add does not do; PyTorch does it between segments
                raise Unsupported(f"{kind} of a constant of shape {tuple(t.shape)}")
            v = t.detach().float().reshape(-1).numpy().copy()
            one, zero = np.ones_like(v), np.zeros_like(v)
            self.emit_checked(node, "affine", [x], scale=v if kind == "mul" else one,
                              shift=zero if kind == "mul" else v, dim=-1)
            return True
        return False

    def channels_last_step(self, node):
        """How node works on the [N, H, W, C] tensor x it reads (a rank-4 value permuted
        to channels-last): "linear" (a Linear over C), "layer_norm" (over C), "same"
        (elementwise: activations, eval dropout, identity), "back" (permute(0, 3, 1,
        2): the value itself again), or None (anything else)."""
        m = self.modules.get(node.target) if node.op == "call_module" else None
        if _permute_dims(node) == [0, 3, 1, 2]:
            return "back"
        if isinstance(m, FrozenLinear) and len(node.args) == 1 and not node.kwargs:
            return "linear"
        ln = _layer_norm_args(node, self.modules)
        if ln is not None:
            return "layer_norm" if len(ln[1]) == 1 else None
        if (isinstance(m, _IDENTITY_MODULES) or self.is_eval_dropout(node) or
                _activation(node, self.modules) is not None):
            return "same"
        return None

    def channels_last_region(self, node):
        """True when node, x.permute(0, 2, 3, 1) of a rank-4 value, starts a chain of
        ops over the channels, each the only reader of the one before, that ends in
        permute(0, 3, 1, 2) (ConvNeXt's block: LayerNorm, Linear, GELU, Linear). The
        core holds rank-4 values NHWC, so the permuted tensor is the value itself and
        each op runs on its channels: a per-pixel linear, a layer_norm over dim 1."""
        cur = node
        while True:
            nxt = _only_user(cur)
            if nxt is None or not nxt.args or nxt.args[0] is not cur or _in_place(nxt, self.modules):
                return False
            step = self.channels_last_step(nxt)
            if step == "back":
                return True
            if step is None:
                return False
            cur = nxt

    def lower_channels_last(self, node, x):
        """An op of a channels-last region (channels_last_region) on x's value."""
        step = self.channels_last_step(node)
        if step == "back":
            self.value_of[node] = self.arg(x)
            return
        if step == "linear":
            m = self.modules[node.target]
            if m._spec["io"] == "legacy":
                raise Unsupported("a torch.ao linear in a channels-last region")
            self.layers.append(m)
            self.emit(node, "linear", [x], layer=m, per_pixel=True)
        elif step == "layer_norm":
            _, shape, weight, bias, eps = _layer_norm_args(node, self.modules)
            self.emit_layer_norm(node, x, shape, weight, bias, eps, dim=1)
        elif step == "same":
            self.lower_node(node, channels_last_ok=True)
        else:
            raise Unsupported("an op on a channels-last view other than Linear, LayerNorm and activations")
        self.channels_last.add(node)

    def lower_node(self, node, channels_last_ok=False):
        m = self.modules.get(node.target) if node.op == "call_module" else None
        if _in_place(node, self.modules) and self.write_is_seen(node):
            raise Unsupported("an in-place op whose write a later op reads (through a view or an alias)")
        x0 = node.args[0] if node.args else None
        if not channels_last_ok and isinstance(x0, torch.fx.Node) and x0 in self.channels_last:
            self.lower_channels_last(node, x0)
            return
        if any(isinstance(a, torch.fx.Node) and a in self.channels_last
               for a in list(node.args[1:]) + list(node.kwargs.values())):
            raise Unsupported("a channels-last view read as a second operand")
        if _permute_dims(node) == [0, 2, 3, 1] and rank_of(x0) == 4 and self.channels_last_region(node):
            self.value_of[node] = self.arg(x0)
            self.channels_last.add(node)
            return
        if (m is not None and isinstance(m, _IDENTITY_MODULES)) or self.is_eval_dropout(node):
            self.value_of[node] = self.arg(node.args[0])
            return
        if (node.op == "call_method" and node.target in ("contiguous", "float") and len(node.args) == 1
                and not node.kwargs and node.args[0] not in self.channels_last):
            # the same values (a graph value is float32, stored as the core lays it out):
            # CSPNet's x.contiguous() between convolutions
            self.value_of[node] = self.arg(node.args[0])
            return
        if isinstance(m, (FrozenConv1d, FrozenConv2d, FrozenLinear)):
            if len(node.args) != 1:
                raise Unsupported("a layer called with more than its input")
            if isinstance(m, FrozenLinear) and rank_of(node.args[0]) not in (None, 2, 3):
                raise Unsupported("a linear over the last dim of a rank-4 value (stored NHWC in the core)")
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
            # An activation right after an add that nothing else reads (through identity
            # modules: MobileOne's act(se(out)) with se an nn.Identity) is fused into it;
            # the add's value now stands for the activation (calibration, qparams: a
            # ReLU's output range starts at 0, so its zero point is 0).
            x = node.args[0]
            while (isinstance(x, torch.fx.Node) and x.op == "call_module" and len(x.users) == 1 and x.args
                   and isinstance(self.modules.get(x.target), _IDENTITY_MODULES)):
                x = x.args[0]
            if (src is not None and src["kind"] == "add" and src.get("activation") is None
                    and src["fx"] is x and len(x.users) == 1):
                src.update(activation=name, act_min=lo, act_max=hi)
                self.values[src["output"]] = node
                self.value_of[node] = src["output"]
                return
            self.emit_checked(node, "activation", [node.args[0]], activation=name, act_min=lo, act_max=hi)
            return
        scalar = _scalar_affine(node)
        if scalar is not None and scalar[1:] == (1.0, 0.0):  # x + 0, x * 1 (MobileOne's scale_out + 0): x
            self.value_of[node] = self.arg(scalar[0])
            return
        if scalar is not None:
            x, scale, shift = scalar
            c = channels_of(x) or 1  # (one scale and shift for every value where the trace cannot tell C)
            last = self.nodes[-1] if self.nodes else None
            if (last is not None and last["kind"] == "affine" and last["fx"] is x and len(x.users) == 1
                    and self.value_of.get(x) not in self.qp and x not in self.input_nodes):
                # (x * a + b) op c: one affine (its value now stands for this node: calibration, qparams)
                last.update(scale=(last["scale"] * scale).astype(np.float32),
                            shift=(last["shift"] * scale + shift).astype(np.float32), fx=node)
                self.values[last["output"]] = node
                self.value_of[node] = last["output"]
                return
            self.emit_checked(node, "affine", [x], scale=np.full(c, scale, np.float32),
                              shift=np.full(c, shift, np.float32))
            return
        if ((node.op == "call_function" and node.target in (operator.add, torch.add, operator.iadd))
                or (node.op == "call_method" and node.target in ("add", "add_"))):
            if len(node.args) != 2 or node.kwargs:
                raise Unsupported("add with alpha or a scalar")
            if not self.lower_last_dim_constant(node, "add"):
                self.emit_checked(node, "add", list(node.args))
            return
        if ((node.op == "call_function" and node.target in (operator.mul, torch.mul, operator.imul))
                or (node.op == "call_method" and node.target in ("mul", "mul_"))):
            if len(node.args) != 2 or node.kwargs or not all(isinstance(a, torch.fx.Node) for a in node.args):
                raise Unsupported("mul by a scalar")
            if not self.lower_last_dim_constant(node, "mul"):
                self.emit_checked(node, "mul", list(node.args))
            return
        if (pad := _image_pad(node, m)) is not None:
            x, pads, value = pad
            self.emit_checked(node, "pad", [x], padding=pads, act_min=value)
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
        if isinstance(m, nn.AdaptiveAvgPool2d) or (node.op == "call_function" and node.target is F.adaptive_avg_pool2d):
            size = m.output_size if m is not None else _dim_arg(node, 1, "output_size")
            size = _ints(size, 2) if isinstance(size, (int, tuple, list)) else None
            if size is None or not all(isinstance(v, int) and v >= 1 for v in size):
                raise Unsupported("adaptive pooling to a size that keeps an input dim (None) or is traced")
            self.emit_checked(node, "adaptive_avgpool2d", [node.args[0]], kernel=size)
            return
        keep = _is_spatial_mean(node)
        if keep is not None:
            self.emit_checked(node, "global_avgpool", [node.args[0]], keepdim=keep)
            return
        if self.is_flatten(node, m):
            self.emit_checked(node, "flatten", [node.args[0]])
            return
        if _swaps_last_two_of_rank3(node):
            self.emit_checked(node, "transpose", [node.args[0]])
            return
        if node.op == "call_function" and node.target is image_to_tokens:
            self.emit_checked(node, "transpose", [node.args[0]])
            return
        if node.op == "call_function" and node.target is tokens_to_image:
            self.emit_checked(node, "transpose", list(node.args))
            return
        if node.op == "call_function" and node.target is heads_attention:
            q, k, v, heads, d, dv, offsets, scale, causal, mask = node.args[:10]
            strides = node.args[10] if len(node.args) > 10 and node.args[10] is not None else (d, dv)
            multi_query = bool(node.args[11]) if len(node.args) > 11 else False
            if mask is not None:
                t = _attr_tensor(self.gm, mask)
                if t is None or t.dtype != torch.float32 or t.dim() > 4 or any(n != 1 for n in t.shape[:-3]):
                    raise Unsupported("an attention mask that is not a float32 constant of [L, S] or [H, L, S]")
                t = t.reshape(t.shape[-3:]) if t.dim() >= 3 else t
                if t.dim() == 3 and t.shape[0] == 1:
                    t = t[0]
                if t.dim() == 3 and t.shape[0] != heads:
                    raise Unsupported("an attention mask of other heads than the attention's")
                mask = t.detach().contiguous().numpy().copy()
            self.emit_checked(node, "attention", [q, k, v], heads=heads, head_dim=d, value_dim=dv,
                              offsets=tuple(offsets), scale=scale, causal=causal, mask=mask,
                              head_strides=tuple(strides), multi_query=multi_query)
            return
        if node.op == "call_function" and node.target is blocks_to_space:
            x, kh, kw = node.args
            self.emit_checked(node, "depth_to_space", [x], kernel=(kh, kw))
            return
        r = _pixel_shuffle_factor(node, m)
        if r is not None:
            self.emit_checked(node, "depth_to_space", [node.args[0]], kernel=(r, r), ceil_mode=True)
            return
        if node.op == "call_function" and node.target is channel_part:
            x, parts, index, groups = node.args
            self.emit_checked(node, "channels", [x], kernel=(parts, index), stride=(groups, 1))
            return
        if node.op == "call_function" and node.target is last_dim_affine:
            x, scale, shift = (node.args[0], *(_attr_tensor(self.gm, a) for a in node.args[1:]))
            self.emit_checked(node, "affine", [x], scale=scale.detach().float().reshape(-1).numpy().copy(),
                              shift=shift.detach().float().reshape(-1).numpy().copy(), dim=-1)
            return
        if node.op == "call_function" and node.target is channel_scale:
            x, scale = node.args
            t = _attr_tensor(self.gm, scale)
            c = _channels_or_constant(x, t)
            if t is None or c is None or t.numel() != c:
                raise Unsupported("a channel scale that is not a constant of the value's channels")
            self.emit_checked(node, "affine", [x], scale=t.detach().float().reshape(-1).numpy().copy(),
                              shift=np.zeros(c, np.float32))
            return
        if node.op == "call_function" and node.target is layer_norm2d:
            x, weight, bias, eps = node.args
            self.emit_layer_norm(node, x, (channels_of(x),), weight, bias, eps, dim=1)
            return
        gn = _group_norm_args(node, self.modules)
        if gn is not None:
            x, groups, weight, bias, eps = gn
            c = _channels_or_constant(x, _attr_tensor(self.gm, weight) if isinstance(weight, torch.fx.Node)
                                      else weight)
            if not isinstance(groups, int) or c is None or groups < 1 or c % groups:
                raise Unsupported("a GroupNorm whose groups or channels the trace cannot tell")
            self.emit_layer_norm(node, x, (c,), weight, bias, eps, dim=1, groups=groups)
            return
        ln = _layer_norm_args(node, self.modules)
        if ln is not None:
            if rank_of(ln[0]) == 4:  # over W of an NHWC value (Swin's [B, H, W, C] tensors): PyTorch's
                raise Unsupported("a LayerNorm over the last dim of a rank-4 value")  # contiguous rows are faster
            self.emit_layer_norm(node, *ln, dim=-1)
            return
        if node.op == "call_function" and node.target is batch_constant:
            like, table = node.args
            t = _attr_tensor(self.gm, table)
            self.emit_checked(node, "constant", [like], table=t.detach()[0].float().numpy().copy())
            return
        if node.op == "call_function" and node.target is permute_rows:
            x, rows, shape = node.args
            self.emit_checked(node, "permute_rows", [x], rows=_attr_tensor(self.gm, rows).numpy().astype(np.float32),
                              kernel=(shape[1], 0) if len(shape) == 3 else (shape[2], shape[3]))
            return
        if node.op == "call_function" and node.target is channel_range:
            x, first, count = node.args
            self.emit_checked(node, "channel_range", [x], kernel=(first, count))
            return
        if node.op == "call_function" and node.target is torch.cat:
            tensors = node.args[0]
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
            if dim != 1 or not isinstance(tensors, (list, tuple)) or not tensors:
                raise Unsupported("concat other than along dim 1")
            if len(tensors) <= _MAX_NODE_INPUTS:
                self.emit_checked(node, "concat", list(tensors))
                return
            if any(self.value_of.get(t) in self.qp for t in tensors):
                raise Unsupported(f"a concat of more than {_MAX_NODE_INPUTS} torch.ao quantized values")
            # more inputs than a node takes (DenseNet's): concats of concats, each level's
            # partial results valued as the whole (its qparams in int8 graphs)
            ins = [self.arg(t) for t in tensors]
            while len(ins) > _MAX_NODE_INPUTS:
                parts = []
                for k in range(0, len(ins), _MAX_NODE_INPUTS):
                    group = ins[k:k + _MAX_NODE_INPUTS]
                    if len(group) == 1:  # a lone last input goes up a level as it is
                        parts.append(group[0])
                        continue
                    parts.append(self.new_value(node))
                    self.nodes.append(dict(kind="concat", inputs=group, output=parts[-1], fx=node))
                ins = parts
            self.nodes.append(dict(kind="concat", inputs=ins, output=self.new_value(node), fx=node))
            return
        if isinstance(m, nn.PReLU):
            self.emit_checked(node, "prelu", [node.args[0]], slopes=m.weight.detach().float().reshape(-1).numpy().copy())
            return
        resize = _resize(node, m)
        if resize is not None:
            x, like, kind, params = resize
            if rank_of(x) not in (None, 4):
                raise Unsupported("a resize of a value other than rank 4")
            self.emit_checked(node, kind, [x] + ([like] if like is not None else []), **params)
            return
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)) and not m.training and m.track_running_stats:
            scale, shift = _bn_affine(m.running_mean, m.running_var, m.weight, m.bias, m.eps)
            self.emit_checked(node, "affine", [node.args[0]], scale=scale.float().numpy(),
                              shift=shift.float().numpy())
            return
        bn = _functional_bn(node, self.gm)
        if bn is not None:
            # F.batch_norm in eval over module tensors (a BatchNorm subclass's own forward,
            # timm's BatchNormAct2d): an affine, or nothing where freeze folded it (identity)
            x, scale, shift = bn
            if bool((scale == 1).all()) and bool((shift == 0).all()):
                self.value_of[node] = self.arg(x)
                return
            self.emit_checked(node, "affine", [x], scale=scale.float().numpy(), shift=shift.float().numpy())
            return
        raise Unsupported(f"{node.op} {node.target}")

    # ops that keep their input's torch.ao qparams (what PyTorch's quantized kernels do)
    _KEEPS_QPARAMS = ("activation", "maxpool2d", "avgpool2d", "global_avgpool", "flatten", "channels", "channel_range",
                      "adaptive_avgpool2d", "resize_nearest", "resize_bilinear", "transpose", "depth_to_space", "pad",
                      "permute_rows")

    def constant(self, a):
        """A number, or the one-element tensor a get_attr node names (convert_fx keeps
        qparams as module attributes); None for anything else."""
        t = _attr_tensor(self.gm, a)
        if t is not None:
            return t.item() if t.numel() == 1 else None
        return a if isinstance(a, (int, float)) and not isinstance(a, bool) else None

    def lower_torch_ao(self, node, m):
        """A torch.ao quantized model's own ops, eager mode (Quantize / DeQuantize modules)
        or convert_fx (``torch.quantize_per_tensor`` on attribute qparams, ``.dequantize()``),
        and quantized add (their qparams become the values'). True when lowered."""
        try:
            import torch.ao.nn.quantized as nnq
        except ImportError:
            return False
        if isinstance(m, nnq.Quantize) or (node.op == "call_function" and node.target is torch.quantize_per_tensor):
            if m is not None:
                scale, zp, dtype = float(m.scale), int(m.zero_point), m.dtype
            else:
                args = list(node.args) + [node.kwargs.get(k) for k in ("scale", "zero_point", "dtype")][len(node.args) - 1:]
                scale, zp, dtype = self.constant(args[1]), self.constant(args[2]), args[3]
                if scale is None or zp is None:
                    raise Unsupported("quantize_per_tensor without constant scale and zero point")
            if dtype != torch.quint8:
                raise Unsupported("quantize to a dtype other than quint8")
            out = self.emit(node, "quantize", [node.args[0]])
            self.qp[out] = (float(scale), int(zp))
            return True
        if isinstance(m, nnq.DeQuantize) or (node.op == "call_method" and node.target == "dequantize"
                                             and self.value_of.get(node.args[0]) in self.qp):
            self.emit(node, "dequantize", [node.args[0]])
            return True
        if node.op == "call_function" and node.target is not None and node.target in (_Q_ADD, _Q_ADD_RELU):
            a, b, scale, zp = (list(node.args) + [node.kwargs.get("scale"), node.kwargs.get("zero_point")])[:4]
            scale, zp = self.constant(scale), self.constant(zp)
            if not all(self.value_of.get(v) in self.qp for v in (a, b)):
                raise Unsupported("quantized add of values quantized outside the graph")
            if not isinstance(scale, (int, float)) or not isinstance(zp, int):
                raise Unsupported("quantized add without constant scale and zero point")
            out = self.emit(node, "add", [a, b],
                            **({"activation": "relu"} if node.target is _Q_ADD_RELU else {}))
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
        """F.dropout(x, p, training=False) (fx records a module's self.training as a
        constant), and torchvision's stochastic_depth(x, p, mode, training=False)
        (EfficientNet's, ConvNeXt's; fx keeps it as one call)."""
        if node.op != "call_function":
            return False
        if node.target in (F.dropout, F.dropout2d):
            training = node.args[2] if len(node.args) > 2 else node.kwargs.get("training", True)
            return training is False
        if getattr(node.target, "__module__", "") == "torchvision.ops.stochastic_depth" and getattr(
                node.target, "__name__", "") == "stochastic_depth":
            training = node.args[3] if len(node.args) > 3 else node.kwargs.get("training", True)
            return training is False
        return False

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


class _CpuProxy(torch.fx.Proxy):
    """An fx proxy whose ``.device`` is the CPU, the only device a frozen model runs on:
    a forward that passes ``x.device.type`` on as a string (timm's EfficientViT:
    ``torch.autocast(device_type=v.device.type, enabled=False)``) traces."""

    def __getattr__(self, k):
        if k == "device":
            return torch.device("cpu")
        return super().__getattr__(k)


class CpuTracer(torch.fx.Tracer):
    """torch.fx's tracer with _CpuProxy values: qpack's traces. Buffers are proxied
    as parameters are (get_attr nodes), so a forward may index one by sizes the trace
    computes (nanoGPT's causal mask ``self.bias[:, :, :T, :T]``)."""

    proxy_buffer_attributes = True

    def proxy(self, node):
        return _CpuProxy(node, self)


def trace_clean(tracer, model, concrete_args=None):
    """tracer.trace(model), then the fx proxies the forward stored in the modules
    removed: a forward that caches into its module (timm's LeViT keeps attention
    biases in a dict keyed by str(x.device)) would otherwise leave one there, and
    a later deepcopy of the model copies it into half-built modules."""
    try:
        return tracer.trace(model, concrete_args=concrete_args)
    finally:
        for m in model.modules():
            for k, v in list(m.__dict__.items()):
                if isinstance(v, torch.fx.Proxy):
                    del m.__dict__[k]
                elif isinstance(v, dict):
                    for kk in [kk for kk, vv in v.items() if isinstance(vv, torch.fx.Proxy)]:
                        del v[kk]
                elif isinstance(v, list) and any(isinstance(x, torch.fx.Proxy) for x in v):
                    v[:] = [x for x in v if not isinstance(x, torch.fx.Proxy)]


class _LayerLeaves(CpuTracer):
    """qpack's trace of a layer-frozen model: frozen layers are leaves; a timm Swin
    block's window attention (its ``_attn``) is one call of
    qpack.torch.attention.timm_window_attention (_timm_swin_attn)."""

    def is_leaf_module(self, m, qualname):
        return (isinstance(m, (FrozenConv1d, FrozenConv2d, FrozenLinear, FrozenMultiheadAttention))
                or super().is_leaf_module(m, qualname))

    def call_module(self, m, forward, args, kwargs):
        attn = _timm_swin_attn(self, m)
        if attn is None:
            return super().call_module(m, forward, args, kwargs)
        m.__dict__["_attn"] = attn  # the block's forward calls self._attn: this one while traced
        try:
            return super().call_module(m, forward, args, kwargs)
        finally:
            m.__dict__.pop("_attn", None)


def _timm_swin_attn(tracer, block):
    """For a timm SwinTransformerBlock (eval, its masks fixed at init, qkv and proj
    frozen): its ``_attn`` as the trace's one call of timm_window_attention, the
    relative position bias gathered now (a constant of the trace), the shifted
    windows' mask the block's buffer; else None (traced as it is)."""
    cls = type(block)
    if (cls.__module__ != "timm.models.swin_transformer" or cls.__name__ != "SwinTransformerBlock"
            or block.training or getattr(block, "dynamic_mask", False)):
        return None
    attn = block._modules.get("attn")
    table = attn._parameters.get("relative_position_bias_table") if attn is not None else None
    index = attn._buffers.get("relative_position_index") if attn is not None else None
    qkv, proj = (attn._modules.get(k) for k in ("qkv", "proj")) if attn is not None else (None, None)
    window, shift = getattr(block, "window_size", None), getattr(block, "shift_size", None)
    if (not isinstance(qkv, FrozenLinear) or not isinstance(proj, FrozenLinear) or table is None or index is None
            or not isinstance(getattr(attn, "num_heads", None), int) or len(tuple(window or ())) != 2
            or len(tuple(shift or ())) != 2):
        return None
    heads, n = attn.num_heads, int(window[0]) * int(window[1])
    with torch.no_grad():
        bias = table.detach()[index.reshape(-1)].reshape(n, n, -1).permute(2, 0, 1).contiguous().unsqueeze(0)
    if bias.shape[1] != heads:
        return None
    mask = block._buffers.get("attn_mask")
    args = (qkv.weight, proj.weight, bias, tuple(int(w) for w in window), heads, tuple(int(s) for s in shift),
            qkv.bias, proj.bias, mask)

    def _attn(x):
        return tracer.create_proxy("call_function", _attention.timm_window_attention, (x,) + args, {})
    return _attn


_NO_VALUE = object()
# ops whose result's shape depends on the data: a trace specialized to example shapes
# must not read sizes off them
_DATA_SHAPED = frozenset({"nonzero", "masked_select", "unique", "unique_consecutive", "item", "tolist",
                          "bincount", "argwhere", "nonzero_static", "repeat_interleave"})


class _SizeInt(int):
    """A size read off a traced value of a specialized trace (_ShapeTracer): Python
    reads the number; passed to a traced op it becomes the size node a symbolic
    trace makes (``x.size(d)``), so the graph is the one canonicalize knows. What
    Python computes from it (``H // 2``, ``math.ceil(H / p)``) is a plain int, a
    constant of the graph."""

    def __new__(cls, value, proxy, dim):
        o = int.__new__(cls, value)
        o.proxy, o.dim = proxy, dim
        return o


class _SizeTuple(tuple):
    """x.shape / x.size() of a specialized trace: _SizeInt items."""

    def numel(self):
        return int(np.prod([int(a) for a in self]))


class _ShapeProxy(_CpuProxy):
    """A proxy that carries the value the example inputs give its node: a tensor's
    shape, sizes, rank and dtype read off it are those numbers, so Python control
    flow on them runs (the trace is specialized to the example's shapes)."""

    def __getattr__(self, k):
        v = self.node.meta.get("qpack_value", _NO_VALUE)
        if isinstance(v, torch.Tensor):
            if k in ("shape", "size"):
                sizes = _SizeTuple(_SizeInt(n, self, i) for i, n in enumerate(v.shape))
                return sizes if k == "shape" else lambda dim=None: sizes if dim is None else sizes[dim]
            if k in ("ndim", "dtype", "dim", "numel"):
                return getattr(v, k)
        return super().__getattr__(k)

    def __len__(self):
        v = self.node.meta.get("qpack_value", _NO_VALUE)
        if isinstance(v, torch.Tensor):
            return _SizeInt(len(v), self, 0)
        return super().__len__()


_REVERT_PATCHES = getattr(torch.fx._symbolic_trace, "_maybe_revert_all_patches", None)


def _meta(v):
    """A tensor's stand-in on the meta device (its shape and dtype, no data), else v."""
    return v.to("meta") if isinstance(v, torch.Tensor) and v.device.type != "meta" else v


def _on_meta(m, args, kwargs):
    """A leaf module's output on meta values: a frozen layer's by its geometry, a torch
    module's with its parameters and buffers on the meta device."""
    if isinstance(m, FrozenLinear):
        (x,) = args
        return x.new_empty(tuple(x.shape[:-1]) + (m.out_features,))
    if isinstance(m, (FrozenConv1d, FrozenConv2d)):
        (x,) = args
        conv = F.conv1d if isinstance(m, FrozenConv1d) else F.conv2d
        w = torch.empty((m.out_channels, m.in_channels // m.groups, *m.kernel_size), device="meta", dtype=x.dtype)
        return conv(x, w, None, m.stride, m.padding, m.dilation, m.groups)
    if isinstance(m, FrozenMultiheadAttention):
        raise LookupError("no meta forward")  # (sizes read after it stay symbolic)
    tensors = {k: _meta(t) for k, t in list(m.named_parameters()) + list(m.named_buffers())}
    return torch.func.functional_call(m, tensors, tuple(args), kwargs)


class Specialized:
    """A tracer mixin that runs each traced op on meta tensors of the shapes the example
    inputs give (leaf layers by their geometry, _on_meta: no data, no compute), for a
    forward whose Python reads its inputs' sizes (``if H % p:``, ``math.ceil(H / p)``):
    those sizes are then the example's (_SizeInt), and what Python computes from them
    constants of the graph. Values of data-shaped ops (nonzero, item...) are not kept,
    so a size read off one stays symbolic (and fails as before); control flow on values
    fails as before."""

    def __init__(self, examples, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._examples = [_meta(x) for x in examples]
        self._placeholders = 0
        self._sizes = {}  # (node, dim) -> its size node

    def proxy(self, node):
        return _ShapeProxy(node, self)

    def create_arg(self, a):
        if isinstance(a, _SizeInt):
            key = (a.proxy.node, a.dim)
            if key not in self._sizes:
                self._sizes[key] = self.create_proxy("call_method", "size", (a.proxy, a.dim), {}).node
            return self._sizes[key]
        return super().create_arg(a)

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None, proxy_factory_fn=None):
        p = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        if kind == "placeholder":
            i = self._placeholders
            self._placeholders += 1
            p.node.meta["qpack_value"] = self._examples[i] if i < len(self._examples) else (
                args[0] if args else None)
        elif kind != "output" and _REVERT_PATCHES is not None and getattr(target, "__name__", target) not in _DATA_SHAPED:
            try:
                p.node.meta["qpack_value"] = self._run(p.node)
            except Exception:  # noqa: BLE001 - a value it cannot compute: sizes read off it stay symbolic
                pass
        return p

    def _attribute(self, target):
        v = self.root
        for part in target.split("."):
            v = getattr(v, part)
        return _meta(v)

    def _run(self, node):
        def value(n):
            v = n.meta.get("qpack_value", _NO_VALUE)
            if v is _NO_VALUE and n.op == "get_attr":
                # a tensor fx made a constant of (create_arg's _tensor_constant: a value the
                # forward cached in its module on an earlier call, timm's attention biases)
                v = n.meta["qpack_value"] = self._attribute(n.target)
            if v is _NO_VALUE:
                raise LookupError(n.name)
            return v
        args = torch.fx.node.map_arg(node.args, value)
        kwargs = torch.fx.node.map_arg(node.kwargs, value)
        # fx patches nn.Module.__call__ and __getattr__ while it traces: undone around
        # the op, which would otherwise be traced again
        with _REVERT_PATCHES(), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the op's own, which eager gives anyway
            if node.op == "get_attr":
                return self._attribute(node.target)
            if node.op == "call_function":
                return _meta(node.target(*args, **kwargs))
            if node.op == "call_method":
                return _meta(getattr(args[0], node.target)(*args[1:], **kwargs))
            return _on_meta(self.root.get_submodule(node.target), args, kwargs)


class _ShapeTracer(Specialized, _LayerLeaves):
    """_LayerLeaves specialized to example inputs (Specialized)."""


def example_tensors(shapes):
    """Inputs of ``shapes`` (example_shapes) for a specialized trace: meta tensors (the
    trace reads their sizes, never their values)."""
    return [torch.empty(s, dtype=d, device="meta") for s, d in shapes]


def example_shapes(example_inputs):
    """((shape, dtype), ...) of the positional tensors of one example input (a
    tensor or a tuple of them) for a trace specialized to them; None for other
    inputs (keywords, non-tensors)."""
    xs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    if not xs or not all(isinstance(x, torch.Tensor) for x in xs):
        return None
    return tuple((tuple(x.shape), x.dtype) for x in xs)


def _shapes_match(args, shapes):
    return len(args) == len(shapes) and all(
        isinstance(a, torch.Tensor) and tuple(a.shape) == s and a.dtype == d for a, (s, d) in zip(args, shapes))


def trace(model, shapes=None):
    """fx trace of a layer-frozen model, frozen layers as leaves. A forward that does
    not trace symbolically is traced on inputs of ``shapes`` (example_shapes) when
    given, specialized to them (gm._qpack_shapes; GraphRunner runs other shapes on
    the model's own forward)."""
    nones = None
    specialized = None
    try:
        graph = trace_clean(_LayerLeaves(), model)
    except Exception:
        # a forward that tests its optional arguments (nn.TransformerEncoder's masks:
        # `if mask is not None`), traced once more with them None; calls that pass one
        # run the model's own forward (GraphRunner.__call__)
        nones = _trailing_defaults(model)
        graph = None
        if nones:
            try:
                graph = trace_clean(_LayerLeaves(), model, concrete_args=nones)
            except Exception:
                if not shapes:
                    raise
                nones = None
        if graph is None:
            if not shapes:
                raise
            # Python control flow on the inputs' sizes (MobileViT's `if new_h != H`,
            # Twins' size tuples): traced on inputs of the example's shapes
            graph = trace_clean(_ShapeTracer(example_tensors(shapes)), model)
            specialized = tuple(shapes)
    else:
        if _attention_reads_placeholder(graph, model):
            # a forward's optional mask or is_causal reaching its attention (timm's ViT):
            # traced with their defaults, the attention becomes a core node; calls that
            # pass others run the model's own forward
            nones = _trailing_defaults(model)
            if nones:
                graph = trace_clean(_LayerLeaves(), model, concrete_args=nones)
    for node in graph.nodes:
        v = node.meta.pop("qpack_value", None)  # the example's tensors: not kept by the trace,
        if specialized and isinstance(v, torch.Tensor):  # their shapes are (_Shapes.terms)
            node.meta["qpack_shape"] = tuple(v.shape)
    try:
        gm = torch.fx.GraphModule(model, graph)
    except Exception as e:  # noqa: BLE001 - e.g. a submodule named like a GraphModule attribute
        raise Unsupported(f"the traced model cannot become a GraphModule ({type(e).__name__}: {e})") from None
    gm._qpack_none_from = None if not nones else _positions(model)[next(iter(nones))]
    gm._qpack_defaults = None if not nones else tuple(nones.values())
    gm._qpack_shapes = specialized
    canonicalize(gm)
    return gm


def _attention_reads_placeholder(graph, model):
    """True when a scaled_dot_product_attention call's mask, is_causal or scale, or a
    frozen nn.MultiheadAttention's masks, is a forward argument (traced as a placeholder)."""
    for n in graph.nodes:
        if (n.op == "call_function" and n.target in _SDPA) or (
                n.op == "call_module" and isinstance(_submodule(model, n.target), FrozenMultiheadAttention)):
            for a in list(n.args[3:]) + list(n.kwargs.values()):
                if isinstance(a, torch.fx.Node) and a.op == "placeholder":
                    return True
    return False


def _submodule(model, name):
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def _defaults_given(args, gm):
    """True when args, passed for the parameters gm was traced with at their defaults,
    are those defaults (None: None; a number: one equal and of its type)."""
    defaults = getattr(gm, "_qpack_defaults", None) or (None,) * len(args)
    return all(a is d or (type(a) is type(d) and a == d) for a, d in zip(args, defaults))


def _positions(model):
    """{name: position} of the forward's parameters that may be passed positionally."""
    params = list(inspect.signature(type(model).forward).parameters.values())[1:]
    return {p.name: i for i, p in enumerate(params)
            if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)}


_CONSTANT_DEFAULTS = (type(None), bool, int, float)


def _trailing_defaults(model):
    """{name: default} for the trailing forward parameters whose default is None or a
    number (none when a parameter without such a default follows one)."""
    try:
        params = list(inspect.signature(type(model).forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return {}
    out = {}
    for p in params:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            return {}
        if p.default is not inspect.Parameter.empty and type(p.default) in _CONSTANT_DEFAULTS:
            out[p.name] = p.default
        elif out:
            return {}
    positions = _positions(model)
    return out if all(n in positions for n in out) else {}


# ---- canonical spellings: shape arithmetic the trace records, rewritten to ops the core runs ----

def channel_part(x, parts, index, groups):
    """Part ``index`` of ``torch.chunk(x, parts, 1)``, then a channel shuffle in
    ``groups`` (ShuffleNet's view / transpose / view): what canonicalize()
    rewrites those spellings to; the core runs it as one ``channels`` node."""
    if parts > 1:
        x = torch.chunk(x, parts, 1)[index]
    if groups > 1:
        n, c = x.shape[0], x.shape[1]
        x = x.reshape(n, groups, c // groups, *x.shape[2:]).transpose(1, 2).reshape(x.shape)
    return x


def channel_range(x, first, count):
    """``x[:, first:first + count]`` (a slice of channels, or a part of an uneven
    ``torch.split`` along dim 1): what canonicalize() rewrites those spellings to;
    the core runs it as one ``channel_range`` node."""
    return x[:, first:first + count]


def layer_norm2d(x, weight, bias, eps):
    """LayerNorm over the channels of each pixel of [N, C, H, W] (timm's
    LayerNorm2d: permute to NHWC, F.layer_norm over C, permute back): what
    canonicalize() rewrites that spelling to; the core runs it as one
    ``layer_norm`` node on the NHWC value it holds."""
    return F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), weight, bias, eps).permute(0, 3, 1, 2)


def last_dim_affine(x, scale, shift):
    """``x * scale + shift`` for constants of the last dim's size: what canonicalize()
    rewrites an eval BatchNorm1d over a rank-3 value's flattened rows to (timm's
    LeViT: ``bn(x.flatten(0, 1)).reshape_as(x)`` after each Linear); the core runs
    it as one ``affine`` node over the last dim."""
    return x * scale + shift


def channel_scale(x, scale):
    """``x * scale.reshape(1, -1, 1, 1)`` for a constant ``scale`` of C values
    (ConvNeXt's layer scale): what canonicalize() rewrites that spelling to; the
    core runs it as an ``affine`` node without shift."""
    return x * scale.reshape(1, -1, 1, 1)


def image_to_tokens(x):
    """``x.flatten(2).transpose(1, 2)``: an image [N, C, H, W] as its tokens [N, H W, C]
    (a patch embedding's); canonicalize() rewrites that spelling to it and the core runs
    it as a ``transpose`` node (the NHWC bytes as they are)."""
    return x.flatten(2).transpose(1, 2)


def tokens_to_image(t, like):
    """``t.transpose(1, 2).reshape(N, C, H, W)``: tokens [N, H W, C] as the image of the H
    and W of ``like`` (rank 4); canonicalize() rewrites that spelling to it (PVT's spatial
    reduction) and the core runs it as a ``transpose`` node with ``like`` as its second input."""
    return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], like.shape[2], like.shape[3])


def batch_constant(like, table):
    """``table.expand(like.shape[0], ...)``: a constant [1, ...] of rank 2 or 3 (ViT's class
    token, its position embedding) repeated over the batch of ``like``; canonicalize()
    rewrites that expand, and an add of such a constant to a value of its shape, to it, and
    the core runs it as a ``constant`` node (the table copied at graph creation)."""
    return table.expand((like.shape[0],) + tuple(table.shape[1:]))


def _batch_constant(node, gm, shapes):
    """(like, table node, added) when node expands a constant table [1, ...] of rank 2 or 3 over
    the batch of value ``like`` (``cls_token.expand(x.shape[0], -1, -1)``: added False), or adds
    one whose other dims are all above 1 to ``like``, a value of its rank (``x + pos_embed``:
    added True; PyTorch's broadcast then needs their dims equal, which the core's add checks);
    else None."""
    def table(a):
        t = _attr_tensor(gm, a)
        return t if (isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.ndim in (2, 3)
                     and t.shape[0] == 1 and 0 < t.numel() <= _FOLDED_CONSTANT_BYTES // 4) else None
    if node.op == "call_method" and node.target == "expand" and not node.kwargs and len(node.args) >= 2:
        t = table(node.args[0])
        sizes = list(_sizes(node.args[1:]))
        first = shapes.sym.get(sizes[0]) if isinstance(sizes[0], torch.fx.Node) else None
        if (t is not None and len(sizes) == t.ndim and isinstance(first, tuple) and first[0] == "dim"
                and first[2] == 0 and all(a == -1 or a == t.shape[i] for i, a in enumerate(sizes) if i)):
            return first[1], node.args[0], False
        return None
    if not ((node.op == "call_function" and node.target in (operator.add, torch.add)) or (
            node.op == "call_method" and node.target == "add")) or len(node.args) != 2 or node.kwargs:
        return None
    for x, k in (node.args, node.args[::-1]):
        t = table(k)
        if (t is not None and isinstance(x, torch.fx.Node) and _attr_tensor(gm, x) is None and rank_of(x) == t.ndim
                and all(d > 1 for d in t.shape[1:]) and not _last_dim_constant(t)):  # (those: an affine node)
            return x, k, True
    return None


def permute_rows(x, rows, shape):
    """x's rows of C values (a rank-4 value's NHWC pixels, a rank-3 value's rows) in the
    order ``rows`` gives, block by block (row b R + i is x's row b R + rows[i], R =
    len(rows)), as a value of ``shape``: rank 3 [N, L, C], or rank 4 [N, C, H, W] with
    those rows as its pixels (the core's permute_rows node). What a chain of reshapes
    and transposes computes that moves whole rows (MobileViT's unfold of an image into
    patches and its fold back: _row_permutation)."""
    c = x.shape[1] if x.dim() == 4 else x.shape[-1]
    y = (x.permute(0, 2, 3, 1) if x.dim() == 4 else x).reshape(-1, rows.numel(), c)[:, rows]
    if len(shape) == 4:
        return y.reshape(shape[0], shape[2], shape[3], shape[1]).permute(0, 3, 1, 2)
    return y.reshape(shape)


def _view_step(node):
    """A function doing what a reshape / view / flatten / transpose / permute / contiguous
    node does to its first argument (the reshapes to the node's traced shape), else None."""
    if not node.args or not isinstance(node.args[0], torch.fx.Node) or node.kwargs:
        return None
    method = node.target if node.op == "call_method" else {
        torch.reshape: "reshape", torch.flatten: "flatten", torch.transpose: "transpose",
        torch.permute: "permute"}.get(node.target) if node.op == "call_function" else None
    shape = node.meta.get("qpack_shape")
    if method in ("reshape", "view", "flatten") and shape is not None:
        return lambda t: t.reshape(shape)
    if method == "transpose" and len(node.args) == 3 and all(isinstance(d, int) for d in node.args[1:]):
        return lambda t: t.transpose(*node.args[1:])
    if method == "permute" and _permute_dims(node) is not None:
        return lambda t: t.permute(_permute_dims(node))
    if method == "contiguous" and len(node.args) == 1:
        return lambda t: t
    return None


def _row_permutation(node):
    """(x, rows, shape, chain) when node ends a chain of reshapes and transposes (each
    value in it read by the next step alone) from a value x of rank 3 or 4 to one of
    rank 3 or 4 that moves whole rows of C values: x's rows (NHWC pixels, or rows of
    its last dim) reordered, the same C (permute_rows); rows the order in blocks of
    one sample of x or of the result where every block moves alike, else of the whole
    value. Found by
    running the chain on x's element indices, so only in a trace specialized to
    example shapes (each value's qpack_shape); else None."""
    shape = node.meta.get("qpack_shape")
    if _view_step(node) is None or shape is None or len(shape) not in (3, 4):
        return None
    if len(node.users) == 1 and _view_step(next(iter(node.users))) is not None:
        return None  # not the chain's last step
    chain = [node]
    while _view_step(chain[-1].args[0]) is not None and len(chain[-1].args[0].users) == 1:
        chain.append(chain[-1].args[0])
    chain.reverse()
    x = chain[0].args[0]
    xs = x.meta.get("qpack_shape")
    if xs is None or len(xs) not in (3, 4) or rank_of(x) != len(xs) or \
            any(n.meta.get("qpack_shape") is None for n in chain):
        return None
    c = xs[1] if len(xs) == 4 else xs[2]
    if c != (shape[1] if len(shape) == 4 else shape[2]) or c < 1 or math.prod(xs) == 0:
        return None
    idx = torch.arange(math.prod(xs))  # each element's offset in x's rows
    t = idx.reshape(xs[0], xs[2], xs[3], c).permute(0, 3, 1, 2) if len(xs) == 4 else idx.reshape(xs)
    for step in chain:
        t = _view_step(step)(t)
    src = (t.permute(0, 2, 3, 1) if t.dim() == 4 else t).reshape(-1, c)
    if not torch.equal(src, src[:, :1] + torch.arange(c)) or bool((src[:, 0] % c).any()):
        return None  # not whole rows
    rows = src[:, 0] // c
    total = rows.numel()
    for per in sorted({total // xs[0], total // shape[0]}):  # a sample of x, of the result
        blocks = rows.reshape(-1, per) - torch.arange(0, total, per)[:, None]
        if bool((blocks == blocks[:1]).all()):
            return x, blocks[0], tuple(shape), chain
    return x, rows, tuple(shape), chain


def heads_attention(q, k, v, heads, head_dim, value_dim, offsets, scale, causal=False, mask=None, strides=None,
                    multi_query=False):
    """Multi-head attention over rank-3 values of rows: head h of the query is
    ``q[..., offsets[0] + h * head_dim:][:head_dim]``, of the key ``k``'s from
    offsets[1], of the value ``v``'s of value_dim from offsets[2]; the heads' outputs
    side by side, [N, L, heads * value_dim]. What canonicalize() rewrites a split into
    heads (timm's ``qkv(x).reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)``,
    ``.view(B, N, H, D).transpose(1, 2)``), scaled_dot_product_attention and the merge
    (``.transpose(1, 2).reshape(B, N, C)``) to; the core runs it as one ``attention``
    node, reading the heads where they are. ``strides``: (q's and k's, v's) distance from
    one head to the next where it is not the head's width (LeViT's heads in groups).
    ``multi_query``: k and v hold one head (at their offsets) that every head of q reads
    (MobileNetV4's multi-query attention)."""
    if q.dim() == 2:  # one sequence (nn.MultiheadAttention's unbatched call)
        return heads_attention(q[None], k[None], v[None], heads, head_dim, value_dim, offsets, scale, causal,
                               mask, strides, multi_query)[0]
    n, length, s = q.shape[0], q.shape[1], k.shape[1]
    qk_stride, v_stride = strides or (head_dim, value_dim)

    def split(t, at, rows, d, step, count=heads):
        if count == 1:
            return t[..., at:at + d].reshape(n, rows, 1, d).transpose(1, 2).expand(n, heads, rows, d)
        if step == d:
            return t[..., at:at + heads * d].reshape(n, rows, heads, d).transpose(1, 2)
        return torch.stack([t[..., at + i * step:at + i * step + d] for i in range(heads)], 1)
    kv_heads = 1 if multi_query else heads
    out = _attention.scaled_dot_product_attention(
        split(q, offsets[0], length, head_dim, qk_stride), split(k, offsets[1], s, head_dim, qk_stride, kv_heads),
        split(v, offsets[2], s, value_dim, v_stride, kv_heads), attn_mask=mask, is_causal=causal, scale=scale)
    return out.transpose(1, 2).reshape(n, length, heads * value_dim)


def _per_channel_constant(gm, node, x):
    """The get_attr node a per-channel constant of x comes from when node is
    g.reshape(1, -1, 1, 1) / g.view(1, C, 1, 1) / g.view(C, 1, 1) of a 1-D get_attr g, or a get_attr
    of shape [C, 1, 1] or [1, C, 1, 1] itself (torchvision's ConvNeXt), else None."""
    c = x.meta.get("qpack_channels")
    t = _attr_tensor(gm, node)
    if t is not None:  # x's channels unknown to the trace: the constant's (the core checks them)
        c = c if c is not None else t.numel()
        return node if tuple(t.shape) in ((c, 1, 1), (1, c, 1, 1)) else None
    if not (isinstance(node, torch.fx.Node) and node.op == "call_method" and node.target in ("reshape", "view")
            and not node.kwargs and len(node.args) >= 2):
        return None
    g, shape = node.args[0], _sizes(node.args[1:])
    if len(shape) == 4 and shape[0] == 1:
        shape = shape[1:]  # [1, C, 1, 1] as [C, 1, 1] (timm's metaformer Scale: view(C, 1, 1))
    if not (isinstance(g, torch.fx.Node) and g.op == "get_attr" and len(shape) == 3
            and shape[1:] == (1, 1) and (shape[0] == -1 or (c is not None and shape[0] == c))):
        return None
    return g


def _channel_scaled(gm, node):
    """(x, the constant operand, its get_attr) of a mul of a rank-4 value x by a
    per-channel constant (_per_channel_constant), in either order, else None."""
    for x, k in (node.args, node.args[::-1]):
        if isinstance(x, torch.fx.Node) and rank_of(x) == 4 and (a := _per_channel_constant(gm, k, x)) is not None:
            return x, k, a
    return None


def _sizes(args):
    """The sizes of x.view / reshape / permute(...) given one by one or as one sequence."""
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)


def _permute_dims(node):
    """The dims of x.permute(...) / torch.permute(x, ...), else None."""
    if node is None or node.kwargs or not node.args:
        return None
    if not ((node.op == "call_method" and node.target == "permute") or
            (node.op == "call_function" and node.target is torch.permute)):
        return None
    dims = list(_sizes(node.args[1:]))
    return dims if all(isinstance(d, int) for d in dims) else None


def _layer_norm_args(node, modules):
    """(x, normalized_shape as a tuple, weight, bias, eps) of an F.layer_norm call or an
    nn.LayerNorm module (weight and bias: get_attr nodes, tensors or None), else None."""
    if node.op == "call_function" and node.target is F.layer_norm:
        names = ("input", "normalized_shape", "weight", "bias", "eps")
        a = dict(zip(names, node.args))
        a.update(node.kwargs)
        if "input" not in a or "normalized_shape" not in a:
            return None
        x, shape, weight, bias, eps = a["input"], a["normalized_shape"], a.get("weight"), a.get("bias"), \
            a.get("eps", 1e-5)
    else:
        m = modules.get(node.target) if node.op == "call_module" else None
        if not (type(m) is nn.LayerNorm and len(node.args) == 1 and not node.kwargs):
            return None
        x, shape, weight, bias, eps = node.args[0], m.normalized_shape, m.weight, m.bias, m.eps
    return x, tuple(shape) if isinstance(shape, (tuple, list, torch.Size)) else (shape,), weight, bias, eps


def _group_norm_args(node, modules):
    """(x, num_groups, weight, bias, eps) of an F.group_norm call or an nn.GroupNorm
    module (weight and bias: get_attr nodes, tensors or None), else None."""
    if node.op == "call_function" and node.target is F.group_norm:
        a = dict(zip(("input", "num_groups", "weight", "bias", "eps"), node.args))
        a.update(node.kwargs)
        if "input" not in a or "num_groups" not in a:
            return None
        return a["input"], a["num_groups"], a.get("weight"), a.get("bias"), a.get("eps", 1e-5)
    m = modules.get(node.target) if node.op == "call_module" else None
    if type(m) is nn.GroupNorm and len(node.args) == 1 and not node.kwargs:
        return node.args[0], m.num_groups, m.weight, m.bias, m.eps
    return None


def resize_like(x, like, mode, align_corners):
    """``F.interpolate(x, size=like.shape[-2:], ...)``: what canonicalize() rewrites
    that spelling (torchvision's FPN) to; the core runs it as a resize node whose
    second input gives H and W."""
    return F.interpolate(x, size=like.shape[-2:], mode=mode, align_corners=align_corners)


_INTERPOLATE_ARGS = ("size", "scale_factor", "mode", "align_corners", "recompute_scale_factor", "antialias")


def _interpolate_args(node, m):
    """F.interpolate's arguments of an nn.Upsample / F.interpolate node, else None."""
    if isinstance(m, nn.Upsample):
        return dict(size=m.size, scale_factor=m.scale_factor, mode=m.mode, align_corners=m.align_corners,
                    recompute_scale_factor=m.recompute_scale_factor, antialias=False)
    if node.op != "call_function" or node.target is not F.interpolate:
        return None
    kw = dict(size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None,
              antialias=False)
    kw.update(zip(_INTERPOLATE_ARGS, node.args[1:]))
    kw.update(node.kwargs)
    return kw


def _resize(node, m):
    """(input, H/W source value or None, node kind, params) of a resize the core runs
    (nearest or bilinear to a constant size, by constant scale factors, or to another
    value's H and W), None when the node is no resize; Unsupported for the others."""
    if node.op == "call_function" and node.target is resize_like:
        x, like, mode, align_corners = node.args
        like_params = {}
    else:
        kw = _interpolate_args(node, m)
        if kw is None:
            return None
        x, like, mode, align_corners = node.args[0], None, kw["mode"], kw["align_corners"]
        if kw["antialias"] or any(isinstance(v, torch.fx.Node) for k, v in kw.items() if k != "size"):
            raise Unsupported("interpolate with antialias or traced arguments")
        size, scale = kw["size"], kw["scale_factor"]
        if isinstance(size, torch.fx.Node) or (size is None) == (scale is None):
            raise Unsupported("interpolate to a traced size (other than another value's H and W)")
        if size is not None:
            size = _ints(size, 2)
            if len(size) != 2 or not all(isinstance(v, int) and v >= 1 for v in size):
                raise Unsupported(f"interpolate to size {size}")
            like_params = dict(size=size)
        else:
            scale = tuple(float(v) for v in _ints(scale, 2))
            # the core holds float32 scale factors: only those that are exactly one
            # give PyTorch's floor(in * scale) sizes and 1 / scale coordinates
            if len(scale) != 2 or not all(v > 0 and float(np.float32(v)) == v for v in scale):
                raise Unsupported(f"interpolate by scale factors {scale}")
            if kw["recompute_scale_factor"] and not all(v == int(v) for v in scale):
                raise Unsupported("recompute_scale_factor with a fractional scale factor")
            like_params = dict(scale=scale)
    if mode not in ("nearest", "bilinear"):
        raise Unsupported(f"interpolate mode {mode!r}")
    if mode == "nearest" and align_corners is not None:
        raise Unsupported("nearest with align_corners")
    params = dict(like_params, **({"align_corners": bool(align_corners)} if mode == "bilinear" else {}))
    return x, like, "resize_" + mode, params


def _hw_source(size, shapes):
    """The value whose H and W a traced interpolate size is (``y.shape[-2:]``,
    ``y.size()[2:]``, ``(y.shape[2], y.shape[3])``), else None."""
    if isinstance(size, torch.fx.Node) and size.op == "call_function" and size.target is operator.getitem \
            and isinstance(size.args[1], slice):
        base, sl = shapes.sym.get(size.args[0]), size.args[1]
        if base is not None and base[0] == "size" and sl.stop is None and sl.step is None and (
                sl.start == -2 or sl.start == 2 and rank_of(base[1]) in (None, 4)):
            return base[1]
        return None
    if isinstance(size, (tuple, list)) and len(size) == 2:
        dims = [shapes.sym.get(d) if isinstance(d, torch.fx.Node) else None for d in size]
        if all(d is not None and d[0] == "dim" for d in dims) and dims[0][1] is dims[1][1] and \
                [dims[0][2], dims[1][2]] == [2, 3]:
            return dims[0][1]
    return None


_SAME_RANK_MODULES = (nn.ReLU, nn.ReLU6, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid, nn.SiLU, nn.GELU,
                      nn.LeakyReLU, nn.PReLU, nn.Tanh, nn.LayerNorm, nn.Identity, nn.Dropout, nn.Dropout2d,
                      nn.Dropout1d, nn.BatchNorm1d, nn.GroupNorm, FrozenLinear, nn.Linear)
_RANK4_MODULES = (FrozenConv2d, nn.Conv2d, nn.BatchNorm2d, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d,
                  nn.AdaptiveMaxPool2d, nn.Upsample, nn.ZeroPad2d, nn.ConstantPad2d)
_RANK3_MODULES = (FrozenConv1d, nn.Conv1d, nn.MaxPool1d, nn.AvgPool1d, nn.AdaptiveAvgPool1d)
_SAME_RANK_FUNCS = {F.relu, torch.relu, F.relu_, torch.relu_, F.relu6, F.hardtanh, F.hardtanh_, F.hardswish,
                    torch.sigmoid, F.silu, F.gelu, F.hardsigmoid, F.leaky_relu, torch.tanh, F.dropout, F.dropout2d,
                    F.layer_norm, F.group_norm, F.interpolate, F.max_pool2d, F.avg_pool2d, torch.clamp, channel_part, channel_range,
                    layer_norm2d, channel_scale, last_dim_affine,
                    operator.add, operator.iadd, torch.add, operator.mul, operator.imul, torch.mul,
                    operator.sub, operator.isub, torch.sub, operator.truediv, operator.itruediv, torch.div, torch.cat,
                    F.pad}
_SAME_RANK_METHODS = {"relu", "relu_", "sigmoid", "clamp", "clamp_", "contiguous", "add", "add_", "mul", "mul_",
                      "sub", "sub_", "div", "div_", "transpose", "float"}


def _pixel_shuffle_factor(node, m):
    """r when node is nn.PixelShuffle(r) / F.pixel_shuffle(x, r) / torch.pixel_shuffle of a
    rank-4 value (sub-pixel upsampling: ESPCN, EDSR), else None."""
    if isinstance(m, nn.PixelShuffle):
        r = m.upscale_factor
    elif node.op == "call_function" and node.target in (F.pixel_shuffle, torch.pixel_shuffle) and not node.kwargs:
        r = node.args[1] if len(node.args) == 2 else None
    else:
        return None
    return r if isinstance(r, int) and r >= 1 and rank_of(node.args[0]) in (4, None) else None


def _swaps_last_two_of_rank3(node):
    """True when node is x.transpose(1, 2) (any spelling of dims 1 and 2, or -1 and -2,
    torch.transpose too) or x.permute(0, 2, 1) of a value of rank 3."""
    if not (isinstance(node, torch.fx.Node) and node.args and rank_of(node.args[0]) == 3 and not node.kwargs):
        return False
    if node.target in ("transpose", torch.transpose) and len(node.args) == 3:
        return {_norm_dim(d, 3) for d in node.args[1:]} == {1, 2}
    if node.op == "call_method" and node.target == "permute":
        return tuple(_norm_dim(d, 3) for d in _sizes(node.args[1:])) == (0, 2, 1)
    return False


def rank_of(node):
    """The rank canonicalize() found for an fx node's value (None: not known)."""
    return node.meta.get("qpack_rank") if isinstance(node, torch.fx.Node) else None


def _dim_arg(node, pos, name, default=None):
    return node.args[pos] if len(node.args) > pos else node.kwargs.get(name, default)


def _norm_dim(d, rank):
    """A dim >= 0, or None when it is negative and the rank is not known."""
    if not isinstance(d, int):
        return None
    if d >= 0:
        return d
    return d + rank if rank is not None and d + rank >= 0 else None


def _mean_last(t, keepdim):
    """``t.mean(2, keepdim)`` of a rank-3 value: what canonicalize() makes of tokens'
    ``x.mean(1)`` (after transposing them); the core runs it as a global average pool."""
    return t.mean(2, keepdim=keepdim)


def _tokens_mean(node):
    """(x, keepdim) when node is ``x.mean(1)`` (``dim=1``, ``[1]``, ``-2``) of a rank-3 x;
    else None."""
    mean = _mean_dims(node)
    if mean is None or rank_of(mean[0]) != 3 or mean[1] != [1]:
        return None
    return mean[0], mean[2]


def _mean_dims(node):
    """(input, dims normalized, keepdim) of x.mean(dims) / torch.mean(x, dims), else None."""
    if not ((node.op == "call_method" and node.target == "mean") or
            (node.op == "call_function" and node.target is torch.mean)) or "dtype" in node.kwargs:
        return None
    dims = _dim_arg(node, 1, "dim")
    keepdim = _dim_arg(node, 2, "keepdim", False)
    if isinstance(dims, int):
        dims = [dims]
    if not isinstance(dims, (tuple, list)) or not dims or not isinstance(keepdim, bool):
        return None
    r = rank_of(node.args[0])
    dims = [_norm_dim(d, r) for d in dims]
    if any(d is None for d in dims):
        return None
    return node.args[0], sorted(dims), keepdim


def _own_image_view(x, terms):
    """True when terms are ``(N, -1, H, W)`` of a rank-4 value y of x's batch and x's H
    and W (_batch, _spatial): a view of the image x as itself."""
    if len(terms) != 4 or terms[1] != -1 or not all(isinstance(t, tuple) and len(t) == 3 and t[0] == "dim"
                                                     for t in (terms[0], terms[2], terms[3])):
        return False
    y = terms[0][1]
    if not (terms[2][1] is y and terms[3][1] is y and (terms[0][2], terms[2][2], terms[3][2]) == (0, 2, 3)
            and rank_of(y) == 4):
        return False
    return (x.meta.get("qpack_batch", x) is y.meta.get("qpack_batch", y)
            and x.meta.get("qpack_hw", x) is y.meta.get("qpack_hw", y))


def _concrete(term):
    """The number a shape term (_Shapes.terms) stands for in a trace specialized to
    example shapes, else None."""
    if isinstance(term, int) and not isinstance(term, bool):
        return term
    if isinstance(term, tuple) and len(term) == 3 and term[0] == "dim":
        known = term[1].meta.get("qpack_shape")
        return known[term[2]] if known is not None and term[2] < len(known) else None
    return None


class _Shapes:
    """Symbolic dims of traced values: x.size(), x.shape, their items and // by
    constants (what `b, c, h, w = x.size()` and `x.view(x.size(0), -1)` trace to)."""

    def __init__(self):
        self.sym = {}

    def visit(self, node):
        if node.op == "call_method" and node.target == "size":
            d = _dim_arg(node, 1, "dim")
            if d is None:
                self.sym[node] = ("size", node.args[0])
            elif isinstance(d, int):
                self.sym[node] = self.dim(node.args[0], d)
        elif node.op == "call_function" and node.target is getattr and node.args[1:] == ("shape",):
            self.sym[node] = ("size", node.args[0])
        elif node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[1], int):
            base = self.sym.get(node.args[0])
            if base is not None and base[0] == "size":
                self.sym[node] = self.dim(base[1], node.args[1])
        elif node.op == "call_function" and node.target is operator.floordiv and isinstance(node.args[1], int):
            base = self.sym.get(node.args[0])
            if base is not None:
                self.sym[node] = ("floordiv", base, node.args[1])
        elif node.op == "call_function" and node.target is operator.mul and len(node.args) == 2:
            a, b = (self.sym.get(t) if isinstance(t, torch.fx.Node) else None for t in node.args)
            if a is not None and b is not None:
                self.sym[node] = ("mul", a, b)  # torchvision ViT's n_h * n_w

    @staticmethod
    def dim(x, d):
        d = _norm_dim(d, rank_of(x))
        return None if d is None else ("dim", x, d)

    def terms(self, node):
        """The target shape of a view / reshape as ints and symbols (None: not one). In a
        trace specialized to example shapes (trace's _ShapeTracer), a number that is the
        input's size at its position is that size (``reshape(b, h * w, c)`` of [b, h w, c]:
        the trace has 64 where a symbolic one has h * w)."""
        if not (node.op == "call_method" and node.target in ("view", "reshape")) and not (
                node.op == "call_function" and node.target is torch.reshape):
            return None
        shape = list(_sizes(node.args[1:]))
        if node.kwargs.get("shape") is not None:
            shape = list(node.kwargs["shape"])
        x = node.args[0]
        known = x.meta.get("qpack_shape") if isinstance(x, torch.fx.Node) else None
        out = []
        for i, a in enumerate(shape):
            if not isinstance(a, int):
                if a not in self.sym and isinstance(a, torch.fx.Node):
                    self.visit(a)  # a size node made after the node being rewritten (_ShapeTracer's)
                out.append(self.sym.get(a, "?"))
            elif known is not None and i < len(known) and a == known[i] and a != -1 and not isinstance(a, bool):
                out.append(("dim", x, i))
            else:
                out.append(a)
        return out


_INPLACE_FUNCS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.setitem}
# ops whose result may be their first input itself or a view of it (PyTorch's)
_ALIAS_FUNCS = {operator.getitem, torch.flatten, torch.reshape, torch.narrow, torch.transpose, torch.permute,
                torch.squeeze, torch.unsqueeze, torch.chunk, torch.split, F.dropout, F.dropout2d}
_ALIAS_METHODS = {"view", "view_as", "reshape", "reshape_as", "flatten", "squeeze", "unsqueeze", "transpose",
                  "permute", "narrow", "expand", "expand_as", "contiguous", "chunk", "split", "t", "float", "detach"}


@functools.lru_cache(maxsize=None)
def _inplace_position(fn):
    """Where a function takes ``inplace`` positionally (F.relu(x, True): 1), or None."""
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("inplace") if "inplace" in names else None


def _in_place(node, modules):
    """True when ``node`` may write into its first input (x += y, x[...] = y, relu_(),
    inplace=True)."""
    if node.op == "call_function":
        at = _inplace_position(node.target)
        return node.target in _INPLACE_FUNCS or node.kwargs.get("inplace") is True or (
            at is not None and len(node.args) > at and node.args[at] is True)
    if node.op == "call_method":
        return node.target.endswith("_") or node.kwargs.get("inplace") is True
    return node.op == "call_module" and getattr(modules.get(node.target), "inplace", False) is True


def _is_alias(node, modules):
    """True when ``node``'s value may be its first input or a view of it."""
    if node.op == "call_function":
        return node.target in _ALIAS_FUNCS or node.target in (channel_part, channel_range) or _in_place(node, modules)
    if node.op == "call_method":
        return node.target in _ALIAS_METHODS or _in_place(node, modules)
    return node.op == "call_module" and (isinstance(modules.get(node.target), _IDENTITY_MODULES + (nn.Flatten,))
                                         or _in_place(node, modules))


def _mutated(node, modules):
    """True when an op may write into ``node``'s value in place: a slice of it, a
    view in PyTorch, would see the write."""
    return any(_in_place(u, modules) for u in node.users)


def _channel_slice(node, modules):
    """(first, count, picked) of x[:, a:b] (trailing dims whole) on a value of known rank and
    channels (picked False), or of x[:, k] (``x[:, k, :]``) for k >= 0 on rank-3 rows [N, L, C]
    (count 1, picked True: dim 1 dropped; ViT's class token taken for its head), x written in
    place by nothing; else None."""
    x, idx = node.args if len(node.args) == 2 else (None, None)
    if not isinstance(x, torch.fx.Node) or not isinstance(idx, tuple) or len(idx) < 2:
        return None
    r, c = rank_of(x), channels_of(x)
    s = idx[1]
    if (r is None or len(idx) > r or idx[0] != slice(None) or any(i != slice(None) for i in idx[2:])
            or _mutated(node, modules) or _mutated(x, modules)):
        return None
    if isinstance(s, int) and not isinstance(s, bool):
        return (s, 1, True) if r == 3 and s >= 0 else None
    if (c is None or not isinstance(s, slice) or s.step not in (None, 1)
            or not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in (s.start, s.stop))):
        return None
    first, stop, _ = s.indices(c)
    return (first, stop - first, False) if stop > first else None


_PAD_ARGS = ("input", "pad", "mode", "value")


def _image_pad(node, m):
    """(x, (top, left, bottom, right), value) when node pads the H and W of a rank-4 value by
    constants >= 0 (``F.pad(x, (l, r[, t, b]), value=v)`` in "constant" mode; nn.ZeroPad2d,
    nn.ConstantPad2d: module m), else None."""
    if isinstance(m, (nn.ZeroPad2d, nn.ConstantPad2d)):
        x, pads, mode, value = (node.args[0] if node.args else None), m.padding, "constant", m.value
    elif node.op == "call_function" and node.target is F.pad:
        kw = dict(zip(_PAD_ARGS, node.args), **node.kwargs)
        x, pads, mode, value = kw.get("input"), kw.get("pad"), kw.get("mode", "constant"), kw.get("value")
    else:
        return None
    pads = tuple(pads) if isinstance(pads, (tuple, list)) else None
    value = 0.0 if value is None else value
    if not (isinstance(x, torch.fx.Node) and rank_of(x) == 4 and mode == "constant" and pads is not None
            and len(pads) in (2, 4) and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in pads)
            and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
        return None
    left, right, top, bottom = pads + (0, 0) * (len(pads) == 2)
    return x, (top, left, bottom, right), float(value)


def _split_parts(node, modules):
    """{getitem user: (first, count)} of torch.split(x, sizes, 1) / x.split(...)
    along the channels of a value of known channels, all of whose users take
    one part by index; else None."""
    if not ((node.op == "call_method" and node.target == "split") or (
            node.op == "call_function" and node.target is torch.split)) or not node.args:
        return None
    x = node.args[0]
    sizes = node.args[1] if len(node.args) > 1 else node.kwargs.get(
        "split_size_or_sections", node.kwargs.get("split_size"))
    if not isinstance(x, torch.fx.Node):
        return None
    c, dim = channels_of(x), _norm_dim(_dim_arg(node, 2, "dim", 0), rank_of(x))
    if dim != 1 or c is None or set(node.kwargs) - {"dim", "split_size_or_sections", "split_size"}:
        return None
    if isinstance(sizes, int) and not isinstance(sizes, bool) and sizes >= 1:
        sizes = [sizes] * (c // sizes) + ([c % sizes] if c % sizes else [])
    if not (isinstance(sizes, (list, tuple)) and sizes and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes) and sum(sizes) == c):
        return None
    users = list(node.users)
    if not users or not all(u.op == "call_function" and u.target is operator.getitem and isinstance(u.args[1], int)
                            and -len(sizes) <= u.args[1] < len(sizes) and not _mutated(u, modules) for u in users):
        return None  # (a negative index counts from the end: Res2Net's spx[-1])
    if _mutated(x, modules):
        return None
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    return {u: (offsets[u.args[1] % len(sizes)], sizes[u.args[1] % len(sizes)]) for u in users}


def _only_user(node):
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _is_transpose_12(node, x):
    """node is x.transpose(1, 2) / torch.transpose(x, 1, 2) / x.permute(0, 2, 1, 3, 4)."""
    if node is None or not node.args or node.args[0] is not x or node.kwargs:
        return False
    if (node.op == "call_method" and node.target == "transpose") or (
            node.op == "call_function" and node.target is torch.transpose):
        return sorted(node.args[1:]) == [1, 2]
    return _permute_dims(node) == [0, 2, 1, 3, 4]


_SCALAR_OPS = {operator.add: "add", operator.iadd: "add", torch.add: "add", "add": "add", "add_": "add",
               operator.sub: "sub", operator.isub: "sub", torch.sub: "sub", "sub": "sub", "sub_": "sub",
               operator.mul: "mul", operator.imul: "mul", torch.mul: "mul", "mul": "mul", "mul_": "mul",
               operator.truediv: "div", operator.itruediv: "div", torch.div: "div", "div": "div", "div_": "div"}


def _scalar_affine(node):
    """(x, scale, shift) when node is x + c, c + x, x - c, c - x, x * c, c * x or
    x / c for a number c (written-out Hardswish: x * relu6(x + 3) / 6), else None."""
    op = node.target if node.op in ("call_function", "call_method") else None
    kind = _SCALAR_OPS.get(op) if isinstance(op, str) == (node.op == "call_method") else None
    if kind is None or len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    num = (int, float)
    if isinstance(a, torch.fx.Node) and isinstance(b, num) and not isinstance(b, bool):
        x, c, x_first = a, float(b), True
    elif isinstance(b, torch.fx.Node) and isinstance(a, num) and not isinstance(a, bool) and node.op == "call_function":
        x, c, x_first = b, float(a), False
    else:
        return None
    if kind == "add":
        return x, 1.0, c
    if kind == "sub":
        return (x, 1.0, -c) if x_first else (x, -1.0, c)
    if kind == "mul":
        return x, c, 0.0
    if kind == "div" and x_first and c != 0.0:
        return x, 1.0 / c, 0.0
    return None


def channels_of(node):
    """Dim 1 of a node's value where canonicalize() could tell it (None: not known)."""
    return node.meta.get("qpack_channels") if isinstance(node, torch.fx.Node) else None


def _channels_or_constant(x, t):
    """x's channels, or where the trace cannot tell them the count of the per-channel
    constant t applied to it (None: neither; the core checks them when it plans)."""
    c = channels_of(x)
    return c if c is not None or t is None else t.numel()


def _channels(node, modules):
    """Dim 1 of a node's value from its layer or its inputs', or None."""
    x = node.args[0] if node.args else None
    if node.op == "call_module":
        m = modules.get(node.target)
        if isinstance(m, (FrozenConv1d, FrozenConv2d, nn.Conv1d, nn.Conv2d)):
            return m.out_channels
        if isinstance(m, (FrozenLinear, nn.Linear)):
            return m.out_features if rank_of(node) == 2 else None
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            return m.num_features
        if isinstance(m, nn.Flatten):
            return channels_of(x) if rank_of(x) == 2 else None
        if isinstance(m, _SAME_RANK_MODULES + _RANK4_MODULES + _RANK3_MODULES) and not isinstance(m, nn.LayerNorm):
            return channels_of(x)
        return None
    if node.op == "call_function" and node.target is torch.cat:
        cs = [channels_of(t) for t in x] if isinstance(x, (tuple, list)) else [None]
        return sum(cs) if None not in cs and _dim_arg(node, 1, "dim", 0) == 1 else None
    if node.op == "call_function" and node.target in (resize_like, F.batch_norm):
        return channels_of(x)
    if node.op == "call_function" and node.target is channel_part:
        c = channels_of(x)
        return c // node.args[1] if c is not None and c % node.args[1] == 0 else None
    if node.op == "call_function" and node.target is channel_range:
        return node.args[2]
    if _permute_dims(node) == [0, 3, 1, 2]:  # the end of a channels-last region (ConvNeXt): its last Linear's
        while isinstance(x, torch.fx.Node) and x.args and (  # outputs, through dropout and activations
                isinstance(modules.get(x.target) if x.op == "call_module" else None, _IDENTITY_MODULES)
                or _activation(x, modules) is not None):
            x = x.args[0]
        m = modules.get(x.target) if isinstance(x, torch.fx.Node) and x.op == "call_module" else None
        return m.out_features if isinstance(m, (FrozenLinear, nn.Linear)) else None
    if _scalar_affine(node) is not None:
        return channels_of(_scalar_affine(node)[0])
    if node.op == "call_function" and node.target is F.pad:  # of H and W only: the channels kept
        pad = _image_pad(node, None)
        return channels_of(pad[0]) if pad is not None else None
    if (node.op == "call_function" and node.target in _SAME_RANK_FUNCS - {torch.cat, F.layer_norm}) or (
            node.op == "call_method" and node.target in _SAME_RANK_METHODS - {"transpose"}):
        cs = {channels_of(a) for a in node.args if isinstance(a, torch.fx.Node)} - {None}
        return cs.pop() if len(cs) == 1 else None
    if node.op == "call_function" and node.target in (F.adaptive_avg_pool2d, F.adaptive_avg_pool1d):
        return channels_of(x)
    mean = _mean_dims(node)
    if mean is not None and 1 not in mean[1]:
        return channels_of(x)
    if (node.op == "call_function" and node.target is torch.flatten) or (
            node.op == "call_method" and node.target == "flatten"):
        r = rank_of(x)
        unit = x.meta.get("qpack_unit", frozenset()) if isinstance(x, torch.fx.Node) else frozenset()
        if rank_of(node) == 2 and r is not None and set(range(2, r)) <= unit:
            return channels_of(x)
    return None


def _attr_tensor(gm, a):
    """The tensor a get_attr node names, or None."""
    if not (isinstance(a, torch.fx.Node) and a.op == "get_attr"):
        return None
    t = gm
    for part in a.target.split("."):
        t = getattr(t, part, None)
    return t if isinstance(t, torch.Tensor) else None


# the most bytes a constant computed at freeze (an index of a table, below) may take
_FOLDED_CONSTANT_BYTES = 16 << 20


def _constant_index(gm, index):
    """An index made of constants only (ints, None, Ellipsis, slices of ints, tensors
    the module holds, tuples of those) as PyTorch takes it, else raises LookupError."""
    if isinstance(index, torch.fx.Node):
        t = _attr_tensor(gm, index)
        if t is None:
            raise LookupError(index)
        return t
    if isinstance(index, tuple):
        return tuple(_constant_index(gm, i) for i in index)
    if isinstance(index, slice):
        parts = (index.start, index.stop, index.step)
        if not all(p is None or type(p) is int for p in parts):
            raise LookupError(index)
        return index
    if index is None or index is Ellipsis or type(index) is int:
        return index
    raise LookupError(index)


def _constant_view(gm, a):
    """The tensor a get_attr node names, a view / reshape of one by constant sizes
    (timm's metaformer Scale: ``self.scale.view(self.shape)``), or an index of one by
    constants with a tensor among them (timm's LeViT:
    ``self.attention_biases[:, self.attention_bias_idxs]``, a table gathered at every
    call; at most _FOLDED_CONSTANT_BYTES), else None."""
    t = _attr_tensor(gm, a)
    if (t is None and isinstance(a, torch.fx.Node) and a.op == "call_function" and a.target is operator.getitem
            and len(a.args) == 2 and not a.kwargs):
        base = _attr_tensor(gm, a.args[0])
        try:
            index = _constant_index(gm, a.args[1])
        except LookupError:
            return None
        flat = index if isinstance(index, tuple) else (index,)
        ours = a.args[0].op == "get_attr" and str(a.args[0].target).startswith("_qpack_constant_")
        if base is None or not (ours or any(isinstance(i, torch.Tensor) for i in flat)):
            # a basic slice stays a view of the module's tensor, not a copy (of a constant
            # folded here, EfficientViT-M's biases gathered then indexed by head, it is one)
            return None
        with torch.no_grad():
            try:
                t = base.detach()[index]
            except (IndexError, RuntimeError, TypeError):
                return None
        return t.clone() if t.numel() * t.element_size() <= _FOLDED_CONSTANT_BYTES else None
    if t is not None or not (isinstance(a, torch.fx.Node) and a.op == "call_method"
                             and a.target in ("view", "reshape") and len(a.args) >= 2 and not a.kwargs):
        return t
    base, shape = _attr_tensor(gm, a.args[0]), _sizes(a.args[1:])
    if base is None or not all(isinstance(d, int) for d in shape):
        return None
    try:
        return base.reshape(shape)
    except RuntimeError:
        return None


def _small_power(node):
    """2 or 3 when node is x ** 2 / x ** 3 (torch.pow(x, n), x.pow(n), x.square()) of a
    traced value, else 0."""
    is_pow = (node.op == "call_function" and node.target in (operator.pow, torch.pow)) or (
        node.op == "call_method" and node.target == "pow")
    if is_pow and len(node.args) == 2 and not node.kwargs and node.args[1] in (2, 3) \
            and type(node.args[1]) in (int, float):
        x, n = node.args[0], int(node.args[1])
    elif ((node.op == "call_method" and node.target == "square") or
          (node.op == "call_function" and node.target is torch.square)) and len(node.args) == 1 and not node.kwargs:
        x, n = node.args[0], 2
    else:
        return 0
    return n if isinstance(x, torch.fx.Node) and not x.meta.get("qpack_shape_value") and x.op != "get_attr" else 0


def _tensor_sub(gm, node):
    """node is a - b (operator.sub, torch.sub, .sub()) of two traced values, neither a
    size nor a constant the module holds."""
    is_sub = (node.op == "call_function" and node.target in (operator.sub, torch.sub)) or (
        node.op == "call_method" and node.target == "sub")
    return (is_sub and len(node.args) == 2 and not node.kwargs and all(
        isinstance(v, torch.fx.Node) and not v.meta.get("qpack_shape_value") and v.op != "get_attr"
        and _attr_tensor(gm, v) is None for v in node.args) and not node.meta.get("qpack_shape_value"))


def _flat_rows_bn(node, modules):
    """(x, the BatchNorm1d, the flatten node) when node is ``bn(x.flatten(0, 1)).reshape_as(x)``
    for an eval BatchNorm1d over x's last dim and x of rank 3 (the flattened rows
    [B * N, C]: the BatchNorm normalizes C), neither in-between value read elsewhere;
    else None."""
    if not (node.op == "call_method" and node.target == "reshape_as" and len(node.args) == 2 and not node.kwargs):
        return None
    b, x = node.args
    m = modules.get(b.target) if isinstance(b, torch.fx.Node) and b.op == "call_module" else None
    if not (isinstance(m, nn.BatchNorm1d) and not m.training and m.track_running_stats
            and m.running_mean is not None and len(b.args) == 1 and not b.kwargs and len(b.users) == 1):
        return None
    flat = b.args[0]
    if not (isinstance(flat, torch.fx.Node) and len(flat.users) == 1 and flat.args and flat.args[0] is x
            and rank_of(x) == 3):
        return None
    spelled = (flat.op == "call_method" and flat.target == "flatten") or (
        flat.op == "call_function" and flat.target is torch.flatten)
    if not spelled or (_dim_arg(flat, 1, "start_dim", 0), _dim_arg(flat, 2, "end_dim", -1)) not in ((0, 1), (0, -2)):
        return None
    return x, m, flat


def _bn_affine(mean, var, weight, bias, eps):
    """(scale, shift), float64: eval BatchNorm as x * scale + shift."""
    var, mean = var.detach().double(), mean.detach().double()
    g = weight.detach().double() if weight is not None else torch.ones_like(var)
    b = bias.detach().double() if bias is not None else torch.zeros_like(var)
    scale = g / torch.sqrt(var + eps)
    return scale, b - mean * scale


_BN_ARGS = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")


def _functional_bn(node, gm):
    """(x, scale, shift) of F.batch_norm(x, ...) with training=False over float
    tensors the module holds (get_attr), else None."""
    if node.op != "call_function" or node.target is not F.batch_norm or len(node.args) > len(_BN_ARGS):
        return None
    a = dict(weight=None, bias=None, training=False, eps=1e-5)
    a.update(zip(_BN_ARGS, node.args))
    a.update(node.kwargs)
    if a["training"] is not False or not isinstance(a["eps"], (int, float)) or isinstance(a["eps"], bool):
        return None
    t = {k: _attr_tensor(gm, a.get(k)) for k in ("running_mean", "running_var", "weight", "bias")}
    for k in ("weight", "bias"):
        if a[k] is not None and t[k] is None:
            return None
    if t["running_mean"] is None or t["running_var"] is None or any(
            v is not None and (v.dtype != torch.float32 or v.dim() != 1) for v in t.values()):
        return None
    scale, shift = _bn_affine(t["running_mean"], t["running_var"], t["weight"], t["bias"], float(a["eps"]))
    return a["input"], scale, shift


def _rank_query(node):
    """x of x.ndim / x.dim(), else None."""
    if not isinstance(node, torch.fx.Node) or len(node.args) < 1:
        return None
    if node.op == "call_function" and node.target is getattr and node.args[1:] == ("ndim",):
        return node.args[0]
    if node.op == "call_method" and node.target == "dim" and len(node.args) == 1 and not node.kwargs:
        return node.args[0]
    return None


def _rank_check_holds(cond):
    """True when ``cond`` is x.ndim == k (or x.dim() == k) for a value x whose rank is known to be k."""
    if not (isinstance(cond, torch.fx.Node) and cond.op == "call_function" and cond.target is operator.eq
            and len(cond.args) == 2):
        return False
    a, k = cond.args
    if _rank_query(a) is None:
        a, k = k, a
    x = _rank_query(a)
    return x is not None and isinstance(k, int) and rank_of(x) == k


def _rank(node, modules):
    """The rank of an fx node's value from its op and its inputs' ranks, or None."""
    if node.op == "placeholder":  # an input's, in a trace specialized to example shapes
        shape = node.meta.get("qpack_shape")
        return len(shape) if shape is not None else None
    first = node.args[0] if node.args else None
    r = rank_of(first)
    if node.op == "call_module":
        m = modules.get(node.target)
        if isinstance(m, _RANK4_MODULES):
            return 4
        if isinstance(m, _RANK3_MODULES):
            return 3
        if isinstance(m, nn.Flatten):
            return 2 if (m.start_dim, m.end_dim) == (1, -1) else None
        return r if isinstance(m, _SAME_RANK_MODULES) else None
    if node.op == "call_function" and node.target is batch_constant:
        return rank_of(node.args[1])  # its table's
    if node.op == "call_function" and node.target is permute_rows:
        return len(node.args[2])
    if node.op == "call_function" and node.target is torch.cat:
        return next((rank_of(t) for t in first if rank_of(t) is not None), None) if isinstance(
            first, (tuple, list)) else None
    if node.op == "call_function" and (node.target in (F.batch_norm, channel_scale, layer_norm2d) or (
            getattr(node.target, "__name__", "") == "stochastic_depth"
            and getattr(node.target, "__module__", "") == "torchvision.ops.stochastic_depth")):
        return r  # the other arguments are constants
    if (node.op == "call_function" and node.target in _SAME_RANK_FUNCS) or (
            node.op == "call_method" and node.target in _SAME_RANK_METHODS):
        ranks = [rank_of(a) for a in node.args if isinstance(a, torch.fx.Node)]
        return None if not ranks or None in ranks else max(ranks)
    if node.op == "call_function" and node.target in (F.adaptive_avg_pool2d, F.adaptive_max_pool2d, resize_like):
        return 4
    if node.op == "call_function" and node.target is F.adaptive_avg_pool1d:
        return 3
    if (node.op == "call_function" and node.target is torch.flatten) or (
            node.op == "call_method" and node.target == "flatten"):
        start, end = _dim_arg(node, 1, "start_dim", 0), _dim_arg(node, 2, "end_dim", -1)
        if r is not None and isinstance(start, int) and isinstance(end, int):
            s, e = _norm_dim(start, r), _norm_dim(end, r)
            return None if s is None or e is None else r - (e - s)
        return 2 if (start, end) == (1, -1) else None
    mean = _mean_dims(node)
    if mean is not None and r is not None:
        return r if mean[2] else r - len(set(mean[1]))
    if _permute_dims(node) is not None:
        return len(_permute_dims(node))
    if node.op == "call_method" and node.target in ("view", "reshape", "permute"):
        return len(_sizes(node.args[1:])) or None
    if node.op == "call_method" and node.target == "squeeze" and r is not None:
        d = _norm_dim(_dim_arg(node, 1, "dim"), r)
        return r - 1 if d is not None and d in node.args[0].meta.get("qpack_unit", ()) else None
    if node.op == "call_method" and node.target == "unsqueeze" and r is not None:
        return r + 1
    return None


def _source_of(a, key, find, modules):
    """The value a node's meta ``key`` names (qpack_batch by _batch, qpack_hw by _spatial:
    the value whose dims it shares), itself when none; found now for a node a rewrite
    made after the walk that sets the meta; None for a non-node."""
    if not isinstance(a, torch.fx.Node):
        return None
    if key not in a.meta and a.op == "call_function" and a.target in _REWRITTEN:
        return find(a, modules)
    return a.meta.get(key, a)


def _batch(node, modules):
    """The value whose dim 0 this node's value has (itself unless its op keeps
    its input's dim 0: layers, pooling, elementwise ops on one batch, flatten(1),
    cat along dim >= 1, means that keep dim 0)."""
    def of(a):
        return _source_of(a, "qpack_batch", _batch, modules)

    x = node.args[0] if node.args else None
    if not isinstance(x, torch.fx.Node) and not (node.op == "call_function" and node.target is torch.cat):
        return node
    keeps = False
    if node.op == "call_module":
        keeps = isinstance(modules.get(node.target), _SAME_RANK_MODULES + _RANK4_MODULES + _RANK3_MODULES)
    elif node.op == "call_function" and node.target is torch.cat:
        dim = _dim_arg(node, 1, "dim", 0)
        if isinstance(node.args[0], (tuple, list)) and isinstance(dim, int) and dim >= 1:
            batches = {of(t) for t in node.args[0]}
            return batches.pop() if len(batches) == 1 and None not in batches else node
    elif (node.op == "call_function" and node.target in _SAME_RANK_FUNCS) or (
            node.op == "call_method" and node.target in _SAME_RANK_METHODS - {"transpose"}):
        batches = {of(a) for a in node.args if isinstance(a, torch.fx.Node)}
        keeps = len(batches) == 1
    elif node.op == "call_function" and node.target in (F.adaptive_avg_pool2d, F.adaptive_avg_pool1d, resize_like,
                                                          image_to_tokens, tokens_to_image, _mean_last,
                                                          batch_constant):
        keeps = True
    elif (node.op == "call_function" and node.target is torch.flatten) or (
            node.op == "call_method" and node.target == "flatten"):
        keeps = isinstance(_dim_arg(node, 1, "start_dim", 0), int) and _dim_arg(node, 1, "start_dim", 0) >= 1
    else:
        mean = _mean_dims(node)
        keeps = mean is not None and 0 not in mean[1]
    return of(x) if keeps else node


# ops canonicalize writes in place of others, after the walk that sets each node's meta
_REWRITTEN = (channel_part, channel_range, tokens_to_image)

_KEEP_HW_FUNCS = {F.relu, torch.relu, F.relu_, torch.relu_, F.relu6, F.hardtanh, F.hardtanh_, F.hardswish,
                  torch.sigmoid, F.silu, F.gelu, F.hardsigmoid, F.leaky_relu, torch.tanh, F.dropout, F.dropout2d,
                  torch.clamp, channel_part, channel_range, channel_scale, layer_norm2d, operator.add, operator.iadd,
                  torch.add, operator.mul, operator.imul, torch.mul}


def _spatial(node, modules):
    """The rank-4 value whose H and W (dims 2, 3) this node's rank-4 value has (itself
    unless its op keeps them: a stride-1 convolution padded to its input's size,
    BatchNorm, activations, channel parts and concats, elementwise ops of values that
    have them, tokens back to an image of them)."""
    def of(a):
        return _source_of(a, "qpack_hw", _spatial, modules)

    if rank_of(node) != 4:
        return node
    if node.op == "call_function" and node.target is tokens_to_image:
        return of(node.args[1])
    x = node.args[0] if node.args else None
    if node.op == "call_module":
        m = modules.get(node.target)
        if isinstance(m, (FrozenConv2d, nn.Conv2d)):
            k, p, d, st = (tuple(a) if isinstance(a, (tuple, list)) else (a, a)
                           for a in (m.kernel_size, m.padding, m.dilation, m.stride))
            same = not isinstance(m.padding, str) and st == (1, 1) and all(
                2 * p[i] == d[i] * (k[i] - 1) for i in range(2))
            return of(x) if same else node
        return of(x) if isinstance(m, _SAME_RANK_MODULES + (nn.BatchNorm2d,)) else node
    if node.op == "call_function" and node.target is operator.getitem:
        return of(x) if isinstance(node.args[1], int) and x.op in ("call_method", "call_function") and (
            x.target in ("split", "chunk", torch.split, torch.chunk)) and _dim_arg(x, 2, "dim", 0) == 1 else node
    if node.op == "call_function" and node.target is torch.cat:
        parts = node.args[0] if isinstance(node.args[0], (tuple, list)) else ()
        hws = {of(t) for t in parts}
        return hws.pop() if _dim_arg(node, 1, "dim", 0) == 1 and len(hws) == 1 and None not in hws else node
    if (node.op == "call_function" and node.target in _KEEP_HW_FUNCS) or (
            node.op == "call_method" and node.target in _SAME_RANK_METHODS - {"transpose", "permute", "view",
                                                                               "reshape", "flatten"}):
        hws = {of(a) for a in node.args if isinstance(a, torch.fx.Node) and rank_of(a) == 4}
        return hws.pop() if len(hws) == 1 else node
    return node


def _unit_dims(node, modules):
    """Dims of a node's value known to be 1 (global pooling with keepdim)."""
    r = node.meta.get("qpack_rank")
    m = modules.get(node.target) if node.op == "call_module" else None
    size = None
    if isinstance(m, (nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool1d)):
        size = m.output_size
    elif node.op == "call_function" and node.target in (F.adaptive_avg_pool2d, F.adaptive_avg_pool1d):
        size = _dim_arg(node, 1, "output_size")
    if size is not None and r in (3, 4) and _ints(size, r - 2) == (1,) * (r - 2):
        return frozenset(range(2, r))
    mean = _mean_dims(node)
    if mean is not None and mean[2]:
        return frozenset(mean[1])
    if node.op == "call_method" and node.target == "squeeze" and rank_of(node.args[0]) is not None:
        d = _norm_dim(_dim_arg(node, 1, "dim"), rank_of(node.args[0]))
        return frozenset(u for u in node.args[0].meta.get("qpack_unit", ()) if u < d)
    return frozenset()


_SHAPE_ARITHMETIC = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv, operator.mod}


_SDPA = (F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention)
_MATMUL = (operator.matmul, torch.matmul)


def _is_matmul(node):
    return isinstance(node, torch.fx.Node) and (
        (node.op == "call_function" and node.target in _MATMUL and len(node.args) == 2 and not node.kwargs)
        or (node.op == "call_method" and node.target == "matmul" and len(node.args) == 2 and not node.kwargs))


def _by_number(node):
    """(x, c) when node is x scaled by a number c (x * c, c * x, x / c: _scalar_affine
    without a shift) and read by one op only, else None."""
    scalar = _scalar_affine(node) if isinstance(node, torch.fx.Node) else None
    if scalar is None or scalar[2] != 0.0 or len(node.users) != 1:
        return None
    return scalar[0], scalar[1]


def _causal_fill(x, gm):
    """(scores, nodes to drop) when x is ``scores.masked_fill(tril[:, :, :T, :T] == 0,
    float("-inf"))`` for a constant lower-triangular matrix of ones ``tril`` ([M, M] behind
    unit dims) and one size T for both slices: a causal mask, top-left (nanoGPT's slow
    path); else None."""
    if not (isinstance(x, torch.fx.Node) and x.op == "call_method" and x.target == "masked_fill"
            and len(x.args) == 3 and not x.kwargs and len(x.users) == 1 and x.args[2] == float("-inf")):
        return None
    cond = x.args[1]
    if not (isinstance(cond, torch.fx.Node) and cond.op == "call_function" and cond.target is operator.eq
            and len(cond.args) == 2 and cond.args[1] == 0 and len(cond.users) == 1):
        return None
    sl = cond.args[0]
    if not (isinstance(sl, torch.fx.Node) and sl.op == "call_function" and sl.target is operator.getitem
            and len(sl.users) == 1 and isinstance(sl.args[1], tuple)):
        return None
    t = _attr_tensor(gm, sl.args[0])
    index = sl.args[1]
    if t is None or t.dim() < 2 or len(index) != t.dim() or any(n != 1 for n in t.shape[:-2]) \
            or t.shape[-1] != t.shape[-2]:
        return None
    rows, cols = index[-2:]
    if not (all(isinstance(i, slice) and i == slice(None) for i in index[:-2]) and isinstance(rows, slice)
            and isinstance(cols, slice) and rows.start is None and rows.step is None and cols.start is None
            and cols.step is None and rows.stop is not None and rows.stop is cols.stop):
        return None
    m = t.reshape(t.shape[-2:])
    if not torch.equal(m != 0, torch.ones_like(m, dtype=torch.bool).tril()):
        return None
    return x.args[0], [x, cond, sl]


def _softmax_scores(p, gm=None):
    """(q side, k side, mask or None, scale, causal, the nodes it replaces) when p is
    ``softmax((qs @ ks) * c [+ mask], dim=-1)`` (the scale also as ``(qs * c) @ ks``,
    ``/ c`` or none; or a causal mask filled in, _causal_fill), every value in between
    read by the next op only; else None."""
    if not (isinstance(p, torch.fx.Node) and len(p.users) == 1 and p.args):
        return None
    x = p.args[0]
    dim = _dim_arg(p, 1, "dim")
    if not ((p.op == "call_method" and p.target == "softmax") or (
            p.op == "call_function" and p.target in (F.softmax, torch.softmax))) \
            or set(p.kwargs) - {"dim", "_stacklevel", "dtype"} or p.kwargs.get("dtype") is not None \
            or len(p.args) > 2 or not (dim == -1 or (dim is not None and dim == (rank_of(x) or 0) - 1)):
        return None  # (F.softmax's _stacklevel only picks a warning's frame)
    replaced, mask, causal = [p], None, False
    filled = _causal_fill(x, gm) if gm is not None else None
    if filled is not None:
        x, dropped = filled
        replaced += dropped
        causal = True
    elif (isinstance(x, torch.fx.Node) and x.op == "call_function" and x.target in (operator.add, torch.add)
            and len(x.args) == 2 and not x.kwargs and len(x.users) == 1):
        for a, b in (x.args, x.args[::-1]):
            if isinstance(b, torch.fx.Node) and (_is_matmul(a) or _by_number(a) is not None):
                replaced.append(x)
                x, mask = a, b
                break
    scale = 1.0
    scaled = _by_number(x)
    if scaled is not None:
        replaced.append(x)
        x, scale = scaled
    if not (_is_matmul(x) and len(x.users) == 1):
        return None
    replaced.append(x)
    q, kt = x.args
    pre = _by_number(q)
    if pre is not None:  # (q * c) @ kt
        replaced.append(q)
        q, c = pre
        scale *= c
    if not (isinstance(q, torch.fx.Node) and isinstance(kt, torch.fx.Node)):
        return None
    return q, kt, mask, scale, causal, replaced


def _explicit_attention(node, gm=None, modules=None):
    """(q, k transposed, v, mask or None, scale, causal, the nodes it replaces) when node
    is ``softmax((q @ kt) * c [+ mask], dim=-1) @ v`` (_softmax_scores: LeViT's attention
    with its bias table, timm's unfused attention, nanoGPT's causal fill; an eval Dropout
    between the softmax and the product, timm's attn_drop); else None."""
    if not _is_matmul(node):
        return None
    top, v = node.args
    p = _through_identity(top, modules, _IDENTITY_MODULES) if modules is not None else top
    skipped = []
    while top is not p:
        skipped.append(top)
        top = top.args[0]
    scores = _softmax_scores(p, gm)
    if scores is None or not isinstance(v, torch.fx.Node):
        return None
    q, kt, mask, scale, causal, replaced = scores
    return q, kt, v, mask, scale, causal, [node] + skipped + replaced


def _flat_image(n):
    """x when n is ``x.flatten(2)`` (``torch.flatten(x, 2)``) of a rank-4 x, read by one
    op only; else None."""
    if not (isinstance(n, torch.fx.Node) and len(n.users) == 1 and n.args and isinstance(n.args[0], torch.fx.Node)
            and ((n.op == "call_method" and n.target == "flatten") or
                 (n.op == "call_function" and n.target is torch.flatten))):
        return None
    if _dim_arg(n, 1, "start_dim", 0) != 2 or _dim_arg(n, 2, "end_dim", -1) not in (-1, 3) \
            or rank_of(n.args[0]) != 4:
        return None
    return n.args[0]


def _channels_first_attention(node, gm, shapes):
    """(q, k, v images, q's and v's channels, mask, scale, the view, the image whose H and W
    it takes, nodes it replaces) when node is ``v.flatten(2) @ A.transpose(-2, -1)`` with A
    ``softmax((q.flatten(2).transpose(-2, -1) @ k.flatten(2)) [* c] [+ bias], dim=-1)``
    (the scale also on q's tokens), read by a ``view(N, C, H, W)`` of one image's H and W:
    one head of attention over images' pixels as tokens and their channels as features
    (timm's EfficientViT-M: q through a depthwise convolution, k and v a 1x1's channels);
    else None."""
    if not (_is_matmul(node) and len(node.users) == 1):
        return None
    vf, at = node.args
    v = _flat_image(vf)
    swapped = isinstance(at, torch.fx.Node) and (_swaps_last_two_of_rank3(at) or (
        at.target in ("transpose", torch.transpose) and len(at.args) == 3 and not at.kwargs
        and set(at.args[1:]) == {-2, -1}))  # (the scores' rank: the matmul's, not known)
    if v is None or not (swapped and len(at.users) == 1):
        return None
    scores = _softmax_scores(at.args[0], gm)
    if scores is None:
        return None
    qt, kf, mask, scale, causal, replaced = scores
    k = _flat_image(kf)
    if k is None or causal or not (_swaps_last_two_of_rank3(qt) and len(qt.users) == 1):
        return None
    qs = qt.args[0]
    pre = _by_number(qs)
    dead = [node, at] + replaced + [qt]
    if pre is not None:  # (q.flatten(2) * c).transpose(-2, -1)
        dead.append(qs)
        qs, c = pre
        scale *= c
    q = _flat_image(qs)
    if q is None:
        return None
    view = next(iter(node.users))
    terms = shapes.terms(view)
    if terms is None or len(terms) != 4 or view.args[0] is not node:
        return None
    d0, c, h, w = terms
    d, dv = q.meta.get("qpack_channels"), v.meta.get("qpack_channels")
    if not (isinstance(d0, tuple) and d0[0] == "dim" and d0[2] == 0 and isinstance(h, tuple)
            and isinstance(w, tuple) and h[0] == w[0] == "dim" and h[1] is w[1] and (h[2], w[2]) == (2, 3)
            and rank_of(h[1]) == 4 and (c == dv or c == ("dim", v, 1))
            and d is not None and d == k.meta.get("qpack_channels") and dv is not None):
        return None
    return q, k, v, d, dv, mask, scale, view, h[1], dead + [qs, kf, vf]


def _through_identity(t, modules, types=nn.Identity):
    """t past modules of ``types`` that pass their one input on, each read by one op only
    (nn.Identity: timm's q_norm / k_norm when off)."""
    while (isinstance(t, torch.fx.Node) and t.op == "call_module" and isinstance(modules.get(t.target), types)
           and len(t.args) == 1 and len(t.users) == 1):
        t = t.args[0]
    return t


def _head_view(t, modules, shapes):
    """(x, offset, heads, head_dim, nodes, sizes' source, head stride) when fx node t is one
    head split of a rank-3 value x [N, L, C] read by nothing else (N and L x's sizes or those
    of the value a Linear made x of): ``x.view(N, L, H, D).transpose(1, 2)`` (or
    ``permute(0, 2, 1, 3)``; offset 0), part j of each head's group ``x.view(N, L, H, G)
    .split(sizes, dim=3)[j]`` so permuted (LeViT: head stride G; k as ``permute(0, 2, 3, 1)``
    transposed back), or part i of ``x.reshape(N, L, P, H, D).permute(2, 0, 3, 1, 4)``
    (``.unbind(0)[i]`` or ``[i]``; offset i H D); else None."""
    t = _through_identity(t, modules)
    chain = []

    def swaps_last_two(n):
        return (isinstance(n, torch.fx.Node) and n.op == "call_method" and n.target == "transpose"
                and len(n.args) == 3 and len(n.users) == 1 and sorted(_norm_dim(a, 4) for a in n.args[1:]) == [2, 3])

    while swaps_last_two(t) and swaps_last_two(t.args[0]):
        # k transposed for q @ k^T and back by the spelled-out attention's rewrite
        chain += [t, t.args[0]]
        t = t.args[0].args[0]

    def linear_of(x):
        """The Linear's call x is, or x's through affines over the last dim (LeViT's
        LinearNorm: a Linear, then its token BatchNorm), else None."""
        while isinstance(x, torch.fx.Node) and x.op == "call_function" and x.target is last_dim_affine:
            x = x.args[0]
        layer = modules.get(x.target) if isinstance(x, torch.fx.Node) and x.op == "call_module" else None
        return x if isinstance(layer, (nn.Linear, FrozenLinear)) else None

    def linear_width(x):
        lin = linear_of(x)
        return None if lin is None else modules[lin.target].out_features

    def piece(x):
        """(whole, offset, width) when x is part i of ``whole.split(w, -1)`` (or of sizes) or
        of ``whole.chunk(n, -1)``, whole a Linear's rank-3 output (nanoGPT's c_attn);
        (x, 0, its width or None) otherwise."""
        p = x.args[0] if x.op == "call_function" and x.target is operator.getitem and len(x.users) == 1 \
            and isinstance(x.args[1], int) and x.args[1] >= 0 else None
        split = isinstance(p, torch.fx.Node) and p.target in ("split", torch.split) and len(p.args) >= 2
        chunk = isinstance(p, torch.fx.Node) and p.target in ("chunk", torch.chunk) and len(p.args) >= 2
        if not (split or chunk) or _dim_arg(p, 2, "dim", 0) not in (-1, 2) or rank_of(p.args[0]) not in (3, None):
            return x, 0, linear_width(x)
        whole, arg, i = p.args[0], p.args[1], x.args[1]
        total = linear_width(whole)
        if total is None:
            return None
        if chunk:
            if not isinstance(arg, int) or arg < 1 or total % arg:
                return None
            arg = total // arg
        sections = [arg] * (total // arg) if isinstance(arg, int) and arg >= 1 and total % arg == 0 else arg
        if not (isinstance(sections, (list, tuple)) and all(isinstance(a, int) for a in sections)
                and sum(sections) == total and i < len(sections)):
            return None
        return whole, sum(sections[:i]), sections[i]

    def sized(r, n):
        """(x, its n sizes after N and L, the value whose N and L they are, offset, nodes)
        when r is a view / reshape of a rank-3 value to N, L (or -1) and n sizes; x the
        value itself or the whole a split / chunk of the last dim took it from."""
        terms = shapes.terms(r) if isinstance(r, torch.fx.Node) else None
        if terms is None or len(terms) != 2 + n:
            return None
        x = r.args[0]
        if not (isinstance(x, torch.fx.Node) and rank_of(x) in (3, None) and len(r.users) == 1):
            return None
        got = piece(x)
        if got is None:
            return None
        whole, offset, width = got
        sizes = terms[2:]
        unknown = [i for i, a in enumerate(sizes) if not (isinstance(a, int) and a >= 1)]
        if len(unknown) == 1 and width is not None:
            # one size the trace computes (C // heads): what the Linear's width leaves
            known = int(np.prod([a for a in sizes if isinstance(a, int) and a >= 1]))
            if width % known:
                return None
            sizes = list(sizes)
            sizes[unknown[0]] = width // known
        elif unknown:
            return None
        d0, d1 = terms[:2]
        known = x.meta.get("qpack_shape")
        if known is not None and len(known) == 3 and _concrete(d0) == known[0] and (
                d1 == -1 or _concrete(d1) == known[1]):
            # a trace specialized to example shapes: the view keeps x's N and L, by number
            return whole, sizes, x, offset, [x, x.args[0]] if whole is not x else []
        if not (isinstance(d0, tuple) and d0[0] == "dim" and d0[2] == 0) or not (
                d1 == -1 or isinstance(d1, tuple) and d1[0] == "dim" and d1[2] == 1 and d1[1] is d0[1]):
            return None
        # the sizes are the value's own, or those of what a Linear made it of (the same leading
        # dims), or N is that of a value of the same batch and L is left to the view (PVT's k and v
        # from the reduced tokens: reshape(B, -1, 2, H, D) with B the block input's)
        src, lin = d0[1], linear_of(whole)
        if not (src in (x, whole) or lin is not None and lin.args[0] is src
                or d1 == -1 and src.meta.get("qpack_batch", src) is whole.meta.get("qpack_batch", whole)):
            return None
        nodes = [x, x.args[0]] if whole is not x else []
        return whole, sizes, src, offset, nodes

    def is_permute(node, dims):
        if not (isinstance(node, torch.fx.Node) and len(node.users) == 1):
            return False
        if node.op == "call_method" and node.target == "permute":
            return tuple(_sizes(node.args[1:])) == dims
        if len(dims) == 4 and node.op == "call_method" and node.target == "transpose" and len(node.args) == 3:
            return sorted(_norm_dim(a, 4) for a in node.args[1:]) == [1, 2]
        return False

    if isinstance(t, torch.fx.Node) and t.op == "call_function" and t.target is operator.getitem \
            and len(t.users) == 1 and isinstance(t.args[1], int) and t.args[1] >= 0:
        # part i of each head's group, split after the heads were moved forward
        # (EfficientFormer's reshape(B, N, H, -1).permute(0, 2, 1, 3).split([kd, kd, vd], dim=3))
        p = t.args[0]
        if isinstance(p, torch.fx.Node) and p.target in ("split", torch.split) and len(p.args) >= 2 \
                and _dim_arg(p, 2, "dim", 0) in (-1, 3) and isinstance(p.args[1], (list, tuple)) \
                and all(isinstance(a, int) and a >= 1 for a in p.args[1]) and t.args[1] < len(p.args[1]) \
                and isinstance(p.args[0], torch.fx.Node) and p.args[0].op == "call_method" \
                and p.args[0].target == "permute" and tuple(_sizes(p.args[0].args[1:])) == (0, 2, 1, 3):
            got = sized(p.args[0].args[0], 2)
            if got is None or got[1][1] != sum(p.args[1]):
                return None
            x, (h, g), src, offset, nodes = got
            i = t.args[1]
            return (x, offset + sum(p.args[1][:i]), h, p.args[1][i],
                    chain + [t, p, p.args[0], p.args[0].args[0]] + nodes, src, g)
    head = chain + [t]
    if swaps_last_two(t) and is_permute(t.args[0], (0, 2, 3, 1)):
        head.append(t.args[0])  # k^T's transpose: LeViT's k.permute(0, 2, 3, 1), transposed back
    elif not is_permute(t, (0, 2, 1, 3)):
        head = None
    if head is not None:
        v = head[-1].args[0]
        part, at, width = None, 0, None
        p = v.args[0] if (v.op == "call_function" and v.target is operator.getitem and len(v.users) == 1
                          and isinstance(v.args[1], int) and v.args[1] >= 0) else None
        if isinstance(p, torch.fx.Node) and p.target in ("split", torch.split) and len(p.args) >= 2 \
                and _dim_arg(p, 2, "dim", 0) in (-1, 3) and isinstance(p.args[1], (list, tuple)) \
                and all(isinstance(a, int) and a >= 1 for a in p.args[1]) and v.args[1] < len(p.args[1]):
            # part i of each head's group (LeViT's view(B, N, H, -1).split([kd, kd, vd], dim=3))
            part, at, width = [v, p], sum(p.args[1][:v.args[1]]), p.args[1][v.args[1]]
            v = p.args[0]
        got = sized(v, 2)
        if got is None or part is not None and got[1][1] != sum(p.args[1]):
            return None
        x, (h, d), src, offset, nodes = got
        if part is None:
            return x, offset, h, d, head + [v] + nodes, src, d
        return x, offset + at, h, width, head + part + [v] + nodes, src, d
    if not (isinstance(t, torch.fx.Node) and t.op == "call_function" and t.target is operator.getitem
            and isinstance(t.args[1], int) and len(t.users) == 1):
        return None
    chain.append(t)
    p = t.args[0]
    if isinstance(p, torch.fx.Node) and p.op == "call_method" and p.target == "unbind" \
            and _dim_arg(p, 1, "dim", 0) == 0:
        chain.append(p)
        p = p.args[0]
    if isinstance(p, torch.fx.Node) and p.op == "call_method" and p.target == "permute" \
            and tuple(_sizes(p.args[1:])) == (1, 0, 2, 4, 3) and len(p.users) == 1:
        # part i of an image's channels as [B, P, H, D, pixels] (Visformer's
        # qkv(x).reshape(B, 3, H, D, -1).permute(1, 0, 2, 4, 3)): the image, read as its tokens
        r = p.args[0]
        terms = shapes.terms(r) if isinstance(r, torch.fx.Node) else None
        img = r.args[0] if terms is not None else None
        if not (terms is not None and len(terms) == 5 and len(r.users) == 1 and rank_of(img) == 4
                and all(isinstance(a, int) and a >= 1 for a in terms[1:4]) and terms[4] == -1
                and isinstance(terms[0], tuple) and terms[0][0] == "dim" and terms[0][2] == 0
                and terms[0][1].meta.get("qpack_batch", terms[0][1]) is img.meta.get("qpack_batch", img)
                and 0 <= t.args[1] < terms[1]):
            return None
        parts, h, d = terms[1:4]
        if channels_of(img) not in (None, parts * h * d):
            return None
        return img, t.args[1] * h * d, h, d, chain + [p, r], img, d
    if not (isinstance(p, torch.fx.Node) and p.op == "call_method" and p.target == "permute"
            and tuple(_sizes(p.args[1:])) == (2, 0, 3, 1, 4)):
        return None
    got = sized(p.args[0], 3)
    if got is None or not 0 <= t.args[1] < got[1][0]:
        return None
    x, (parts, h, d), src, offset, nodes = got
    return x, offset + t.args[1] * h * d, h, d, chain + [p, p.args[0]] + nodes, src, d


def _heads_attention(node, gm, modules, shapes):
    """(merge node, heads_attention args, nodes it replaces, like) when
    scaled_dot_product_attention ``node`` reads head splits (_head_view) and its output is
    merged back into rows of heads side by side (``.transpose(1, 2)`` or ``.permute(0, 2, 1,
    3)``, optionally ``.contiguous()``, then ``.reshape(N, L, H Dv)`` / ``.view`` /
    ``.flatten(2)``; like None), or heads of an image's channels back into an image (like:
    the image whose H and W it has), its mask none or a constant and no dropout; else None."""
    if len(node.args) < 3 or len(node.users) != 1:
        return None
    kw = dict(zip(("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"), node.args[3:]))
    kw.update(node.kwargs)
    if kw.get("dropout_p", 0.0) != 0.0 or kw.get("enable_gqa", False) is not False \
            or not isinstance(kw.get("is_causal", False), bool) \
            or not (kw.get("scale") is None or isinstance(kw["scale"], (int, float))):
        return None
    mask = kw.get("attn_mask")
    if mask is not None and (not isinstance(mask, torch.fx.Node) or _attr_tensor(gm, mask) is None):
        return None
    views = [_head_view(a, modules, shapes) for a in node.args[:3]]
    if any(v is None for v in views) or views[0][2] != views[1][2] or views[0][2] != views[2][2] \
            or views[0][3] != views[1][3] or views[0][6] != views[1][6]:
        return None
    t = next(iter(node.users))
    heads, d, dv = views[0][2], views[0][3], views[2][3]
    like = None
    if rank_of(views[0][0]) == 4:
        # heads of an image's channels merged back into an image (Visformer's
        # x.permute(0, 1, 3, 2).reshape(B, -1, H, W)): the tokens' image, of the H and W of `like`
        r = next(iter(t.users)) if t.op == "call_method" and t.target == "permute" and len(t.users) == 1 \
            and tuple(_sizes(t.args[1:])) == (0, 1, 3, 2) else None
        terms = shapes.terms(r) if r is not None else None
        src = views[0][0]
        if not (terms is not None and len(terms) == 4 and r.args[0] is t and terms[1] in (-1, heads * dv)
                and all(isinstance(a, tuple) and a[0] == "dim" for a in (terms[0], terms[2], terms[3]))
                and terms[2][1] is terms[3][1] and (terms[2][2], terms[3][2]) == (2, 3)
                and _source_of(terms[2][1], "qpack_hw", _spatial, modules) is _source_of(src, "qpack_hw", _spatial, modules)
                and all(v[0] is src for v in views)):
            return None
        dead, like = [t, node], terms[2][1]
    else:
        if not (t.op == "call_method" and (t.target == "transpose" and len(t.args) == 3 and sorted(
                _norm_dim(a, 4) for a in t.args[1:]) == [1, 2] or t.target == "permute"
                and tuple(_sizes(t.args[1:])) == (0, 2, 1, 3))) or len(t.users) != 1:
            return None
        dead = [t, node]
        r = next(iter(t.users))
        if r.op == "call_method" and r.target == "contiguous" and len(r.users) == 1:
            dead.insert(0, r)
            r = next(iter(r.users))
        terms = shapes.terms(r)
        ok = False
        if terms is not None and len(terms) == 3 and r.args[0] is dead[0]:
            d0, d1, c = terms
            ok = (isinstance(d0, tuple) and d0[0] == "dim" and d0[2] == 0 and d0[1] is views[0][5]
                  and (d1 == -1 or isinstance(d1, tuple) and d1[0] == "dim" and d1[2] == 1 and d1[1] is d0[1])
                  and (c == heads * dv or c == -1 and d1 != -1 or c == ("dim", d0[1], 2)))
            known = views[0][0].meta.get("qpack_shape")
            if not ok and known is not None and len(known) == 3:
                # a trace specialized to example shapes: q's N and L, by number
                ok = (_concrete(d0) == known[0] and (d1 == -1 or _concrete(d1) == known[1])
                      and (_concrete(c) == heads * dv or c == -1 and d1 != -1))
        elif r.op == "call_method" and r.target == "flatten" and r.args[0] is dead[0]:
            ok = _dim_arg(r, 1, "start_dim", 0) == 2 and _dim_arg(r, 2, "end_dim", -1) in (-1, 3)
        if not ok:
            return None
    scale = kw.get("scale")
    args = (views[0][0], views[1][0], views[2][0], heads, d, dv, (views[0][1], views[1][1], views[2][1]),
            float(d ** -0.5 if scale is None else scale), kw.get("is_causal", False), mask)
    if views[0][6] != d or views[2][6] != dv:  # heads in groups (LeViT's): where each next one starts
        args += ((views[0][6], views[2][6]),)
    replaced = dead + [n for v in views for n in v[4]]
    for a in node.args[:3]:  # the Identity modules passed through
        while a not in replaced and isinstance(a, torch.fx.Node) and a.op == "call_module":
            replaced.append(a)
            a = a.args[0]
    return r, args, replaced, like


def _is_dim(term, x, d, modules):
    """True when the shape term is dim d of x: ("dim", x, d), or for H and W of a patch
    embedding x (a convolution whose kernel is its stride, no padding, dilation 1) its input's
    dim floor-divided by that stride (torchvision ViT's ``n_h = h // p``)."""
    if term == ("dim", x, d):
        return True
    m = modules.get(x.target) if x.op == "call_module" else None
    if not (isinstance(m, FrozenConv2d) and d in (2, 3) and isinstance(term, tuple) and term[0] == "floordiv"):
        return False
    i = d - 2
    return (m.kernel_size[i] == m.stride[i] == term[2] and m.padding[i] == 0 and m.dilation[i] == 1
            and term[1] == ("dim", x.args[0], d))


def _image_tokens(node, shapes, modules):
    """(x, nodes it replaces) when node is ``x.flatten(2).transpose(1, 2)`` of a rank-4 x
    (also ``torch.flatten(x, 2)``, ``x.reshape(N, C, -1)`` or ``x.reshape(N, C, H * W)`` of
    x's H and W (_is_dim), ``.permute(0, 2, 1)``), the flatten read by it only; else None."""
    if not _swaps_last_two_of_rank3(node):
        return None
    f = node.args[0]
    if len(f.users) != 1 or not isinstance(f.args[0], torch.fx.Node) or rank_of(f.args[0]) != 4:
        return None
    x = f.args[0]
    if (f.op == "call_method" and f.target == "flatten") or (f.op == "call_function" and f.target is torch.flatten):
        ok = _dim_arg(f, 1, "start_dim", 0) == 2 and _dim_arg(f, 2, "end_dim", -1) in (-1, 3)
    else:  # x.reshape(N, C, -1): N and C sizes the trace reads (PVT's B, C of its tokens) or numbers
        terms = shapes.terms(f)
        hw = terms[2] if terms is not None and len(terms) == 3 else None
        ok = terms is not None and len(terms) == 3 and (hw == -1 or isinstance(hw, tuple) and hw[0] == "mul" and (
            _is_dim(hw[1], x, 2, modules) and _is_dim(hw[2], x, 3, modules))) and all(
            isinstance(a, int) and a >= 1 or isinstance(a, tuple) and a[0] == "dim" for a in terms[:2]) \
            and (isinstance(terms[0], int) or terms[0][2] == 0)
    return (x, [f]) if ok else None


def _multi_query_attention(node, modules, shapes):
    """(Q, k tokens, v tokens, heads, D, Dv, scale, the image node, nodes it replaces) when
    scaled_dot_product_attention ``node`` is multi-query attention over an image's pixels
    (timm's MultiQueryAttention2d, MobileNetV4's): q the heads of image Q's channels
    (``Q.reshape(N, H, D, -1).transpose(-1, -2)``), k and v one head each, the tokens of
    images of Q's batch (``image_to_tokens(K).unsqueeze(1)``) that every head reads, each
    ``.contiguous()`` or not, no mask or dropout; the heads merged back into an image of Q's
    H and W (``.transpose(1, 2).reshape(N, H, W, -1).permute(0, 3, 1, 2)``); else None."""
    def strip(x):  # through .contiguous() read by nothing else
        while isinstance(x, torch.fx.Node) and x.op == "call_method" and x.target == "contiguous" \
                and len(x.users) == 1:
            x = x.args[0]
        return x

    def batch(x):
        return x.meta.get("qpack_batch", x)

    def hw(x):
        return _source_of(x, "qpack_hw", _spatial, modules)

    kw = dict(zip(("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"), node.args[3:]))
    kw.update(node.kwargs)
    if len(node.args) < 3 or kw.get("attn_mask") is not None or kw.get("dropout_p", 0.0) != 0.0 \
            or kw.get("is_causal", False) is not False or kw.get("enable_gqa", False) is not False \
            or not (kw.get("scale") is None or isinstance(kw["scale"], (int, float))):
        return None
    q, k, v = (strip(a) for a in node.args[:3])
    # q: the heads of an image's channels, its pixels as rows
    if not (isinstance(q, torch.fx.Node) and q.op == "call_method" and q.target == "transpose" and len(q.args) == 3
            and len(q.users) == 1 and sorted(_norm_dim(a, 4) for a in q.args[1:]) == [2, 3]):
        return None
    r = q.args[0]
    terms = shapes.terms(r) if isinstance(r, torch.fx.Node) and len(r.users) == 1 else None
    if not (terms is not None and len(terms) == 4 and terms[3] == -1
            and all(isinstance(a, int) and a >= 1 for a in terms[1:3])
            and isinstance(terms[0], tuple) and terms[0][0] == "dim" and terms[0][2] == 0):
        return None
    img, (heads, d) = r.args[0], terms[1:3]
    if rank_of(img) != 4 or channels_of(img) not in (None, heads * d) or batch(terms[0][1]) is not batch(img):
        return None
    # k, v: one head, an image's tokens
    kv, dead = [], [node.args[0], q, r]
    for a in node.args[1:3]:
        u = strip(a)
        t = u.args[0] if isinstance(u, torch.fx.Node) and u.op == "call_method" and u.target == "unsqueeze" \
            and len(u.users) == 1 and _dim_arg(u, 1, "dim") == 1 else None
        if not (isinstance(t, torch.fx.Node) and t.op == "call_function" and t.target is image_to_tokens
                and batch(t.args[0]) is batch(img)):
            return None
        kv.append(t)
        dead += [a, u]
    if channels_of(kv[0].args[0]) != d or not isinstance(dv := channels_of(kv[1].args[0]), int):
        return None
    # the merge: rows of heads side by side, as an image of Q's H and W
    users = [u for u in node.users if not (u.op == "call_function" and u.target is getattr)]
    if len(users) != 1:
        return None
    t = users[0]
    if not (t.op == "call_method" and t.target == "transpose" and len(t.args) == 3 and len(t.users) == 1
            and sorted(_norm_dim(a, 4) for a in t.args[1:]) == [1, 2]):
        return None
    m = next(iter(t.users))
    terms = shapes.terms(m) if len(m.users) == 1 else None

    def spatial(term, i):  # dim i of a value of img's H and W (or it // 1)
        if isinstance(term, tuple) and term[0] == "floordiv" and term[2] == 1:
            term = term[1]
        return isinstance(term, tuple) and term[0] == "dim" and term[2] == i and rank_of(term[1]) == 4 \
            and hw(term[1]) is hw(img)

    def own_batch(term, arg):  # N of img's batch, or the attention's own size(0)
        if isinstance(term, tuple):
            return term[0] == "dim" and term[2] == 0 and batch(term[1]) in (batch(node), batch(img))
        return isinstance(arg, torch.fx.Node) and arg.op == "call_function" and arg.target is operator.getitem \
            and arg.args[1] == 0 and isinstance(arg.args[0], torch.fx.Node) and arg.args[0].target is getattr \
            and arg.args[0].args == (node, "shape")

    if not (terms is not None and len(terms) == 4 and own_batch(terms[0], _sizes(m.args[1:])[0])
            and spatial(terms[1], 2) and spatial(terms[2], 3) and terms[3] in ("?", -1, heads * dv)):
        return None
    p = next(iter(m.users))
    if _permute_dims(p) != [0, 3, 1, 2]:
        return None
    end = next(iter(p.users)) if len(p.users) == 1 else None
    end = end if end is not None and end.op == "call_method" and end.target == "contiguous" else p
    dead += [end, p, m, t, node]
    # the shape queries of the attention's output (the merge's sizes) go with it
    dead += [u for u in node.users if u.op == "call_function" and u.target is getattr]
    scale = kw.get("scale")
    return img, kv[0], kv[1], heads, d, dv, float(d ** -0.5 if scale is None else scale), end, dead


def _tokens_image(node, shapes):
    """(t, like, dims, nodes it replaces) when node is ``t.transpose(1, 2).reshape(N, C, H,
    W)`` (or ``permute(0, 2, 1)``, ``.view``) of rank-3 tokens t, H and W the sizes
    ``like.shape[2], like.shape[3]`` of a rank-4 value, or ``like.shape[1], like.shape[2]``
    of a channels-last view (PVT's ``feat_size``), the transpose read by the reshape only;
    else None."""
    if _permute_dims(node) == [0, 3, 1, 2] and len(node.args[0].users) == 1:
        # t.reshape(N, H, W, -1).permute(0, 3, 1, 2): the tokens as NHWC, then the image (PVT's stage end)
        r = node.args[0]
        terms = shapes.terms(r)
        if terms is None or len(terms) != 4 or not isinstance(r.args[0], torch.fx.Node) or rank_of(r.args[0]) != 3:
            return None
        d0, h, w, c = terms
        t, dead = r.args[0], [r]
    else:
        terms = shapes.terms(node)
        if terms is None or len(terms) != 4:
            return None
        tr = node.args[0]
        if not (_swaps_last_two_of_rank3(tr) and len(tr.users) == 1):
            return None
        t, dead = tr.args[0], [tr]
        d0, c, h, w = terms
    if not (isinstance(h, tuple) and isinstance(w, tuple) and h[0] == w[0] == "dim" and h[1] is w[1]
            and rank_of(h[1]) == 4 and (h[2], w[2]) in ((2, 3), (1, 2))):
        return None
    known = t.meta.get("qpack_shape")  # (a trace specialized to example shapes: C by number)
    if not (isinstance(d0, tuple) and d0[0] == "dim" and d0[2] == 0) or not (
            c == -1 or isinstance(c, int) or isinstance(c, tuple) and c[0] == "dim" and c[1] is t and c[2] == 2
            or known is not None and len(known) == 3 and _concrete(c) == known[2]):
        return None
    if _regrouped_batch(t, shapes):  # N is not the tokens' own batch
        return None
    if (h[2], w[2]) == (1, 2) and not _channels_last_view(h[1]):
        return None
    return t, h[1], (h[2], w[2]), dead


def _regrouped_batch(t, shapes):
    """True when t's dim 0 comes (through attention, matmuls and transposes that keep
    dim 0) from a reshape whose dim 0 is not a plain dim 0 of a value: a batch regrouped,
    as BoTNet's q.reshape(B * heads, d, -1), whose (attn @ v).transpose(-1, -2)
    .reshape(B, C, H, W) is not the tokens' image."""
    x = t
    while isinstance(x, torch.fx.Node):
        if x.op == "call_function" and (x.target in _SDPA + _MATMUL or x.target in (
                _attention.scaled_dot_product_attention, heads_attention)) or _is_matmul(x):
            x = x.args[0]
        elif x.op == "call_method" and x.target == "contiguous" or (
                x.op == "call_method" and x.target == "transpose" and len(x.args) == 3
                and 0 not in {_norm_dim(a, rank_of(x) or 3) for a in x.args[1:] if isinstance(a, int)}):
            x = x.args[0]
        elif (x.op == "call_method" and x.target in ("reshape", "view")) or (
                x.op == "call_function" and x.target is torch.reshape):
            terms = shapes.terms(x)
            return not (terms and isinstance(terms[0], tuple) and terms[0][0] == "dim" and terms[0][2] == 0)
        else:
            return False
    return False


def _channels_last_tokens(node, shapes):
    """z when node is ``z.reshape(N, -1, C)`` (or ``.view``) of a channels-last view z
    [N, H, W, C] (_channels_last_view), C its last size or a number; else None."""
    terms = shapes.terms(node)
    z = node.args[0] if node.args else None
    if terms is None or len(terms) != 3 or terms[1] != -1 or not isinstance(z, torch.fx.Node) \
            or rank_of(z) != 4 or not _channels_last_view(z):
        return None
    d0, c = terms[0], terms[2]
    if not (isinstance(d0, tuple) and d0[0] == "dim" and d0[2] == 0) or not (
            isinstance(c, int) and c >= 1 or c == ("dim", z, 3)):
        return None
    return z


def _channels_last_view(x):
    """True when x is ``y.permute(0, 2, 3, 1)`` of a rank-4 y, or that through modules that
    keep the shape (a LayerNorm over C: timm's PVT patch embedding)."""
    while isinstance(x, torch.fx.Node) and x.op == "call_module" and x.args:
        x = x.args[0]
    return _permute_dims(x) == [0, 2, 3, 1]


_MHA_ARGS = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights",
             "is_causal")


def _torchvision_swin(node):
    """"attention" for a call of torchvision's Swin window attention, "bias" for one of its
    relative position bias, else None."""
    if node.op != "call_function" or getattr(node.target, "__module__", "") != "torchvision.models.swin_transformer":
        return None
    return {"shifted_window_attention": "attention", "_get_relative_position_bias": "bias"}.get(
        getattr(node.target, "__name__", ""))


def _self_attention_call(node, modules):
    """(x, module) when node calls a frozen nn.MultiheadAttention (batch_first) on one
    value for query, key and value without masks, only its output read; else None."""
    m = modules.get(node.target) if node.op == "call_module" else None
    if not isinstance(m, FrozenMultiheadAttention) or not m.batch_first:
        return None
    kw = dict(zip(_MHA_ARGS, node.args))
    kw.update(node.kwargs)
    x = kw.get("query")
    if not (isinstance(x, torch.fx.Node) and kw.get("key") is x and kw.get("value") is x
            and kw.get("key_padding_mask") is None and kw.get("attn_mask") is None
            and kw.get("is_causal", False) in (False, None) and set(kw) <= set(_MHA_ARGS)):
        return None
    if not all(u.op == "call_function" and u.target is operator.getitem and u.args[1] in (0, 1)
               and (u.args[1] == 0 or not u.users) for u in node.users):
        return None
    return x, m


def canonicalize(gm):
    """Rewrites shape spellings in a trace to ops the core runs, in place, and
    records each value's rank where its ops tell it (node.meta["qpack_rank"]):
    - x.view(x.size(0), -1) / x.reshape(x.shape[0], -1) -> torch.flatten(x, 1);
    - x.squeeze(-1) (twice for rank 4) of a globally pooled value -> flatten;
    - ShuffleNet's channel shuffle (view to 5-D, transpose(1, 2), contiguous,
      view back) and x.chunk(n, 1)[i] -> channel_part();
    - F.interpolate(x, size=y.shape[-2:]) (torchvision's FPN) -> resize_like();
    - negative dims of torch.cat and mean made positive where the rank is known;
    - a view or reshape of a constant by constant sizes, and an index of a constant
      by constant tensors (a bias table gathered at every call) -> a constant;
    - a - b of two values -> a + b * -1 (an add and a scalar affine); x ** 2 -> x * x, x ** 3 -> (x * x) * x;
    - a constant [1, ...] expanded over a value's batch, or added to a value of its shape
      (ViT's class token and position embedding) -> batch_constant(); x[:, k] of rows
      [N, L, C] -> channel_range(x, k, 1) flattened;
    - reshapes and transposes that move whole rows of a value traced on example shapes
      (MobileViT's unfold of an image into patches and its fold back) -> permute_rows();
    - F.scaled_dot_product_attention, and softmax((q @ kt) * c [+ bias]) @ v
      spelled out (a causal mask filled in too) -> qpack.torch.attention's (the
      core's kernel where it applies, PyTorch's call otherwise); between a split of
      rows into heads and their merge back, and a frozen nn.MultiheadAttention on
      one value -> heads_attention (the graph's attention node); multi-query attention
      over an image's pixels (MobileNetV4's: one k and v head for every q head) ->
      heads_attention(..., multi_query=True) between the image's tokens and their image.
    Every rewrite computes what the spelling did, in PyTorch too."""
    g = gm.graph
    modules = dict(gm.named_modules())
    shapes = _Shapes()
    erased = set()
    backs = {}  # a channels-last view whose tokens were taken -> its permute back to the image

    def replace(old, fn, args, kwargs=None):
        with g.inserting_before(old):
            new = g.call_function(fn, args, kwargs or {})
        old.replace_all_uses_with(new)
        new.meta.update(old.meta)
        g.erase_node(old)
        erased.add(old)
        return new

    def to_constant(node, t):
        """node, whose value t was computed from constants, becomes a read of t (a buffer,
        beside the first constant it read: not an op between ops); the constants it read,
        read by nothing else now, go."""
        name = f"_qpack_constant_{len(erased)}_{node.name}"
        gm.register_buffer(name, t, persistent=False)
        reads = [a for a in node.all_input_nodes if a.op == "get_attr"]
        with g.inserting_after(reads[0]):
            new = g.get_attr(name)
        node.replace_all_uses_with(new)
        g.erase_node(node)
        erased.add(node)
        for a in reads:
            if not a.users and a not in erased:
                g.erase_node(a)
                erased.add(a)

    def erase_dead(dead):
        """The nodes of `dead` nothing reads any more, until none is left (and the shape
        items read from a dead node's size)."""
        dead = list(dead)
        for d in dead:  # (grows: the items of a size and the arithmetic on them)
            if d.op == "call_function" and (d.target is getattr or d.target is operator.getitem
                                            or d.target in _SHAPE_ARITHMETIC):
                dead += [u for u in d.users if u.op == "call_function" and u not in dead and (
                    u.target is operator.getitem or u.target in _SHAPE_ARITHMETIC)]
        while any(d not in erased and not d.users for d in dead):
            for d in dead:
                if d not in erased and not d.users:
                    g.erase_node(d)
                    erased.add(d)

    def heads(node):
        """An attention call between a split into heads and their merge -> one
        heads_attention on the rows (True), else False."""
        att = _heads_attention(node, gm, modules, shapes)
        if att is None:
            return False
        merge, args, dead, like = att
        if like is not None:  # heads of an image's channels: its tokens in, the tokens' image out
            with g.inserting_before(merge):
                tokens = g.call_function(image_to_tokens, (args[0],))
                att_node = g.call_function(heads_attention, (tokens, tokens, tokens) + args[3:])
            tokens.meta.update(qpack_rank=3, qpack_batch=args[0].meta.get("qpack_batch", args[0]))
            att_node.meta.update(qpack_rank=3, qpack_batch=tokens.meta["qpack_batch"])
            replace(merge, tokens_to_image, (att_node, like)).meta.update(
                qpack_rank=4, qpack_batch=tokens.meta["qpack_batch"])
        else:
            replace(merge, heads_attention, args).meta["qpack_rank"] = 3
        erase_dead(dead)
        return True

    for node in list(g.nodes):
        if node in erased:
            continue
        if (tv := _torchvision_swin(node)) == "attention":
            # torchvision's Swin window attention (fx-wrapped): qpack's, one core graph a call
            node.target = _attention.shifted_window_attention
        elif tv == "bias" and all(a.op == "get_attr" for a in node.all_input_nodes):
            # its relative position bias, gathered from a table at every call: a constant
            args = torch.fx.node.map_arg(node.args, lambda a: _attr_tensor(gm, a))
            with torch.no_grad():
                to_constant(node, node.target(*args).contiguous())
            continue
        if (sa := _self_attention_call(node, modules)) is not None:
            # a frozen nn.MultiheadAttention on one value: its projections and the core's
            # attention over the packed q, k, v (torchvision's ViT, nn.TransformerEncoderLayer)
            x, m = sa
            e, h = m.embed_dim, m.num_heads
            with g.inserting_before(node):
                qkv = g.call_module(f"{node.target}.in_proj", (x,))
                att = g.call_function(heads_attention, (qkv, qkv, qkv, h, e // h, e // h, (0, e, 2 * e),
                                                        float((e // h) ** -0.5), False, None))
                out = g.call_module(f"{node.target}.out_proj", (att,))
            for new in (qkv, att, out):
                new.meta["qpack_rank"] = rank_of(x)
            for u in list(node.users):
                if u.args[1] == 0:
                    u.replace_all_uses_with(out)
                g.erase_node(u)
                erased.add(u)
            g.erase_node(node)
            erased.add(node)
            continue
        if node.op == "call_function" and node.target in _SDPA \
                and (mq := _multi_query_attention(node, modules, shapes)) is not None:
            # multi-query attention over an image's pixels: its tokens, one attention node
            # whose heads all read k's and v's one head, the rows back to the image
            img, k, v, h, d, dv, scale, end, dead = mq
            with g.inserting_before(end):
                tokens = g.call_function(image_to_tokens, (img,))
                att = g.call_function(heads_attention, (tokens, k, v, h, d, dv, (0, 0, 0), scale, False, None,
                                                        None, True))
            tokens.meta.update(qpack_rank=3, qpack_batch=img.meta.get("qpack_batch", img))
            att.meta.update(qpack_rank=3, qpack_batch=tokens.meta["qpack_batch"])
            replace(end, tokens_to_image, (att, img)).meta.update(qpack_rank=4, qpack_batch=tokens.meta["qpack_batch"])
            erase_dead(dead)
            continue
        if node.op == "call_function" and node.target in _SDPA:
            if not heads(node):
                node.target = _attention.scaled_dot_product_attention
            continue
        if (cf := _channels_first_attention(node, gm, shapes)) is not None:
            # one head over an image's pixels (EfficientViT-M): the images' tokens, the
            # core's attention, the tokens back to the image
            q, k, v, d, dv, mask, scale, view, like, dead = cf
            with g.inserting_before(view):
                tokens = [g.call_function(image_to_tokens, (x,)) for x in (q, k, v)]
                att = g.call_function(heads_attention, (*tokens, 1, d, dv, (0, 0, 0), float(scale), False, mask))
            for t, x in zip(tokens + [att], (q, k, v, q)):
                t.meta.update(qpack_rank=3, qpack_batch=x.meta.get("qpack_batch", x))
            new = replace(view, tokens_to_image, (att, like))
            new.meta.update(qpack_rank=4, qpack_batch=att.meta["qpack_batch"])
            for d_ in dead:
                g.erase_node(d_)
                erased.add(d_)
            continue
        if (att := _explicit_attention(node, gm, modules)) is not None:
            # one call of the core's attention (with the bias as its mask) for the ops spelled out
            q, kt, v, mask, scale, causal, dead = att
            with g.inserting_before(node):
                k = g.call_method("transpose", (kt, -2, -1))
            new = replace(node, _attention.scaled_dot_product_attention, (q, k, v),
                          dict(attn_mask=mask, scale=scale, is_causal=causal))
            new.meta["qpack_rank"] = rank_of(q)
            for d in dead[1:]:
                g.erase_node(d)
                erased.add(d)
            heads(new)
            continue
        if (z := _channels_last_tokens(node, shapes)) is not None:
            # tokens of a channels-last view (PVT's patch embedding: permute(0, 2, 3, 1), LayerNorm,
            # reshape(B, -1, C)): the view permuted back to the image, then its tokens
            with g.inserting_before(node):
                back = g.call_method("permute", (z, 0, 3, 1, 2))
            back.meta.update(qpack_rank=4, qpack_batch=z.meta.get("qpack_batch", z))
            backs[z] = back
            replace(node, image_to_tokens, (back,)).meta.update(qpack_rank=3, qpack_batch=back.meta["qpack_batch"])
            continue
        if (tok := _image_tokens(node, shapes, modules)) is not None:
            x, dead = tok
            replace(node, image_to_tokens, (x,)).meta.update(qpack_rank=3, qpack_batch=x.meta.get("qpack_batch", x))
            for d in dead:
                g.erase_node(d)
                erased.add(d)
            continue
        if (img := _tokens_image(node, shapes)) is not None and (img[2] == (2, 3) or img[1] in backs):
            t, like, dims, dead = img
            if dims == (1, 2):  # H, W of a channels-last view: those of the image it was permuted back to
                like = backs[like]
            new = replace(node, tokens_to_image, (t, like))
            new.meta["qpack_rank"] = 4
            new.meta["qpack_batch"] = t.meta.get("qpack_batch", t)
            for d in dead:
                g.erase_node(d)
                erased.add(d)
            continue
        if node.op in ("call_method", "call_function") and node.args and isinstance(node.args[0], torch.fx.Node) \
                and node.args[0].op == "get_attr" and (t := _constant_view(gm, node)) is not None:
            # a constant's view by constant sizes (timm's metaformer Scale) or its index by
            # constants (LeViT's attention biases) is a constant too
            to_constant(node, t)
            continue
        if (moved := _row_permutation(node)) is not None:
            # reshapes and transposes that move whole rows (MobileViT's unfold into patches and
            # fold back) -> permute_rows, the rows' order a constant
            x, rows, shape, chain = moved
            name = f"_qpack_rows_{len(erased)}_{node.name}"
            gm.register_buffer(name, rows, persistent=False)
            with g.inserting_before(node):
                attr = g.get_attr(name)
            new = replace(node, permute_rows, (x, attr, shape))
            new.meta["qpack_rank"] = len(shape)
            for dead in reversed(chain[:-1]):
                g.erase_node(dead)
                erased.add(dead)
            continue
        node.meta["qpack_rank"] = _rank(node, modules)
        shapes.visit(node)
        fx_args = [a for a in node.args if isinstance(a, torch.fx.Node)]
        if node in shapes.sym or (node.op == "call_function" and node.target in _SHAPE_ARITHMETIC and fx_args
                                  and all(a.meta.get("qpack_shape_value") for a in fx_args)):
            node.meta["qpack_shape_value"] = True  # a size or a number made of sizes, not a tensor
        terms = shapes.terms(node)
        x = node.args[0] if node.args else None
        if (terms is not None and isinstance(x, torch.fx.Node) and rank_of(x) == len(terms) and terms.count(-1) <= 1
                and (all(a == -1 or a == ("dim", x, i) for i, a in enumerate(terms)) or _own_image_view(x, terms))):
            # a view of a value as its own shape (EfficientViT-M's view(B, -1, H, W) of a
            # convolution's output, B, H and W the block input's): the value
            node.replace_all_uses_with(x)
            g.erase_node(node)
            erased.add(node)
            continue
        if (terms is not None and len(terms) == 2 and terms[1] == -1 and isinstance(terms[0], tuple)
                and terms[0][0] == "dim" and terms[0][2] == 0
                and terms[0][1].meta.get("qpack_batch", terms[0][1]) is x.meta.get("qpack_batch", x)):
            node = replace(node, torch.flatten, (x, 1))
        elif (terms is not None and len(terms) == 5 and terms[0] == ("dim", x, 0) and isinstance(terms[1], int)
              and terms[2] == ("floordiv", ("dim", x, 1), terms[1]) and terms[3:] == [("dim", x, 2), ("dim", x, 3)]):
            t = _only_user(node)
            nxt = _only_user(t) if _is_transpose_12(t, node) else None
            c = nxt if nxt is not None and nxt.op == "call_method" and nxt.target == "contiguous" else None
            back = _only_user(c) if c is not None else nxt
            want = [("dim", x, 0), -1, ("dim", x, 2), ("dim", x, 3)]
            back_terms = shapes.terms(back) if back is not None and back.args[0] is (c or t) else None
            if back_terms is not None and (back_terms == want or back_terms[:1] + back_terms[2:] == want[:1] + want[2:]
                                           and back_terms[1] == ("dim", x, 1)):
                replace(back, channel_part, (x, 1, 0, terms[1])).meta["qpack_rank"] = rank_of(x)
                for dead in (c, t, node):
                    if dead is not None and dead not in erased:
                        g.erase_node(dead)
                        erased.add(dead)
                continue
        elif ((node.op == "call_method" and node.target == "chunk") or
              (node.op == "call_function" and node.target is torch.chunk)):
            parts, dim = _dim_arg(node, 1, "chunks"), _norm_dim(_dim_arg(node, 2, "dim", 0), rank_of(x))
            items = list(node.users)
            if (dim == 1 and isinstance(parts, int) and parts >= 1 and items and all(
                    u.op == "call_function" and u.target is operator.getitem and isinstance(u.args[1], int)
                    and 0 <= u.args[1] < parts for u in items)):
                for u in items:
                    new = replace(u, channel_part, (x, parts, u.args[1], 1))
                    new.meta["qpack_rank"] = rank_of(x)
                g.erase_node(node)
                erased.add(node)
                continue
        elif node.op == "call_function" and node.target is operator.getitem and (
                part := _channel_slice(node, modules)):
            first, count, picked = part
            if not picked:
                new = replace(node, channel_range, (x, first, count))
                new.meta["qpack_rank"], new.meta["qpack_channels"] = rank_of(x), count
                continue
            # x[:, k] of rows [N, L, C]: row k as channel_range [N, 1, C] flattened to [N, C]
            with g.inserting_before(node):
                row = g.call_function(channel_range, (x, first, 1))
            row.meta.update(qpack_rank=3, qpack_channels=1, qpack_batch=x.meta.get("qpack_batch", x))
            node = replace(node, torch.flatten, (row, 1))
        elif parts := _split_parts(node, modules):
            for u, (first, count) in parts.items():
                new = replace(u, channel_range, (x, first, count))
                new.meta["qpack_rank"], new.meta["qpack_channels"] = rank_of(x), count
            g.erase_node(node)
            erased.add(node)
            continue
        elif (power := _small_power(node)):
            # x ** 2 (StarReLU's relu(x) ** 2) -> x * x, x ** 3 (GPT-2's spelled-out tanh GELU)
            # -> (x * x) * x, as PyTorch's pow computes them: the core's mul nodes
            x = node.args[0]
            if power == 3:
                with g.inserting_before(node):
                    sq = g.call_function(operator.mul, (x, x))
                sq.meta.update(qpack_rank=rank_of(x), qpack_channels=channels_of(x))
                replace(node, operator.mul, (sq, x))
            else:
                replace(node, operator.mul, (x, x))
            continue
        elif _tensor_sub(gm, node):
            # a - b of two values (FastViT's mixer(x) - norm(x)) -> a + b * -1: the add node
            # and a scalar affine the core runs (exactly a - b in float)
            a, b = node.args
            with g.inserting_before(node):
                neg = g.call_function(operator.mul, (b, -1.0))
            neg.meta.update(qpack_rank=rank_of(b), qpack_channels=channels_of(b))
            replace(node, operator.add, (a, neg))
            continue
        elif (aff := _addcmul_affine(node, gm)) is not None:
            # torch.addcmul(beta, alpha, x) with constants of the last dim (timm's ResMLP
            # Affine) -> x * alpha + beta, one affine node
            new = replace(node, last_dim_affine, aff)
            new.meta["qpack_rank"] = rank_of(aff[0])
            continue
        elif (bn := _flat_rows_bn(node, modules)) is not None:
            x, mod, flat = bn
            scale, shift = _bn_affine(mod.running_mean, mod.running_var, mod.weight, mod.bias, mod.eps)
            consts = []
            first_op = next(n for n in g.nodes if n.op != "placeholder")
            for what, t in (("scale", scale), ("shift", shift)):
                name = f"_qpack_{what}_{len(erased)}_{node.name}"
                gm.register_buffer(name, t.float(), persistent=False)
                with g.inserting_before(first_op):  # with the inputs: not an op between ops
                    consts.append(g.get_attr(name))
            bn_node = node.args[0]
            new = replace(node, last_dim_affine, (x, *consts))
            new.meta["qpack_rank"] = 3
            for dead in (bn_node, flat):
                g.erase_node(dead)
                erased.add(dead)
            continue
        elif (tm := _tokens_mean(node)) is not None:
            # x.mean(1) of tokens [N, L, C] (a transformer's average-pool head: EfficientFormer,
            # LeViT, ResMLP) -> x.transpose(1, 2).mean(2): a transpose and a global average pool
            x, keepdim = tm
            with g.inserting_before(node):
                t = g.call_method("transpose", (x, 1, 2))
            t.meta.update(qpack_rank=3, qpack_batch=x.meta.get("qpack_batch", x))
            new = replace(node, _mean_last, (t, keepdim))
            new.meta["qpack_rank"] = 3 if keepdim else 2
            continue
        elif node.op == "call_method" and node.target == "squeeze" and not node.kwargs and len(node.args) == 2:
            # [N, C, 1] -> [N, C], and [N, C, 1, 1] squeezed twice
            r, d = rank_of(x), _norm_dim(node.args[1], rank_of(x))
            unit = x.meta.get("qpack_unit", frozenset())
            if r == 3 and d == 2 and 2 in unit:
                src = x
                if (x.op == "call_method" and x.target == "squeeze" and len(x.users) == 1
                        and rank_of(x.args[0]) == 4 and {2, 3} <= x.args[0].meta.get("qpack_unit", frozenset())):
                    src = x.args[0]
                node = replace(node, torch.flatten, (src, 1))
        elif node.op == "call_function" and node.target is F.interpolate:
            kw = _interpolate_args(node, None)
            like = _hw_source(kw["size"], shapes)
            if like is not None and kw["scale_factor"] is None and not kw["antialias"] and isinstance(kw["mode"], str):
                size = kw["size"]
                node = replace(node, resize_like, (x, like, kw["mode"], kw["align_corners"]))
                for dead in size if isinstance(size, (tuple, list)) else [size]:
                    if not dead.users and dead.op == "call_function" and dead.target is operator.getitem \
                            and dead not in shapes.sym:
                        g.erase_node(dead)
                        erased.add(dead)
        elif (bc := _batch_constant(node, gm, shapes)) is not None:
            # a constant over a value's batch: ViT's class token expanded to it, its position
            # embedding added to it -> batch_constant (the core's constant node; an add of two values)
            like, attr, added = bc
            if not added:
                node = replace(node, batch_constant, (like, attr))
            else:
                with g.inserting_before(node):
                    const = g.call_function(batch_constant, (like, attr))
                const.meta.update(qpack_rank=_attr_tensor(gm, attr).ndim,
                                  qpack_batch=like.meta.get("qpack_batch", like))
                node.args = tuple(const if a is attr else a for a in node.args)
        elif node.op == "call_function" and node.target is torch.cat:
            dim = _dim_arg(node, 1, "dim", 0)
            ranks = {rank_of(t) for t in node.args[0]} if isinstance(node.args[0], (tuple, list)) else {None}
            if isinstance(dim, int) and dim < 0 and len(ranks) == 1 and None not in ranks:
                node.args, node.kwargs = (node.args[0], dim + ranks.pop()), {}
        elif ((node.op == "call_function" and node.target in (operator.mul, torch.mul)) or (
                node.op == "call_method" and node.target == "mul")) and len(node.args) == 2 and not node.kwargs \
                and (scaled := _channel_scaled(gm, node)) is not None:
            v, r, g_attr = scaled
            node = replace(node, channel_scale, (v, g_attr))
            if r is not g_attr and not r.users:
                g.erase_node(r)
                erased.add(r)
        elif _permute_dims(node) == [0, 2, 3, 1] and rank_of(x) == 4 and (
                ln := _only_user(node)) is not None and (a := _layer_norm_args(ln, modules)) is not None and \
                a[0] is node and len(a[1]) == 1 and _permute_dims(back := _only_user(ln)) == [0, 3, 1, 2] \
                and back.args[0] is ln:
            # timm's LayerNorm2d / ConvNeXt's permute, LayerNorm, permute: one layer_norm2d()
            _, _, weight, bias, eps = a
            if ln.op == "call_module":
                with g.inserting_before(back):
                    weight = g.get_attr(f"{ln.target}.weight") if weight is not None else None
                    bias = g.get_attr(f"{ln.target}.bias") if bias is not None else None
            new = replace(back, layer_norm2d, (x, weight, bias, eps))
            new.meta["qpack_rank"] = 4
            for dead in (ln, node):
                g.erase_node(dead)
                erased.add(dead)
            node = new
        elif node.op == "call_function" and node.target is torch._assert and _rank_check_holds(x):
            # torch._assert(x.ndim == 4, ...) on a value of known rank 4 (timm's BatchNormAct2d)
            g.erase_node(node)
            erased.add(node)
            continue
        mean = _mean_dims(node)
        if mean is not None:
            node.args, node.kwargs = (mean[0], mean[1], mean[2]), {}
        # (a constant's rank is its tensor's: torchvision ViT's position embedding)
        node.meta["qpack_rank"] = (t.dim() if isinstance(t := _attr_tensor(gm, node), torch.Tensor)
                                   else _rank(node, modules) if node.op != "call_function" or
                                   node.target is not channel_part else rank_of(node.args[0]))
        node.meta["qpack_unit"] = _unit_dims(node, modules)
        node.meta["qpack_channels"] = _channels(node, modules)
        batch = _batch(node, modules)
        if batch is not node:
            node.meta["qpack_batch"] = batch
        hw = _spatial(node, modules)
        if hw is not node:
            node.meta["qpack_hw"] = hw
    # shape arithmetic nothing reads any more
    for node in reversed(list(g.nodes)):
        if not node.users and (node in shapes.sym or _rank_query(node) is not None or (
                node.op == "call_method" and node.target == "squeeze") or (
                node.op == "call_function" and node.target in (operator.eq, operator.ne)
                and _rank_query(node.args[0]) is not None)):
            g.erase_node(node)
    _checks_last(g)
    g.lint()
    gm.recompile()
    return gm


_SIZE_OPS = {operator.getitem, operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge,
             operator.and_, operator.or_, operator.not_, operator.truth} | _SHAPE_ARITHMETIC


def _checks_last(g):
    """Moves each torch._assert on sizes (EfficientViT-M's ``_assert(H == H_, ...)`` on a
    block input inside the graph), with the size reads and arithmetic only it reads, to
    just before the output: checks of values inside a graph would otherwise split it
    (PyTorch must hold a value to read its size). A failing one still raises, after the
    ops that came before the output."""
    out = next(n for n in reversed(g.nodes) if n.op == "output")
    order = {n: i for i, n in enumerate(g.nodes)}

    def size_only(n):
        return (n.op == "call_function" and (n.target in _SIZE_OPS or (
            n.target is getattr and n.args[1:] in (("shape",), ("ndim",)))) or (
            n.op == "call_method" and n.target in ("size", "dim")))

    # the asserts and the size reads and arithmetic whose every reader moves too (in
    # reverse order: a node moves when all its readers do; x.shape unpacked for two
    # asserts moves with both)
    moving = set()
    for n in reversed(list(g.nodes)):
        if n.op == "call_function" and n.target is torch._assert and not n.users:
            moving.add(n)
        elif size_only(n) and n.users and all(u in moving for u in n.users):
            moving.add(n)
    for n in sorted(moving, key=order.get):
        out.prepend(n)


# ---- segments: the parts of a trace the core runs ------------------------------------------

_MIN_SEGMENT_NODES = 2  # a lone elementwise op is cheaper in PyTorch than crossing into the core


def _addcmul_affine(node, gm):
    """(x, alpha, beta) when node is ``torch.addcmul(beta, alpha, x)`` (or ``(beta, x,
    alpha)``) of a value x and two constants of one last dim (_last_dim_constant), the
    value factor 1; else None."""
    if not (node.op == "call_function" and node.target is torch.addcmul and len(node.args) == 3
            and set(node.kwargs) <= {"value"} and node.kwargs.get("value", 1) == 1):
        return None
    beta, a, b = node.args
    for alpha, x in ((a, b), (b, a)):
        ts = [_attr_tensor(gm, t) for t in (alpha, beta)]
        if (isinstance(x, torch.fx.Node) and x.op != "get_attr" and all(
                t is not None and _last_dim_constant(t) and t.dtype == torch.float32 for t in ts)
                and ts[0].numel() == ts[1].numel()):
            return x, alpha, beta
    return None


def _last_dim_constant(t):
    """True for a float tensor of C values along the last dim ([C], [1, C], [1, 1, C]; or
    one value): what _Lowering.lower_last_dim_constant makes an affine node of."""
    return 1 <= t.ndim <= 3 and all(d == 1 for d in t.shape[:-1]) and t.is_floating_point()


_ADD_MUL = {operator.add, operator.iadd, torch.add, operator.mul, operator.imul, torch.mul}


def _constant_attr(node, gm=None):
    """A get_attr node read only as a constant by the ops that use it: qparams of
    convert_fx's quantize / quantized add, statistics and affine of F.batch_norm (and
    of the layer and group norms), an attention's mask, a constant of the last dim that a value is
    multiplied by or added to (with gm)."""
    def constant_operand(u):
        if not ((u.op == "call_function" and u.target in _ADD_MUL) or
                (u.op == "call_method" and u.target in ("add", "add_", "mul", "mul_"))):
            return False
        if len(u.args) != 2 or u.kwargs or node not in u.args or u.args[0] is u.args[1]:
            return False
        other = u.args[1] if u.args[0] is node else u.args[0]
        t = _attr_tensor(gm, node)
        return (isinstance(other, torch.fx.Node) and other.op != "get_attr" and t is not None
                and _last_dim_constant(t))

    def reads_as_constant(u):
        if u.op != "call_function":
            return False
        if u.target in _QPARAM_READERS:
            return True
        if u.target in (F.batch_norm, F.layer_norm, F.group_norm, layer_norm2d, channel_scale, last_dim_affine,
                        batch_constant, permute_rows):
            return not u.args or u.args[0] is not node
        return u.target is heads_attention and len(u.args) > 9 and u.args[9] is node and node not in u.args[:3]
    return node.op == "get_attr" and bool(node.users) and all(
        reads_as_constant(u) or (gm is not None and constant_operand(u))
        for u in node.users)


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
        if any(m in cur.channels_last for m, _ in cur.exported):
            return  # a channels-last view read outside (a region cut short): all in PyTorch
        if outs and (cur.layers or len(cur.nodes) >= _MIN_SEGMENT_NODES):
            out.append(cur)

    for node in gm.graph.nodes:
        if _constant_attr(node, gm) or (node.op == "get_attr" and not node.users):
            continue  # read as constants by the ops that use it, or by none
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

def _each_float_value(gm, batches, visit, show_progress=False):
    """Runs gm on every batch and calls visit(node name, tensor) for each non-empty float
    tensor a node produces."""
    class Visitor(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if torch.is_tensor(out) and out.is_floating_point() and out.numel():
                visit(n.name, out)
            return out

    runner = Visitor(gm)
    with torch.no_grad():
        for batch in progress(batches, len(batches), "qpack calibrate", show_progress):
            runner.run(*(batch if isinstance(batch, tuple) else (batch,)))


def calibrate(gm, batches, show_progress=None):
    """(min, max) of every float tensor an fx node produces, by node name."""
    ranges = {}

    def record(name, out):
        lo, hi = float(out.min()), float(out.max())
        old = ranges.get(name)
        ranges[name] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))

    _each_float_value(gm, batches, record, show_progress)
    return ranges


class QParams(dict):
    """{fx node name: (scale, zero_point)} of an int8 graph, chosen onto [0, qmax]
    (freeze's reduce_range: 127). It travels with the runner (deepcopy, pickle), so a
    rebuilt graph clamps its values to qmax again (Segment)."""
    qmax = 255


def narrow_bounds(scale, zero_point, qmax):
    """(lowest, highest) float a u8 value on [0, qmax] holds: a clamp to them keeps the
    value's bytes in [0, qmax]."""
    return -zero_point * scale, (qmax - zero_point) * scale


_RANGE_KEEPING = ("maxpool2d", "flatten", "channels", "channel_range", "resize_nearest", "transpose", "depth_to_space",
                  "permute_rows")


def _narrow_values(nodes, values, outputs, qmax):
    """Every u8 value of the graph kept on [0, qmax] (qmax < 255: reduce_range), so that a
    convolution or linear never reads a byte above it, whatever the data: the u8 add
    clamps in its activation, an f32 input is clamped before its quantize, and any other
    u8 producer but conv2d / linear (whose layers clamp themselves: freeze's
    _int8_graph_layers) and the range-keeping ops is followed by a u8 clamp node.
    Returns (nodes, values, outputs)."""
    values, outputs, out = list(values), list(outputs), []
    for i, n in enumerate(nodes):
        v = n["output"]
        kind = n["kind"]
        u8 = values[v][0] == "u8"
        keeps = kind in _RANGE_KEEPING or (kind == "concat" and all(values[i] == values[v] for i in n["inputs"]))
        if not u8 or kind in ("conv2d", "linear") or keeps:
            out.append(n)
            continue
        lo, hi = narrow_bounds(values[v][1], values[v][2], qmax)
        if kind == "quantize":  # clamp the float input first
            values.append(("f32", 0.0, 0))
            out.append(dict(kind="activation", inputs=list(n["inputs"]), output=len(values) - 1,
                            activation="clamp", act_min=lo, act_max=hi))
            out.append(dict(n, inputs=[len(values) - 1]))
            continue
        if kind == "add" and n.get("activation") in (None, "none", "relu", "clamp"):
            act = n.get("activation")
            a_lo = 0.0 if act == "relu" else (max(lo, n["act_min"]) if act == "clamp" else lo)
            a_hi = min(hi, n["act_max"]) if act == "clamp" else hi
            out.append(dict(n, activation="clamp", act_min=a_lo, act_max=a_hi))
            continue
        values.append(values[v])  # the clamped copy: later readers and outputs take it
        w = len(values) - 1
        out.append(n)
        out.append(dict(kind="activation", inputs=[v], output=w, activation="clamp", act_min=lo, act_max=hi))
        for later in nodes[i + 1:]:
            later["inputs"] = [w if i == v else i for i in later["inputs"]]
        outputs = [w if o == v else o for o in outputs]
    return out, values, outputs


_BINS = 2048


def refine_ranges(gm, batches, ranges, qmax, names=None):
    """Ranges clipped where that lowers the expected squared error of quantizing onto
    qmax + 1 levels (as PyTorch's HistogramObserver does): a second pass over the
    calibration batches counts each value's elements in 2048 bins over its [min, max];
    the clip [a, b] (bin edges, 0 kept inside) minimizes sum over elements of the
    rounding error (step^2 / 12, step = (b - a) / qmax) inside and the squared distance
    to the clip outside. ``names``: the values to refine (None: all)."""
    import numpy as np

    hists = {}

    def count(name, out):
        r = ranges.get(name)
        if r is not None and (names is None or name in names) and r[1] > r[0]:
            hists[name] = hists.get(name, 0) + torch.histc(out.float(), _BINS, r[0], r[1]).double().numpy()

    _each_float_value(gm, batches, count)
    out = dict(ranges)
    for name, c in hists.items():
        out[name] = clip_range(c, *ranges[name], qmax)
    return out


def clip_range(c, lo, hi, qmax):
    """The clip [a, b] of a value whose elements fell into the histogram c (equal bins
    over [lo, hi]) that minimizes the expected squared error of quantizing onto qmax + 1
    levels: the rounding error (step^2 / 12, step = (b - a) / qmax) inside, the squared
    distance to the clip outside; a and b bin edges, 0 kept inside."""
    bins = len(c)
    w = (hi - lo) / bins
    x = lo + (np.arange(bins) + 0.5) * w
    edges = lo + np.arange(bins + 1) * w
    # prefix sums of c, c x, c x^2: the clipping error of [a, b] in O(1)
    c0, c1, c2 = (np.concatenate([[0.0], np.cumsum(c * x ** k)]) for k in (0, 1, 2))
    zero = min(max(int(np.floor((0.0 - lo) / w)), 0), bins)  # a <= 0 <= b
    ia = np.unique(np.linspace(0, zero, min(zero + 1, 256)).astype(int))
    ib = np.unique(np.linspace(min(zero + 1, bins), bins, max(min(bins - zero, 256), 1)).astype(int))
    a, b = edges[ia][:, None], edges[ib][None, :]
    below = c2[ia][:, None] - 2 * a * c1[ia][:, None] + a * a * c0[ia][:, None]
    above = (c2[-1] - c2[ib])[None, :] - 2 * b * (c1[-1] - c1[ib])[None, :] + b * b * (c0[-1] - c0[ib])[None, :]
    inside = (c0[ib][None, :] - c0[ia][:, None]) * ((b - a) / qmax) ** 2 / 12
    err = below + above + inside
    i, j = np.unravel_index(np.argmin(err), err.shape)
    return float(min(edges[ia[i]], 0.0)), float(max(edges[ib[j]], 0.0))


def value_qparams(seg, ranges, qmax=255):
    """u8 (scale, zero_point) per value of a segment: its own calibrated range onto [0, qmax]
    (freeze's reduce_range: 127), except where the op keeps its input's (max pooling, flatten,
    nearest resize)."""
    qp = {}
    producer = {n["output"]: n for n in seg.nodes}
    for v, fx in enumerate(seg.values):
        n = producer.get(v)
        if n is not None and n["kind"] in _RANGE_KEEPING:
            qp[v] = qp[n["inputs"][0]]
            continue
        if fx.name not in ranges:
            raise Unsupported(f"{fx.name} was not seen in calibration")
        qp[v] = _q.uint8_qparams(*ranges[fx.name], qmax, what=f"the value {fx.name} (made by {fx.op} "
                                                                f"{_target_name(fx)})")
    return qp


def _target_name(node):
    """A readable name of what an fx node calls (a module path, a function or method name)."""
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", repr(t))


def shared_layer_ranges(segs, ranges):
    """``ranges`` with the values a layer called more than once reads given the union of
    their ranges, and likewise the values it makes: its one static int8 twin quantizes
    every call (a detection head run over each pyramid level, a module applied twice)."""
    sites = collections.defaultdict(lambda: (set(), set()))
    for seg in segs:
        for n in seg.nodes:
            if "layer" in n:
                ins, outs = sites[id(n["layer"])]
                ins.add(seg.values[n["inputs"][0]].name)
                outs.add(seg.values[n["output"]].name)
    out = dict(ranges)
    for names in (group for ins, outs in sites.values() for group in (ins, outs)):
        if len(names) > 1 and all(name in out for name in names):
            union = (min(out[name][0] for name in names), max(out[name][1] for name in names))
            out.update((name, union) for name in names)
    return out


def qparams_by_name(segs, ranges, qmax=255):
    """{fx node name: (scale, zero_point)} for every value of the segments, onto [0, qmax]
    (a QParams)."""
    out = QParams()
    out.qmax = qmax
    inputs = {}
    for seg in segs:
        produced = {n["output"] for n in seg.nodes}
        for v, qp in value_qparams(seg, ranges, qmax).items():
            # a value some segment produces keeps that segment's qparams (a channel_range's
            # are its input's); where it is another segment's input they would be its own range's
            (out if v in produced else inputs)[seg.values[v].name] = qp
    for name, qp in inputs.items():
        out.setdefault(name, qp)
    return out


# ---- running -------------------------------------------------------------------------

_ARRAY_DTYPES = (torch.float32, torch.uint8)


def _to_array(t):
    """(physical C-contiguous array, layout) of a CPU float32/uint8 tensor, or None."""
    # attribute checks, not t.device.type (a new device object, ~0.9 us a call),
    # and detach only where autograd is on (~1.4 us): a graph's own per-call cost
    # is a few microseconds, which small models feel
    if not isinstance(t, torch.Tensor) or not t.is_cpu or t.dtype not in _ARRAY_DTYPES \
            or t.is_quantized or not 1 <= t.ndim <= 4:
        return None
    if t.requires_grad:
        t = t.detach()
    if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
        return t.permute(0, 2, 3, 1).numpy(), "nhwc"
    return t.contiguous().numpy(), "nchw"


def _run_handle(handle, arrays):
    """Runs a core graph on ``_to_array`` results. Rank-4 outputs in the memory format
    PyTorch's own ops would give: channels last when a rank-4 input was, else
    contiguous NCHW (``.view`` works on them)."""
    if len(arrays) == 1:  # the common case without the generic lists (a few microseconds a call)
        a, layout = arrays[0]
        nhwc = layout == "nhwc"
        outs = handle.run([a], [layout], layout)
    else:
        nhwc = any(layout == "nhwc" for _, layout in arrays)
        outs = handle.run([a for a, _ in arrays], [layout for _, layout in arrays], "nhwc" if nhwc else "nchw")
    if not nhwc:
        return [torch.from_numpy(o) for o in outs]
    return [torch.from_numpy(o).permute(0, 3, 1, 2) if o.ndim == 4 else torch.from_numpy(o) for o in outs]


class LayerGraph:
    """A frozen layer's own forward on a core graph of one node, between a quantize
    and a dequantize for a static int8 layer: float tensor in and out in one core
    call, as the layer runs inside a frozen graph. What ``qpack.freeze`` of a bare
    Linear / Conv gives runs this way, and so does each layer of a model frozen
    layer by layer; the layer's own torch path stays for the rest (other ranks
    and dtypes, torch.ao's quantized tensors) and gives its errors. Held by the
    layer, not pickled; rebuilt when the layer is re-packed (load_state_dict),
    dropped when its packed op is closed (the graph shares the op: it would
    keep the memory ``close()`` frees)."""

    _RANKS = {"linear": (2, 3), "conv1d": (3,), "conv2d": (4,)}

    def __init__(self, layer):
        s = layer._spec
        self.ranks = self._RANKS[layer._op]
        self.kind = "linear" if layer._op == "linear" else "conv2d"
        self.static = s["mode"] == "int8_static"
        self.usable = s.get("io") != "legacy" and (not self.static or s.get("input_scale") is not None)
        if self.static and self.usable:
            self.values = [("f32", 0.0, 0), ("u8", float(s["input_scale"]), int(s["input_zero_point"])),
                           ("u8", float(s["output_scale"]), int(s["output_zero_point"])), ("f32", 0.0, 0)]
        else:
            self.values = [("f32", 0.0, 0), ("f32", 0.0, 0)]
        self.packed = None  # the packed op the handle was made over
        self.handle = None

    def graph(self, layer):
        if self.handle is None or self.packed is not layer._packed:
            op = dict(kind=self.kind, op=layer._packed._h)
            if self.static:
                nodes = [dict(kind="quantize", inputs=[0], output=1), dict(op, inputs=[1], output=2),
                         dict(kind="dequantize", inputs=[2], output=3)]
            else:
                nodes = [dict(op, inputs=[0], output=1)]
            self.handle = _core.GraphHandle(self.values, nodes, [0], [len(self.values) - 1])
            self.packed = layer._packed
        return self.handle

    def drop(self):
        if self.handle is not None:
            self.handle.close()
        self.handle = self.packed = None

    def __call__(self, layer, x):
        """``layer``'s output for ``x``, or None where its own forward is to run."""
        rows = None  # a linear over the last dim of more dims (Swin's [B, H, W, C]): as rows
        if self.kind == "linear" and getattr(x, "ndim", 0) > 3:
            rows, x = x.shape[:-1], x.reshape(-1, x.shape[-1])
        if not self.usable or getattr(x, "ndim", 0) not in self.ranks or x.dtype is not torch.float32:
            return None
        if layer._packed.closed:
            self.drop()
            return None  # the layer's own path raises ClosedError
        a = _to_array(x)
        if a is None:
            return None
        try:
            handle = self.graph(layer)
        except _core.ClosedError:
            return None
        except _core.Error:
            self.usable = False  # a layer no core graph takes: its own path from now on
            return None
        try:
            y = _run_handle(handle, [a])[0]
        except (_core.InvalidArgumentError, _core.InvalidTypeError):
            return None  # shapes this layer's graph cannot plan: the layer's own path says why
        return y if rows is None else y.view(*rows, y.shape[-1])


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
        nodes = _fuse_layer_activations(nodes, values, outputs)
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
            qmax = getattr(qparams, "qmax", 255)
            if qmax < 255:
                nodes, values, outputs = _narrow_values(nodes, values, outputs, qmax)
        self.spec = dict(values=values, nodes=nodes, inputs=inputs, outputs=outputs,
                         output_is_tuple=low.output_is_tuple)
        self.rowwise = all(_rowwise(n) for n in nodes)
        self.fallback = None  # why its ops last ran in PyTorch (qpack_segment), for the report
        self.refused = set()  # the input signatures (_signature) it fell back on
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
        return _run_handle(self.graph(), arrays)

    def __call__(self, *args):
        lead = _rows_lead(args) if self.rowwise else None
        if lead is not None:  # every op works on rows: the inputs as [rows, last dim]
            args = [a.reshape(-1, a.shape[-1]) for a in args]
        arrays = [_to_array(a) for a in args]
        if any(a is None for a in arrays):
            raise _core.InvalidTypeError("a graph segment takes float32 CPU tensors of rank 1 to 4")
        outs = self.run_arrays(arrays)
        if lead is not None:
            outs = [o.view(*lead, o.shape[-1]) for o in outs]
        return tuple(outs)


def _signature(xs):
    """What a segment's inputs are to its graph: each tensor's shape, dtype, strides and
    device, anything else its type."""
    return tuple((tuple(x.shape), x.dtype, x.stride(), x.device.type, x.is_quantized) if isinstance(x, torch.Tensor)
                 else type(x) for x in xs)


def _rowwise(node):
    """True when a node works on each row of the last dim alone, whatever the rank of
    its value (a linear, a layer_norm or affine over the last dim, activations,
    equal-shape add and mul, quantize and dequantize): a segment of such nodes runs on
    any rank as rows."""
    kind = node["kind"]
    if kind == "linear":
        return not node.get("per_pixel")
    if kind in ("layer_norm", "affine"):
        return node.get("dim") == -1
    return kind in ("activation", "add", "mul", "quantize", "dequantize")


def _rows_lead(args):
    """The leading dims of a row-wise segment's inputs (all but the last, equal for all)
    where one has more dims than the core's linear takes (Swin's [B, H, W, C]), else None."""
    if not any(isinstance(a, torch.Tensor) and a.ndim > 3 for a in args):
        return None
    lead = args[0].shape[:-1]
    if all(isinstance(a, torch.Tensor) and a.ndim >= 2 and a.shape[:-1] == lead for a in args):
        return lead
    return None


class GraphRunner:
    """The forward of a graph-frozen model.

    The whole trace as one core graph when it lowers entirely; otherwise the
    trace itself with each run of supported ops replaced by a core graph
    (segments) and PyTorch in between. Held in the model instance's
    ``__dict__`` as ``forward`` (the model keeps its class); not a submodule,
    so ``state_dict`` is the layers'. Graphs follow re-packed layers
    (``load_state_dict``); pickling keeps only the model, the per-value
    qparams and the example shapes, and the trace is redone on first use.
    ``shapes`` (example_shapes): a forward that does not trace symbolically is
    traced on inputs of these shapes; calls with others run the model's own
    forward, layer by layer (a FreezeWarning says so, once)."""

    def __init__(self, model, qparams=None, shapes=None):
        self._model_ref = model
        self._qparams = qparams  # {fx node name: (scale, zero_point)} for int8 graphs
        self._shapes = shapes
        self._specialized = None  # the shapes the trace was specialized to, if it was
        self._segments = None
        self._gm = None          # the rewritten trace when there are several segments

    def build(self):
        try:
            gm = trace(self._model_ref, self._shapes)
        except Unsupported:
            raise
        except Exception as e:  # noqa: BLE001 - anything fx cannot trace is not a graph
            raise Unsupported(f"trace: {type(e).__name__}") from None
        self._specialized = gm._qpack_shapes
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
            def qpack_segment(*xs, _run=runner, _torch=_torch_segment(gm, seg, replaced)):
                if _run.refused and _signature(xs) in _run.refused:
                    return _torch(*xs)  # (refused before: not converted and planned again)
                try:
                    return _run(*xs)
                except (_core.InvalidArgumentError, _core.InvalidTypeError) as e:
                    # inputs this graph cannot take or plan (dtype, rank, shapes): its ops in
                    # PyTorch (graph_report says so), at once for these inputs from now on
                    _run.fallback = str(e)
                    if len(_run.refused) < 64:
                        _run.refused.add(_signature(xs))
                    return _torch(*xs)
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
        for node in list(gm.graph.nodes):  # tensors only ops the segments took read: an
            if node.op == "get_attr" and not node.users:  # attribute lookup at every call
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
        if self._specialized is not None and not _shapes_match(args, self._specialized):
            self._warn_other_shapes(args)
            return type(model).forward(model, *args)
        if self._gm is not None:
            first = getattr(self._gm, "_qpack_none_from", None)
            if first is not None and not _defaults_given(args[first:], self._gm):
                return type(model).forward(model, *args)  # traced with their defaults
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

    def _warn_other_shapes(self, args):
        if getattr(self, "_warned_shapes", False):
            return
        self._warned_shapes = True
        from qpack.torch.freeze import FreezeWarning
        got = ", ".join(str(tuple(a.shape)) if isinstance(a, torch.Tensor) else type(a).__name__ for a in args)
        want = ", ".join(str(s) for s, _ in self._specialized)
        warnings.warn(f"qpack: {type(self._model_ref).__name__}'s graph was traced for inputs of shape {want} "
                      f"(its forward reads their sizes); inputs of shape {got} run its layers one by one",
                      FreezeWarning, stacklevel=3)

    def info(self):
        self._ready()
        infos = [s.graph().info() for s in self._segments]
        out = dict(infos[0])
        for k in ("nbytes_packed", "nbytes_constants", "nbytes_workspace", "plans_built", "runs", "num_nodes",
                  "num_values"):
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
                if seg.fallback is not None:
                    lines.append(f"  (a call ran its ops in PyTorch instead: {seg.fallback})")
            values = seg.spec["values"]
            runs_on = seg.graph().node_backends()
            # how the plans so far hold each value; before any plan, the rule (rank 4 NHWC, the rest NC)
            held = [layout if layout != "unplanned" else "NHWC/NC" for layout in seg.graph().value_layouts()]
            # the core names a fused add's convolution by node index: here by the value it makes
            sums = {}
            for ni, where in enumerate(runs_on):
                m = re.search(r"sum post-op of node (\d+)", where)
                if m:
                    k = int(m.group(1))
                    sums[k] = ni
                    runs_on[ni] = where.replace(m.group(0), f"sum post-op of the conv2d -> "
                                                            f"{seg.spec['nodes'][k]['output']}")
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
                    if n.get("activation"):  # an activation node fused into it (_fuse_layer_activations)
                        extra += f" +{n['activation']}"
                    if ni in sums:  # an add run as its sum post-op (the core's plan)
                        extra += f" +add({','.join(str(i) for i in seg.spec['nodes'][sums[ni]]['inputs'])})"
                    extra += f" packed={layer.nbytes_packed}B"
                elif n.get("activation"):
                    extra = f" +{n['activation']}"
                if "layer_index" not in n:  # a backend's own operator, or qpack's C++ code
                    extra += f" backend={runs_on[ni]}"
                ins = ",".join(str(i) for i in n["inputs"])
                lines.append(f"{n['kind']:<15} ({ins}) -> {n['output']} {dt}{q} {held[n['output']]}{extra}")
        info = self.info()
        lines.append(f"{info['num_nodes']} nodes in {info['segments']} graph(s); packed {info['nbytes_packed']} B, "
                     f"constants {info['nbytes_constants']} B, workspace {info['nbytes_workspace']} B (largest plan "
                     "so far)")
        return "\n".join(lines)

    def __reduce__(self):
        return (GraphRunner, (self._model_ref, self._qparams, self._shapes))

    def __qpk_reduce__(self):
        # qpack.save: a one-graph forward keeps its lowered segment (spec and
        # layers), so a loaded model skips the trace; several segments live
        # in a rewritten trace (closures), which is redone on first use.
        self._ready()
        if self._gm is not None:
            return self.__reduce__()
        return (_restore_runner, (self._model_ref, self._qparams,
                                  [(s.spec, s.layers) for s in self._segments], self._specialized))

    def __qpk_graphs__(self):
        """The core graphs this forward runs (qpack.save writes them to the file)."""
        self._ready()
        return [s.graph() for s in self._segments]

    def __deepcopy__(self, memo):
        return GraphRunner(copy.deepcopy(self._model_ref, memo), copy.deepcopy(self._qparams, memo), self._shapes)


# activations oneDNN applies as a post-op of an f32 convolution (runtime.cc's eltwise_of)
_CONV_POST_OPS = {"relu", "clamp", "hardswish", "hardsigmoid", "sigmoid", "silu", "gelu", "leaky_relu"}


def _fuse_layer_activations(nodes, values, outputs):
    """An f32 activation node whose input is an f32 conv2d's or linear's output that
    nothing else reads becomes part of that node (oneDNN's eltwise post-op, applied
    before the store, or qpack's vector loop over the output right after); the layer
    writes the activation's output. int8 graphs keep the node (u8 activations are a
    256-entry table)."""
    readers = collections.Counter(v for n in nodes for v in n["inputs"])
    producer = {n["output"]: n for n in nodes}
    kept = []
    for n in nodes:
        p = producer.get(n["inputs"][0]) if n["kind"] == "activation" else None
        v = n["inputs"][0]
        if (p is not None and p["kind"] in ("conv2d", "linear") and "layer_index" in p and p.get("activation") is None
                and (p["kind"] == "linear" or n.get("activation") in _CONV_POST_OPS) and readers[v] == 1
                and v not in outputs
                and values[v][0] == "f32" and values[n["output"]][0] == "f32"):
            p.update(activation=n["activation"], act_min=n.get("act_min", 0.0), act_max=n.get("act_max", 0.0),
                     output=n["output"])
            producer[n["output"]] = p
            continue
        kept.append(n)
    return kept


def _torch_segment(gm, seg, replaced):
    """A GraphModule running a segment's own fx nodes in PyTorch: same inputs,
    same outputs (a tuple) as its core graph (``replaced``: inputs an earlier
    segment took over -> what its members now read)."""
    g = torch.fx.Graph()
    env = {}
    for i, n in enumerate(seg.input_nodes):
        env[n] = env[replaced.get(n, n)] = g.placeholder(f"x{i}")
    def arg(a):
        if a not in env and a.op == "get_attr":  # a constant (_constant_attr): read where it is
            env[a] = g.node_copy(a)
        return env[a]
    for n in seg.members:
        env[n] = g.node_copy(n, arg)
    outs = [None] * len(seg.outputs)
    for n, k in seg.exported:
        outs[k] = env[n]
    g.output(tuple(outs))
    return torch.fx.GraphModule(gm, g)


def _restore_runner(model, qparams, segments, specialized=None):
    """A one-graph GraphRunner from qpack.load (no trace; the graph is made on first use)."""
    runner = GraphRunner(model, qparams, specialized)
    runner._specialized = specialized
    runner._segments = []
    for spec, layers in segments:
        seg = Segment.__new__(Segment)
        seg.spec, seg.layers, seg.handle, seg.packed_ids = spec, layers, None, None
        runner._segments.append(seg)
    return runner


def attach(model, qparams=None, shapes=None):
    """Makes ``model`` run on core graphs (f32, or u8 with ``qparams`` by fx node
    name; a forward that does not trace symbolically traced on inputs of
    ``shapes``, GraphRunner); raises Unsupported when no part of it lowers."""
    runner = GraphRunner(model, qparams, shapes).build()
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
    except (Unsupported, _core.Error):
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


def _calls_attention(gm):
    return any(n.op == "call_function" and n.target is _attention.scaled_dot_product_attention
               for n in gm.graph.nodes)


def worth_part(nodes, inputs, outputs, num_layers):
    """A submodule's graph pays for the crossings at its edges (NHWC / u8
    conversions of its inputs and outputs) when values flow between 2 or more
    layers and a layer reads an input or writes an output (edges a layer run
    by itself converts anyway); a squeeze-excitation part (pool, tiny convs,
    then a mul over the big input) or a lone layer with an activation does not,
    unless that activation is one PyTorch computes slowly and the core's vector
    loop does not (GELU, SiLU, sigmoid: a transformer's MLP, Linear then GELU). One
    with an attention node does too (a transformer block: its attention would be a
    PyTorch call between the layers' graphs)."""
    if any(n["kind"] == "attention" for n in nodes):
        return True
    if num_layers == 1 and any(n.get("activation") in _SLOW_IN_TORCH for n in nodes):
        return True
    return num_layers >= 2 and any(
        ("layer" in n or "layer_index" in n) and (set(n["inputs"]) & set(inputs) or n["output"] in outputs)
        for n in nodes)


_SLOW_IN_TORCH = ("gelu", "silu", "sigmoid")


def attach_parts(model, qparams_of=None):
    """Graphs for the largest submodules that trace, when ``model`` itself does
    not (a forward with Python control flow on its inputs, keyword outputs...):
    its children, or theirs. ``qparams_of(module)``: int8 per-edge qparams of a
    submodule (None: fp32). Returns {qualified name: runner}."""
    attached = {}
    for name, child in model.named_children():
        if isinstance(child, (FrozenConv1d, FrozenConv2d, FrozenLinear)) or not any(
                isinstance(m, (FrozenConv1d, FrozenConv2d, FrozenLinear)) for m in child.modules()):
            continue
        try:
            runner = attach(child, qparams_of(child) if qparams_of else None)
            seg = runner._segments[0]
            if runner._gm is None and worth_part(seg.spec["nodes"], seg.spec["inputs"], seg.spec["outputs"],
                                                 len(seg.layers)):
                attached[name] = runner
                continue
            if runner._gm is not None and _calls_attention(runner._gm):
                # segments around an attention call (MobileViT's transformer blocks): the
                # core's attention runs between them; the children alone would leave it to
                # PyTorch's kernel (twice the time)
                attached[name] = runner
                continue
            # PyTorch inside it, or too little for its edges' crossings: its children may do better
            detach(child)
        except Unsupported as e:
            if not str(e).startswith("trace"):
                continue
        except _core.Error:
            continue  # a graph the core rejects: this part runs layer by layer
        attached.update({f"{name}.{k}": r for k, r in attach_parts(child, qparams_of).items()})
    return attached


def detach(model):
    """Back to the model's own forward, and its submodules' (unfreeze)."""
    for m in model.modules():
        if "forward" in m.__dict__ and (m.__dict__["forward"] is None or isinstance(m.__dict__["forward"], GraphRunner)):
            del m.__dict__["forward"]  # (None: a runner unfreeze's deepcopy left out)


def runner_of(model):
    r = model.__dict__.get("forward")
    return r if isinstance(r, GraphRunner) else None


def graph_report(model):
    """The plan of a graph-frozen model, a line per node (op, dtype, qparams,
    layer, backend, what was fused, packed bytes) and the totals; None when the
    model runs layer by layer."""
    r = runner_of(model)
    if r is not None:
        out = r.report()
    else:
        parts = graph_parts(model)
        if not parts:
            return None
        out = "\n".join(f"submodule {name} (PyTorch around it):\n{r.report()}" for name, r in parts.items())
    return out + "".join(_window_graph_lines(model))


def _window_graph_lines(model):
    """A line per Swin window-attention graph built so far (qpack.torch.attention's,
    kept on the qkv layer for the last image size it ran): its constants are the
    permutations and the masks (relative position bias + shifted windows)."""
    for name, m in model.named_modules():
        g = m.__dict__.get("_window_graph") if isinstance(m, FrozenLinear) else None
        handle = getattr(g, "handle", None)
        if handle is None:
            continue
        try:
            info = handle.info()
        except _core.Error:
            continue
        yield (f"\nwindow attention of {name} ({g.key[0]}x{g.key[1]} image, qpack.torch.attention): "
               f"{info['num_nodes']} nodes, constants {info['nbytes_constants']} B, "
               f"workspace {info['nbytes_workspace']} B")


def graph_parts(model):
    """{qualified name: runner} of the submodules that run as graphs inside a
    model that does not (attach_parts)."""
    return {name: r for name, m in model.named_modules() if name and (r := runner_of(m)) is not None}


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


__all__ = ["GraphRunner", "QParams", "Segment", "Specialized", "Unsupported", "attach", "attach_parts", "calibrate", "detach",
           "graph_parts", "graph_report", "narrow_bounds", "refine_ranges", "worth_part",
           "progress", "qparams_by_name", "runner_of", "segments", "value_qparams"]
