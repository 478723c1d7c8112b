"""PackedLinear: a linear layer whose weights live in a backend's packed layout."""
import math
import sys

import numpy as np

from qpack import _core
from qpack._core import ClosedError, InvalidArgumentError, InvalidTypeError

_INF = float("inf")


def _torch():
    return sys.modules.get("torch")


def _is_torch(x):
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def _is_legacy_quantized(x):
    return _is_torch(x) and x.is_quantized


def _activation_bounds(activation):
    """activation -> (min, max) in the real domain."""
    if activation is None:
        return -_INF, _INF
    if isinstance(activation, str):
        name, args = activation, ()
    elif isinstance(activation, tuple) and activation and isinstance(activation[0], str):
        name, args = activation[0], activation[1:]
    else:
        raise InvalidArgumentError(
            f"activation must be None, 'relu', 'relu6' or ('hardtanh', min, max), got {activation!r}")
    if name == "relu" and not args:
        return 0.0, _INF
    if name == "relu6" and not args:
        return 0.0, 6.0
    if name in ("hardtanh", "clamp"):
        lo, hi = args if len(args) == 2 else (-1.0, 1.0) if not args else (None, None)
        if lo is None:
            raise InvalidArgumentError(f"{name} takes (min, max), got {args!r}")
        lo = -_INF if lo is None else float(lo)
        hi = _INF if hi is None else float(hi)
        if not (lo < hi):
            raise InvalidArgumentError(f"{name} needs min < max, got ({lo}, {hi})")
        return lo, hi
    raise InvalidArgumentError(
        f"unknown activation {activation!r}; use None, 'relu', 'relu6' or ('hardtanh', min, max)")


_F32_MAX = float(np.finfo(np.float32).max)
_F32_TINY = float(np.finfo(np.float32).tiny)


def _check_scale(value, name):
    """A scale must be a finite, positive, normal float32."""
    if isinstance(value, bool):
        raise InvalidTypeError(f"{name} must be a float, got bool")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InvalidTypeError(f"{name} must be a float, got {type(value).__name__}") from None
    if not (math.isfinite(v) and v > 0.0):
        raise InvalidArgumentError(f"{name} = {value} is not a valid scale: it must be finite and positive")
    if not _F32_TINY <= v <= _F32_MAX:
        raise InvalidArgumentError(f"{name} = {value} is not a valid scale: it does not fit a normal float32 "
                                   f"[{_F32_TINY:.3g}, {_F32_MAX:.3g}]")
    return v


def _check_zero_point(value, name, lo=0, hi=255):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidTypeError(f"{name} must be an int, got {type(value).__name__}")
    v = int(value)
    if not lo <= v <= hi:
        raise InvalidArgumentError(f"{name} = {v} is outside [{lo}, {hi}]")
    return v


def _to_numpy(x, what):
    """numpy view of a numpy array or CPU torch tensor (no copy)."""
    if isinstance(x, np.ndarray):
        return x
    if _is_torch(x):
        if x.device.type != "cpu":
            raise InvalidArgumentError(f"{what} is on {x.device}; qpack runs on the CPU")
        return x.detach().numpy()
    raise InvalidTypeError(f"{what} must be a numpy array or a torch tensor, got {type(x).__name__}")


def _legacy_weight(weight, weight_scale):
    """(array, weight_scale, zero_points, legacy_per_channel) of a weight.

    legacy_per_channel is None unless weight is a legacy torch.qint8 tensor,
    whose own scales and zero points are returned."""
    if not _is_legacy_quantized(weight):
        return _to_numpy(weight, "weight"), weight_scale, None, None
    torch = _torch()
    if weight.dtype != torch.qint8:
        raise InvalidTypeError(f"a quantized weight must be torch.qint8, got {weight.dtype}")
    if weight_scale is not None:
        raise InvalidArgumentError("a torch.qint8 weight carries its own scales; do not pass weight_scale")
    qscheme = weight.qscheme()
    if qscheme in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        scales = np.array([weight.q_scale()], dtype=np.float32)
        zero_points = np.array([weight.q_zero_point()], dtype=np.int32)
        per_channel = False
    elif qscheme in (torch.per_channel_affine, torch.per_channel_symmetric,
                     torch.per_channel_affine_float_qparams):
        if weight.q_per_channel_axis() != 0:
            raise InvalidArgumentError("per-channel weight must be quantized along axis 0 (output channels)")
        scales = weight.q_per_channel_scales().to(torch.float32).numpy()
        zero_points = weight.q_per_channel_zero_points().to(torch.int32).numpy()
        per_channel = True
    else:
        raise InvalidArgumentError(f"unsupported weight qscheme {qscheme}")
    return weight.int_repr().contiguous().numpy(), scales, zero_points, per_channel


def _bias_array(bias, channels):
    """bias -> contiguous float32 [channels] numpy array (None stays None)."""
    if bias is None:
        return None
    b = _to_numpy(bias, "bias")
    if b.ndim != 1 or b.shape[0] != channels:
        raise InvalidArgumentError(f"bias must have shape [{channels}], got {tuple(b.shape)}")
    if b.dtype != np.float32:
        raise InvalidTypeError(f"bias must be float32, got {b.dtype}")
    if not np.isfinite(b).all():
        raise InvalidArgumentError("bias holds NaN or infinity")
    return np.ascontiguousarray(b)


def _weight_scales(weight_scale, n_out, what):
    """weight_scale (float, sequence, array or tensor) -> validated float32 [1 or n_out]."""
    ws = _to_numpy(weight_scale, "weight_scale") if _is_torch(weight_scale) else weight_scale
    try:
        scales = np.atleast_1d(np.asarray(ws, dtype=np.float64))
    except (TypeError, ValueError):
        raise InvalidTypeError(
            f"weight_scale must be a float or a 1-D array of floats, got {type(weight_scale).__name__}") from None
    if scales.ndim != 1 or scales.shape[0] not in (1, n_out):
        raise InvalidArgumentError(
            f"weight_scale must be a float or have {n_out} values (one per {what}), "
            f"got shape {tuple(scales.shape)}")
    for i, s in enumerate(scales):
        _check_scale(s, f"weight_scale[{i}]")
    return scales.astype(np.float32)


def _input_array(x, scale, zero_point):
    """(array, scale, zero_point, legacy) of an input; a torch.quint8 input brings its own."""
    if not _is_legacy_quantized(x):
        return _to_numpy(x, "input"), scale, zero_point, False
    torch = _torch()
    if x.dtype != torch.quint8:
        raise InvalidTypeError(f"quantized input must be torch.quint8, got {x.dtype}")
    if scale is not None or zero_point is not None:
        raise InvalidArgumentError("a torch.quint8 input carries its own scale and zero point")
    if x.qscheme() != torch.per_tensor_affine:
        raise InvalidArgumentError("quantized input must be per-tensor affine")
    return x.int_repr().numpy(), x.q_scale(), x.q_zero_point(), True


def _as_given(w, kind, scales, zero_points, legacy_per_channel):
    """An unpacked weight array in the kind the caller gave (numpy, torch, torch.qint8)."""
    if kind == "numpy":
        return w
    torch = _torch()
    wt = torch.from_numpy(w)
    if kind != "torch_qint8":
        return wt
    if not legacy_per_channel:
        return torch._make_per_tensor_quantized_tensor(wt, float(scales[0]), int(zero_points[0]))
    return torch._make_per_channel_quantized_tensor(
        wt, torch.from_numpy(scales.astype(np.float64)),
        torch.from_numpy(zero_points.astype(np.int64)), 0)


class _PackedLifetime:
    """The lifetime surface every packed object shares (over self._h)."""

    _what = "packed object"

    def _static_io(self, mode, input_scale, input_zero_point, output_scale, output_zero_point):
        """Validates and records the static int8 input/output parameters.

        Returns (input_scale, input_zero_point, output_scale, output_zero_point)
        for the core: zeros where absent (an input scale of 0 means "per call").
        """
        self.input_scale = self.input_zero_point = None
        self.output_scale = self.output_zero_point = None
        if mode != "int8_static":
            return 0.0, 0, 0.0, 0
        out_s = _check_scale(output_scale, "output_scale")
        out_zp = _check_zero_point(output_zero_point, "output_zero_point")
        self.output_scale, self.output_zero_point = out_s, out_zp
        in_s, in_zp = 0.0, 0
        if input_scale is not None:
            in_s = _check_scale(input_scale, "input_scale")
            in_zp = _check_zero_point(0 if input_zero_point is None else input_zero_point, "input_zero_point")
            self.input_scale, self.input_zero_point = in_s, in_zp
        return in_s, in_zp, out_s, out_zp

    def release_original(self):
        """Drop the original weight; unpack() keeps working from the packed form."""
        self._h.release_original()

    def close(self):
        """Free the packed memory now (after in-flight runs end). Idempotent."""
        self._h.close()

    @property
    def closed(self):
        return self._h.closed

    def __enter__(self):
        if self.closed:
            raise ClosedError(f"this {self._what} was closed")
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def has_original(self):
        return self._h.info()["has_original"]

    @property
    def nbytes_packed(self):
        return self._h.info()["nbytes_packed"]

    @property
    def nbytes_original(self):
        return self._h.info()["nbytes_original"]

    @property
    def backend(self):
        return self._h.backend

    @property
    def stats(self):
        """Counters: states_built, cache_hits, evictions, runs."""
        return self._h.stats()


class PackedLinear(_PackedLifetime):
    """y = x @ weight.T + bias, on weights packed once for oneDNN or QNNPACK.

    Quantized data is plain integers plus explicit parameters:

    - float32 weight: an fp32 layer (oneDNN).
    - int8 weight + ``weight_scale`` (a float, or one per output feature;
      symmetric): with ``output_scale``/``output_zero_point`` a static layer
      (uint8 in, uint8 out); with ``dynamic=True`` a dynamic one (float in and
      out, the input quantized per call as PyTorch does).
    - a legacy ``torch.qint8`` weight carries its own scales.

    ``retain`` keeps (True) or releases (False) the original weight once
    packed; None defers to ``qpack.retain(...)`` then the process default.
    ``unpack()`` works either way: after release it reconstructs the weight
    bit-exactly from the packed form.
    """

    _what = "packed linear"

    def __init__(self, weight, bias=None, *, backend="auto", retain=None, activation=None,
                 weight_scale=None, input_scale=None, input_zero_point=None,
                 output_scale=None, output_zero_point=None, dynamic=False):
        if backend not in ("auto", "onednn", "qnnpack"):
            raise InvalidArgumentError(f"backend must be 'auto', 'onednn' or 'qnnpack', got {backend!r}")
        if retain is not None and not isinstance(retain, bool):
            raise InvalidTypeError(f"retain must be True, False or None, got {retain!r}")
        clamp_min, clamp_max = _activation_bounds(activation)
        self._activation = activation
        self._weight_kind = "torch" if _is_torch(weight) else "numpy"
        self._bias_kind = "torch" if _is_torch(bias) else "numpy"
        w, weight_scale, weight_zero_points, self._legacy_per_channel = _legacy_weight(
            weight, weight_scale)
        if self._legacy_per_channel is not None:
            self._weight_kind = "torch_qint8"
        if w.ndim != 2:
            raise InvalidArgumentError(f"weight must be 2-D [out_features, in_features], got shape {tuple(w.shape)}")
        if w.shape[0] < 1 or w.shape[1] < 1:
            raise InvalidArgumentError(f"weight must have at least one row and column, got shape {tuple(w.shape)}")
        w = np.ascontiguousarray(w)
        if w.dtype == np.float32:
            if weight_scale is not None or dynamic or output_scale is not None:
                raise InvalidArgumentError(
                    "a float32 weight gives a float32 layer; quantize it to int8 (with weight_scale) "
                    "for a static or dynamic int8 layer")
            if not np.isfinite(w).all():
                raise InvalidArgumentError("weight holds NaN or infinity")
            mode = "f32"
        elif w.dtype == np.int8:
            if weight_scale is None:
                raise InvalidArgumentError("an int8 weight needs weight_scale (a float, or one per output feature)")
            mode = "int8_dynamic" if dynamic else "int8_static"
            if not dynamic and (output_scale is None or output_zero_point is None):
                raise InvalidArgumentError(
                    "an int8 weight gives a static layer when output_scale and output_zero_point are given, "
                    "or a dynamic one with dynamic=True")
        else:
            raise InvalidTypeError(f"weight must be float32 or int8 (or torch.qint8), got {w.dtype}")

        scales = None if mode == "f32" else _weight_scales(weight_scale, w.shape[0], "output feature")
        self._weight_scale = scales
        self._weight_zero_points = weight_zero_points

        b = _bias_array(bias, w.shape[0])

        in_s, in_zp, out_s, out_zp = self._static_io(mode, input_scale, input_zero_point, output_scale,
                                                     output_zero_point)
        if mode != "int8_static" and (input_scale is not None or output_scale is not None):
            raise InvalidArgumentError("input/output quantization parameters apply to static int8 layers only")

        self._h = _core.LinearHandle(w, b, mode, backend, retain, scales, weight_zero_points,
                                     clamp_min, clamp_max, in_s, in_zp, out_s, out_zp)
        self.mode = mode
        self.in_features = int(w.shape[1])
        self.out_features = int(w.shape[0])

    # ---- running ---------------------------------------------------------

    def __call__(self, x, scale=None, zero_point=None):
        return self.forward(x, scale=scale, zero_point=zero_point)

    def forward(self, x, scale=None, zero_point=None):
        h = self._h
        xa, scale, zero_point, legacy = _input_array(x, scale, zero_point)
        torch_in = legacy or _is_torch(x)
        if xa.ndim < 1:
            raise InvalidArgumentError("input must have at least one dimension [..., in_features]")
        if xa.shape[-1] != self.in_features:
            raise InvalidArgumentError(
                f"input has {xa.shape[-1]} features (last dim); this layer takes {self.in_features}")
        if not xa.flags.c_contiguous:
            raise InvalidArgumentError("input must be contiguous; call .contiguous() (torch) or "
                                       "np.ascontiguousarray (numpy) first")
        lead = xa.shape[:-1]
        x2 = xa.reshape(-1, self.in_features)
        if self.mode == "int8_static":
            if xa.dtype != np.uint8:
                raise InvalidTypeError(f"this static int8 layer takes uint8 input, got {xa.dtype}")
            if scale is None:
                if self.input_scale is None:
                    raise InvalidArgumentError(
                        "no input scale: pass scale= and zero_point= to the call, or input_scale= at construction")
                scale, zero_point = self.input_scale, self.input_zero_point
            else:
                scale = _check_scale(scale, "scale")
                zero_point = _check_zero_point(0 if zero_point is None else zero_point, "zero_point")
            y = h.run_u8(x2, scale, zero_point)
        else:
            if scale is not None or zero_point is not None:
                raise InvalidArgumentError("scale/zero_point apply to static int8 layers only")
            if xa.dtype != np.float32:
                raise InvalidTypeError(f"this {self.mode} layer takes float32 input, got {xa.dtype}")
            y = h.run_f32(x2)
        y = y.reshape(lead + (self.out_features,))
        if not torch_in:
            return y
        torch = _torch()
        yt = torch.from_numpy(y)
        if legacy:
            return torch._make_per_tensor_quantized_tensor(yt, self.output_scale, self.output_zero_point)
        return yt

    # ---- lifetime ----------------------------------------------------------

    def unpack(self):
        """(weight, bias) as given: reconstructed from the packed form if released."""
        w, b = self._h.unpack()
        w = _as_given(w, self._weight_kind, self._weight_scale, self._weight_zero_points,
                      self._legacy_per_channel)
        if b is not None and self._bias_kind == "torch":
            b = _torch().from_numpy(b)
        return w, b

    @property
    def weight_scale(self):
        """Weight scales (float32 array: 1 per-tensor or N per-channel); None for fp32."""
        return None if self._weight_scale is None else self._weight_scale.copy()

    @property
    def weight_zero_point(self):
        if self._weight_zero_points is None:
            return None if self._weight_scale is None else np.zeros_like(self._weight_scale, dtype=np.int32)
        return self._weight_zero_points.copy()

    def __repr__(self):
        state = "closed" if self.closed else ("original kept" if self.has_original else "original released")
        return (f"PackedLinear(in_features={self.in_features}, out_features={self.out_features}, "
                f"mode={self.mode}, backend={self.backend}, {state})")
