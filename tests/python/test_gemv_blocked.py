"""Linears of a few rows on qpack's kernels over oneDNN's brgemm weight layouts: int8 up
to 8 rows on gemv_vnni.h (AVX-512 VNNI), fp32 up to 4 rows on gemv_f32.h (AVX-512);
elsewhere these compare oneDNN with itself or with the AVX2 kernels. The same values as
oneDNN's matmul on the same packed weight (QPACK_ONEDNN_OWN_GEMM=0 when the layer is
frozen): static int8 within one output quantum, dynamic int8 and fp32 within float
rounding; batches above the kernels' rows, file round trips and threads."""
import itertools
import os

import pytest
import torch
from torch import nn

import qpack

pytestmark = pytest.mark.skipif("onednn" not in qpack.backends(), reason="the oneDNN backend is not built")


def freeze(m, dtype, calib, own=True, **kw):
    if not own:
        os.environ["QPACK_ONEDNN_OWN_GEMM"] = "0"
    try:
        if calib is not None:
            return qpack.freeze(m, dtype="int8", backend="onednn", example_inputs=calib, **kw)
        return qpack.freeze(m, dtype=dtype, backend="onednn", **kw)
    finally:
        os.environ.pop("QPACK_ONEDNN_OWN_GEMM", None)


CASES = list(itertools.product([3, 17, 64, 65, 200, 1000], [1, 63, 64, 130], [1, 2, 3, 5, 8, 9]))


@pytest.mark.parametrize("k,n,m", CASES, ids=lambda v: str(v))
def test_static_int8_rows_match_onednn(k, n, m):
    torch.manual_seed(k * 31 + n * 7 + m)
    model = nn.Sequential(nn.Linear(k, n)).eval()
    x = torch.randn(m, k) * 2
    calib = [x, torch.randn(m, k) * 2]  # x inside the calibrated range
    own, ref = freeze(model, "int8", calib), freeze(model, "int8", calib, own=False)
    with torch.no_grad():
        a, b = own(x), ref(x)
    q = own[0]._packed.output_scale
    assert (a - b).abs().max().item() <= q * 1.001
    with torch.no_grad():  # and PyTorch, end to end, loosely
        assert (a - model(x)).abs().max().item() <= 0.1 * model(x).abs().max().item() + 4 * q


@pytest.mark.parametrize("k,n,m", [(512, 512, 1), (100, 70, 4), (1000, 64, 8), (64, 200, 3)])
def test_dynamic_int8_rows_match_onednn(k, n, m):
    torch.manual_seed(k + n + m)
    model = nn.Sequential(nn.Linear(k, n)).eval()
    x = torch.randn(m, k)
    # int8 without example inputs: dynamic linears
    own, ref = freeze(model, "int8", None), freeze(model, "int8", None, own=False)
    assert own[0]._packed.mode == "int8_dynamic"
    with torch.no_grad():
        a, b = own(x), ref(x)
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())


def test_rank3_and_threads_and_file_round_trip(tmp_path):
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(300, 130), nn.ReLU()).eval()
    calib = [torch.randn(2, 3, 300)]
    x = torch.randn(2, 3, 300)  # 6 rows
    ref = freeze(model, "int8", calib, own=False)
    with torch.no_grad():
        b = ref(x)
    old = qpack.get_num_threads()
    try:
        for threads in (1, 2, 4):
            qpack.set_num_threads(threads)
            f = freeze(model, "int8", calib)
            with torch.no_grad():
                a = f(x)
            assert (a - b).abs().max().item() <= f[0]._packed.output_scale * 1.001
    finally:
        qpack.set_num_threads(old)
    path = tmp_path / "m.qpk"
    qpack.save(f, path)
    g = qpack.load(path)
    with torch.no_grad():
        assert torch.equal(g(x), a)


def test_released_weights_unpack_exactly_after_kernel_runs():
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(96, 70)).eval()
    calib = [torch.randn(4, 96)]
    f = freeze(model, "int8", calib, retain=False)
    p = f[0]._packed
    w = p.unpack()
    with torch.no_grad():
        f(torch.randn(1, 96))
        f(torch.randn(7, 96))
    w2 = p.unpack()  # (int8 weight, scales...)
    assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(w2, w))


F32_CASES = list(itertools.product([3, 17, 64, 100, 1280], [1, 63, 64, 130, 1000], [1, 2, 3, 4, 5]))


@pytest.mark.parametrize("k,n,m", F32_CASES, ids=lambda v: str(v))
def test_f32_rows_match_onednn(k, n, m):
    torch.manual_seed(k * 13 + n * 5 + m)
    model = nn.Sequential(nn.Linear(k, n, bias=(n % 2 == 0)), nn.ReLU6()).eval()
    x = torch.randn(m, k) * 2
    own, ref = freeze(model, None, None), freeze(model, None, None, own=False)
    with torch.no_grad():
        a, b, r = own(x), ref(x), model(x)
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * max(1.0, b.abs().max().item()))
    assert torch.allclose(a, r, rtol=1e-4, atol=1e-4 * max(1.0, r.abs().max().item()))


def test_f32_rows_threads_and_file_round_trip(tmp_path):
    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(1280, 1000)).eval()
    x = torch.randn(2, 1280)
    with torch.no_grad():
        r = model(x)
    old = qpack.get_num_threads()
    try:
        for threads in (1, 2, 3):
            qpack.set_num_threads(threads)
            f = freeze(model, None, None, retain=False)
            with torch.no_grad():
                a = f(x)
            assert torch.allclose(a, r, rtol=1e-4, atol=1e-4)
    finally:
        qpack.set_num_threads(old)
    path = tmp_path / "f.qpk"
    qpack.save(f, path)
    with torch.no_grad():
        assert torch.equal(qpack.load(path)(x), a)
