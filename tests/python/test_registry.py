"""The core's op interface as Python sees it: the backend registry, one
qparams rule, honest counters and close state (issue: one op interface)."""
import numpy as np
import pytest

import qpack
from qpack import _core


def test_backends_come_from_the_registry():
    b = qpack.backends()
    assert list(b) == [info["name"] for info in _core.backend_infos()]
    assert list(b) == ["onednn", "qnnpack"]  # AUTO's preference order on x86-64
    assert b["onednn"]["linear"] == ["f32", "int8_static", "int8_dynamic"]
    assert b["onednn"]["conv2d"] == ["f32", "int8_static"]
    assert b["qnnpack"]["linear"] == ["int8_static", "int8_dynamic"]
    assert b["qnnpack"]["conv2d"] == ["int8_static"]
    assert all(v["compiled"] for v in b.values())
    assert b["onednn"]["weight_quantization"] == ["per_tensor_symmetric", "per_channel_symmetric"]
    assert b["qnnpack"]["weight_quantization"] == ["per_tensor_affine", "per_channel_affine"]
    assert qpack.build_info()["version"] == qpack.__version__
    assert {"conv2d", "linear", "add", "mul", "concat", "quantize"} <= set(qpack.build_info()["graph_nodes"])


def test_auto_follows_the_registry(backend):
    """AUTO on x86-64: oneDNN for fp32 and int8; QNNPACK for int8 weights with zero points,
    which oneDNN does not take."""
    w8 = np.ones((4, 3), np.int8)
    assert qpack.PackedLinear(np.ones((4, 3), np.float32)).backend == "onednn"
    assert qpack.PackedLinear(w8, weight_scale=0.1, dynamic=True).backend == "onednn"
    torch = pytest.importorskip("torch")
    w = torch.randn(4, 3)
    asym = torch.quantize_per_tensor(w, 0.1, 3, torch.qint8)
    assert qpack.PackedLinear(asym, dynamic=True).backend == "qnnpack"
    per_channel = torch.quantize_per_channel(w, torch.full((4,), 0.1, dtype=torch.double),
                                             torch.tensor([0, 0, 1, 0]), 0, torch.qint8)
    assert qpack.PackedLinear(per_channel, output_scale=0.1, output_zero_point=0).backend == "qnnpack"
    sym = torch.quantize_per_tensor(w, 0.1, 0, torch.qint8)
    assert qpack.PackedLinear(sym, dynamic=True).backend == "onednn"
    conv = qpack.PackedConv2d(np.ones((4, 3, 1, 1), np.float32))
    assert conv.backend == "onednn"
    q = qpack.PackedConv2d(np.ones((4, 3, 1, 1), np.int8), weight_scale=0.1, output_scale=0.1, output_zero_point=0)
    assert q.backend == "onednn"


@pytest.mark.parametrize("make,exc,fragment", [
    (lambda: qpack.PackedLinear(np.ones((2, 3), np.float32), backend="tpu"),
     qpack.InvalidArgumentError, "unknown backend 'tpu'; use one of 'auto', 'onednn', 'qnnpack'"),
    (lambda: qpack.PackedConv2d(np.ones((2, 3, 1, 1), np.float32), backend="qnnpack"),
     qpack.UnsupportedError, "QNNPACK has no float32 convolution; use backend='onednn'"),
    (lambda: qpack.PackedConv2d(np.ones((2, 3, 1, 1), np.int8), weight_scale=0.1, output_scale=0.1,
                                output_zero_point=0, activation=("hardtanh", 2.0, 1.0)),
     qpack.InvalidArgumentError, "activation bounds need min < max"),
])
def test_registry_errors_name_the_alternative(make, exc, fragment):
    with pytest.raises(exc, match=fragment):
        make()


def test_asymmetric_weights_need_a_backend_that_takes_them(needs_torch):
    torch = needs_torch
    w = torch.quantize_per_tensor(torch.ones(2, 3), 0.1, 3, torch.qint8)
    with pytest.raises(qpack.UnsupportedError, match="oneDNN int8 needs symmetric weights"):
        qpack.PackedLinear(w, backend="onednn", output_scale=0.1, output_zero_point=0)
    assert qpack.PackedLinear(w, backend="qnnpack", output_scale=0.1, output_zero_point=0).backend == "qnnpack"


def test_one_uint8_qparams_rule(needs_torch):
    torch = needs_torch
    rng = np.random.default_rng(3)
    # (PyTorch ignores reduce_range under its qnnpack engine, which an earlier test may have left set)
    engine = torch.backends.quantized.engine
    torch.backends.quantized.engine = "x86" if "x86" in torch.backends.quantized.supported_engines else "fbgemm"
    try:
        for _ in range(200):
            lo, hi = sorted(rng.normal(0, 10, 2).astype(np.float32))
            x = torch.tensor([lo, hi], dtype=torch.float32)
            scale, zp = torch._choose_qparams_per_tensor(x, False)
            assert _core.choose_qparams_u8(float(lo), float(hi)) == (pytest.approx(scale, rel=1e-6), zp)
            scale, zp = torch._choose_qparams_per_tensor(x, True)  # reduce_range: [0, 127]
            assert _core.choose_qparams_u8(float(lo), float(hi), 127) == (pytest.approx(scale, rel=1e-6), zp)
    finally:
        torch.backends.quantized.engine = engine
    from qpack.torch import quantize
    assert quantize.uint8_qparams(-1.0, 3.0) == _core.choose_qparams_u8(-1.0, 3.0)
    assert quantize.uint8_qparams(-1.0, 3.0, 127) == _core.choose_qparams_u8(-1.0, 3.0, 127)
    for lo, hi in [(float("nan"), 1.0), (0.0, float("inf")), (2.0, 1.0)]:
        with pytest.raises(qpack.InvalidArgumentError, match="finite with min <= max"):
            _core.choose_qparams_u8(lo, hi)
    for qmax in (0, 256, -1):
        with pytest.raises(qpack.InvalidArgumentError, match=r"outside \[1, 255\]"):
            _core.choose_qparams_u8(-1.0, 1.0, qmax)


def test_int8_input_max_says_where_inputs_run_split():
    """255 where the backend's int8 kernels take any uint8 input at full speed; 127 for oneDNN
    on a CPU without VNNI (its ISA names no vnni/amx): inputs above 127 run split there."""
    infos = qpack.backends()
    for name, b in infos.items():
        if not b["available"]:
            assert b["int8_input_max"] == 0
            continue
        want = 255
        if name == "onednn":
            isa = b["version"].rpartition("isa=")[2]
            want = 255 if any(k in isa for k in ("vnni", "amx", "bf16", "fp16")) else 127
        assert b["int8_input_max"] == want, (name, b["version"])


def test_counters_mean_the_same_on_every_backend(backend):
    lin = qpack.PackedLinear(np.ones((4, 3), np.int8), backend=backend, weight_scale=0.1,
                             output_scale=0.1, output_zero_point=0)
    x = np.ones((2, 3), np.uint8)
    for _ in range(3):
        lin(x, scale=0.1, zero_point=0)
    st = lin.stats
    assert st["runs"] == 3
    assert st["cache_hits"] == 2  # the first run built its state (QNNPACK) or primitive (oneDNN)
    assert st["states_built"] >= 1


def test_onednn_counts_f32_hits_and_primitive_evictions():
    lin = qpack.PackedLinear(np.ones((4, 3), np.float32))
    # past 64 rows (fewer may run on qpack's own kernel, no primitive): 20 batch sizes
    # through a cache of 16 primitives
    for m in range(65, 85):
        lin(np.ones((m, 3), np.float32))
    lin(np.ones((84, 3), np.float32))
    st = lin.stats
    assert st["runs"] == 21 and st["cache_hits"] == 1
    assert st["evictions"] == 4
    assert st["states_built"] == 1
    # few rows: every run after the first counts as a hit, on either kernel; nothing evicted
    few = qpack.PackedLinear(np.ones((4, 3), np.float32))
    for m in (1, 1, 1, 1):
        few(np.ones((m, 3), np.float32))
    assert few.stats["runs"] == 4 and few.stats["cache_hits"] == 3 and few.stats["evictions"] == 0


def test_closed_is_reported_not_raised(backend):
    conv = qpack.PackedConv2d(np.ones((2, 2, 1, 1), np.int8), backend=backend, weight_scale=0.1,
                              output_scale=0.1, output_zero_point=0)
    assert not conv.closed
    conv.close()
    assert conv.closed
    with pytest.raises(qpack.ClosedError):
        conv.nbytes_packed


def test_released_error_is_gone():
    # Nothing needs a released original (unpack rebuilds it), so there is no such error.
    assert not hasattr(qpack, "ReleasedError")
