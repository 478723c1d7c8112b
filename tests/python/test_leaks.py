"""Create/run/release/unpack/close cycles must not grow resident memory."""
import gc

import numpy as np
import pytest

import qpack


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def cycle(backend, w, b, x, xq):
    if backend.startswith("conv-"):
        conv_cycle(backend[5:], w, b, xq)
        return
    if backend == "onednn-f32":
        lin = qpack.PackedLinear(w, b)
        lin(x)
    else:
        lin = qpack.PackedLinear(w.astype(np.int8), b, backend=backend, weight_scale=0.01,
                                 output_scale=0.1, output_zero_point=5)
        lin(xq, scale=0.02, zero_point=3)
        lin(xq, scale=0.03, zero_point=3)  # a second state
    lin.release_original()
    lin.unpack()
    lin.close()


def conv_cycle(backend, w, b, xq):
    wc = w[:, :16].reshape(32, 4, 2, 2).astype(np.int8)
    xc = xq[:, :16].reshape(1, 4, 4, 4)
    if backend == "onednn-f32":
        conv = qpack.PackedConv2d(wc.astype(np.float32), b, padding=1)
        conv(xc.astype(np.float32))
    else:
        conv = qpack.PackedConv2d(wc, b, padding=1, backend=backend, weight_scale=0.01, output_scale=0.1,
                                  output_zero_point=5)
        conv(xc, scale=0.02, zero_point=3)
        conv(xc, scale=0.03, zero_point=3)  # a second state
    conv.release_original()
    conv.unpack()
    conv.close()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["onednn-f32", "onednn", "qnnpack",
                                     "conv-onednn-f32", "conv-onednn", "conv-qnnpack"])
def test_no_rss_growth_over_10000_cycles(backend):
    rng = np.random.default_rng(0)
    w = rng.integers(-50, 50, size=(32, 48)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    x = rng.standard_normal((4, 48)).astype(np.float32)
    xq = rng.integers(0, 256, size=(4, 48), dtype=np.uint8)
    for _ in range(2000):  # warm up allocator pools and primitive caches
        cycle(backend, w, b, x, xq)
    gc.collect()
    before = rss_bytes()
    for _ in range(10000):
        cycle(backend, w, b, x, xq)
    gc.collect()
    growth = rss_bytes() - before
    print(f"{backend}: RSS growth over 10000 cycles = {growth} bytes")
    assert growth < 1 << 20
