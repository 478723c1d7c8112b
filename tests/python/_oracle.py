"""PyTorch reference implementations (the numerical oracle)."""
import contextlib
import functools
import warnings

import numpy as np

SATURATING_ENGINES = ("x86", "onednn")


@functools.lru_cache(maxsize=None)
def torch_int8_exact():
    """Whether PyTorch's x86 and onednn engines compute static int8 exactly on this CPU.

    Without VNNI (AVX2, AVX-512 without VNNI) their u8 x s8 kernels add pairs of products in
    saturating int16 (vpmaddubsw): with full-range uint8 inputs and int8 weights a pair can
    reach 2 * 255 * 127 and clips at 32767, so their outputs are off by many quanta (measured
    12 on a 131-input linear on a Zen 3). qpack's oneDNN backend is exact there (it splits the
    input, test_no_vnni.py). Where they saturate, the oracle is PyTorch in float64 instead.
    The oneDNN that qpack loads names the ISA it dispatches to, the same one PyTorch's onednn
    engine picks (both read ONEDNN_MAX_CPU_ISA); FBGEMM, behind x86, needs VNNI in the CPU."""
    import qpack

    version = qpack.backends()["onednn"].get("version", "")
    isa = version.rpartition("isa=")[2].strip()
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    cpu_vnni = bool(flags & {"avx512_vnni", "avx_vnni"})
    return cpu_vnni and ("vnni" in isa or "amx" in isa or "bf16" in isa or "fp16" in isa)


def requantize(torch, y, out_scale, out_zp, relu=False):
    """float64 result -> uint8 the way the quantized ops round (half to even), as int32."""
    if relu:
        y = y.clamp(min=0)
    return (torch.round(y / out_scale) + out_zp).clamp(0, 255).to(torch.int32)


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
    """torch.ops.quantized.linear[_relu] on the given engine -> uint8 numpy (in float64 where
    the engine saturates on this CPU: torch_int8_exact)."""
    if engine_name in SATURATING_ENGINES and not torch_int8_exact():
        n = np.shape(w_int8)[0]
        zps = np.broadcast_to(np.asarray(0 if zero_points is None else zero_points, np.float64), (n,))
        ws = np.broadcast_to(np.asarray(scales, np.float64), (n,))
        w = torch.from_numpy((np.asarray(w_int8, np.float64) - zps[:, None]) * ws[:, None])
        x = (torch.from_numpy(np.asarray(x_u8, dtype=np.float64)) - in_zp) * in_scale
        y = x @ w.T + (0 if bias is None else torch.from_numpy(np.asarray(bias, dtype=np.float64)))
        return requantize(torch, y, out_scale, out_zp, relu).to(torch.uint8).numpy()
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
