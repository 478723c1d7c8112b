"""PyTorch reference implementations (the numerical oracle)."""
import contextlib
import warnings

import numpy as np


@contextlib.contextmanager
def engine(torch, name):
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous


def legacy_weight(torch, w_int8, scales, zero_points=None):
    w = torch.from_numpy(np.ascontiguousarray(w_int8))
    scales = np.atleast_1d(np.asarray(scales, dtype=np.float64))
    if scales.shape[0] == 1 and (zero_points is None or np.size(zero_points) == 1):
        zp = 0 if zero_points is None else int(np.atleast_1d(zero_points)[0])
        return torch._make_per_tensor_quantized_tensor(w, float(scales[0]), zp)
    zps = torch.zeros(scales.shape[0], dtype=torch.int64) if zero_points is None else \
        torch.from_numpy(np.asarray(zero_points, dtype=np.int64))
    return torch._make_per_channel_quantized_tensor(w, torch.from_numpy(scales), zps, 0)


def static_linear(torch, engine_name, w_int8, scales, bias, x_u8, in_scale, in_zp, out_scale, out_zp,
                  relu=False, zero_points=None):
    """torch.ops.quantized.linear[_relu] on the given engine -> uint8 numpy."""
    with engine(torch, engine_name):
        qw = legacy_weight(torch, w_int8, scales, zero_points)
        b = None if bias is None else torch.from_numpy(bias)
        packed = torch.ops.quantized.linear_prepack(qw, b)
        qx = torch._make_per_tensor_quantized_tensor(torch.from_numpy(np.ascontiguousarray(x_u8)),
                                                     float(in_scale), int(in_zp))
        op = torch.ops.quantized.linear_relu if relu else torch.ops.quantized.linear
        return op(qx, packed, float(out_scale), int(out_zp)).int_repr().numpy()


def dynamic_linear(torch, engine_name, w_int8, scales, bias, x):
    """torch.ao.nn.quantized.dynamic.Linear on the given engine -> float numpy."""
    n, k = w_int8.shape
    with engine(torch, engine_name), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ignores reduce_range.*")
        lin = torch.ao.nn.quantized.dynamic.Linear(k, n)
        lin.set_weight_bias(legacy_weight(torch, w_int8, scales),
                            None if bias is None else torch.from_numpy(bias))
        return lin(torch.from_numpy(x)).numpy()
