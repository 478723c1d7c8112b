"""qpack.freeze / qpack.unfreeze: a PyTorch model onto packed weights, and back.

One explicit mapping table (``MAPPING``) says which source module type becomes
which frozen module; users extend it with ``register``. Folding and fusion are
decided on a ``torch.fx`` trace of the model and applied by swapping modules in
(a copy of) the model itself, so the result keeps the user's class, attributes
and methods: BatchNorm after a conv/linear is folded into its weights (the
BatchNorm becomes ``nn.Identity``), ReLU/ReLU6/Hardtanh after it become the
packed op's activation (a module activation used only there becomes
``nn.Identity``; a functional one stays and is a no-op on clamped output).
When tracing fails, layers are swapped without folding or fusion, and one
warning says so.
"""
import collections
import copy
import dataclasses
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from qpack._core import Error as qpack_error
from qpack._core import InvalidArgumentError, InvalidTypeError
from qpack._policy import backends as _backends
from qpack.torch import quantize as _q
from qpack.torch.modules import (FROZEN_TYPES, FrozenConv1d, FrozenConv2d, FrozenConvTranspose2d, FrozenLinear,
                                 FrozenMultiheadAttention, FrozenTransformerEncoder, FrozenTransformerEncoderLayer,
                                 SamePadConv2d, same_pads)


class FreezeWarning(UserWarning):
    """qpack.freeze could not do everything it would have liked (e.g. fx tracing failed)."""


@dataclasses.dataclass
class Rule:
    """How one source module type is frozen.

    ``convert(module, ctx, bn=None, activation=None)`` returns the frozen module,
    or None to keep the source module as it is. ``fold_bn``: the BatchNorm
    types that may be folded into it; ``fuse_activation``: whether a following
    ReLU/ReLU6/Hardtanh may become its activation (its output must be float).
    """

    convert: object
    fold_bn: tuple = ()
    fuse_activation: bool = False


@dataclasses.dataclass(frozen=True)
class Int8Range:
    """What freeze's reduce_range chose: uint8 activations onto [0, act] and int8
    weights onto [-weight, weight]."""
    act: int = 255
    weight: int = 127

    def quantize(self, w):
        """(int8 weight, per-channel scales) of a float Linear / Conv weight."""
        return _q.quantize_weight_per_channel(w, self.weight)


@dataclasses.dataclass
class FreezeContext:
    backend: str = "auto"
    retain: object = None
    dtype: object = None
    ranges: dict = dataclasses.field(default_factory=dict)
    bits: Int8Range = Int8Range()  # freeze's reduce_range
    # int8 Linears run on their own between PyTorch ops (a model that does not trace): dynamic.
    # A static one's output is quantized to u8 and at once dequantized for the PyTorch op after
    # it, and that rounding of every layer's output adds up: MiniLM-L6 (seq 128, its 37 Linears
    # simulated in PyTorch) 0.177 relative error with inputs quantized, 0.575 with outputs too;
    # frozen, static 0.583 against dynamic 0.172.
    alone: bool = False

    def static_qparams(self, module, activation):
        """uint8 qparams from calibration, or None when the layer was not seen."""
        r = self.ranges.get(id(getattr(module, "_mod", module)))  # (a view of a module: the module's)
        if r is None or r.get("in") is None or r.get("out") is None:
            return None
        lo, hi = _clamp_range(r["out"], activation)
        in_s, in_zp = _q.uint8_qparams(*r["in"], self.bits.act)
        out_s, out_zp = _q.uint8_qparams(lo, hi, self.bits.act)
        return dict(input_scale=in_s, input_zero_point=in_zp, output_scale=out_s, output_zero_point=out_zp)


def _clamp_range(r, activation):
    lo, hi = r
    if activation is None:
        return lo, hi
    if activation == "relu":
        a, b = 0.0, float("inf")
    elif activation == "relu6":
        a, b = 0.0, 6.0
    else:
        a, b = activation[1], activation[2]
    lo, hi = min(max(lo, a), b), min(max(hi, a), b)
    return lo, hi


# ---- BatchNorm folding (float math, no packing) ---------------------------------

def fold_bn(weight, bias, bn):
    """(weight, bias) of a conv/linear followed by an eval-mode BatchNorm, folded.

    w' = w * g / sqrt(var + eps) per output channel; b' = (b - mean) * g / sqrt(var + eps) + beta.
    Computed in float64, returned as float32.
    """
    var = bn.running_var.detach().to(torch.float64)
    mean = bn.running_mean.detach().to(torch.float64)
    gamma = bn.weight.detach().to(torch.float64) if bn.weight is not None else torch.ones_like(var)
    beta = bn.bias.detach().to(torch.float64) if bn.bias is not None else torch.zeros_like(var)
    factor = gamma / torch.sqrt(var + bn.eps)
    w = weight.detach().to(torch.float64) * factor.reshape((-1,) + (1,) * (weight.dim() - 1))
    b = bias.detach().to(torch.float64) if bias is not None else torch.zeros_like(mean)
    b = (b - mean) * factor + beta
    return w.to(torch.float32).contiguous(), b.to(torch.float32).contiguous()


def _bn_foldable(bn, channels):
    return (bn.track_running_stats and bn.running_mean is not None and bn.running_var is not None
            and bn.num_features == channels)


# ---- converters -------------------------------------------------------------------

def _float_params(mod):
    w = mod.weight
    if type(w) not in (torch.Tensor, nn.Parameter) or w.dtype != torch.float32 or w.device.type != "cpu":
        return None
    b = mod.bias
    if b is not None and (b.dtype != torch.float32 or b.device.type != "cpu"):
        return None
    return w.detach(), None if b is None else b.detach()


def _bias_f32(b):
    return None if b is None else b.detach().to(torch.float32).contiguous()


def convert_linear(mod, ctx, bn=None, activation=None):
    """nn.Linear: fp32, qpack int8 (dtype="int8"), or torchao Int8Tensor weights."""
    common = dict(activation=activation, backend=ctx.backend, retain=ctx.retain)
    if _q.is_torchao_int8(mod.weight):
        q, s = _q.torchao_int8_weight(mod.weight)
        return FrozenLinear.make("int8_dynamic", q, _bias_f32(mod.bias), weight_scale=s, source="torchao", **common)
    params = _float_params(mod)
    if params is None:
        return None
    w, b = params
    if bn is not None:
        w, b = fold_bn(w, b, bn)
    if ctx.dtype == "int8":
        q, s = ctx.bits.quantize(w)
        qp = ctx.static_qparams(mod, activation) if ctx.ranges and not ctx.alone else None
        if qp is not None:
            return FrozenLinear.make("int8_static", q, _bias_f32(b), weight_scale=s, source="qpack_int8",
                                     folded_bn=bn is not None, **common, **qp)
        return FrozenLinear.make("int8_dynamic", q, _bias_f32(b), weight_scale=s, source="qpack_int8",
                                 folded_bn=bn is not None, **common)
    return FrozenLinear.make("f32", w.contiguous(), None if b is None else b.contiguous(),
                             folded_bn=bn is not None, **common)


class _Projection:
    """nn.MultiheadAttention's packed-together query/key/value projection as what
    convert_linear reads (.weight, .bias)."""

    def __init__(self, weight, bias):
        self.weight, self.bias = weight, bias


def convert_multihead_attention(mod, ctx, bn=None, activation=None):
    """nn.MultiheadAttention: its two projections frozen as convert_linear freezes a Linear
    (fp32, or int8 dynamic: attention's inputs are not calibrated), attention itself in
    PyTorch (FrozenMultiheadAttention). Kept as it is with bias_k / bias_v, add_zero_attn,
    or key / value sizes of their own."""
    if (mod.bias_k is not None or mod.bias_v is not None or mod.add_zero_attn or not mod._qkv_same_embed_dim
            or mod.in_proj_weight is None):
        return None
    in_proj = convert_linear(_Projection(mod.in_proj_weight, mod.in_proj_bias), ctx)
    out_proj = convert_linear(mod.out_proj, ctx)
    if in_proj is None or out_proj is None:
        return None
    return FrozenMultiheadAttention(in_proj, out_proj, mod.num_heads, mod.batch_first)


def _written_out_as(m):
    """The type of _WRITTEN_OUT whose forward m runs (m's class, or a subclass that
    overrides none of the methods the frozen form writes out), else None."""
    for base in _WRITTEN_OUT:
        if isinstance(m, base):
            same = all(getattr(type(m), k) is getattr(base, k) for k in ("forward", "_sa_block", "_ff_block")
                       if hasattr(base, k))
            return base if same else None
    return None


def convert_conv_transpose2d(mod, ctx, bn=None, activation=None):
    """nn.ConvTranspose2d whose stride is its kernel (no padding, output padding, groups
    or dilation; zeros padding mode): a 1x1 convolution to kh kw Cout channels frozen as
    convert_conv freezes one (FrozenConvTranspose2d), fp32; int8 graphs make that
    convolution u8 with the rest. Others stay PyTorch's."""
    kh, kw = mod.kernel_size
    if (tuple(mod.stride) != (kh, kw) or any(mod.padding) or any(mod.output_padding) or mod.groups != 1
            or any(d != 1 for d in mod.dilation) or mod.padding_mode != "zeros" or ctx.dtype == "int8"):
        return None
    params = _float_params(mod)
    if params is None:
        return None
    w, b = params  # [Cin, Cout, kh, kw]
    cin, cout = w.shape[0], w.shape[1]
    one = nn.Conv2d(cin, kh * kw * cout, 1, bias=b is not None)
    with torch.no_grad():
        one.weight.copy_(w.permute(2, 3, 1, 0).reshape(kh * kw * cout, cin, 1, 1))
        if b is not None:
            one.bias.copy_(b.repeat(kh * kw))
    conv = _make_conv_converter(FrozenConv2d)(one, ctx)
    if conv is None:
        return None
    return FrozenConvTranspose2d(conv, cout, (kh, kw))


def convert_transformer_encoder_layer(mod, ctx, bn=None, activation=None):
    """nn.TransformerEncoderLayer: its attention and feed-forward Linears frozen as
    convert_multihead_attention / convert_linear freeze them, the layer's forward
    written out (FrozenTransformerEncoderLayer); kept as it is where its attention is."""
    if not isinstance(mod.self_attn, nn.MultiheadAttention) or not isinstance(mod.linear1, nn.Linear) \
            or not isinstance(mod.linear2, nn.Linear):
        return None
    attn = convert_multihead_attention(mod.self_attn, ctx)
    l1, l2 = convert_linear(mod.linear1, ctx), convert_linear(mod.linear2, ctx)
    if attn is None or l1 is None or l2 is None:
        return None
    return FrozenTransformerEncoderLayer(mod, attn, l1, l2)


def convert_transformer_encoder(mod, ctx, bn=None, activation=None):
    """nn.TransformerEncoder: each layer as convert_transformer_encoder_layer freezes it,
    under FrozenTransformerEncoder; kept as it is where a layer is."""
    layers = []
    for layer in mod.layers:
        new = convert_transformer_encoder_layer(layer, ctx) if _written_out_as(layer) else None
        if new is None:
            return None
        layers.append(new)
    return FrozenTransformerEncoder(mod, layers)


def _conv_padding(mod):
    if mod.padding_mode != "zeros":
        return None
    if isinstance(mod.padding, str):
        if mod.padding == "valid":
            return (0,) * len(mod.kernel_size)
        pads = []
        for k, d in zip(mod.kernel_size, mod.dilation):
            total = d * (k - 1)
            if total % 2:
                return None  # asymmetric 'same' padding: keep the layer
            pads.append(total // 2)
        return tuple(pads)
    return tuple(mod.padding)


def _make_conv_converter(frozen_cls):
    def convert_conv(mod, ctx, bn=None, activation=None):
        padding = _conv_padding(mod)
        params = _float_params(mod)
        if padding is None or params is None:
            return None
        w, b = params
        if bn is not None:
            w, b = fold_bn(w, b, bn)
        geo = dict(stride=mod.stride, padding=padding, dilation=mod.dilation, groups=mod.groups)
        common = dict(activation=activation, backend=ctx.backend, retain=ctx.retain, folded_bn=bn is not None)
        if ctx.dtype == "int8":
            qp = ctx.static_qparams(mod, activation) if ctx.ranges else None
            if qp is not None:
                q, s = ctx.bits.quantize(w)
                return frozen_cls.make("int8_static", q, _bias_f32(b), weight_scale=s, source="qpack_int8",
                                       **geo, **common, **qp)
            # no dynamic int8 convolution: uncalibrated convolutions stay fp32
        return frozen_cls.make("f32", w.contiguous(), None if b is None else b.contiguous(), **geo, **common)
    convert_conv.__name__ = f"convert_{frozen_cls._op}"
    return convert_conv


def _quantized_activation(own_relu, activation):
    """The clamp a torch.ao quantized layer fuses: its own ReLU (intrinsic ...ReLU
    modules) and a following ReLU/ReLU6/Hardtanh. PyTorch's quantized ReLU and
    hardtanh keep their input's qparams, so clamping before the layer's own
    requantization gives the same uint8 values. False: the pair cannot fuse."""
    if not own_relu or activation is None:
        return "relu" if own_relu else activation
    if activation in ("relu", "relu6"):
        return activation
    _, lo, hi = activation  # ("hardtanh", lo, hi) after a ReLU
    return ("hardtanh", max(lo, 0.0), hi) if hi > max(lo, 0.0) else False


def convert_quantized_linear(mod, ctx, bn=None, activation=None):
    """torch.ao.nn.quantized.Linear (and intrinsic LinearReLU): static int8, quint8 in and out."""
    import torch.ao.nn.intrinsic.quantized as nniq
    q, s = _q.legacy_int8_weight(mod.weight())
    act = _quantized_activation(isinstance(mod, nniq.LinearReLU), activation)
    if act is False:
        return None
    return FrozenLinear.make("int8_static", q, _bias_f32(mod.bias()), weight_scale=s, activation=act,
                             backend=ctx.backend, retain=ctx.retain, io="legacy", source="torch.ao",
                             output_scale=float(mod.scale), output_zero_point=int(mod.zero_point))


def convert_dynamic_linear(mod, ctx, bn=None, activation=None):
    """torch.ao.nn.quantized.dynamic.Linear (and LinearReLU): dynamic int8, float in and out."""
    import torch.ao.nn.intrinsic.quantized.dynamic as nniqd
    if mod._packed_params.dtype != torch.qint8:
        return None  # float16 dynamic: keep
    q, s = _q.legacy_int8_weight(mod.weight())
    if isinstance(mod, nniqd.LinearReLU):
        activation = "relu"
    return FrozenLinear.make("int8_dynamic", q, _bias_f32(mod.bias()), weight_scale=s, activation=activation,
                             backend=ctx.backend, retain=ctx.retain, source="torch.ao.dynamic")


def _make_quantized_conv_converter(frozen_cls, relu_cls):
    def convert_quantized_conv(mod, ctx, bn=None, activation=None):
        if mod.padding_mode != "zeros":
            return None
        act = _quantized_activation(isinstance(mod, relu_cls), activation)
        if act is False:
            return None
        q, s = _q.legacy_int8_weight(mod.weight())
        return frozen_cls.make("int8_static", q, _bias_f32(mod.bias()), weight_scale=s, activation=act,
                               stride=mod.stride, padding=mod.padding, dilation=mod.dilation, groups=mod.groups,
                               backend=ctx.backend, retain=ctx.retain, io="legacy", source="torch.ao",
                               output_scale=float(mod.scale), output_zero_point=int(mod.zero_point))
    return convert_quantized_conv


def _default_mapping():
    m = {
        nn.Linear: Rule(convert_linear, fold_bn=(nn.BatchNorm1d,), fuse_activation=True),
        nn.Conv1d: Rule(_make_conv_converter(FrozenConv1d), fold_bn=(nn.BatchNorm1d,), fuse_activation=True),
        nn.Conv2d: Rule(_make_conv_converter(FrozenConv2d), fold_bn=(nn.BatchNorm2d,), fuse_activation=True),
        nn.MultiheadAttention: Rule(convert_multihead_attention),
        nn.ConvTranspose2d: Rule(convert_conv_transpose2d),
        nn.TransformerEncoderLayer: Rule(convert_transformer_encoder_layer),
        nn.TransformerEncoder: Rule(convert_transformer_encoder),
    }
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch.ao.nn.intrinsic.quantized as nniq
            import torch.ao.nn.intrinsic.quantized.dynamic as nniqd
            import torch.ao.nn.quantized as nnq
            import torch.ao.nn.quantized.dynamic as nnqd
    except ImportError:  # a future torch without torch.ao quantized modules
        return m
    # quantized layers fuse a following ReLU/ReLU6/Hardtanh (which keep qparams in PyTorch)
    m[nnq.Linear] = Rule(convert_quantized_linear, fuse_activation=True)
    m[nniq.LinearReLU] = Rule(convert_quantized_linear, fuse_activation=True)
    m[nnqd.Linear] = Rule(convert_dynamic_linear, fuse_activation=True)
    m[nniqd.LinearReLU] = Rule(convert_dynamic_linear)
    m[nnq.Conv1d] = Rule(_make_quantized_conv_converter(FrozenConv1d, nniq.ConvReLU1d), fuse_activation=True)
    m[nniq.ConvReLU1d] = Rule(_make_quantized_conv_converter(FrozenConv1d, nniq.ConvReLU1d),
                              fuse_activation=True)
    m[nnq.Conv2d] = Rule(_make_quantized_conv_converter(FrozenConv2d, nniq.ConvReLU2d), fuse_activation=True)
    m[nniq.ConvReLU2d] = Rule(_make_quantized_conv_converter(FrozenConv2d, nniq.ConvReLU2d),
                              fuse_activation=True)
    return m


#: source module type (exact type) -> Rule. Extend with register(). Subclasses of nn.Linear /
#: nn.Conv1d / nn.Conv2d that compute exactly what their base class does take its rule (_subclass_rules).
MAPPING = _default_mapping()


def register(source_type, convert, *, fold_bn=(), fuse_activation=False):
    """Add (or replace) the rule that freezes modules of exactly ``source_type``."""
    if not (isinstance(source_type, type) and issubclass(source_type, nn.Module)):
        raise InvalidTypeError(f"source_type must be an nn.Module subclass, got {source_type!r}")
    MAPPING[source_type] = Rule(convert, tuple(fold_bn), bool(fuse_activation))


# ---- graph analysis (fx) ------------------------------------------------------------

_RELU_FUNCS = {F.relu, torch.relu, torch.relu_, F.relu_}
_HARDTANH_FUNCS = {F.hardtanh, F.hardtanh_}


def _activation_of(node, cur, modules):
    """(activation spec, module to drop or None) if ``node`` applies ReLU/ReLU6/Hardtanh to ``cur``."""
    if not node.args or node.args[0] is not cur:
        return None
    if node.op == "call_module":
        m = modules.get(node.target)
        if type(m) is nn.ReLU:
            return "relu", m
        if type(m) is nn.ReLU6:
            return "relu6", m
        if type(m) is nn.Hardtanh:
            return ("hardtanh", float(m.min_val), float(m.max_val)), m
        return None
    if node.op == "call_function":
        if node.target in _RELU_FUNCS:
            return "relu", None
        if node.target is F.relu6:
            return "relu6", None
        if node.target in _HARDTANH_FUNCS:
            lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min_val", -1.0)
            hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max_val", 1.0)
            if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo < hi:
                return ("hardtanh", float(lo), float(hi)), None
        return None
    if node.op == "call_method" and node.target in ("relu", "relu_") and len(node.args) == 1:
        return "relu", None
    return None


def _inside_torch_leaves(model, rules):
    """ids of the layers inside a torch.nn module that fx calls as one leaf and that
    has no rule: its own code uses them, and may read their tensors itself
    (PyTorch's attention layers hand their weights to fused functions), so they stay
    as they are, whether the model traces or not."""
    leaf = torch.fx.Tracer().is_leaf_module
    return {id(c) for m in model.modules()
            if type(m) not in rules and not isinstance(m, _BatchNorm) and type(m).forward is not nn.Module.forward
            and (leaf(m, "") or _own_transformer_forward(m)) for c in m.modules() if c is not m and type(c) in rules}


def _own_transformer_forward(m):
    """A subclass of a Transformer layer with a forward of its own: it may read its
    attention's weights as PyTorch's fast path does, so it stays whole."""
    return isinstance(m, _WRITTEN_OUT) and _written_out_as(m) is None


def _analyze(model, rules, shapes=None):
    """{id(layer): (bn, activation)}, the modules that become Identity, and the layers
    whose tensors the forward reads itself (left unfrozen), from an fx trace (one
    specialized to inputs of ``shapes`` when the forward does not trace symbolically
    and they are given: graph.Specialized)."""
    from qpack.torch.graph import CpuTracer, Specialized, example_tensors, trace_clean

    class Tracer(CpuTracer):
        # every type with a rule is a leaf, so user-registered layers show up as calls
        def is_leaf_module(self, m, qualname):
            return type(m) in rules or isinstance(m, _BatchNorm) or super().is_leaf_module(m, qualname)

    class ShapeTracer(Specialized, Tracer):
        pass

    try:
        graph = trace_clean(Tracer(), model)
    except Exception:
        if not shapes:
            raise
        graph = trace_clean(ShapeTracer(example_tensors(shapes)), model)
    modules = dict(model.named_modules(remove_duplicate=False))
    calls = collections.Counter()
    keep = set()
    for n in graph.nodes:
        if n.op == "call_module":
            calls[id(modules[n.target])] += 1
        elif n.op == "get_attr":
            # a module read as an attribute may be used in ways the graph does not show
            obj = modules.get(n.target)
            if obj is not None:
                calls[id(obj)] += 2
            # a convolution's own weight read by the forward: the layer stays as it is (a
            # frozen Linear's .weight is a PackedWeight, which F.linear runs packed:
            # torchvision's Swin hands qkv.weight to its attention function)
            owner = modules.get(n.target.rpartition(".")[0])
            if (owner is not None and owner is not model and type(owner) in rules and obj is None
                    and not isinstance(owner, nn.Linear)):
                keep.add(id(owner))
    plan, drop = {}, {}
    for n in graph.nodes:
        if n.op != "call_module":
            continue
        mod = modules[n.target]
        rule = rules.get(type(mod))
        if rule is None or calls[id(mod)] != 1:
            continue
        cur, bn, act = n, None, None
        dropped = []
        users = list(cur.users)
        if rule.fold_bn and len(users) == 1 and users[0].op == "call_module" and len(users[0].args) == 1:
            cand = modules[users[0].target]
            channels = getattr(mod, "out_channels", getattr(mod, "out_features", None))
            if (isinstance(cand, rule.fold_bn) and calls[id(cand)] == 1 and users[0].args[0] is cur
                    and _bn_foldable(cand, channels) and _folded_away(cand, rule.fold_bn) is not None):
                bn, cur = cand, users[0]
                dropped.append(cand)
        users = list(cur.users)
        # (after a BatchNorm subclass the activation would run before the rest of its forward)
        if rule.fuse_activation and len(users) == 1 and (bn is None or type(bn) in rule.fold_bn):
            found = _activation_of(users[0], cur, modules)
            if found is not None:
                act, act_mod = found
                if act_mod is not None and calls[id(act_mod)] == 1:
                    dropped.append(act_mod)
        if bn is not None or act is not None:
            plan[id(mod)] = (bn, act)
            for d in dropped:
                drop.setdefault(id(mod), []).append(d)
    return plan, drop, keep


def _analyze_parts(model, rules):
    """_analyze over the largest submodules that trace, when ``model`` does not; a
    layer seen in more than one of them is left alone (the parent's own code may
    pass it between them)."""
    plan, drop, keep, seen = {}, {}, set(), collections.Counter()

    def walk(mod):
        for child in mod.children():
            if type(child) in rules or not any(type(m) in rules for m in child.modules()):
                continue
            try:
                p, d, k = _analyze(child, rules)
            except Exception:  # noqa: BLE001 - untraceable: its children may trace
                walk(child)
                continue
            for key in p:
                seen[key] += 1
            plan.update(p)
            drop.update(d)
            keep.update(k)

    walk(model)
    for key in [k for k, n in seen.items() if n > 1]:
        plan.pop(key, None)
        drop.pop(key, None)
    return plan, drop, keep


# ---- calibration (static int8) ---------------------------------------------------------

def _calibrate(model, example_inputs, layers, plan):
    ranges = {}

    def update(key, field, t):
        if not torch.is_tensor(t) or not t.is_floating_point() or t.numel() == 0:
            return
        lo, hi = float(t.min()), float(t.max())
        r = ranges.setdefault(key, {"in": None, "out": None})
        old = r[field]
        r[field] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))

    handles = []
    for layer in layers:
        key = id(layer)
        bn = plan.get(key, (None, None))[0]

        def layer_hook(mod, args, out, key=key, has_bn=bn is not None):
            if args:
                update(key, "in", args[0])
            if not has_bn:
                update(key, "out", out)
        handles.append(layer.register_forward_hook(layer_hook))
        if bn is not None and type(bn) in (nn.BatchNorm1d, nn.BatchNorm2d):
            handles.append(bn.register_forward_hook(lambda mod, args, out, key=key: update(key, "out", out)))
        elif bn is not None:  # a subclass's output is past its own activation: the normalized values
            handles.append(layer.register_forward_hook(lambda mod, args, out, key=key, bn=bn: update(
                key, "out", F.batch_norm(out, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps))))
    batches = example_inputs if isinstance(example_inputs, list) else [example_inputs]
    try:
        with torch.no_grad():
            for batch in batches:
                if isinstance(batch, dict):
                    model(**batch)
                elif isinstance(batch, tuple):
                    model(*batch)
                else:
                    model(batch)
    finally:
        for h in handles:
            h.remove()
    return ranges


# ---- swapping --------------------------------------------------------------------------

def _swap(root, replacements):
    """Replace every occurrence (by identity) of the keys' modules below root."""
    for mod in list(root.modules()):
        for name, child in list(mod._modules.items()):
            if child is not None and id(child) in replacements:
                mod._modules[name] = replacements[id(child)]


def _drop_tensors(mod):
    """Drop a consumed source module's tensors (inplace freeze)."""
    for m in mod.modules():
        for k in list(m._parameters):
            m._parameters[k] = None
        for k in list(m._buffers):
            m._buffers[k] = None
        m.__dict__.pop("_packed_params", None)


def _identity():
    return nn.Identity().train(False)


_BatchNorm = nn.modules.batchnorm._BatchNorm


def _folded_away(bn, types):
    """What a BatchNorm folded into the layer before it becomes: nn.Identity for the
    ``types`` themselves; for a subclass that does more after normalizing (timm's
    BatchNormAct2d: then an activation), a copy whose statistics and affine are the
    identity (mean 0, var 1, eps 0, weight 1, bias 0), so only the rest of its forward
    runs. None when the subclass does not compute the BatchNorm then that rest
    (checked on a random input, exactly)."""
    if type(bn) in types:
        return _identity()
    rest = copy.deepcopy(bn).train(False)
    with torch.no_grad():
        rest.running_mean.zero_()
        rest.running_var.fill_(1.0)
        if rest.weight is not None:
            rest.weight.fill_(1.0)
        if rest.bias is not None:
            rest.bias.zero_()
    rest.eps = 0.0
    g = torch.Generator().manual_seed(0)
    try:
        x = torch.randn(2, bn.num_features, *((3, 3) if isinstance(bn, nn.BatchNorm2d) else ()), generator=g)
        with torch.no_grad():
            normed = F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)
            same = torch.equal(bn(x), rest(normed))
    except Exception:  # noqa: BLE001 - a forward that does not take a plain tensor: leave it
        return None
    return rest if same else None


_TRAIN_DEPENDENT = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)


def _check_eval(model):
    # The root's flag, and every module whose output depends on it. (torch.ao's convert
    # leaves its new quantized modules in training mode; they behave the same either way.)
    training = [name or "<root>" for name, m in model.named_modules()
                if m.training and (m is model or isinstance(m, _TRAIN_DEPENDENT))]
    if training:
        shown = ", ".join(training[:5]) + (" ..." if len(training) > 5 else "")
        raise InvalidArgumentError(
            f"qpack.freeze takes a model in eval mode, but {len(training)} module(s) are in training mode "
            f"({shown}); call model.eval() first (freezing snapshots inference weights, and BatchNorm/Dropout "
            "behave differently in training)")


def freeze(model, *, backend="auto", retain=None, inplace=False, example_inputs=None, dtype=None,
           fuse=True, mapping=None, graph=True, progress=None, reduce_range="auto"):
    """A copy of ``model`` whose Linear/Conv1d/Conv2d layers run on qpack's packed weights
    (and nn.MultiheadAttention on packed projections: FrozenMultiheadAttention).

    - ``dtype=None`` keeps each layer's precision: float layers become fp32
      (oneDNN); torchao Int8Tensor weights and torch.ao quantized modules
      become int8 layers on ``backend``. ``dtype="int8"`` quantizes float
      Linear layers (per-channel symmetric int8 weights): dynamic, or static
      when ``example_inputs`` (a tensor, a tuple of positional inputs, a
      dict of keyword inputs, or a list of those) are given for calibration;
      convolutions are quantized only when calibrated (there is no dynamic
      int8 convolution) and stay fp32 otherwise.
    - ``backend``: "auto", "onednn" or "qnnpack", for the int8 layers
      (fp32 layers always run on oneDNN). "auto" is the build's preference:
      oneDNN on x86-64 (QNNPACK for a torch.ao layer whose weights have zero
      points), QNNPACK elsewhere (``qpack.backends()`` lists them in order).
    - ``retain``: keep (True) or release (False) the original weights beside
      the packed ones; None: ``qpack.retain(...)`` then the process default.
      Saving and ``unfreeze`` work either way.
    - Snapshot: the result does not share weights with ``model``; later
      changes to ``model`` do not affect it. With ``inplace=True`` the layers
      of ``model`` itself are replaced and each source layer's tensors are
      dropped as soon as it is packed, so peak memory stays near the packed
      total plus one layer's original.
    - ``fuse``: fold BatchNorm and fuse activations where a torch.fx trace
      shows the pattern (a warning says when tracing fails).
    - ``mapping``: {source type: Rule} entries that override ``MAPPING``.
    - ``graph``: when the traced model holds only ops qpack's core runs
      (frozen conv/linear, add, mul, pooling, mean, flatten, concat, ReLU/
      ReLU6/Hardtanh/Hardswish/Hardsigmoid/Sigmoid/GELU/SiLU/LeakyReLU, PReLU,
      nearest / bilinear interpolate and Upsample, unfolded BatchNorm2d,
      Identity/Dropout), its forward becomes one graph run by the
      core (other ops split it into graphs with PyTorch between): activations
      stay NHWC between ops and, for ``dtype="int8"`` with
      ``example_inputs``, uint8 with parameters calibrated per edge
      (``frozen.forward.report()`` lists the plan). Otherwise, or with
      ``graph=False``, the layers run one by one; a model whose own forward
      does not trace gets graphs for its submodules that do.
    - ``example_inputs`` (a tensor or a tuple of tensors; for ``dtype="int8"``
      the calibration batches, all of one shape) also let a forward whose
      Python reads its inputs' sizes (``if H % p:``, ``math.ceil(H / p)``, size
      tuples passed between blocks: MobileViT, TinyViT, Twins), which
      ``torch.fx`` cannot trace symbolically, be traced on inputs of those
      shapes: the graph is then for that shape, and calls with another run
      the layers one by one (a FreezeWarning says so, once). Control flow on
      the inputs' values is never traced that way.
      ``qpack.graph_report(frozen)`` prints the plan.
    - ``progress``: a tqdm bar over calibration batches and int8 packing
      (None: when stderr is a terminal and tqdm is installed).
    - ``reduce_range``: one bit of int8 resolution traded for speed where
      oneDNN's int8 kernels would saturate int16 pair sums (a CPU without VNNI:
      ``qpack.backends()["onednn"]["int8_input_max"] == 127``). There qpack runs
      an input above 127 on weights outside [-64, 64] split, exact at twice the
      work; anything narrower runs the fused kernels, as exact.
      ``"weights"``: int8 weights onto [-64, 64] (7 bits, as ONNX Runtime's
      reduce_range), activations 8-bit: every layer fused, whatever the
      input, and depthwise convolutions on qpack's AVX2 kernel.
      ``True`` (or ``"activations"``): static int8 activations calibrated onto
      [0, 127] instead of [0, 255] (PyTorch's reduce_range), clamped there
      through the graph. ``False``: 8 bits for both. ``"auto"`` (default):
      ``"weights"`` where the int8 layers run on such a CPU's oneDNN, else
      ``False``. Elsewhere the choice changes only the resolution.

    The model must be in eval mode. Modules without a rule are kept as they are.
    """
    if not isinstance(model, nn.Module):
        raise InvalidTypeError(f"qpack.freeze takes an nn.Module, got {type(model).__name__}")
    if backend not in ("auto", "onednn", "qnnpack"):
        raise InvalidArgumentError(f"backend must be 'auto', 'onednn' or 'qnnpack', got {backend!r}")
    if retain is not None and not isinstance(retain, bool):
        raise InvalidTypeError(f"retain must be True, False or None, got {retain!r}")
    if dtype not in (None, "int8", "float32", torch.float32, torch.int8):
        raise InvalidArgumentError(f"dtype must be None, 'float32' or 'int8', got {dtype!r}")
    dtype = "int8" if dtype in ("int8", torch.int8) else None
    shapes = None
    if example_inputs is not None and dtype != "int8":
        # fp32: an example input to trace a forward that reads its inputs' sizes
        from qpack.torch import graph as _g
        first = example_inputs[0] if isinstance(example_inputs, list) and example_inputs else example_inputs
        shapes = _g.example_shapes(first)
        if shapes is None:
            raise InvalidArgumentError(
                "example_inputs of a float freeze are a tensor or a tuple of tensors (the inputs a forward "
                "that reads their sizes is traced on); keyword inputs calibrate int8 freezes only")
        example_inputs = None
    bits = _int8_range(reduce_range, backend)
    _check_eval(model)
    # a model that is one layer is that frozen layer (a Transformer encoder, whose forward the
    # frozen one writes out, runs on graphs as any model)
    if not graph or (type(model) in MAPPING and type(model) not in _WRITTEN_OUT) or type(model) in (mapping or {}):
        return _freeze_layers(model, backend=backend, retain=retain, inplace=inplace,
                              example_inputs=example_inputs, dtype=dtype, fuse=fuse, mapping=mapping, bits=bits)
    if dtype == "int8" and example_inputs is not None and not inplace:
        frozen = _freeze_int8_graph(model, backend, retain, example_inputs, fuse, mapping, progress, bits)
        if frozen is not None:
            return frozen
    frozen = _freeze_layers(model, backend=backend, retain=retain, inplace=inplace,
                            example_inputs=example_inputs, dtype=dtype, fuse=fuse, mapping=mapping, bits=bits,
                            shapes=shapes)
    _try_graph(frozen, shapes)
    return frozen


_REDUCE_RANGE = {False: Int8Range(), True: Int8Range(act=127), "activations": Int8Range(act=127),
                 "weights": Int8Range(weight=64)}


def _int8_range(reduce_range, backend):
    """freeze's ``reduce_range`` as an Int8Range ("auto" resolved for ``backend`` on this CPU)."""
    if not isinstance(reduce_range, (bool, str)):
        raise InvalidTypeError(f"reduce_range must be a bool or a str, got {type(reduce_range).__name__}")
    if reduce_range == "auto":
        infos = _backends()
        name = backend if backend != "auto" else next((n for n, b in infos.items() if b["available"]), None)
        narrow = name is not None and infos[name]["int8_input_max"] == 127
        return _REDUCE_RANGE["weights" if narrow else False]
    if reduce_range not in _REDUCE_RANGE:
        raise InvalidArgumentError(
            f"reduce_range must be 'auto', 'weights', 'activations', True or False, got {reduce_range!r}")
    return _REDUCE_RANGE[reduce_range]


def _try_graph(frozen, shapes=None):
    """Runs ``frozen`` on core graphs where its trace lowers (a forward that does not
    trace symbolically traced on inputs of ``shapes``, when given); returns the runner
    or None."""
    from qpack.torch import graph as _g
    if isinstance(frozen, FROZEN_TYPES):
        return None
    try:
        return _g.attach(frozen, shapes=shapes)
    except _g.Unsupported as e:
        if "GraphModule" in str(e):  # traced, but fx would not hold it: say why it runs layer by layer
            warnings.warn(f"qpack.freeze: the model runs layer by layer, not as a core graph: {e}",
                          FreezeWarning, stacklevel=3)
        elif str(e).startswith("trace"):  # untraceable forward: graphs for the submodules that trace
            try:
                _g.attach_parts(frozen)
            except Exception:  # noqa: BLE001 - submodules that break when traced (timm's LeViT caches
                _g.detach(frozen)  # a tensor in the module in its forward): layer by layer, all of it
        return None
    except qpack_error:
        return None


def _freeze_int8_graph(model, backend, retain, example_inputs, fuse, mapping, show_progress, bits):
    """Static int8 graphs calibrated per edge, or None when no part of the model lowers."""
    from qpack.torch import graph as _g
    batches = example_inputs if isinstance(example_inputs, list) else [example_inputs]
    if any(isinstance(b, dict) for b in batches):
        return None
    # a forward that reads its inputs' sizes is traced on the calibration batches'
    # shapes, when they all have the first's
    shapes = _g.example_shapes(batches[0])
    if shapes is not None and any(_g.example_shapes(b) != shapes for b in batches[1:]):
        shapes = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FreezeWarning)  # a failed trace is reported by the fallback
        fp32 = _freeze_layers(model, backend=backend, retain=True, inplace=False, example_inputs=None,
                              dtype=None, fuse=fuse, mapping=mapping, pack_tied=True, shapes=shapes)
    if isinstance(fp32, FROZEN_TYPES):
        return None
    try:
        gm = _g.trace(fp32, shapes)
    except Exception:  # noqa: BLE001 - untraceable: int8 graphs for the submodules that trace
        try:
            frozen = _freeze_int8_parts(fp32, backend, retain, batches, show_progress, bits)
        except Exception:  # noqa: BLE001 - submodules that break when traced (timm's LeViT caches a
            frozen = None  # tensor in the module in its forward): the layer-by-layer int8 freeze
        for w in caught if frozen is not None else ():
            warnings.warn(w.message, w.category, stacklevel=4)
        return frozen
    try:
        segs = _g.segments(gm)
        if not segs:
            return None
        ranges = _g.shared_layer_ranges(segs, _calibrate_edges(gm, batches, show_progress, bits.act))
        qp = _g.qparams_by_name(segs, ranges, bits.act)
    except _g.Unsupported:
        return None
    if any(layer.mode != "f32" for seg in segs for layer in seg.layers):
        return None
    _swap(fp32, _int8_graph_layers(segs, qp, backend, retain, show_progress, bits))
    _swap(fp32, _int8_leftovers(fp32, backend, retain, bits))
    try:
        _g.attach(fp32, qp, shapes)
    except (_g.Unsupported, qpack_error):
        return None
    return fp32


def _calibrate_edges(gm, batches, show_progress, qmax):
    """Per-edge (min, max) over the calibration batches; onto 7 bits (reduce_range) the
    ranges are then clipped where that lowers the expected quantization error (a second
    pass: graph.refine_ranges). Measured on MobileNetV2 / ResNet-18 at 7 bits, relative
    error against fp32 0.381 -> 0.269 and 0.076 -> 0.063; at 8 bits it moved them
    0.254 -> 0.231 and 0.0446 -> 0.0455, so 8 bits keep min / max."""
    from qpack.torch import graph as _g
    ranges = _g.calibrate(gm, batches, show_progress)
    return _g.refine_ranges(gm, batches, ranges, qmax) if qmax < 255 else ranges


def _int8_graph_layers(segs, qp, backend, retain, show_progress, bits):
    """{id(fp32 layer): its static int8 twin} for the layers of lowered segments,
    on the per-edge qparams ``qp`` (by fx node name) of their input and output; with
    ``qp.qmax`` < 255 (reduce_range) each clamps its output onto [0, qmax]."""
    from qpack.torch import graph as _g
    replacements = {}
    qmax = getattr(qp, "qmax", 255)
    todo = [(seg, n) for seg in segs for n in seg.nodes if "layer" in n]
    for seg, n in _g.progress(todo, len(todo), "qpack pack int8", show_progress):
        layer = n["layer"]
        if id(layer) not in replacements:
            out_qp = qp[seg.values[n["output"]].name]
            activation = layer.activation
            if qmax < 255:
                activation = _within(activation, *_g.narrow_bounds(*out_qp, qmax))
            replacements[id(layer)] = _static_int8(layer, qp[seg.values[n["inputs"][0]].name], out_qp, backend,
                                                   retain, activation, bits)
    return replacements


def _int8_leftovers(fp32, backend, retain, bits):
    """{id: int8} for the frozen linears of an int8 graph freeze that no graph holds (they
    run in PyTorch between graphs: nn.MultiheadAttention's projections, Swin's whose weight
    its attention function takes): re-packed int8 dynamic, per-channel weights from the fp32
    packed ones, as a layer-by-layer int8 freeze makes them."""
    ctx = FreezeContext(backend=backend, retain=retain, dtype="int8", bits=bits)
    return {id(m): convert_linear(_Projection(*m.unpack()), ctx, activation=m._spec.get("activation")).train(False)
            for m in fp32.modules() if isinstance(m, FrozenLinear) and m.mode == "f32"}


def _within(activation, lo, hi):
    """The layer activation that also clamps to [lo, hi], as a hardtanh."""
    a, b = _clamp_range((lo, hi), activation)
    return ("hardtanh", float(a), float(b))


def _static_int8(layer, in_qp, out_qp, backend, retain, activation, bits):
    """A frozen fp32 layer's static int8 twin (per-channel weights onto ``bits.weight``;
    uint8 (scale, zero point) in and out)."""
    w, b = layer.unpack()
    q, s = bits.quantize(w)
    common = dict(weight_scale=s, activation=activation, backend=backend, retain=retain,
                  source="qpack_int8", folded_bn=layer._spec.get("folded_bn", False),
                  input_scale=in_qp[0], input_zero_point=in_qp[1], output_scale=out_qp[0], output_zero_point=out_qp[1])
    if isinstance(layer, (FrozenConv1d, FrozenConv2d)):
        sp = layer._spec
        new = type(layer).make("int8_static", q, b, stride=sp["stride"], padding=sp["padding"],
                               dilation=sp["dilation"], groups=sp["groups"], **common)
    else:
        new = FrozenLinear.make("int8_static", q, b, **common)
    return new.train(False)


def _freeze_int8_parts(fp32, backend, retain, batches, show_progress, bits):
    """A model whose own forward does not trace: static int8 graphs, calibrated per
    edge, for the largest submodules that lower as whole graphs (attach_parts);
    its other convolutions static int8 on their own calibrated input/output ranges
    (fp32 where calibration never reached them), its other linears dynamic int8
    (FreezeContext.alone). None when no submodule lowers."""
    from qpack.torch import graph as _g
    parts = {name: fp32.get_submodule(name) for name in _g.attach_parts(fp32)}
    _g.detach(fp32)
    lowered = {}
    for name, part in parts.items():
        try:
            gm = _g.trace(part)
            segs = _g.segments(gm)
        except (_g.Unsupported, Exception):  # noqa: BLE001 - traced once already; skip it if not again
            continue
        # (one graph, or segments with PyTorch between: a transformer block around its attention)
        if segs and not any(layer.mode != "f32" for seg in segs for layer in seg.layers):
            lowered[name] = (part, gm, segs)
    if not lowered:
        return None
    layers = [m for m in fp32.modules() if isinstance(m, FROZEN_TYPES) and m.mode == "f32"]
    inputs = {name: [] for name in lowered}
    ranges = {}

    def update(key, field, t):
        if torch.is_tensor(t) and t.is_floating_point() and t.numel():
            r = ranges.setdefault(key, {})
            lo, hi = float(t.min()), float(t.max())
            old = r.get(field)
            r[field] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))

    def record(mod, args, kwargs, name):
        inputs[name].append(None if kwargs else args)  # (called with keywords: its graph would not run)

    handles = [part.register_forward_pre_hook(lambda mod, args, kwargs, name=name: record(mod, args, kwargs, name),
                                              with_kwargs=True)
               for name, (part, _, _) in lowered.items()]
    for layer in layers:
        def hook(mod, args, out, key=id(layer)):
            if args:
                update(key, "in", args[0])
            update(key, "out", out)
        handles.append(layer.register_forward_hook(hook))
    try:
        with torch.no_grad():
            for batch in _g.progress(batches, len(batches), "qpack calibrate", show_progress):
                fp32(*(batch if isinstance(batch, tuple) else (batch,)))
    finally:
        for h in handles:
            h.remove()
    replacements, qparams = {}, {}
    for name, (part, gm, segs) in lowered.items():
        if not inputs[name] or None in inputs[name]:
            continue  # never called, or with keywords: its layers one by one
        try:
            edges = _g.shared_layer_ranges(segs, _calibrate_edges(gm, inputs[name], False, bits.act))
            qp = _g.qparams_by_name(segs, edges, bits.act)
        except Exception:  # noqa: BLE001 - its trace cannot run what its forward was given
            continue
        replacements.update(_int8_graph_layers(segs, qp, backend, retain, show_progress, bits))
        qparams[name] = qp
    for layer in layers:
        if id(layer) in replacements:
            continue
        r = ranges.get(id(layer), {})
        if isinstance(layer, FrozenLinear):  # a Linear alone between PyTorch ops: dynamic (FreezeContext.alone)
            w, b = layer.unpack()
            q, s = bits.quantize(w)
            replacements[id(layer)] = FrozenLinear.make(
                "int8_dynamic", q, b, weight_scale=s, activation=layer.activation, backend=backend, retain=retain,
                source="qpack_int8", folded_bn=layer._spec.get("folded_bn", False)).train(False)
        elif "in" in r and "out" in r:
            replacements[id(layer)] = _static_int8(layer, _q.uint8_qparams(*r["in"], bits.act),
                                                   _q.uint8_qparams(*r["out"], bits.act), backend, retain,
                                                   layer.activation, bits)
        elif retain is False:
            layer.release_original()  # an fp32 convolution calibration never reached
    _swap(fp32, replacements)
    for name, qp in qparams.items():
        try:
            _g.attach(fp32.get_submodule(name), qp)
        except (_g.Unsupported, qpack_error):
            pass  # runs layer by layer
    return fp32


class _WithWeight:
    """A layer with another weight and bias than its parameters, as the converters read it:
    what a convolution's forward made (weight standardization), or a Linear's weight held
    transposed (transformers' Conv1D); every other attribute, and calibration ranges
    (FreezeContext.static_qparams), are the module's."""

    def __init__(self, mod, weight, bias):
        self._mod, self.weight, self.bias = mod, weight, bias

    def __getattr__(self, name):
        return getattr(self._mod, name)


def _transposes_linear(m):
    """Whether m, a module of its own parameters ``weight`` [in, out] and ``bias`` [out] (or None)
    and nothing else, computes ``F.linear(x, weight.t(), bias)`` on a random input."""
    w, b = m._parameters.get("weight"), m._parameters.get("bias", None)
    if (set(m._parameters) - {"bias"} != {"weight"} or m._buffers or next(m.children(), None) is not None
            or type(w) not in (torch.Tensor, nn.Parameter) or w.dim() != 2 or w.dtype != torch.float32
            or (b is not None and (b.dim() != 1 or b.shape[0] != w.shape[1]))):
        return False
    try:
        x = torch.randn(3, w.shape[0], generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            y, ref = m(x), F.linear(x, w.t(), b)
        return isinstance(y, torch.Tensor) and y.shape == ref.shape and \
            bool(torch.allclose(y, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max().clamp_min(1))))
    except Exception:  # noqa: BLE001 - whatever it does, it is not that
        return False


def _transposed_linear_rules(model, rules):
    """Rules for the module types of ``model`` that are not nn.Linear but compute a Linear whose
    weight they hold transposed (_transposes_linear, every instance): frozen as that Linear."""
    verdict = {}
    for m in model.modules():
        t = type(m)
        if t in rules or verdict.get(t) is False or isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            continue
        verdict[t] = _transposes_linear(m)
    base = rules[nn.Linear]

    def convert(mod, ctx, bn=None, activation=None):
        return base.convert(_WithWeight(mod, mod.weight.t(), mod.bias), ctx, bn, activation)
    return {t: Rule(convert, (), base.fuse_activation) for t, ok in verdict.items() if ok}


def _subclass_rules(model, rules):
    """Rules for the subclasses of nn.Linear / nn.Conv1d / nn.Conv2d in ``model`` (timm's
    Linear, which calls F.linear itself) whose every instance computes exactly what its
    base class computes, checked on a random input; a subclass that computes something
    else (timm's Conv2dSame pads first) keeps its own forward and its weights."""
    bases = [b for b in (nn.Linear, nn.Conv1d, nn.Conv2d) if b in rules]
    verdict = {}
    for m in model.modules():
        t = type(m)
        base = next((b for b in bases if isinstance(m, b)), None)
        if t in rules or base is None or verdict.get(t) is False:
            continue
        verdict[t] = (_computes_as(m, base) or (base is not nn.Linear and _effective_conv(m) is not None and "weight")
                      or (base is nn.Conv2d and _same_padded(m) and "same"))
    out = {}
    for m in model.modules():  # subclasses of the Transformer layers that compute as them
        base = _written_out_as(m)
        if base is not None and type(m) not in rules and base in rules:
            out[type(m)] = rules[base]
    for t, same in verdict.items():
        rule = rules[next(b for b in bases if issubclass(t, b))]
        if same == "weight":  # its weight made in forward (weight standardization): packed as made
            rule = Rule(_effective_weight_converter(rule.convert), rule.fold_bn, rule.fuse_activation)
        elif same == "same":  # TensorFlow's "SAME" padding from the input's size, then itself unpadded
            rule = Rule(_same_pad_converter(rule.convert), rule.fold_bn, rule.fuse_activation)
        if same:
            out[t] = rule
    return out


def _same_pad_converter(convert):
    def convert_same_padded(mod, ctx, bn=None, activation=None):
        conv = convert(mod, ctx, bn, activation)
        return None if conv is None else SamePadConv2d(conv)
    return convert_same_padded


def _same_padded(m):
    """True when Conv2d subclass m (no padding of its own) computes F.conv2d of its input padded
    as TensorFlow's "SAME" does (timm's Conv2dSame): checked on random inputs of an even and
    an odd size."""
    if tuple(m.padding) != (0, 0) or m.padding_mode != "zeros":
        return False
    g = torch.Generator().manual_seed(2)
    try:
        for extra in (0, 1):
            x = _probe_input(m, g)
            x = torch.randn(*x.shape[:2], x.shape[2] + extra, x.shape[3] + 2 * extra + 1, generator=g)
            (top, bottom), (left, right) = (same_pads(x.shape[2 + i], m.kernel_size[i], m.stride[i], m.dilation[i])
                                            for i in (0, 1))
            with torch.no_grad():
                want = F.conv2d(F.pad(x, (left, right, top, bottom)), m.weight, m.bias, m.stride, 0, m.dilation,
                                m.groups)
                if not torch.equal(m(x), want):
                    return False
    except Exception:  # noqa: BLE001 - a forward that does something else
        return False
    return True


def _effective_weight_converter(convert):
    def convert_made_weight(mod, ctx, bn=None, activation=None):
        made = _effective_conv(mod)
        return None if made is None else convert(_WithWeight(mod, *made), ctx, bn, activation)
    return convert_made_weight


def _effective_conv(m):
    """(weight, bias) a Conv1d / Conv2d subclass hands F.conv1d / F.conv2d when its forward
    is that one call on its input with its own geometry and a weight made from its
    parameters alone (timm's StdConv2d / ScaledStdConv2d: weight standardization, BiT's
    and NF-ResNet's), the same on two random inputs; else None."""
    fn = F.conv1d if isinstance(m, nn.Conv1d) else F.conv2d
    name = fn.__name__
    g = torch.Generator().manual_seed(1)
    made = []
    for _ in range(2):
        x = _probe_input(m, g)
        calls = []

        def capture(inp, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
            y = fn(inp, weight, bias, stride, padding, dilation, groups)
            calls.append((inp, weight, bias, stride, padding, dilation, groups, y))
            return y
        setattr(F, name, capture)
        try:
            with torch.no_grad():
                out = m(x)
        except Exception:  # noqa: BLE001 - a forward that does not take a plain tensor: leave it
            return None
        finally:
            setattr(F, name, fn)
        if len(calls) != 1:
            return None
        inp, weight, bias, stride, padding, dilation, groups, y = calls[0]
        geometry = (tuple(stride) if isinstance(stride, (tuple, list)) else stride, padding, dilation, groups)
        if inp is not x or out is not y or geometry != (m.stride, m.padding, m.dilation, m.groups) or \
                weight.shape != m.weight.shape or (bias is not None and bias is not m.bias):
            return None
        made.append((weight.detach().clone(), bias))
    return made[0] if torch.equal(made[0][0], made[1][0]) else None


def _probe_input(m, g):
    """A small random input layer m takes: [2, in_features], or [1, in_channels, ...]
    just larger than a convolution's dilated kernel."""
    if isinstance(m, nn.Linear):
        return torch.randn(2, m.in_features, generator=g)
    size = [(k - 1) * d + 1 + s for k, d, s in zip(m.kernel_size, m.dilation, m.stride)]
    return torch.randn(1, m.in_channels, *size, generator=g)


def _computes_as(m, base):
    g = torch.Generator().manual_seed(0)
    try:
        x = _probe_input(m, g)
        with torch.no_grad():
            return bool(torch.equal(m(x), base.forward(m, x)))
    except Exception:  # noqa: BLE001 - whatever it does, it is not the base class's forward
        return False


def _freeze_layers(model, *, backend, retain, inplace, example_inputs, dtype, fuse, mapping, bits=Int8Range(),
                   pack_tied=False, shapes=None):
    """Layer by layer: the swap (and folding, fusion, calibration) every freeze starts with.
    fp32 layers whose weight another module holds too (tied weights) stay PyTorch's unless
    ``pack_tied`` (the fp32 step of an int8 freeze, whose int8 twins are another tensor).
    ``shapes``: example input shapes a forward that does not trace symbolically is traced
    on for its folding and fusion (graph.example_shapes)."""
    rules = dict(MAPPING)
    if mapping:
        rules.update(mapping)
    rules.update(_subclass_rules(model, rules))
    rules.update(_transposed_linear_rules(model, rules))

    plan, drop, keep = {}, {}, set()
    untraced = False
    if fuse and type(model) not in rules:  # (a layer frozen on its own has nothing to fuse with)
        try:
            plan, drop, keep = _analyze(model, rules, shapes)
        except Exception as e:  # noqa: BLE001 - any tracing failure means: no fusion
            untraced = True
            reason = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            plan, drop, keep = _analyze_parts(model, rules)
            where = "only inside the submodules that trace" if plan else "without BatchNorm folding or activation fusion"
            warnings.warn(
                f"qpack.freeze: torch.fx could not trace {type(model).__name__} ({reason}); swapping layers "
                f"{where}", FreezeWarning, stacklevel=3)

    seen, layers = set(keep) | _inside_torch_leaves(model, rules), []
    for m in model.modules():  # parents first: a layer kept or converted takes its submodules with it
        if id(m) in seen:  # (MHA's out_proj: its converter's, or read by the kept module's own forward)
            seen.update(id(c) for c in m.modules())
        elif type(m) in rules:
            seen.update(id(c) for c in m.modules())
            layers.append(m)

    if dtype is None and not pack_tied:
        tied = _tied(model, layers)
        if tied:
            names = [n for n, m in model.named_modules() if id(m) in tied]
            warnings.warn(
                f"qpack.freeze: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''} share their weight with "
                "other modules (tied weights, as a language model's output Linear and its token Embedding); "
                "packed fp32 they would hold a second copy of it, so they stay PyTorch layers over the one "
                "tensor (dtype='int8' packs them as int8)", FreezeWarning, stacklevel=3)
            layers = [m for m in layers if id(m) not in tied]
    ctx = FreezeContext(backend=backend, retain=retain, dtype=dtype, bits=bits, alone=untraced)
    if example_inputs is not None:
        ctx.ranges = _calibrate(model, example_inputs, layers, plan)

    replacements = {}

    def convert(layer):
        bn, act = plan.get(id(layer), (None, None))
        new = rules[type(layer)].convert(layer, ctx, bn=bn, activation=act)
        if new is None:
            return None
        new.train(False)
        out = {id(layer): new}
        rule = rules[type(layer)]
        for d in drop.get(id(layer), []):
            out[id(d)] = _folded_away(d, rule.fold_bn) if isinstance(d, rule.fold_bn) else _identity()
        return out

    if id(model) in {id(x) for x in layers}:  # the model is itself one layer
        got = convert(model)
        if got is None:
            return model if inplace else copy.deepcopy(model)
        if inplace:
            _drop_tensors(model)
        return got[id(model)]

    if inplace:
        while layers:
            layer = layers.pop(0)
            got = convert(layer)
            if got is None:
                continue
            _swap(model, got)
            _drop_tensors(layer)
            for d in drop.get(id(layer), []):
                _drop_tensors(d)
            del got, layer
        return model

    for layer in layers:
        got = convert(layer)
        if got is not None:
            replacements.update(got)
    memo = {}
    keep_alive = []
    for m in model.modules():
        if id(m) in replacements:
            memo[id(m)] = replacements[id(m)]
            keep_alive.append(m)
    return copy.deepcopy(model, memo)


def _tied(model, layers):
    """ids of the layers whose weight's storage another module's parameter also uses (tensor
    subclasses without a plain storage, torchao's, are left out)."""
    def storage(t):
        if not isinstance(t, torch.Tensor) or type(t) not in (torch.Tensor, nn.Parameter) or not t.numel() \
                or t.device.type == "meta":
            return None
        return t.untyped_storage().data_ptr()

    owners = collections.defaultdict(set)
    for m in model.modules():
        for t in m._parameters.values():
            if (key := storage(t)) is not None:
                owners[key].add(id(m))
    return {id(layer) for layer in layers
            if (key := storage(getattr(layer, "_parameters", {}).get("weight"))) is not None and len(owners[key]) > 1}


# layers whose frozen forms write their forward out (traced through, run on graphs)
_WRITTEN_OUT = (nn.TransformerEncoderLayer, nn.TransformerEncoder)
# frozen modules that unfreeze turns back whole (to_torch)
_UNFROZEN_WHOLE = FROZEN_TYPES + (FrozenMultiheadAttention, FrozenTransformerEncoderLayer,
                                  FrozenTransformerEncoder, FrozenConvTranspose2d)


def unfreeze(frozen, *, inplace=False):
    """An ordinary, editable nn.Module computing what ``frozen`` computes.

    Each frozen layer becomes its PyTorch equivalent with weights from
    ``unpack()`` (so it works after the originals were released): fp32 layers
    become nn.Linear/nn.Conv*d, followed by nn.ReLU/ReLU6/Hardtanh in an
    nn.Sequential where an activation was fused; layers frozen from torch.ao
    quantized modules become those modules again; other int8 layers become
    float layers holding the dequantized int8 weights (their outputs then
    differ from the frozen ones by the activation quantization the int8 layer
    did). Folded BatchNorm stays folded: the BatchNorm is an nn.Identity in
    the frozen and the unfrozen model, its statistics live in the weights.
    """
    if not isinstance(frozen, nn.Module):
        raise InvalidTypeError(f"qpack.unfreeze takes an nn.Module, got {type(frozen).__name__}")

    def back(m):
        mod = m.to_torch()
        mod.train(m.training)
        return mod

    from qpack.torch import graph as _g
    if isinstance(frozen, _UNFROZEN_WHOLE):
        return back(frozen)
    replacements, inside = {}, set()
    for m in frozen.modules():  # parents first: a frozen encoder turns back with its layers
        if isinstance(m, _UNFROZEN_WHOLE) and id(m) not in inside:
            replacements[id(m)] = back(m)
            inside.update(id(c) for c in m.modules())
    if inplace:
        _swap(frozen, replacements)
        _g.detach(frozen)
        return frozen
    memo = dict(replacements)
    for m in frozen.modules():
        runner = _g.runner_of(m)
        if runner is not None:
            memo[id(runner)] = None  # the graphs stay with the frozen model
    out = copy.deepcopy(frozen, memo)
    _g.detach(out)
    return out
