"""Bad input gets a clear exception and leaves the object usable."""
import numpy as np
import pytest

import qpack

F32 = np.float32
NAN, INF = float("nan"), float("inf")


def int8_w(n=4, k=3):
    return np.arange(n * k, dtype=np.int8).reshape(n, k)


CONSTRUCT_ERRORS = [
    # (kwargs, exception, message fragment)
    (dict(weight=np.ones((2, 3, 4), F32)), qpack.InvalidArgumentError, "2-D"),
    (dict(weight=np.ones((0, 3), F32)), qpack.InvalidArgumentError, "at least one"),
    (dict(weight=np.ones((2, 3), np.float64)), qpack.InvalidTypeError, "float32 or int8"),
    (dict(weight=np.ones((2, 3), np.int16)), qpack.InvalidTypeError, "float32 or int8"),
    (dict(weight=[[1.0]]), qpack.InvalidTypeError, "numpy array or a torch tensor"),
    (dict(weight=np.array([[NAN]], F32)), qpack.InvalidArgumentError, "NaN"),
    (dict(weight=np.ones((2, 3), F32), bias=np.ones(3, F32)), qpack.InvalidArgumentError, "bias must have shape"),
    (dict(weight=np.ones((2, 3), F32), bias=np.ones(2, np.float64)), qpack.InvalidTypeError, "bias must be float32"),
    (dict(weight=np.ones((2, 3), F32), bias=np.array([1, INF], F32)), qpack.InvalidArgumentError, "bias holds"),
    (dict(weight=np.ones((2, 3), F32), backend="cuda"), qpack.InvalidArgumentError, "backend"),
    (dict(weight=np.ones((2, 3), F32), backend="qnnpack"), qpack.UnsupportedError, "QNNPACK has no float32"),
    (dict(weight=np.ones((2, 3), F32), retain="yes"), qpack.InvalidTypeError, "retain"),
    (dict(weight=np.ones((2, 3), F32), activation="gelu"), qpack.InvalidArgumentError, "unknown activation"),
    (dict(weight=np.ones((2, 3), F32), activation=("hardtanh", 1.0, -1.0)), qpack.InvalidArgumentError, "min < max"),
    (dict(weight=np.ones((2, 3), F32), dynamic=True), qpack.InvalidArgumentError, "quantize it to int8"),
    (dict(weight=int8_w()), qpack.InvalidArgumentError, "weight_scale"),
    (dict(weight=int8_w(), weight_scale=0.1), qpack.InvalidArgumentError, "static layer"),
    (dict(weight=int8_w(), weight_scale=0.0, dynamic=True), qpack.InvalidArgumentError, "valid scale"),
    (dict(weight=int8_w(), weight_scale=-1.0, dynamic=True), qpack.InvalidArgumentError, "valid scale"),
    (dict(weight=int8_w(), weight_scale=NAN, dynamic=True), qpack.InvalidArgumentError, "valid scale"),
    (dict(weight=int8_w(), weight_scale=INF, dynamic=True), qpack.InvalidArgumentError, "valid scale"),
    (dict(weight=int8_w(), weight_scale=1e-45, dynamic=True), qpack.InvalidArgumentError, "scale"),
    (dict(weight=int8_w(), weight_scale=[0.1, 0.2], dynamic=True), qpack.InvalidArgumentError, "one per output"),
    (dict(weight=int8_w(), weight_scale="x", dynamic=True), qpack.InvalidTypeError, "weight_scale"),
    (dict(weight=int8_w(), weight_scale=0.1, output_scale=0.1, output_zero_point=256),
     qpack.InvalidArgumentError, "outside"),
    (dict(weight=int8_w(), weight_scale=0.1, output_scale=0.1, output_zero_point=-1),
     qpack.InvalidArgumentError, "outside"),
    (dict(weight=int8_w(), weight_scale=0.1, output_scale=NAN, output_zero_point=0),
     qpack.InvalidArgumentError, "valid scale"),
    (dict(weight=int8_w(), weight_scale=0.1, output_scale=0.1, output_zero_point=1.5),
     qpack.InvalidTypeError, "must be an int"),
    (dict(weight=int8_w(), weight_scale=0.1, output_scale=0.1, output_zero_point=0, input_scale=0.0),
     qpack.InvalidArgumentError, "valid scale"),
    (dict(weight=int8_w(), weight_scale=0.1, dynamic=True, output_scale=0.1),
     qpack.InvalidArgumentError, "static int8 layers only"),
]


@pytest.mark.parametrize("kwargs,exc,fragment", CONSTRUCT_ERRORS)
def test_constructor_rejects(kwargs, exc, fragment):
    kwargs = dict(kwargs)
    weight = kwargs.pop("weight")
    with pytest.raises(exc, match=fragment) as info:
        qpack.PackedLinear(weight, **kwargs)
    assert isinstance(info.value, qpack.Error)
    assert isinstance(info.value, (ValueError, TypeError, NotImplementedError))


def make(kind, backend):
    if kind == "f32":
        return qpack.PackedLinear(np.ones((4, 3), F32), np.zeros(4, F32))
    if kind == "dynamic":
        return qpack.PackedLinear(int8_w(), backend=backend, weight_scale=0.1, dynamic=True)
    bias = np.full(4, 3.0, np.float32) if kind == "static_bias" else None
    return qpack.PackedLinear(int8_w(), bias, backend=backend, weight_scale=0.1, output_scale=0.5,
                              output_zero_point=10)


def good_input(kind):
    return np.ones((2, 3), np.uint8 if kind.startswith("static") else F32)


RUN_ERRORS = [
    # (kind, input builder, call kwargs, exception, fragment)
    ("f32", lambda: np.ones((2, 4), F32), {}, qpack.InvalidArgumentError, "features"),
    ("f32", lambda: np.array(1.0, dtype=F32), {}, qpack.InvalidArgumentError, "at least one dimension"),
    ("f32", lambda: np.ones((2, 3), np.float64), {}, qpack.InvalidTypeError, "float32"),
    ("f32", lambda: np.ones((3, 2), F32).T, {}, qpack.InvalidArgumentError, "contiguous"),
    ("f32", lambda: np.ones((2, 3), np.uint8), {}, qpack.InvalidTypeError, "float32"),
    ("f32", lambda: np.ones((2, 3), F32), {"scale": 0.1}, qpack.InvalidArgumentError, "static int8 layers only"),
    ("f32", lambda: "x", {}, qpack.InvalidTypeError, "numpy array"),
    ("dynamic", lambda: np.array([[1, NAN, 2]], F32), {}, qpack.InvalidArgumentError, "NaN or infinity"),
    ("dynamic", lambda: np.array([[1, INF, 2]], F32), {}, qpack.InvalidArgumentError, "NaN or infinity"),
    ("dynamic", lambda: np.ones((2, 5), F32), {}, qpack.InvalidArgumentError, "features"),
    ("static", lambda: np.ones((2, 3), np.uint8), {}, qpack.InvalidArgumentError, "no input scale"),
    ("static", lambda: np.ones((2, 3), np.int8), {"scale": 0.1, "zero_point": 0}, qpack.InvalidTypeError, "uint8"),
    ("static", lambda: np.ones((2, 3), F32), {"scale": 0.1, "zero_point": 0}, qpack.InvalidTypeError, "uint8"),
    ("static", lambda: np.ones((2, 3), np.uint8), {"scale": 0.0, "zero_point": 0}, qpack.InvalidArgumentError, "valid scale"),
    ("static", lambda: np.ones((2, 3), np.uint8), {"scale": -0.1, "zero_point": 0}, qpack.InvalidArgumentError, "valid scale"),
    ("static", lambda: np.ones((2, 3), np.uint8), {"scale": NAN, "zero_point": 0}, qpack.InvalidArgumentError, "valid scale"),
    ("static", lambda: np.ones((2, 3), np.uint8), {"scale": INF, "zero_point": 0}, qpack.InvalidArgumentError, "valid scale"),
    ("static", lambda: np.ones((2, 3), np.uint8), {"scale": 1e-40, "zero_point": 0}, qpack.InvalidArgumentError, "scale"),
    ("static", lambda: np.ones((2, 3), np.uint8), {"scale": 2e-38, "zero_point": 0}, qpack.InvalidArgumentError, "requantization"),
    ("static", lambda: np.ones((2, 3), np.uint8), {"scale": 0.1, "zero_point": 300}, qpack.InvalidArgumentError, "outside"),
    ("static", lambda: np.ones((2, 3), np.uint8), {"scale": 0.1, "zero_point": -5}, qpack.InvalidArgumentError, "outside"),
    ("static", lambda: np.ones((2, 4), np.uint8), {"scale": 0.1, "zero_point": 0}, qpack.InvalidArgumentError, "features"),
    ("static_bias", lambda: np.ones((2, 3), np.uint8), {"scale": 1e-12, "zero_point": 0}, qpack.InvalidArgumentError,
     "int32 bias"),
]


@pytest.mark.parametrize("kind,build,kwargs,exc,fragment", RUN_ERRORS)
def test_run_rejects_and_object_stays_usable(backend, kind, build, kwargs, exc, fragment):
    if kind == "f32" and backend == "qnnpack":
        pytest.skip("QNNPACK has no float32 linear")
    if fragment in ("requantization", "int32 bias") and backend == "onednn":
        pytest.skip("oneDNN applies scales at run time in float; no requantization-scale limit")
    lin = make(kind, backend)
    x0 = good_input(kind)
    call_kw = {"scale": 0.1, "zero_point": 3} if kind.startswith("static") else {}
    before = lin(x0, **call_kw)
    with pytest.raises(exc, match=fragment) as info:
        lin(build(), **kwargs)
    assert isinstance(info.value, qpack.Error)
    np.testing.assert_array_equal(lin(x0, **call_kw), before)


def test_policy_functions_reject_bad_values():
    with pytest.raises(qpack.InvalidTypeError):
        qpack.set_default_retain("no")
    with pytest.raises(qpack.InvalidTypeError):
        with qpack.retain(None):
            pass
    with pytest.raises(qpack.InvalidArgumentError):
        qpack.set_num_threads(-3)
    with pytest.raises(TypeError):
        qpack.set_num_threads("2")


def test_torch_bad_inputs(needs_torch):
    torch = needs_torch
    lin = qpack.PackedLinear(torch.randn(4, 3))
    with pytest.raises(qpack.InvalidTypeError, match="float32"):
        lin(torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(qpack.InvalidArgumentError, match="contiguous"):
        lin(torch.ones(3, 2).t())
    with pytest.raises(qpack.InvalidTypeError, match="torch.qint8"):
        qpack.PackedLinear(torch.quantize_per_tensor(torch.randn(4, 3), 0.1, 0, torch.quint8),
                           output_scale=0.1, output_zero_point=0)
    with pytest.raises(qpack.InvalidArgumentError, match="carries its own"):
        qpack.PackedLinear(torch.quantize_per_tensor(torch.randn(4, 3), 0.1, 0, torch.qint8),
                           weight_scale=0.1, output_scale=0.1, output_zero_point=0)
    assert lin(torch.ones(2, 3)).shape == (2, 4)
