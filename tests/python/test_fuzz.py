"""Hypothesis fuzzing of the public API: no input may crash the process, and
every rejection is a qpack.Error (also ValueError/TypeError/...) that names
the problem."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qpack

SCALES = st.one_of(
    st.floats(min_value=1e-4, max_value=1.0),
    st.sampled_from([0.0, -0.1, math.nan, math.inf, -math.inf, 1e-45, 1e-39, 1e38, 3e38, 1e300]),
)
ZERO_POINTS = st.one_of(st.integers(0, 255), st.sampled_from([-1, 256, -(2**31), 2**31, 2**40]))
DTYPES = st.sampled_from([np.float32, np.float64, np.int8, np.uint8, np.int32, np.float16, np.bool_])
ALLOWED = (qpack.Error,)
FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))


def check_rejection(exc):
    assert isinstance(exc, ALLOWED), f"unexpected {type(exc).__name__}: {exc}"
    assert isinstance(exc, (ValueError, TypeError, NotImplementedError, MemoryError))
    assert str(exc), "error message must not be empty"


def rand_array(rng, shape, dtype):
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -128), min(info.max, 255) + 1, size=shape).astype(dtype)


@st.composite
def constructions(draw):
    n = draw(st.integers(0, 40))
    k = draw(st.integers(0, 40))
    wdtype = draw(DTYPES)
    ndim = draw(st.sampled_from([2, 2, 2, 1, 3]))
    shape = (n, k) if ndim == 2 else ((n,) if ndim == 1 else (n, k, 2))
    kw = {"backend": draw(st.sampled_from(["auto", "onednn", "qnnpack", "x"]))}
    if draw(st.booleans()):
        kw["weight_scale"] = draw(st.one_of(SCALES, st.lists(SCALES, min_size=0, max_size=3)))
    mode = draw(st.sampled_from(["none", "static", "dynamic"]))
    if mode == "static":
        kw["output_scale"] = draw(SCALES)
        kw["output_zero_point"] = draw(ZERO_POINTS)
        if draw(st.booleans()):
            kw["input_scale"] = draw(SCALES)
            kw["input_zero_point"] = draw(ZERO_POINTS)
    elif mode == "dynamic":
        kw["dynamic"] = True
    bias_len = draw(st.sampled_from([None, n, n + 1, 0]))
    bias_dtype = draw(st.sampled_from([np.float32, np.float32, np.float64]))
    act = draw(st.sampled_from([None, "relu", "relu6", ("hardtanh", -1.0, 1.0), ("hardtanh", 1.0, -1.0), "gelu"]))
    seed = draw(st.integers(0, 2**16))
    return shape, wdtype, kw, bias_len, bias_dtype, act, seed


@pytest.mark.slow
@FUZZ
@given(constructions())
def test_fuzz_construct_and_run(case):
    shape, wdtype, kw, bias_len, bias_dtype, act, seed = case
    rng = np.random.default_rng(seed)
    w = rand_array(rng, shape, wdtype)
    b = None if bias_len is None else rng.standard_normal(bias_len).astype(bias_dtype)
    try:
        lin = qpack.PackedLinear(w, b, activation=act, **kw)
    except Exception as exc:  # noqa: BLE001 - the point is to classify it
        check_rejection(exc)
        return
    k = lin.in_features
    for m in (0, 1, 3):
        x = rng.standard_normal((m, k)).astype(np.float32)
        xq = rng.integers(0, 256, size=(m, k), dtype=np.uint8)
        for inp, call_kw in ((x, {}), (xq, {"scale": 0.05, "zero_point": 7}), (xq, {})):
            try:
                y = lin(inp, **call_kw)
            except Exception as exc:  # noqa: BLE001
                check_rejection(exc)
            else:
                assert y.shape == (m, lin.out_features)
    w2, _ = lin.unpack()
    lin.release_original()
    w3, _ = lin.unpack()
    np.testing.assert_array_equal(w2, w3)


@st.composite
def run_inputs(draw):
    lead = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=3)))
    k = draw(st.sampled_from([7, 8, 6]))
    dtype = draw(DTYPES)
    layout = draw(st.sampled_from(["c", "f", "strided", "neg"]))
    scale = draw(st.one_of(st.none(), SCALES))
    zp = draw(st.one_of(st.none(), ZERO_POINTS))
    special = draw(st.sampled_from([None, math.nan, math.inf, -math.inf, 1e38, 1e-42]))
    return lead, k, dtype, layout, scale, zp, special


@pytest.mark.slow
@FUZZ
@given(run_inputs(), st.sampled_from(["f32", "static", "dynamic"]), st.sampled_from(["onednn", "qnnpack"]))
def test_fuzz_run_inputs(inp, kind, backend):
    lead, k, dtype, layout, scale, zp, special = inp
    if kind == "f32":
        lin = qpack.PackedLinear(np.ones((5, 7), np.float32))
    elif kind == "static":
        lin = qpack.PackedLinear(np.ones((5, 7), np.int8), backend=backend, weight_scale=0.1,
                                 output_scale=0.2, output_zero_point=3)
    else:
        lin = qpack.PackedLinear(np.ones((5, 7), np.int8), backend=backend, weight_scale=0.1, dynamic=True)
    rng = np.random.default_rng(0)
    x = rand_array(rng, lead + (k * 2,), dtype)
    if special is not None and x.dtype in (np.float32, np.float64) and x.size:
        x.flat[0] = special
    x = x[..., ::2] if layout == "strided" else x[..., :k]
    if layout == "f" and x.ndim >= 2:
        x = np.asfortranarray(x)
    elif layout == "neg":
        x = x[..., ::-1]
    kwargs = {}
    if scale is not None:
        kwargs["scale"] = scale
    if zp is not None:
        kwargs["zero_point"] = zp
    try:
        y = lin(x, **kwargs)
    except Exception as exc:  # noqa: BLE001
        check_rejection(exc)
    else:
        assert y.shape == x.shape[:-1] + (5,)
    # The object stays usable.
    ok = np.ones((2, 7), np.uint8 if kind == "static" else np.float32)
    assert lin(ok, **({"scale": 0.1, "zero_point": 0} if kind == "static" else {})).shape == (2, 5)


def mostly(draw, good, bad):
    """Draw from `good` about 85% of the time, else from `bad` (invalid values)."""
    return draw(st.sampled_from(bad)) if draw(st.integers(0, 99)) >= 85 else draw(st.sampled_from(good))


@st.composite
def conv_cases(draw):
    groups = mostly(draw, [1, 1, 2, 3], [0, -1, 5])
    g = max(groups, 1)
    cin = g * mostly(draw, [1, 2, 3], [0])
    cout = g * mostly(draw, [1, 2, 4], [0])
    kh, kw = mostly(draw, [1, 2, 3], [0]), mostly(draw, [1, 3, 4], [0, 12])
    wshape = mostly(draw, [(cout, cin // g, kh, kw)], [(cout, cin, kh), (cout, cin // g, kh, kw, 1), (cout, cin + 1, kh, kw)])
    kw_args = {
        "stride": mostly(draw, [1, 2, (1, 2)], [0, (1,), -1]),
        "padding": mostly(draw, [0, 1, 2, (0, 1), "same", "valid"], ["full", -1]),
        "dilation": mostly(draw, [1, 2, (2, 1)], [0]),
        "groups": groups,
        "backend": draw(st.sampled_from(["auto", "onednn", "qnnpack"])),
    }
    quant = draw(st.booleans())
    if quant:
        kw_args["weight_scale"] = draw(st.one_of(SCALES, st.lists(SCALES, min_size=1, max_size=3)))
        kw_args["output_scale"] = draw(SCALES)
        kw_args["output_zero_point"] = draw(ZERO_POINTS)
    in_shape = (draw(st.integers(0, 2)), mostly(draw, [cin], [cin + 1]), draw(st.integers(1, 9)),
                draw(st.integers(1, 9)))
    layout = draw(st.sampled_from(["nchw", "nhwc", "strided"]))
    scale, zp = draw(SCALES), draw(ZERO_POINTS)
    return wshape, quant, kw_args, in_shape, layout, scale, zp, draw(st.integers(0, 2**16))


@pytest.mark.slow
@FUZZ
@given(conv_cases())
def test_fuzz_conv2d(case):
    wshape, quant, kw_args, in_shape, layout, scale, zp, seed = case
    rng = np.random.default_rng(seed)
    w = rand_array(rng, wshape, np.int8 if quant else np.float32)
    try:
        conv = qpack.PackedConv2d(w, **kw_args)
    except Exception as exc:  # noqa: BLE001
        check_rejection(exc)
        return
    x = rand_array(rng, in_shape if layout != "strided" else in_shape[:3] + (in_shape[3] * 2,),
                   np.uint8 if quant else np.float32)
    if layout == "nhwc":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    elif layout == "strided":
        x = x[..., ::2]
    call_kw = {"scale": scale, "zero_point": zp} if quant else {}
    try:
        y = conv(x, **call_kw)
    except Exception as exc:  # noqa: BLE001
        check_rejection(exc)
    else:
        assert y.shape[:2] == (in_shape[0], conv.out_channels)
    conv.release_original()
    np.testing.assert_array_equal(conv.unpack()[0], w)
