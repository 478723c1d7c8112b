"""fp32 depthwise convolutions on planar data (src/backends/onednn/depthwise_nchw_f32.h):
a graph's NCHW float input read by a depthwise convolution of large output planes (from
28x28 on the AVX-512 3x3 path, from 56x56 on the AVX2 one) is read in place and its
output written NCHW, on qpack's kernel, without transposes; smaller ones keep oneDNN's
kernel. Run also with ONEDNN_MAX_CPU_ISA=AVX2 for the AVX2 path everywhere.
PyTorch is the oracle; oneDNN's channels-last kernel (QPACK_ONEDNN_OWN_DEPTHWISE=0 when
the layer is frozen) gives the same values."""
import os
import subprocess
import sys
import threading

import pytest
import torch
from torch import nn

import qpack

pytestmark = pytest.mark.skipif("onednn" not in qpack.backends(), reason="the oneDNN backend is not built")


def frozen(m, own=True):
    if own:
        return qpack.freeze(m)
    os.environ["QPACK_ONEDNN_OWN_DEPTHWISE"] = "0"
    try:
        return qpack.freeze(m)
    finally:
        del os.environ["QPACK_ONEDNN_OWN_DEPTHWISE"]


def close(a, b, tol=1e-4):
    return a.shape == b.shape and (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


# (channels, H, W, kernel, stride, padding, dilation): 3x3 stride 1 dense (the AVX-512
# direct path: rows of one and of several 64-pixel tiles, paddings 0 to 3), and strides, dilations, other windows and paddings (the padded-copy path)
SHAPES = [
    (8, 28, 28, 3, 1, 1, 1), (17, 56, 61, 3, 1, 1, 1), (16, 30, 45, 3, 1, 0, 1), (5, 33, 29, 3, 1, 2, 1),
    (4, 29, 131, 3, 1, 1, 1), (4, 28, 66, 3, 1, 3, 1), (4, 30, 65, 3, 1, 0, 1),  # several tiles a row
    (8, 113, 115, 3, 2, 1, 1), (16, 112, 112, 3, 2, 1, 1), (8, 60, 60, 3, 1, 2, 2), (8, 60, 57, 5, 1, 2, 1),
    (8, 121, 118, 5, 2, 2, 1), (3, 57, 64, 1, 1, 0, 1), (8, 64, 64, 7, 1, 3, 1), (8, 120, 123, 3, 2, 0, 2),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "c{}_{}x{}_k{}s{}p{}d{}".format(*s))
@pytest.mark.parametrize("act", [None, "relu", "relu6"])
def test_planar_depthwise_matches_pytorch_and_onednn(shape, act):
    c, h, w, k, s, p, d = shape
    torch.manual_seed(c * 1000 + h + w + k)
    conv = nn.Conv2d(c, c, k, stride=s, padding=p, dilation=d, groups=c, bias=(h % 2 == 0))
    m = nn.Sequential(conv, *([nn.ReLU()] if act == "relu" else [nn.ReLU6()] if act == "relu6" else [])).eval()
    x = torch.randn(2, c, h, w) * 3
    with torch.no_grad():
        ref = m(x)
        own, dnnl = frozen(m)(x), frozen(m, own=False)(x)
        nhwc = frozen(m)(x.contiguous(memory_format=torch.channels_last))
    assert own.is_contiguous()
    assert close(own, ref), (own - ref).abs().max()
    assert close(own, dnnl)
    assert close(nhwc, ref)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_planar_depthwise_threads_split_the_planes(threads):
    torch.manual_seed(1)
    m = nn.Sequential(nn.Conv2d(37, 37, 3, padding=1, groups=37), nn.ReLU6()).eval()
    x = torch.randn(3, 37, 28, 30)
    old = qpack.get_num_threads()
    qpack.set_num_threads(threads)
    try:
        f = qpack.freeze(m)
        with torch.no_grad():
            assert close(f(x), m(x))
    finally:
        qpack.set_num_threads(old)


class DwThenPointwise(nn.Module):
    """The depthwise output read by another node: it stays channels-last inside."""

    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pw = nn.Conv2d(16, 24, 1)

    def forward(self, x):
        y = self.dw(x)
        return self.pw(y), y


class InputReadTwice(nn.Module):
    """The NCHW input read by the depthwise convolution and by an add: it becomes
    channels-last for both."""

    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)

    def forward(self, x):
        return self.dw(x) + x


class TwoDepthwise(nn.Module):
    """Two planar depthwise convolutions of one input, both outputs only the caller's."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.b = nn.Conv2d(8, 8, 5, padding=2, stride=2, groups=8)

    def forward(self, x):
        return self.a(x), torch.relu(self.b(x))


@pytest.mark.parametrize("cls", [DwThenPointwise, InputReadTwice, TwoDepthwise])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_planar_depthwise_inside_graphs(cls, layout):
    torch.manual_seed(2)
    m = cls().eval()
    x = torch.randn(2, m.dw.in_channels if hasattr(m, "dw") else 8, 56, 56)
    if layout == "nhwc":
        x = x.contiguous(memory_format=torch.channels_last)
    f = qpack.freeze(m)
    with torch.no_grad():
        ref, out = m(x), f(x)
    ref = ref if isinstance(ref, tuple) else (ref,)
    out = out if isinstance(out, tuple) else (out,)
    assert len(out) == len(ref)
    for o, r in zip(out, ref):
        assert close(o, r)
        if layout == "nhwc":
            assert o.is_contiguous(memory_format=torch.channels_last)


def test_planar_depthwise_graph_runs_concurrently():
    torch.manual_seed(3)
    m = nn.Sequential(nn.Conv2d(24, 24, 3, padding=1, groups=24)).eval()
    f = qpack.freeze(m)
    xs = [torch.randn(1, 24, 28 + 4 * i, 56) for i in range(4)]
    with torch.no_grad():
        refs = [m(x) for x in xs]
    errors = []

    def work(i):
        try:
            for _ in range(20):
                with torch.no_grad():
                    y = f(xs[i])
                if not close(y, refs[i]):
                    errors.append(i)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


def test_planar_depthwise_bad_input_leaves_the_layer_usable():
    torch.manual_seed(4)
    m = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8)).eval()
    f = qpack.freeze(m)
    with pytest.raises(Exception) as e:
        f(torch.randn(1, 9, 28, 28))  # wrong channel count
    assert "8" in str(e.value) or "channel" in str(e.value).lower()
    x = torch.randn(1, 8, 28, 28)
    with torch.no_grad():
        assert close(f(x), m(x))


@pytest.mark.parametrize("k,s", [(3, 1), (3, 2), (5, 1)])
def test_planar_depthwise_passes_nan_and_inf_as_pytorch(k, s):
    """A NaN or inf in a plane reaches the outputs whose windows hold it, as in PyTorch
    (the clamps keep NaN), on both kernels' paths (output planes from 28x28: on qpack's
    kernel, where output planes are at least 28x28 (AVX-512 3x3) or 56x56; oneDNN's fused
    clip turns NaN into a number)."""
    torch.manual_seed(9)
    m = nn.Sequential(nn.Conv2d(8, 8, k, stride=s, padding=k // 2, groups=8), nn.ReLU6()).eval()
    x = torch.randn(1, 8, 112, 112)
    x[0, 1, 10, 10], x[0, 2, 0, 111], x[0, 3, 20, 5] = float("nan"), float("inf"), -float("inf")
    f = frozen(m)
    with torch.no_grad():
        ref, y = m(x), f(x)
    assert torch.equal(y.isnan(), ref.isnan()) and torch.equal(y.isinf(), ref.isinf())
    ok = ~ref.isnan()
    assert close(y[ok], ref[ok])


_AVX2_PATH = """
import sys, torch, qpack
from torch import nn
sys.path.insert(0, sys.argv[1])
import test_depthwise_nchw as T
for shape in T.SHAPES:
    for act in (None, "relu6"):
        T.test_planar_depthwise_matches_pytorch_and_onednn(shape, act)
T.test_planar_depthwise_passes_nan_and_inf_as_pytorch(3, 1)
T.test_planar_depthwise_passes_nan_and_inf_as_pytorch(3, 2)
print("ok")
"""


def test_planar_depthwise_avx2_path():
    """ONEDNN_MAX_CPU_ISA=AVX2 (read once per process): the AVX2 path for every window,
    as on a CPU without AVX-512, against PyTorch and oneDNN's AVX2 kernels."""
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    r = subprocess.run([sys.executable, "-c", _AVX2_PATH, os.path.dirname(__file__)], env=env,
                       capture_output=True, text=True, cwd="/tmp")
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr
