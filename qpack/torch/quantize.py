"""Where int8 weights come from: qpack's own quantization, torchao, torch.ao.

Everything here returns plain tensors plus explicit parameters: an int8
weight, one float32 scale per output channel (symmetric, zero point 0) and,
for static layers, uint8 input/output scale and zero point.
"""
import math

import torch

from qpack._core import InvalidArgumentError, UnsupportedError, choose_qparams_u8

_QMAX = 127


def quantize_weight_per_channel(weight, qmax=_QMAX):
    """Per-output-channel symmetric int8: (int8 weight, float32 scales).

    scale = max|w| / qmax per output channel, values on [-qmax, qmax]; an all-zero
    channel gets scale 1. qmax 64 (freeze's reduce_range="weights") keeps every
    u8 x s8 pair sum inside int16, which oneDNN's kernels without VNNI need.
    """
    if not isinstance(qmax, int) or not 1 <= qmax <= _QMAX:
        raise ValueError(f"qmax must be an int in [1, {_QMAX}], got {qmax!r}")
    w = weight.detach().to(torch.float32)
    flat = w.reshape(w.shape[0], -1)
    amax = flat.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    scale = torch.clamp(scale, min=torch.finfo(torch.float32).tiny * 2)
    shape = (-1,) + (1,) * (w.dim() - 1)
    q = torch.clamp(torch.round(w / scale.reshape(shape)), -qmax, qmax).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def dequantize_weight(qweight, scale):
    shape = (-1,) + (1,) * (qweight.dim() - 1)
    return (qweight.to(torch.float32) * scale.reshape(shape).to(torch.float32)).contiguous()


def uint8_qparams(lo, hi, qmax=255, what="a layer's input or output"):
    """Affine uint8 (scale, zero_point) covering [lo, hi] (widened to hold 0) with [0, qmax]:
    the core's rule (PyTorch's ChooseQuantizationParams, with its minimum scale, below which
    QNNPACK's int32 bias would overflow for ordinary biases). A calibrated range that is not
    finite (``what`` saw inf or NaN) raises InvalidArgumentError saying so."""
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise InvalidArgumentError(f"calibration saw {what} take the range [{lo}, {hi}], which must be finite: "
                                   "pass example_inputs without inf / NaN")
    return choose_qparams_u8(lo, hi, int(qmax))


# ---- torchao ---------------------------------------------------------------

def is_torchao_int8(weight):
    """True for a torchao Int8Tensor (quantize_ with an Int8*Config)."""
    cls = type(weight)
    return cls.__name__ == "Int8Tensor" and cls.__module__.startswith("torchao") and hasattr(weight, "qdata")


def torchao_int8_weight(weight):
    """(int8 weight, float32 per-row scales) of a torchao Int8Tensor."""
    q = weight.qdata
    scale = weight.scale
    if q.dtype != torch.int8:
        raise UnsupportedError(f"torchao weight holds {q.dtype}; qpack takes int8 qdata")
    scale = scale.reshape(-1).to(torch.float32)
    if scale.numel() == 1:
        scale = scale.expand(q.shape[0])
    if scale.numel() != q.shape[0]:
        raise UnsupportedError(
            f"torchao weight has {scale.numel()} scales for {q.shape[0]} rows; qpack takes per-row "
            "(PerRow) or per-tensor granularity, not block-wise groups")
    zp = getattr(weight, "zero_point", None)
    if zp is not None and torch.is_tensor(zp) and bool((zp != 0).any()):
        raise UnsupportedError("torchao weight is asymmetric (non-zero zero points); qpack takes symmetric int8")
    return q.detach().contiguous().clone(), scale.detach().contiguous().clone()


# ---- legacy torch.ao quantized tensors -------------------------------------------

def legacy_int8_weight(qweight):
    """(int8 weight, float32 per-channel scales) of a legacy torch.qint8 tensor."""
    if qweight.dtype != torch.qint8:
        raise UnsupportedError(f"quantized weight is {qweight.dtype}; qpack takes torch.qint8 weights")
    qs = qweight.qscheme()
    n = qweight.shape[0]
    if qs in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        if qweight.q_zero_point() != 0:
            raise UnsupportedError("quantized weight has a non-zero zero point; qpack takes symmetric int8 weights "
                                   "(use a symmetric weight observer)")
        scale = torch.full((n,), float(qweight.q_scale()), dtype=torch.float32)
    elif qs in (torch.per_channel_affine, torch.per_channel_symmetric):
        if qweight.q_per_channel_axis() != 0:
            raise UnsupportedError("per-channel weight must be quantized along axis 0 (output channels)")
        if bool((qweight.q_per_channel_zero_points() != 0).any()):
            raise UnsupportedError("quantized weight has non-zero zero points; qpack takes symmetric int8 weights")
        scale = qweight.q_per_channel_scales().to(torch.float32)
    else:
        raise UnsupportedError(f"unsupported weight qscheme {qs}")
    return qweight.int_repr().contiguous().clone(), scale.contiguous().clone()
