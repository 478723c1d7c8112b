"""PackedLinear against PyTorch, on every backend."""
import gc
import threading

import numpy as np
import pytest

import qpack
from _oracle import dynamic_linear, static_linear

# (batch shape, K, N): K and N not multiples of any block size, K=1, N=1, batch 0.
SHAPES = [((1,), 1, 1), ((3,), 5, 7), ((2, 3), 17, 33), ((0,), 9, 4), ((4,), 64, 1),
          ((1,), 1, 130), ((5,), 131, 67), ((8,), 256, 96)]
ENGINES = {"qnnpack": ["qnnpack"], "onednn": ["x86", "onednn"]}


def rand_int8(rng, n, k):
    return rng.integers(-127, 128, size=(n, k), dtype=np.int8)


def rand_scales(rng, n, per_channel):
    return (rng.random(n if per_channel else 1) * 0.02 + 0.002).astype(np.float32)


# ---- fp32 ----------------------------------------------------------------

@pytest.mark.parametrize("lead,k,n", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", [None, "relu", "relu6", ("hardtanh", -0.5, 0.25)])
def test_fp32_matches_torch(needs_torch, lead, k, n, bias, activation):
    torch = needs_torch
    w = torch.randn(n, k)
    b = torch.randn(n) if bias else None
    x = torch.randn(*lead, k)
    lin = qpack.PackedLinear(w, b, activation=activation)
    ref = torch.nn.functional.linear(x, w, b)
    if activation == "relu":
        ref = torch.relu(ref)
    elif activation == "relu6":
        ref = torch.nn.functional.relu6(ref)
    elif activation is not None:
        ref = torch.nn.functional.hardtanh(ref, activation[1], activation[2])
    y = lin(x)
    assert isinstance(y, torch.Tensor) and y.shape == ref.shape and y.dtype == torch.float32
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5 * max(1.0, float(ref.abs().max()) if ref.numel() else 1.0))


def test_fp32_numpy_in_numpy_out():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 10)).astype(np.float32)
    x = rng.standard_normal((4, 10)).astype(np.float32)
    y = qpack.PackedLinear(w)(x)
    assert isinstance(y, np.ndarray)
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-5, atol=1e-5)


def test_fp32_many_batch_sizes_one_object(needs_torch):
    torch = needs_torch
    w, b = torch.randn(40, 24), torch.randn(40)
    lin = qpack.PackedLinear(w, b)
    for m in [1, 2, 3, 64, 65, 200, 1, 7]:
        x = torch.randn(m, 24)
        torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-4)


def test_fp32_few_rows_tails_threads_and_nan(needs_torch):
    """Few rows (at most 64, on AVX2 qpack's own kernel over the packed weight) at every row
    count of its tiles of 3 and past them, K off multiples of 8 and N off multiples of 4, on
    1 and 2 threads; a NaN or inf in a row reaches that row's outputs as in PyTorch."""
    torch = needs_torch
    gen = torch.Generator().manual_seed(5)
    for k, n in ((1029, 37), (64, 4096), (3, 5)):
        w, b = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
        for threads in (1, 2):  # conftest's autouse fixture restores the process setting
            qpack.set_num_threads(threads)
            lin = qpack.PackedLinear(w, b)
            for m in (1, 2, 3, 4, 5, 16, 64, 65):
                x = torch.randn(m, k, generator=gen)
                ref = torch.nn.functional.linear(x, w, b)
                torch.testing.assert_close(lin(x), ref, rtol=1e-5, atol=1e-5 * max(1.0, float(ref.abs().max())))
            x = torch.randn(4, k, generator=gen)
            x[1, k // 2], x[2, 0] = float("nan"), float("inf")
            ref, y = torch.nn.functional.linear(x, w, b), lin(x)
            assert torch.equal(y.isnan(), ref.isnan()) and torch.equal(y.isinf(), ref.isinf()), (k, n)
            torch.testing.assert_close(y[::3], ref[::3], rtol=1e-5, atol=1e-4)


def test_fp32_few_rows_on_onednn_kernel_too(needs_torch, monkeypatch):
    """QPACK_ONEDNN_OWN_GEMM=0 when a linear is made keeps few rows on oneDNN's gemm: the same
    results to fp32 rounding."""
    torch = needs_torch
    gen = torch.Generator().manual_seed(6)
    w, b, x = torch.randn(37, 1029, generator=gen), torch.randn(37, generator=gen), torch.randn(5, 1029, generator=gen)
    own = qpack.PackedLinear(w, b)
    monkeypatch.setenv("QPACK_ONEDNN_OWN_GEMM", "0")
    onednn = qpack.PackedLinear(w, b)
    ref = torch.nn.functional.linear(x, w, b)
    for lin in (own, onednn):
        torch.testing.assert_close(lin(x), ref, rtol=1e-5, atol=1e-4)
    # which kernel ran: oneDNN builds a primitive per batch size (new sizes are misses), the
    # own kernel none (every run after the first is a hit); it runs where oneDNN's fp32
    # matmul is its gemm, i.e. at most AVX2
    for m in (1, 2, 3):
        for lin in (own, onednn):
            lin(x[:m])
    assert onednn.stats["cache_hits"] == 0, onednn.stats
    isa = qpack.backends()["onednn"]["version"].split("isa=")[1].split()[0].rstrip(";,")
    if isa == "avx2":
        assert own.stats["cache_hits"] == 3, own.stats


# ---- static int8 ----------------------------------------------------------

@pytest.mark.parametrize("lead,k,n", SHAPES)
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("relu", [False, True])
def test_static_int8_matches_torch(needs_torch, backend, lead, k, n, per_channel, bias, relu):
    torch = needs_torch
    rng = np.random.default_rng(k * 131 + n)
    w = rand_int8(rng, n, k)
    ws = rand_scales(rng, n, per_channel)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    x = rng.integers(0, 256, size=lead + (k,), dtype=np.uint8)
    in_s, in_zp, out_s, out_zp = 0.04, 117, 0.2 + 0.01 * k, 93
    lin = qpack.PackedLinear(w, b, backend=backend, weight_scale=ws, activation="relu" if relu else None,
                             output_scale=out_s, output_zero_point=out_zp)
    y = lin(x, scale=in_s, zero_point=in_zp)
    assert y.dtype == np.uint8 and y.shape == lead + (n,)
    for eng in ENGINES[backend]:
        ref = static_linear(torch, eng, w, ws, b, x.reshape(-1, k), in_s, in_zp, out_s, out_zp, relu=relu)
        diff = np.abs(y.reshape(-1, n).astype(np.int32) - ref.astype(np.int32))
        assert diff.size == 0 or diff.max() <= 1, f"{eng}: max diff {diff.max()}"


def test_static_int8_legacy_tensors(needs_torch, backend):
    torch = needs_torch
    k, n = 19, 11
    w = torch.quantize_per_tensor(torch.randn(n, k), 0.02, 0, torch.qint8)
    x = torch.quantize_per_tensor(torch.rand(3, k), 0.01, 3, torch.quint8)
    b = torch.randn(n)
    lin = qpack.PackedLinear(w, b, backend=backend, output_scale=0.1, output_zero_point=64)
    y = lin(x)
    assert y.dtype == torch.quint8 and y.q_scale() == pytest.approx(0.1) and y.q_zero_point() == 64
    eng = ENGINES[backend][0]
    ref = static_linear(torch, eng, w.int_repr().numpy(), [0.02], b.numpy(), x.int_repr().numpy(),
                        0.01, 3, 0.1, 64)
    assert np.abs(y.int_repr().numpy().astype(int) - ref.astype(int)).max() <= 1
    lin.release_original()
    w2, b2 = lin.unpack()
    assert w2.dtype == torch.qint8 and w2.q_scale() == pytest.approx(0.02)
    assert torch.equal(w2.int_repr(), w.int_repr()) and torch.equal(b2, b)


def test_static_int8_legacy_per_channel_weight(needs_torch, backend):
    torch = needs_torch
    n, k = 9, 13
    scales = torch.rand(n, dtype=torch.float64) * 0.01 + 0.001
    w = torch.quantize_per_channel(torch.randn(n, k), scales, torch.zeros(n, dtype=torch.int64), 0, torch.qint8)
    lin = qpack.PackedLinear(w, backend=backend, retain=False, output_scale=0.05, output_zero_point=10)
    w2, _ = lin.unpack()
    assert w2.qscheme() == torch.per_channel_affine
    assert torch.equal(w2.int_repr(), w.int_repr())
    torch.testing.assert_close(w2.q_per_channel_scales().float(), scales.float())


def test_qnnpack_asymmetric_weight_zero_point(needs_torch):
    torch = needs_torch
    n, k = 10, 21
    rng = np.random.default_rng(3)
    w = rng.integers(-100, 100, size=(n, k), dtype=np.int8)
    qw = torch._make_per_tensor_quantized_tensor(torch.from_numpy(w), 0.01, 5)
    x = rng.integers(0, 256, size=(4, k), dtype=np.uint8)
    lin = qpack.PackedLinear(qw, backend="qnnpack", output_scale=0.3, output_zero_point=128)
    ref = static_linear(torch, "qnnpack", w, [0.01], None, x, 0.05, 100, 0.3, 128, zero_points=[5])
    y = lin(x, scale=0.05, zero_point=100)
    assert np.abs(y.astype(int) - ref.astype(int)).max() <= 1
    with pytest.raises(qpack.UnsupportedError, match="symmetric"):
        qpack.PackedLinear(qw, backend="onednn", output_scale=0.3, output_zero_point=128)


def test_static_input_scale_at_construction_and_change(backend):
    rng = np.random.default_rng(5)
    n, k = 12, 30
    w = rand_int8(rng, n, k)
    b = rng.standard_normal(n).astype(np.float32)
    x = rng.integers(0, 256, size=(5, k), dtype=np.uint8)
    lin = qpack.PackedLinear(w, b, backend=backend, weight_scale=0.01, input_scale=0.02,
                             input_zero_point=128, output_scale=0.1, output_zero_point=128)
    y1 = lin(x)
    np.testing.assert_array_equal(y1, lin(x, scale=0.02, zero_point=128))
    lin.release_original()
    y2 = lin(x, scale=0.05, zero_point=100)  # re-packs from the packed form
    fresh = qpack.PackedLinear(w, b, backend=backend, weight_scale=0.01, output_scale=0.1, output_zero_point=128)
    np.testing.assert_array_equal(y2, fresh(x, scale=0.05, zero_point=100))
    np.testing.assert_array_equal(y1, lin(x))


def test_qnnpack_states_are_cached_and_counted():
    rng = np.random.default_rng(6)
    w = rand_int8(rng, 8, 8)
    lin = qpack.PackedLinear(w, np.ones(8, np.float32), backend="qnnpack", weight_scale=0.01,
                             output_scale=0.1, output_zero_point=0)
    x = rng.integers(0, 256, size=(2, 8), dtype=np.uint8)
    for s in [0.1, 0.1, 0.2, 0.1, 0.3, 0.3]:
        lin(x, scale=s, zero_point=0)
    st = lin.stats
    assert st["runs"] == 6
    assert st["states_built"] == 4  # placeholder + 0.1, 0.2, 0.3
    assert st["cache_hits"] == 3
    assert st["evictions"] == 1


# ---- dynamic int8 ----------------------------------------------------------

@pytest.mark.parametrize("lead,k,n", [s for s in SHAPES if s[0] != (0,)])
@pytest.mark.parametrize("bias", [True, False])
def test_dynamic_int8_matches_torch_qnnpack(needs_torch, backend, lead, k, n, bias):
    torch = needs_torch
    rng = np.random.default_rng(k + 7 * n)
    w = rand_int8(rng, n, k)
    ws = rand_scales(rng, n, False)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    x = (rng.standard_normal(lead + (k,)) * 3).astype(np.float32)
    lin = qpack.PackedLinear(w, b, backend=backend, weight_scale=ws, dynamic=True)
    y = lin(x)
    ref = dynamic_linear(torch, "qnnpack", w, ws, b, x.reshape(-1, k)).reshape(lead + (n,))
    tol = 1e-5 * max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=tol)


def test_dynamic_batch_zero(backend):
    lin = qpack.PackedLinear(np.ones((3, 4), np.int8), backend=backend, weight_scale=0.1, dynamic=True)
    assert lin(np.zeros((0, 4), np.float32)).shape == (0, 3)


# ---- unpack and lifetime ----------------------------------------------------

@pytest.mark.parametrize("lead,k,n", SHAPES)
@pytest.mark.parametrize("mode", ["f32", "static", "dynamic"])
def test_unpack_after_release_is_bit_exact(backend, lead, k, n, mode):
    rng = np.random.default_rng(n * 1000 + k)
    if mode == "f32":
        if backend == "qnnpack":
            pytest.skip("QNNPACK has no float32 linear (oneDNN covers it)")
        w = rng.standard_normal((n, k)).astype(np.float32)
        kw = {}
    else:
        w = rng.integers(-128, 128, size=(n, k), dtype=np.int8)
        kw = {"weight_scale": rand_scales(rng, n, True)}
        kw.update({"dynamic": True} if mode == "dynamic" else {"output_scale": 0.1, "output_zero_point": 3})
    b = rng.standard_normal(n).astype(np.float32)
    lin = qpack.PackedLinear(w, b, backend=backend, retain=False, **kw)
    assert not lin.has_original and lin.nbytes_original == 0
    w2, b2 = lin.unpack()
    assert w2.dtype == w.dtype
    np.testing.assert_array_equal(w2.view(np.uint8), w.view(np.uint8))
    np.testing.assert_array_equal(b2, b)


def test_unpack_with_original_returns_given_kind(needs_torch):
    torch = needs_torch
    w, b = torch.randn(5, 3), torch.randn(5)
    lin = qpack.PackedLinear(w, b, retain=True)
    w2, b2 = lin.unpack()
    assert isinstance(w2, torch.Tensor) and torch.equal(w2, w) and torch.equal(b2, b)
    assert lin.nbytes_original == w.numel() * 4
    lin.release_original()
    assert not lin.has_original and lin.nbytes_original == 0
    assert torch.equal(lin.unpack()[0], w)
    lin.release_original()  # idempotent


def test_packed_vs_original_bytes(backend):
    w = np.ones((2048, 2048), np.int8)
    lin = qpack.PackedLinear(w, backend=backend, weight_scale=0.1, dynamic=True, retain=True)
    assert lin.nbytes_original == 2048 * 2048
    assert 2048 * 2048 <= lin.nbytes_packed < 2048 * 2048 * 1.1


def test_retain_precedence():
    w = np.ones((2, 2), np.float32)
    qpack.set_default_retain(False)
    assert not qpack.get_default_retain()
    assert not qpack.PackedLinear(w).has_original
    with qpack.retain(True):
        assert qpack.PackedLinear(w).has_original                    # thread-local beats default
        assert not qpack.PackedLinear(w, retain=False).has_original  # per-object beats thread-local
        seen = []
        t = threading.Thread(target=lambda: seen.append(qpack.PackedLinear(w).has_original))
        t.start()
        t.join()
        assert seen == [False]                                       # override is thread-local
    assert not qpack.PackedLinear(w).has_original
    qpack.set_default_retain(True)
    with qpack.retain(False):
        assert not qpack.PackedLinear(w).has_original
        assert qpack.PackedLinear(w, retain=True).has_original
    assert qpack.PackedLinear(w).has_original


def test_build_info_and_backends():
    info = qpack.build_info()
    assert info["default_retain"] == (not info["mobile"]) or True
    assert isinstance(info["mobile"], bool)
    b = qpack.backends()
    assert "oneDNN 3." in b["onednn"]["version"]
    assert b["qnnpack"]["linear"] == ["int8_static", "int8_dynamic"]


def test_close_semantics(backend):
    w = np.ones((4, 4), np.int8)
    lin = qpack.PackedLinear(w, backend=backend, weight_scale=0.1, dynamic=True)
    x = np.ones((1, 4), np.float32)
    with lin as same:
        assert same is lin
        same(x)
    assert lin.closed
    for call in (lambda: lin(x), lin.unpack, lin.release_original, lambda: lin.nbytes_packed,
                 lambda: lin.has_original, lambda: lin.stats):
        with pytest.raises(qpack.ClosedError):
            call()
    lin.close()  # idempotent
    with pytest.raises(qpack.ClosedError):
        with lin:
            pass
    assert "closed" in repr(lin)
    del lin
    gc.collect()


def test_num_threads(backend):
    rng = np.random.default_rng(9)
    w = rand_int8(rng, 64, 64)
    lin = qpack.PackedLinear(w, backend=backend, weight_scale=0.01, dynamic=True)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    qpack.set_num_threads(1)
    y1 = lin(x)
    qpack.set_num_threads(2)
    assert qpack.get_num_threads() == 2
    np.testing.assert_array_equal(lin(x), y1)
    with pytest.raises(qpack.InvalidArgumentError):
        qpack.set_num_threads(0)


def test_concurrent_runs_share_one_object(backend):
    rng = np.random.default_rng(11)
    w = rand_int8(rng, 48, 40)
    lin = qpack.PackedLinear(w, rng.standard_normal(48).astype(np.float32), backend=backend,
                             weight_scale=0.01, output_scale=0.2, output_zero_point=128)
    xs = [rng.integers(0, 256, size=(3, 40), dtype=np.uint8) for _ in range(4)]
    scales = [0.01, 0.02, 0.03, 0.04]
    expected = [lin(x, scale=s, zero_point=128) for x, s in zip(xs, scales)]
    errors = []

    def worker(i):
        for j in range(50):
            t = (i + j) % 4
            if not np.array_equal(lin(xs[t], scale=scales[t], zero_point=128), expected[t]):
                errors.append((i, j))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize("m, wmax", [(1, 127), (5, 64), (32, 127)])
def test_zero_points_of_zero_share_the_packed_weights(needs_torch, m, wmax):
    """oneDNN runs a static int8 linear whose input and / or output zero point is 0 on a
    primitive without them (its int8 gemm then skips a per-call compensation), reading the same
    packed bytes: every combination within a quantum of PyTorch, no state built past the first
    pack, no byte added."""
    import torch
    rng = np.random.default_rng(m + wmax)
    k, n = 96, 40
    w = rng.integers(-wmax, wmax + 1, size=(n, k), dtype=np.int8)
    b = rng.standard_normal(n).astype(np.float32)
    x = rng.integers(0, 256, size=(m, k), dtype=np.uint8)
    for out_zp in (0, 90):
        lin = qpack.PackedLinear(w, b, backend="onednn", weight_scale=[0.01], output_scale=0.3,
                                 output_zero_point=out_zp, activation="relu" if out_zp == 0 else None)
        nbytes = lin.nbytes_packed
        for in_zp in (0, 7, 0):
            y = lin(x, scale=0.05, zero_point=in_zp)
            ref = static_linear(torch, "qnnpack", w, [0.01], b, x, 0.05, in_zp, 0.3, out_zp, relu=out_zp == 0)
            assert np.abs(y.astype(np.int32) - ref.astype(np.int32)).max() <= 1, (out_zp, in_zp)
        assert lin.stats["states_built"] == 1 and lin.nbytes_packed == nbytes, lin.stats
        assert np.array_equal(lin.unpack()[0], w)
