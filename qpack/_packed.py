"""What every packed op's Python class shares: turning arrays and tensors into
what the extension takes, and the lifetime surface (PackedOp).

Only translation happens here: which array goes to which C argument, in which
dtype and layout, and how results come back (numpy, torch, legacy quantized
tensors). Values are validated once, in the core; its errors arrive as qpack
exceptions through the extension.
"""
import sys

import numpy as np

from qpack import _core
from qpack._core import ClosedError, InvalidArgumentError, InvalidTypeError

_INF = float("inf")


def torch_module():
    """torch if it was imported (qpack never imports it here), else None."""
    return sys.modules.get("torch")


def is_torch(x):
    t = torch_module()
    return t is not None and isinstance(x, t.Tensor)


def is_legacy_quantized(x):
    return is_torch(x) and x.is_quantized


def activation_bounds(activation):
    """activation -> (min, max) in the real domain (the core checks min < max)."""
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
        if not args:
            return -1.0, 1.0
        if len(args) != 2:
            raise InvalidArgumentError(f"{name} takes (min, max), got {args!r}")
        lo, hi = args
        return (-_INF if lo is None else float(lo)), (_INF if hi is None else float(hi))
    raise InvalidArgumentError(
        f"unknown activation {activation!r}; use None, 'relu', 'relu6' or ('hardtanh', min, max)")


def scale_arg(value, name):
    """A scale as a float for the core (which checks its value)."""
    if isinstance(value, bool):
        raise InvalidTypeError(f"{name} must be a float, got bool")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidTypeError(f"{name} must be a float, got {type(value).__name__}") from None


def zero_point_arg(value, name):
    """A zero point as an int for the core (which checks its range)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidTypeError(f"{name} must be an int, got {type(value).__name__}")
    v = int(value)
    if not -2**31 <= v < 2**31:
        raise InvalidArgumentError(f"{name} = {v} is outside the uint8 range [0, 255]")
    return v


def to_numpy(x, what):
    """numpy view of a numpy array or CPU torch tensor (no copy)."""
    if isinstance(x, np.ndarray):
        return x
    if is_torch(x):
        if x.device.type != "cpu":
            raise InvalidArgumentError(f"{what} is on {x.device}; qpack runs on the CPU")
        return x.detach().numpy()
    raise InvalidTypeError(f"{what} must be a numpy array or a torch tensor, got {type(x).__name__}")


def legacy_weight(weight, weight_scale):
    """(array, weight_scale, zero_points, legacy_per_channel) of a weight.

    legacy_per_channel is None unless weight is a legacy torch.qint8 tensor,
    whose own scales and zero points are returned."""
    if not is_legacy_quantized(weight):
        return to_numpy(weight, "weight"), weight_scale, None, None
    torch = torch_module()
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


def bias_array(bias, channels):
    """bias -> contiguous float32 [channels] numpy array (None stays None)."""
    if bias is None:
        return None
    b = to_numpy(bias, "bias")
    if b.ndim != 1 or b.shape[0] != channels:
        raise InvalidArgumentError(f"bias must have shape [{channels}], got {tuple(b.shape)}")
    if b.dtype != np.float32:
        raise InvalidTypeError(f"bias must be float32, got {b.dtype}")
    return np.ascontiguousarray(b)


def weight_scales(weight_scale):
    """weight_scale (float, sequence, array or tensor) -> 1-D float32 array."""
    ws = to_numpy(weight_scale, "weight_scale") if is_torch(weight_scale) else weight_scale
    try:
        scales = np.atleast_1d(np.asarray(ws, dtype=np.float64))
    except (TypeError, ValueError):
        raise InvalidTypeError(
            f"weight_scale must be a float or a 1-D array of floats, got {type(weight_scale).__name__}") from None
    if scales.ndim != 1:
        raise InvalidArgumentError(f"weight_scale must be a float or a 1-D array, got shape {tuple(scales.shape)}")
    with np.errstate(over="ignore"):  # too large for float32: inf, which the core rejects
        return scales.astype(np.float32)


def input_array(x, scale, zero_point):
    """(array, scale, zero_point, legacy) of an input; a torch.quint8 input brings its own."""
    if not is_legacy_quantized(x):
        return to_numpy(x, "input"), scale, zero_point, False
    torch = torch_module()
    if x.dtype != torch.quint8:
        raise InvalidTypeError(f"quantized input must be torch.quint8, got {x.dtype}")
    if scale is not None or zero_point is not None:
        raise InvalidArgumentError("a torch.quint8 input carries its own scale and zero point")
    if x.qscheme() != torch.per_tensor_affine:
        raise InvalidArgumentError("quantized input must be per-tensor affine")
    return x.int_repr().numpy(), x.q_scale(), x.q_zero_point(), True


def as_given(w, kind, scales, zero_points, legacy_per_channel):
    """An unpacked weight array in the kind the caller gave (numpy, torch, torch.qint8)."""
    if kind == "numpy":
        return w
    torch = torch_module()
    wt = torch.from_numpy(w)
    if kind != "torch_qint8":
        return wt
    if not legacy_per_channel:
        return torch._make_per_tensor_quantized_tensor(wt, float(scales[0]), int(zero_points[0]))
    return torch._make_per_channel_quantized_tensor(
        wt, torch.from_numpy(scales.astype(np.float64)),
        torch.from_numpy(zero_points.astype(np.int64)), 0)


class OpArgs:
    """A packed op's constructor arguments, translated for the extension.

    Attributes: weight (contiguous numpy), bias, mode ('f32', 'int8_static',
    'int8_dynamic'), weight_scales / weight_zero_points (numpy or None),
    clamp (min, max), io (input_scale, input_zero_point, output_scale,
    output_zero_point; zeros where absent, input_scale 0 meaning "per call"),
    and what unpack() needs to give the weight back as it came.
    """

    def __init__(self, what, weight, bias, *, retain, activation, weight_scale, input_scale,
                 input_zero_point, output_scale, output_zero_point, dynamic, check_shape):
        if retain is not None and not isinstance(retain, bool):
            raise InvalidTypeError(f"retain must be True, False or None, got {retain!r}")
        self.clamp = activation_bounds(activation)
        self.weight_kind = "torch" if is_torch(weight) else "numpy"
        self.bias_kind = "torch" if is_torch(bias) else "numpy"
        w, weight_scale, self.weight_zero_points, self.legacy_per_channel = legacy_weight(
            weight, weight_scale)
        if self.legacy_per_channel is not None:
            self.weight_kind = "torch_qint8"
        w = check_shape(w)
        self.weight = np.ascontiguousarray(w)
        if w.dtype == np.float32:
            if weight_scale is not None or dynamic or output_scale is not None or input_scale is not None:
                raise InvalidArgumentError(
                    f"a float32 weight gives a float32 {what}; quantize it to int8 (with weight_scale, "
                    "and output_scale/output_zero_point for a static one) for an int8 one")
            self.mode = "f32"
        elif w.dtype == np.int8:
            if weight_scale is None:
                raise InvalidArgumentError("an int8 weight needs weight_scale (a float, or one per output channel)")
            if dynamic:
                if input_scale is not None or output_scale is not None:
                    raise InvalidArgumentError("input/output quantization parameters apply to static int8 layers only")
                self.mode = "int8_dynamic"
            elif output_scale is None or output_zero_point is None:
                raise InvalidArgumentError(
                    f"an int8 weight gives a static {what} when output_scale and output_zero_point are given"
                    + (", or a dynamic one with dynamic=True" if what == "layer" else ""))
            else:
                self.mode = "int8_static"
        else:
            raise InvalidTypeError(f"weight must be float32 or int8 (or torch.qint8), got {w.dtype}")
        self.weight_scales = None if self.mode == "f32" else weight_scales(weight_scale)
        self.bias = bias_array(bias, w.shape[0])
        self.io = (0.0, 0, 0.0, 0)
        if self.mode == "int8_static":
            in_s, in_zp = 0.0, 0
            if input_scale is not None:
                in_s = scale_arg(input_scale, "input_scale")
                if in_s == 0.0:  # 0 is the extension's "given per call"
                    raise InvalidArgumentError("input_scale = 0.0 is not a valid scale")
                in_zp = zero_point_arg(0 if input_zero_point is None else input_zero_point, "input_zero_point")
            self.io = (in_s, in_zp, scale_arg(output_scale, "output_scale"),
                       zero_point_arg(output_zero_point, "output_zero_point"))


class PackedOp:
    """The lifetime surface every packed op shares (over its extension handle self._h)."""

    _what = "packed object"  # in messages: "this packed linear was closed"
    _noun = "op"             # in messages: "this static int8 layer takes uint8 input"

    def _init_from(self, args, handle):
        """Records what the instance keeps of its OpArgs once the handle exists."""
        self._h = handle
        self.mode = args.mode
        self._activation = None
        self._weight_kind = args.weight_kind
        self._bias_kind = args.bias_kind
        self._legacy_per_channel = args.legacy_per_channel
        self._weight_scale = args.weight_scales
        self._weight_zero_points = args.weight_zero_points
        in_s, in_zp, out_s, out_zp = args.io
        static = args.mode == "int8_static"
        self.input_scale = in_s if static and in_s else None
        self.input_zero_point = in_zp if static and in_s else None
        self.output_scale = out_s if static else None
        self.output_zero_point = out_zp if static else None

    def _run_args(self, xa, scale, zero_point):
        """('u8', scale, zero_point) or ('f32', None, None) for an input, by the op's mode."""
        kind = self._noun
        if self.mode == "int8_static":
            if xa.dtype != np.uint8:
                raise InvalidTypeError(f"this static int8 {kind} takes uint8 input, got {xa.dtype}")
            if scale is None:
                if self.input_scale is None:
                    raise InvalidArgumentError(
                        "no input scale: pass scale= and zero_point= to the call, or input_scale= at construction")
                return "u8", self.input_scale, self.input_zero_point
            return "u8", scale_arg(scale, "scale"), zero_point_arg(0 if zero_point is None else zero_point, "zero_point")
        if scale is not None or zero_point is not None:
            raise InvalidArgumentError(f"scale/zero_point apply to static int8 {kind}s only")
        if xa.dtype != np.float32:
            raise InvalidTypeError(f"this {self.mode} {kind} takes float32 input, got {xa.dtype}")
        return "f32", None, None

    def _unpack_as_given(self):
        w, b = self._h.unpack()
        w = as_given(w, self._weight_kind, self._weight_scale, self._weight_zero_points,
                     self._legacy_per_channel)
        if b is not None and self._bias_kind == "torch":
            b = torch_module().from_numpy(b)
        return w, b

    @property
    def weight_scale(self):
        """Weight scales (float32 array: 1 per-tensor or one per output channel); None for fp32."""
        return None if self._weight_scale is None else self._weight_scale.copy()

    def save(self, path, *, originals=True):
        """qpack.save(self, path): a packed model file holding this op."""
        from qpack._model import save
        save(self, path, originals=originals)

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

    def _live_info(self):
        info = self._h.info()
        if info["closed"]:
            raise ClosedError(f"this {self._what} was closed")
        return info

    @property
    def has_original(self):
        return self._live_info()["has_original"]

    @property
    def nbytes_packed(self):
        return self._live_info()["nbytes_packed"]

    @property
    def nbytes_original(self):
        return self._live_info()["nbytes_original"]

    @property
    def backend(self):
        return self._h.backend

    @property
    def stats(self):
        """Counters: states_built, cache_hits (runs that built nothing), evictions, runs, and
        split_runs (int8 runs on oneDNN without VNNI that split a wide input, exact at twice the
        work: weights outside [-64, 64] and inputs above 127)."""
        return self._h.stats()

    def _state(self):
        return "closed" if self.closed else ("original kept" if self.has_original else "original released")
