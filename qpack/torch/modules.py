"""nn.Module faces of qpack's packed objects: FrozenLinear, FrozenConv1d, FrozenConv2d, and
FrozenMultiheadAttention (nn.MultiheadAttention on two frozen linears).

A frozen module owns one packed object and a small, plain description of it
(mode, activation, quantization parameters, geometry). Its saved state
(``state_dict``, pickle, ``torch.save``, ``copy.deepcopy``) holds the unpacked
tensors, so it is portable across machines and backends; loading re-packs.
Unpacking works after the original weights were released (the packed layouts
are invertible), so saving never needs the originals.
"""
import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import qpack
from qpack._core import InvalidTypeError, UnsupportedError
from qpack.torch import attention as _attention
from qpack.torch import quantize as _q

_STATIC_KEYS = ("input_scale", "input_zero_point", "output_scale", "output_zero_point")


def _as_tensor(x):
    if x is None or torch.is_tensor(x):
        return x
    return torch.from_numpy(np.ascontiguousarray(x))


def _activation_module(activation):
    if activation is None:
        return None
    if activation == "relu":
        return nn.ReLU()
    if activation == "relu6":
        return nn.ReLU6()
    name, lo, hi = activation
    return nn.Hardtanh(lo, hi)


def _restore_frozen(cls, state):
    """A frozen module from qpack.load (its packed op already loaded)."""
    obj = cls.__new__(cls)
    nn.Module.__setstate__(obj, state)
    return obj


class _Frozen(nn.Module):
    """Common lifetime, saving and reporting for the frozen modules."""

    _op = None
    _packed_cls_name = None

    def __init__(self, spec, weight, bias=None, weight_scale=None, *, retain=None):
        super().__init__()
        self._spec = dict(spec)
        self._retain = retain
        self._weight_scale = None if weight_scale is None else weight_scale.detach().to(torch.float32).contiguous()
        self._packed = self._pack(weight, bias)

    # For code that reads a layer's tensors itself (transformers' ViT and CLIP read their patch
    # embedding's weight.dtype; torchvision's Swin hands qkv.weight to its attention function).

    @property
    def weight(self):
        """A PackedWeight: the weight's shape and dtype, its values made only for an op that
        needs them."""
        return PackedWeight.of(self)

    @property
    def bias(self):
        """The bias (None without one), unpacked on first use and kept beside the packed layer
        (out_features floats)."""
        cached = self.__dict__.get("_bias_tensor", False)
        if cached is False:
            cached = self.__dict__["_bias_tensor"] = self.unpack()[1] if self._spec["has_bias"] else None
        return cached

    # ---- packing --------------------------------------------------------------------

    @classmethod
    def _packed_cls(cls):
        packed = getattr(qpack, cls._packed_cls_name, None)
        if packed is None:
            raise UnsupportedError(f"qpack.{cls._packed_cls_name} not available in this build of qpack")
        return packed

    def _quant_kwargs(self):
        s = self._spec
        kw = {}
        if s["mode"] != "f32":
            kw["weight_scale"] = self._weight_scale.numpy()
        if s["mode"] == "int8_static":
            kw["output_scale"] = s["output_scale"]
            kw["output_zero_point"] = s["output_zero_point"]
            if s.get("input_scale") is not None:
                kw["input_scale"] = s["input_scale"]
                kw["input_zero_point"] = s["input_zero_point"]
        return kw

    def _pack(self, weight, bias):
        raise NotImplementedError

    # ---- running -----------------------------------------------------------------

    # made while running, never saved: the one-node graph (graph.LayerGraph), a Swin block's window
    # attention over this qkv layer (attention.WindowGraph), the unpacked bias
    _TRANSIENT = ("_layer_graph", "_window_graph", "_bias_tensor")

    def forward(self, x):
        # one core call where a one-node graph takes x (graph.LayerGraph), else torch around the packed op
        graph = self.__dict__.get("_layer_graph")
        if graph is None:
            from qpack.torch.graph import LayerGraph
            graph = self.__dict__["_layer_graph"] = LayerGraph(self)
        y = graph(self, x)
        return y if y is not None else self._forward_layer(x)

    def _forward_layer(self, x):
        """The layer's forward with torch ops around the packed op (any rank; torch.ao's
        quantized tensors), and its input checks."""
        s = self._spec
        if s["mode"] == "int8_static":
            if s["io"] == "legacy":
                if not (torch.is_tensor(x) and x.is_quantized):
                    raise InvalidTypeError(
                        f"this frozen {self._op} comes from a torch.ao quantized model and takes a torch.quint8 "
                        f"input (keep the model's QuantStub), got {x.dtype}")
                xq = x.int_repr().contiguous()
                y = self._packed(xq, scale=float(x.q_scale()), zero_point=int(x.q_zero_point()))
                return torch._make_per_tensor_quantized_tensor(
                    torch.as_tensor(y), s["output_scale"], s["output_zero_point"])
            xf = self._float_input(x)
            q = torch.clamp(torch.round(xf / s["input_scale"]) + s["input_zero_point"], 0, 255).to(torch.uint8)
            y = torch.as_tensor(self._packed(q))
            return (y.to(torch.float32) - s["output_zero_point"]) * s["output_scale"]
        return torch.as_tensor(self._packed(self._float_input(x)))

    def _float_input(self, x):
        if not torch.is_tensor(x):
            raise InvalidTypeError(f"frozen {self._op} takes a torch tensor, got {type(x).__name__}")
        if x.dtype != torch.float32:
            raise InvalidTypeError(f"frozen {self._op} takes float32 input, got {x.dtype}; call .float() first")
        return x.detach().contiguous()

    # ---- lifetime ------------------------------------------------------------------

    @property
    def packed(self):
        """The packed object (qpack.PackedLinear / PackedConv1d / PackedConv2d)."""
        return self._packed

    def release_original(self):
        """Drop the original weight held beside the packed one; saving and unfreeze keep working."""
        self._packed.release_original()

    @property
    def has_original(self):
        return self._packed.has_original

    @property
    def nbytes_packed(self):
        return self._packed.nbytes_packed

    @property
    def nbytes_original(self):
        return self._packed.nbytes_original

    @property
    def backend(self):
        return self._packed.backend

    @property
    def mode(self):
        return self._spec["mode"]

    @property
    def activation(self):
        return self._spec.get("activation")

    @property
    def weight_scale(self):
        return None if self._weight_scale is None else self._weight_scale.clone()

    def unpack(self):
        """(weight, bias) reconstructed from the packed form: float32, or int8 with ``weight_scale``."""
        w, b = self._packed.unpack()
        w = _as_tensor(w)
        b = _as_tensor(b)
        return w, b

    def dequantized_weight(self):
        w, _ = self.unpack()
        if self._weight_scale is None:
            return w.to(torch.float32)
        return _q.dequantize_weight(w, self._weight_scale)

    # ---- saving ---------------------------------------------------------------------

    def _export(self):
        w, b = self.unpack()
        out = {"weight": w.clone()}
        if b is not None:
            out["bias"] = b.clone()
        if self._weight_scale is not None:
            out["weight_scale"] = self._weight_scale.clone()
        if self._spec["mode"] == "int8_static":
            for k in _STATIC_KEYS:
                v = self._spec.get(k)
                if v is not None:
                    out[k] = torch.tensor(v, dtype=torch.float64 if "scale" in k else torch.int64)
        return out

    def _import(self, state):
        self.__dict__.pop("_bias_tensor", None)  # FrozenLinear.bias's copy of the old bias
        w = state["weight"]
        b = state.get("bias")
        if "weight_scale" in state:
            self._weight_scale = state["weight_scale"].detach().to(torch.float32).contiguous()
        if self._spec["mode"] == "int8_static":
            for k in _STATIC_KEYS:
                if k in state:
                    v = state[k]
                    self._spec[k] = float(v) if "scale" in k else int(v)
        old = self.__dict__.get("_packed")
        self._packed = self._pack(w.detach().contiguous(), None if b is None else b.detach().contiguous())
        if old is not None:
            old.close()

    def _state_keys(self):
        keys = ["weight"]
        if self._spec.get("has_bias"):
            keys.append("bias")
        if self._spec["mode"] != "f32":
            keys.append("weight_scale")
        if self._spec["mode"] == "int8_static":
            keys += [k for k in _STATIC_KEYS if self._spec.get(k) is not None]
        return keys

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for k, v in self._export().items():
            destination[prefix + k] = v

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        keys = self._state_keys()
        found = {}
        for k in keys:
            if prefix + k in state_dict:
                found[k] = state_dict[prefix + k]
            else:
                missing_keys.append(prefix + k)
        if strict:
            for k in state_dict:
                if k.startswith(prefix) and "." not in k[len(prefix):] and k[len(prefix):] not in keys:
                    unexpected_keys.append(k)
        if "weight" not in found:
            return
        w = found["weight"]
        want = torch.float32 if self._spec["mode"] == "f32" else torch.int8
        if w.dtype != want or tuple(w.shape) != tuple(self._spec["weight_shape"]):
            error_msgs.append(f"{prefix}weight: expected {want} of shape {tuple(self._spec['weight_shape'])}, "
                              f"got {w.dtype} of shape {tuple(w.shape)}")
            return
        try:
            self._import(found)
        except qpack.Error as e:
            error_msgs.append(f"{prefix}: could not re-pack: {e}")

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_packed", None)
        for k in self._TRANSIENT:
            state.pop(k, None)
        state["_qpack_state"] = self._export()
        state["_qpack_retain"] = bool(self._packed.has_original)
        return state

    def __setstate__(self, state):
        saved = state.pop("_qpack_state")
        retain = state.pop("_qpack_retain")
        super().__setstate__(state)
        keep = self._retain
        self._retain = retain
        try:
            self._import(saved)
        finally:
            self._retain = keep

    def __qpk_reduce__(self):
        # qpack.save: the packed op itself (a persistent id in the file), not
        # the unpacked weights __getstate__ gives pickle and torch.save.
        state = self.__dict__.copy()
        for k in self._TRANSIENT:
            state.pop(k, None)
        return (_restore_frozen, (self.__class__, state))

    def __deepcopy__(self, memo):
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        state = copy.deepcopy(self.__getstate__(), memo)
        new.__setstate__(state)
        return new

    def close(self):
        """Free the packed memory now; later calls raise qpack.ClosedError."""
        for k in ("_layer_graph", "_window_graph"):
            graph = self.__dict__.pop(k, None)
            if graph is not None:
                graph.drop()
        self._packed.close()

    def extra_repr(self):
        s = self._spec
        bits = [self._geometry_repr(), f"mode={s['mode']}", f"backend={self.backend}"]
        if s.get("activation") is not None:
            bits.append(f"activation={s['activation']!r}")
        if s.get("folded_bn"):
            bits.append("folded_bn=True")
        bits.append("original kept" if self.has_original else "original released")
        return ", ".join(bits)

    # ---- unfreeze ----------------------------------------------------------------

    def _legacy_weight_bias(self):
        """(torch.qint8 per-channel weight, float bias) for a torch.ao quantized module."""
        w, b = self.unpack()
        qw = torch._make_per_channel_quantized_tensor(
            w, self._weight_scale.to(torch.float64), torch.zeros(w.shape[0], dtype=torch.int64), 0)
        return qw, b

    def _legacy_finish(self, mod, qw, b):
        mod.set_weight_bias(qw, b)
        mod.scale = self._spec["output_scale"]
        mod.zero_point = self._spec["output_zero_point"]
        return mod

    def to_torch(self):
        """An ordinary nn.Module computing what this one computes (see qpack.unfreeze)."""
        s = self._spec
        if s["io"] == "legacy":
            mod = self._to_legacy()
        else:
            mod = self._to_float()
            act = _activation_module(s.get("activation"))
            if act is not None:
                mod = nn.Sequential(mod, act)
        return mod


_LINEAR_FUNCS = (F.linear, torch._C._nn.linear)
_METADATA = tuple(f for f in (torch.Tensor.shape.__get__, torch.Tensor.dtype.__get__, torch.Tensor.device.__get__,
                              torch.Tensor.ndim.__get__, torch.Tensor.layout.__get__,
                              torch.Tensor.requires_grad.__get__, torch.Tensor.is_quantized.__get__,
                              torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel,
                              torch.Tensor.is_floating_point, torch.Tensor.__len__))


class PackedWeight(torch.Tensor):
    """A frozen layer's ``.weight`` for code that reads it itself (torchvision's Swin hands
    ``qkv.weight`` to its attention function, transformers' ViT reads its patch embedding's
    ``weight.dtype``): the weight's shape and dtype, no values held. ``F.linear(x, w, b)`` on a
    Linear's runs the packed layer (b: its own bias, or another one: the difference is added);
    any other op gets the unpacked weight (for int8: dequantized) made for that call and
    dropped after it; in-place ops raise (a frozen layer is a snapshot)."""

    @staticmethod
    def of(layer):
        w = torch.zeros((), dtype=torch.float32).expand(*layer._spec["weight_shape"]).as_subclass(PackedWeight)
        w._layer = layer
        return w

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        if (func in _LINEAR_FUNCS and len(args) >= 2 and isinstance(args[1], PackedWeight)
                and not isinstance(args[0], PackedWeight) and isinstance(args[1]._layer, FrozenLinear)):
            layer = args[1]._layer
            if layer._spec.get("activation") is None:  # (with one fused, the layer's call would apply it)
                return layer._linear(args[0], args[2] if len(args) > 2 else kwargs.get("bias"))
        name = getattr(func, "__name__", "")
        if name.endswith("_") and not name.startswith("__"):
            raise UnsupportedError(f"{name} would change a frozen layer's weight in place; a frozen layer is a "
                                   f"snapshot (qpack.unfreeze gives an editable model)")

        def plain(a):
            if isinstance(a, PackedWeight):
                return a._layer.dequantized_weight()
            if isinstance(a, (list, tuple)):
                return type(a)(plain(x) for x in a)
            return a
        with torch._C.DisableTorchFunctionSubclass():
            return func(*plain(args), **{k: plain(v) for k, v in kwargs.items()})


class FrozenLinear(_Frozen):
    """nn.Linear on a qpack.PackedLinear (fp32 on oneDNN, int8 on either backend).
    ``.weight`` is a PackedWeight (F.linear on it runs the packed layer) and ``.bias``
    the bias, for code that reads a layer's tensors itself."""

    _op = "linear"
    _packed_cls_name = "PackedLinear"

    def _linear(self, x, bias):
        """F.linear(x, self.weight, bias) on the packed layer."""
        y = self(x)
        own = self.bias
        if bias is own or (bias is not None and own is not None and torch.equal(bias, own)):
            return y
        if bias is not None:
            y = y + bias
        return y - own if own is not None else y

    def _pack(self, weight, bias):
        s = self._spec
        return qpack.PackedLinear(weight, bias, backend=s["backend"] if s["mode"] != "f32" else "auto",
                                  retain=self._retain, activation=s.get("activation"),
                                  dynamic=s["mode"] == "int8_dynamic", **self._quant_kwargs())

    @property
    def in_features(self):
        return self._spec["weight_shape"][1]

    @property
    def out_features(self):
        return self._spec["weight_shape"][0]

    def _geometry_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}"

    @classmethod
    def make(cls, mode, weight, bias, *, weight_scale=None, activation=None, backend="auto", retain=None,
             io="float", source="float", folded_bn=False, **qparams):
        spec = dict(mode=mode, io=io, source=source, activation=activation, backend=backend,
                    weight_shape=tuple(weight.shape), has_bias=bias is not None, folded_bn=folded_bn)
        spec.update(qparams)
        return cls(spec, weight, bias, weight_scale, retain=retain)

    def _to_float(self):
        w, b = self.unpack()
        lin = nn.Linear(self.in_features, self.out_features, bias=b is not None)
        with torch.no_grad():
            lin.weight.copy_(self.dequantized_weight())
            if b is not None:
                lin.bias.copy_(b)
        return lin

    def _to_legacy(self):
        import torch.ao.nn.quantized as nnq
        import torch.ao.nn.intrinsic.quantized as nniq
        cls = nniq.LinearReLU if self._spec.get("activation") == "relu" else nnq.Linear
        qw, b = self._legacy_weight_bias()
        # (nnq.Linear calls its bias flag bias_, nniq.LinearReLU calls it bias: pass it by position)
        return self._legacy_finish(cls(self.in_features, self.out_features, b is not None), qw, b)


class _FrozenConv(_Frozen):
    _dims = None

    def _pack(self, weight, bias):
        s = self._spec
        return self._packed_cls()(weight, bias, stride=s["stride"], padding=s["padding"],
                                  dilation=s["dilation"], groups=s["groups"],
                                  backend=s["backend"] if s["mode"] != "f32" else "auto",
                                  retain=self._retain, activation=s.get("activation"),
                                  **self._quant_kwargs())

    @classmethod
    def make(cls, mode, weight, bias, *, stride, padding, dilation, groups, weight_scale=None,
             activation=None, backend="auto", retain=None, io="float", source="float", folded_bn=False,
             **qparams):
        if mode == "int8_dynamic":
            raise UnsupportedError("convolutions have no dynamic int8 mode; use fp32 or static int8")
        spec = dict(mode=mode, io=io, source=source, activation=activation, backend=backend,
                    weight_shape=tuple(weight.shape), has_bias=bias is not None, folded_bn=folded_bn,
                    stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation), groups=int(groups))
        spec.update(qparams)
        return cls(spec, weight, bias, weight_scale, retain=retain)

    @property
    def in_channels(self):
        return self._spec["weight_shape"][1] * self._spec["groups"]

    @property
    def out_channels(self):
        return self._spec["weight_shape"][0]

    @property
    def kernel_size(self):
        return tuple(self._spec["weight_shape"][2:])

    # nn.Conv*d's geometry attributes: models read them in forward (e.g. TF-style "same" padding)
    @property
    def stride(self):
        return tuple(self._spec["stride"])

    @property
    def padding(self):
        return tuple(self._spec["padding"])

    @property
    def dilation(self):
        return tuple(self._spec["dilation"])

    @property
    def groups(self):
        return self._spec["groups"]

    @property
    def padding_mode(self):
        return "zeros"

    def _geometry_repr(self):
        s = self._spec
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={s['stride']}, "
                f"padding={s['padding']}, dilation={s['dilation']}, groups={s['groups']}")

    def _torch_conv_cls(self):
        return nn.Conv1d if self._dims == 1 else nn.Conv2d

    def _to_float(self):
        s = self._spec
        w, b = self.unpack()
        conv = self._torch_conv_cls()(self.in_channels, self.out_channels, self.kernel_size, stride=s["stride"],
                                      padding=s["padding"], dilation=s["dilation"], groups=s["groups"],
                                      bias=b is not None)
        with torch.no_grad():
            conv.weight.copy_(self.dequantized_weight())
            if b is not None:
                conv.bias.copy_(b)
        return conv

    def _to_legacy(self):
        import torch.ao.nn.quantized as nnq
        import torch.ao.nn.intrinsic.quantized as nniq
        s = self._spec
        relu = s.get("activation") == "relu"
        if self._dims == 1:
            cls = nniq.ConvReLU1d if relu else nnq.Conv1d
        else:
            cls = nniq.ConvReLU2d if relu else nnq.Conv2d
        qw, b = self._legacy_weight_bias()
        mod = cls(self.in_channels, self.out_channels, self.kernel_size, stride=s["stride"], padding=s["padding"],
                  dilation=s["dilation"], groups=s["groups"], bias=b is not None)
        return self._legacy_finish(mod, qw, b)


class FrozenConv1d(_FrozenConv):
    """nn.Conv1d on a qpack.PackedConv1d."""

    _op = "conv1d"
    _packed_cls_name = "PackedConv1d"
    _dims = 1


class FrozenConv2d(_FrozenConv):
    """nn.Conv2d on a qpack.PackedConv2d."""

    _op = "conv2d"
    _packed_cls_name = "PackedConv2d"
    _dims = 2


FROZEN_TYPES = (FrozenLinear, FrozenConv1d, FrozenConv2d)


class FrozenMultiheadAttention(nn.Module):
    """nn.MultiheadAttention (eval) on packed projections: ``in_proj`` (E -> 3E, the
    query, key and value projections in one) and ``out_proj`` (E -> E) are frozen
    linears (fp32, or int8 as freeze's dtype asks); the attention between them is
    qpack.torch.attention's ``scaled_dot_product_attention`` (the core's kernel without
    a mask, PyTorch's with one), or softmax(Q K^T / sqrt(d) + mask) V
    when the weights are asked for (``need_weights``, nn.MultiheadAttention's
    default). The same arguments and results as nn.MultiheadAttention.forward:
    batched or unbatched inputs, ``batch_first``, boolean or float ``attn_mask``
    (L x S or N*H x L x S) and ``key_padding_mask``, ``is_causal``,
    ``average_attn_weights``. Self-attention (query, key and value the same
    tensor) projects once; otherwise each distinct input is projected by
    ``in_proj`` and the rows it needs kept. ``unfreeze`` gives back an
    nn.MultiheadAttention."""

    def __init__(self, in_proj, out_proj, num_heads, batch_first):
        super().__init__()
        self.in_proj = in_proj
        self.out_proj = out_proj
        self.num_heads = int(num_heads)
        self.batch_first = bool(batch_first)
        self.embed_dim = out_proj.out_features

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"

    def _projections(self, query, key, value):
        E = self.embed_dim
        q_all = self.in_proj(query)
        if key is query and value is query:
            return q_all.split(E, dim=-1)
        kv_all = q_all if key is query else self.in_proj(key)
        v_all = kv_all if value is key else (q_all if value is query else self.in_proj(value))
        return q_all[..., :E], kv_all[..., E:2 * E], v_all[..., 2 * E:]

    @staticmethod
    def _float_mask(mask, dtype, name):
        if mask is None:
            return None
        if mask.dtype == torch.bool:
            return torch.zeros(mask.shape, dtype=dtype).masked_fill_(mask, float("-inf"))
        if not mask.is_floating_point():
            raise InvalidTypeError(f"{name} must be a bool or float tensor, got {mask.dtype}")
        return mask.to(dtype)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not torch.is_tensor(t) or t.dtype != torch.float32:
                raise InvalidTypeError(f"frozen multi-head attention takes float32 tensors; {name} is "
                                       f"{t.dtype if torch.is_tensor(t) else type(t).__name__}")
        unbatched = query.dim() == 2
        if query.dim() not in (2, 3) or key.dim() != query.dim() or value.dim() != query.dim():
            raise InvalidTypeError(f"frozen multi-head attention takes (L, E) or batched 3-d query, key and "
                                   f"value, got {query.dim()}-d, {key.dim()}-d and {value.dim()}-d")
        E, H = self.embed_dim, self.num_heads
        if query.shape[-1] != E or key.shape[-1] != E or value.shape[-1] != E:
            raise InvalidTypeError(f"frozen multi-head attention: embed_dim is {E}, got query, key and value "
                                   f"of last dims {query.shape[-1]}, {key.shape[-1]}, {value.shape[-1]}")
        q_in, k_in, v_in = query, key, value
        if unbatched:
            q_in, k_in, v_in = (t.unsqueeze(0) for t in (query, key, value))
        elif not self.batch_first:
            q_in, k_in, v_in = (t.transpose(0, 1) for t in (query, key, value))
        # keep identity (self-attention) through the reshapes
        k_in = q_in if key is query else k_in
        v_in = q_in if value is query else (k_in if value is key else v_in)
        qp, kp, vp = self._projections(q_in, k_in, v_in)
        B, L, S, hd = q_in.shape[0], q_in.shape[1], k_in.shape[1], E // H
        qh = qp.reshape(B, L, H, hd).transpose(1, 2)
        kh = kp.reshape(B, S, H, hd).transpose(1, 2)
        vh = vp.reshape(B, S, H, hd).transpose(1, 2)
        mask = self._float_mask(attn_mask, qh.dtype, "attn_mask")
        if mask is not None:
            mask = mask.reshape(1, 1, L, S) if mask.dim() == 2 else mask.reshape(B, H, L, S)
        pad = self._float_mask(key_padding_mask, qh.dtype, "key_padding_mask")
        if pad is not None:
            pad = pad.reshape(B, 1, 1, S)
            mask = pad if mask is None else mask + pad
        causal = bool(is_causal) and attn_mask is None
        if causal and (mask is not None or need_weights):  # a mask beside the padding one, or in the scores
            upper = torch.full((L, S), float("-inf")).triu_(1)
            mask = upper if mask is None else mask + upper
            causal = False
        weights = None
        if need_weights:
            scores = torch.matmul(qh, kh.transpose(-2, -1)) * (1.0 / hd ** 0.5)
            if mask is not None:
                scores = scores + mask
            attn = torch.softmax(scores, dim=-1)
            out = torch.matmul(attn, vh)
            weights = attn.mean(dim=1) if average_attn_weights else attn
            if unbatched:
                weights = weights.squeeze(0)
        else:
            out = _attention.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=causal)
        out = self.out_proj(out.transpose(1, 2).reshape(B, L, E))
        if unbatched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return out, weights

    def to_torch(self):
        """An nn.MultiheadAttention with the unpacked (for int8: dequantized) projections."""
        inp, outp = self.in_proj.to_torch(), self.out_proj.to_torch()
        mha = nn.MultiheadAttention(self.embed_dim, self.num_heads, bias=inp.bias is not None,
                                    batch_first=self.batch_first)
        with torch.no_grad():
            mha.in_proj_weight.copy_(inp.weight)
            mha.out_proj.weight.copy_(outp.weight)
            if inp.bias is not None:
                mha.in_proj_bias.copy_(inp.bias)
            if outp.bias is not None:
                mha.out_proj.bias.copy_(outp.bias)
            elif mha.out_proj.bias is not None:
                mha.out_proj.bias.zero_()
        return mha.train(False)


def blocks_to_space(x, kh, kw):
    """[N, kh kw C, H, W] -> [N, C, H kh, W kw]: y[:, c, i kh + a, j kw + b] = x[:, (a kw + b) C + c, i, j]
    (the channels in blocks by position, not pixel_shuffle's order); the core runs it as one
    ``depth_to_space`` node."""
    n, c, h, w = x.shape
    c //= kh * kw
    return x.reshape(n, kh, kw, c, h, w).permute(0, 3, 4, 1, 5, 2).reshape(n, c, h * kh, w * kw)


torch.fx.wrap("blocks_to_space")  # one call in a trace (FrozenConvTranspose2d.forward), not its reshapes


class FrozenConvTranspose2d(nn.Module):
    """nn.ConvTranspose2d whose stride equals its kernel (no padding, groups or dilation:
    U-Net's 2x2 / 2 upsampling) as what it computes: a 1x1 FrozenConv2d to kh kw Cout
    channels (``conv``; weight [(a, b, o), c] = the transposed convolution's [c, o, a, b],
    the bias once per position) and blocks_to_space, which puts each position's block of
    Cout channels at its place. Both run in core graphs (a 1x1 convolution and a
    ``depth_to_space`` node); ``unfreeze`` gives back an nn.ConvTranspose2d."""

    def __init__(self, conv, out_channels, kernel_size):
        super().__init__()
        self.conv = conv
        self.out_channels = int(out_channels)
        self.kernel_size = tuple(int(k) for k in kernel_size)
        self.stride = self.kernel_size
        self.in_channels = conv.in_channels

    def extra_repr(self):
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"

    def forward(self, x):
        return blocks_to_space(self.conv(x), *self.kernel_size)

    def to_torch(self):
        """An nn.ConvTranspose2d of the unpacked (int8: dequantized) weights."""
        conv = self.conv.to_torch()
        kh, kw = self.kernel_size
        w = conv.weight.detach().reshape(kh, kw, self.out_channels, self.in_channels).permute(3, 2, 0, 1)
        t = nn.ConvTranspose2d(self.in_channels, self.out_channels, self.kernel_size, self.kernel_size,
                               bias=conv.bias is not None)
        with torch.no_grad():
            t.weight.copy_(w)
            if conv.bias is not None:
                t.bias.copy_(conv.bias.detach()[:self.out_channels])
        return t.train(False)


def same_pads(size, kernel, stride, dilation):
    """(before, after) of TensorFlow's "SAME" padding of one dim of ``size``: the total that
    makes ceil(size / stride) outputs, the odd one after."""
    total = max((-(-size // stride) - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


class SamePadConv2d(nn.Module):
    """A convolution of its input padded as TensorFlow's "SAME" does, by amounts from the
    input's H and W (timm's Conv2dSame, in its TF-ported models): ``conv`` the frozen
    layer with no padding of its own (a FrozenConv2d; after unfreeze an nn.Conv2d, in an
    nn.Sequential with its fused activation). A trace on example shapes sees the pads as
    constants (the graph's pad node before the convolution); a symbolic one cannot (the
    amounts compare sizes)."""

    def __init__(self, conv):
        super().__init__()
        self.conv = conv
        self.kernel_size, self.stride, self.dilation = (tuple(int(v) for v in getattr(conv, a))
                                                        for a in ("kernel_size", "stride", "dilation"))

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, dilation={self.dilation}"

    def forward(self, x):
        k, s, d = self.kernel_size, self.stride, self.dilation
        h, w = x.shape[-2:]
        top, bottom = same_pads(h, k[0], s[0], d[0])
        left, right = same_pads(w, k[1], s[1], d[1])
        return self.conv(F.pad(x, (left, right, top, bottom)))


class FrozenTransformerEncoderLayer(nn.Module):
    """nn.TransformerEncoderLayer (eval) as the ops it computes, written out:
    ``self_attn`` a FrozenMultiheadAttention, ``linear1`` / ``linear2`` frozen
    linears, the layer's own LayerNorms and activation. PyTorch's layer hands its
    weights to one fused function (its fast path), which no trace sees into; this
    forward is PyTorch's other path (the same arithmetic, dropout off), so a frozen
    model traces through it and its adds, norms and feed-forward run in core graphs.
    The same arguments as nn.TransformerEncoderLayer.forward; ``unfreeze`` gives
    back an nn.TransformerEncoderLayer."""

    def __init__(self, layer, self_attn, linear1, linear2):
        super().__init__()
        self.self_attn, self.linear1, self.linear2 = self_attn, linear1, linear2
        self.norm1, self.norm2 = copy.deepcopy(layer.norm1), copy.deepcopy(layer.norm2)
        act = layer.activation
        self.activation = copy.deepcopy(act) if isinstance(act, nn.Module) else act
        self.norm_first = bool(layer.norm_first)
        self.batch_first = bool(self_attn.batch_first)
        self._dropout = float(layer.dropout.p)  # for to_torch

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        return self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                              need_weights=False, is_causal=is_causal)[0]

    def _ff_block(self, x):
        return self.linear2(self.activation(self.linear1(x)))

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))

    def to_torch(self):
        """An nn.TransformerEncoderLayer with the unpacked (int8: dequantized) weights."""
        mha = self.self_attn.to_torch()
        l1, l2 = self.linear1.to_torch(), self.linear2.to_torch()
        layer = nn.TransformerEncoderLayer(
            mha.embed_dim, mha.num_heads, l1.out_features, dropout=self._dropout,
            activation=copy.deepcopy(self.activation) if isinstance(self.activation, nn.Module) else self.activation,
            layer_norm_eps=self.norm1.eps, batch_first=self.batch_first, norm_first=self.norm_first,
            bias=mha.in_proj_bias is not None)
        layer.self_attn, layer.linear1, layer.linear2 = mha, l1, l2
        layer.norm1, layer.norm2 = copy.deepcopy(self.norm1), copy.deepcopy(self.norm2)
        return layer.train(False)


class FrozenTransformerEncoder(nn.Module):
    """nn.TransformerEncoder (eval) over FrozenTransformerEncoderLayers, its forward
    written out as FrozenTransformerEncoderLayer's is: the masks made float as
    PyTorch makes them, each layer, the final norm. Where PyTorch's encoder would
    run its layers on a nested tensor (a key padding mask, left-aligned, no other
    mask, ``enable_nested_tensor``) the padded positions come out 0 as there; the
    other positions see the padding as masked keys, the same values."""

    def __init__(self, encoder, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.num_layers = len(layers)
        self.norm = copy.deepcopy(encoder.norm)
        self.enable_nested_tensor = bool(getattr(encoder, "enable_nested_tensor", False))
        self.use_nested_tensor = bool(getattr(encoder, "use_nested_tensor", False))
        self.mask_check = bool(getattr(encoder, "mask_check", True))

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        from torch.nn.modules.transformer import _detect_is_causal_mask
        if src_key_padding_mask is not None:
            src_key_padding_mask = F._canonical_mask(
                mask=src_key_padding_mask, mask_name="src_key_padding_mask", other_type=F._none_or_dtype(mask),
                other_name="mask", target_type=src.dtype)
        zero_padded = False
        if mask is not None:
            mask = F._canonical_mask(mask=mask, mask_name="mask", other_type=None, other_name="",
                                     target_type=src.dtype, check_other=False)
            seq_len = src.shape[0] if src.dim() == 2 else src.shape[1 if self.layers[0].batch_first else 0]
            is_causal = _detect_is_causal_mask(mask, is_causal, seq_len)
        else:
            is_causal = bool(is_causal)
            zero_padded = (src_key_padding_mask is not None and self.use_nested_tensor and src.dim() == 3
                           and torch.backends.mha.get_fastpath_enabled()
                           and (not self.mask_check or bool(torch._nested_tensor_from_mask_left_aligned(
                               src, src_key_padding_mask.logical_not()))))
        output = src
        for mod in self.layers:
            output = mod(output, src_mask=mask, is_causal=is_causal, src_key_padding_mask=src_key_padding_mask)
        if zero_padded:  # PyTorch's nested tensor comes back padded with zeros
            pad = src_key_padding_mask != 0
            output = output.masked_fill(pad.unsqueeze(-1) if self.layers[0].batch_first else pad.t().unsqueeze(-1),
                                        0.0)
        if self.norm is not None:
            output = self.norm(output)
        return output

    def to_torch(self):
        """An nn.TransformerEncoder of the layers' to_torch()."""
        import warnings
        layers = [m.to_torch() for m in self.layers]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its notes on enable_nested_tensor
            enc = nn.TransformerEncoder(layers[0], len(layers), norm=copy.deepcopy(self.norm),
                                        enable_nested_tensor=self.enable_nested_tensor, mask_check=self.mask_check)
        enc.layers = nn.ModuleList(layers)
        enc.use_nested_tensor = self.use_nested_tensor
        return enc.train(False)


__all__ = ["FrozenConv1d", "FrozenConv2d", "FrozenConvTranspose2d", "FrozenLinear", "FrozenMultiheadAttention",
           "SamePadConv2d",
           "FrozenTransformerEncoder",
           "FrozenTransformerEncoderLayer", "PackedWeight", "FROZEN_TYPES"]
