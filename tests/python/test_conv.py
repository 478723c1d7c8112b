"""PackedConv2d / PackedConv1d against PyTorch, on every backend."""
import itertools
import random
import threading

import numpy as np
import pytest

import qpack
from _oracle import SATURATING_ENGINES, torch_int8_exact

torch = pytest.importorskip("torch")
F = torch.nn.functional

ENGINE = {"qnnpack": "qnnpack", "onednn": "x86"}
ACTIVATIONS = [None, "relu", "relu6", ("hardtanh", -1.0, 2.0)]


# ---- oracles ---------------------------------------------------------------

def _clamp_bounds(activation):
    if activation is None:
        return None
    if activation == "relu":
        return 0.0, None
    if activation == "relu6":
        return 0.0, 6.0
    return activation[1], activation[2]


def torch_qconv(engine, x, si, zi, w, ws, b, stride, padding, dilation, groups, so, zo, activation):
    """torch.ops.quantized.conv2d with `engine`; the activation clamps the uint8 output. Where
    the engine saturates on this CPU (_oracle.torch_int8_exact), float64 instead."""
    if engine in SATURATING_ENGINES and not torch_int8_exact():
        y = float_qconv(x, si, zi, w, ws, b, list(padding), groups, so, zo, list(stride), list(dilation))
        bounds = _clamp_bounds(activation)
        if bounds is not None:  # clamp the uint8 output, as below
            lo, hi = bounds
            qlo = max(0, round(lo / so) + zo)
            qhi = min(255, round(hi / so) + zo) if hi is not None else 255
            y = y.clamp(qlo, qhi)
        return y
    torch.backends.quantized.engine = engine
    qx = torch._make_per_tensor_quantized_tensor(x, si, zi)
    if len(ws) > 1:
        qw = torch._make_per_channel_quantized_tensor(
            w, torch.tensor(ws, dtype=torch.double), torch.zeros(len(ws), dtype=torch.long), 0)
    else:
        qw = torch._make_per_tensor_quantized_tensor(w, float(ws[0]), 0)
    packed = torch.ops.quantized.conv2d_prepack(qw, b, list(stride), list(padding), list(dilation), groups)
    op = torch.ops.quantized.conv2d_relu if activation == "relu" else torch.ops.quantized.conv2d
    y = op(qx, packed, so, zo).int_repr().to(torch.int32)
    bounds = _clamp_bounds(activation)
    if bounds is not None and activation != "relu":
        lo, hi = bounds
        qlo = max(0, round(lo / so) + zo)
        qhi = min(255, round(hi / so) + zo) if hi is not None else 255
        y = y.clamp(qlo, qhi)
    return y


def float_qconv(x, si, zi, w, ws, b, padding, groups, so, zo, stride=1, dilation=1, activation=None):
    """Reference for what torch's quantized op cannot express or run (padding='same')."""
    xf = (x.double() - zi) * si
    wf = w.double() * torch.tensor(ws, dtype=torch.double).reshape(-1, *([1] * (w.dim() - 1)))
    conv = F.conv2d if w.dim() == 4 else F.conv1d
    y = conv(xf, wf, None if b is None else b.double(), stride=stride, padding=padding,
             dilation=dilation, groups=groups)
    bounds = _clamp_bounds(activation)
    if bounds is not None:
        y = y.clamp(bounds[0], bounds[1])
    return (torch.round(y / so) + zo).clamp(0, 255).to(torch.int32)


def fp32_ref(x, w, b, stride, padding, dilation, groups, activation):
    conv = F.conv2d if w.dim() == 4 else F.conv1d
    y = conv(x, w, b, stride, padding, dilation, groups)
    bounds = _clamp_bounds(activation)
    if bounds is not None:
        y = y.clamp(bounds[0], bounds[1])
    return y


# ---- the grid ----------------------------------------------------------------

def conv_case(rng):
    """A random case from the grid of issue 3 (at least PyTorch's own test ranges)."""
    groups = rng.choice([1, 1, 2, 3, "dw"])
    cpg_in = rng.choice([2, 4, 5, 8, 16, 32])
    cpg_out = rng.choice([2, 4, 5, 8, 16, 32])
    k = (rng.randint(1, 7), rng.randint(1, 7)) if rng.random() < 0.5 else (rng.choice([1, 3, 5, 7]),) * 2
    if groups == "dw":
        groups = rng.choice([2, 8, 16, 24])
        cpg_in = cpg_out = 1
        k = rng.choice([(3, 3), (5, 5), (3, 3), (1, 3)])
    stride = (rng.randint(1, 2), rng.randint(1, 2))
    dilation = (rng.randint(1, 2), rng.randint(1, 2))
    padding = (rng.randint(0, 2), rng.randint(0, 2))
    eff = [d * (kk - 1) + 1 for d, kk in zip(dilation, k)]
    h = max(1, eff[0] - 2 * padding[0]) + rng.randint(0, 8)
    w = max(1, eff[1] - 2 * padding[1]) + rng.randint(0, 8)
    h, w = min(h, 16), min(w, 14)
    if h + 2 * padding[0] < eff[0] or w + 2 * padding[1] < eff[1]:
        padding = (max(padding[0], (eff[0] - h + 1) // 2), max(padding[1], (eff[1] - w + 1) // 2))
    return dict(batch=rng.randint(1, 3), cin=cpg_in * groups, cout=cpg_out * groups, groups=groups,
                k=k, stride=stride, padding=padding, dilation=dilation, hw=(h, w),
                bias=rng.random() < 0.7, per_channel=rng.random() < 0.5,
                activation=rng.choice(ACTIVATIONS), channels_last=rng.random() < 0.5)


def cases(n, seed):
    rng = random.Random(seed)
    return [conv_case(rng) for _ in range(n)]


def make_int8(c):
    w = torch.randint(-127, 128, (c["cout"], c["cin"] // c["groups"], *c["k"]), dtype=torch.int8)
    ws = list(np.random.uniform(0.002, 0.02, c["cout"] if c["per_channel"] else 1))
    b = torch.randn(c["cout"]) * 2 if c["bias"] else None
    x = torch.randint(0, 256, (c["batch"], c["cin"], *c["hw"]), dtype=torch.uint8)
    if c["channels_last"]:
        x = x.contiguous(memory_format=torch.channels_last)
    return w, ws, b, x


def check_int8(backend, c, release=True):
    w, ws, b, x = make_int8(c)
    si, zi, so, zo = 0.04, 117, 0.25, 98
    conv = qpack.PackedConv2d(w, b, c["stride"], c["padding"], c["dilation"], c["groups"],
                              backend=backend, weight_scale=ws, output_scale=so,
                              output_zero_point=zo, activation=c["activation"], retain=not release)
    y = conv(x, scale=si, zero_point=zi)
    if backend == "onednn" and c["k"] == (1, 1) and c["padding"] != (0, 0):
        # torch 2.13's x86 and onednn quantized 1x1 conv with padding segfault: float reference.
        ref = float_qconv(x, si, zi, w, ws, b, c["padding"], c["groups"], so, zo,
                          c["stride"], c["dilation"], c["activation"])
    else:
        ref = torch_qconv(ENGINE[backend], x, si, zi, w, ws, b, c["stride"], c["padding"],
                          c["dilation"], c["groups"], so, zo, c["activation"])
    assert y.shape == ref.shape, c
    diff = (y.to(torch.int32) - ref).abs().max().item() if y.numel() else 0
    assert diff <= 1, (c, diff)
    if backend == "qnnpack":
        assert y.is_contiguous(memory_format=torch.channels_last)
    elif not c["channels_last"]:
        assert y.is_contiguous()
    if release:
        conv.release_original()
    wu, bu = conv.unpack()
    assert wu.dtype == torch.int8 and torch.equal(wu, w), c
    if b is not None:
        assert torch.equal(bu, b)
    return conv


def check_fp32(c):
    w = torch.randn(c["cout"], c["cin"] // c["groups"], *c["k"])
    b = torch.randn(c["cout"]) if c["bias"] else None
    x = torch.randn(c["batch"], c["cin"], *c["hw"])
    if c["channels_last"]:
        x = x.contiguous(memory_format=torch.channels_last)
    conv = qpack.PackedConv2d(w, b, c["stride"], c["padding"], c["dilation"], c["groups"],
                              activation=c["activation"], retain=False)
    y = conv(x)
    ref = fp32_ref(x, w, b, c["stride"], c["padding"], c["dilation"], c["groups"], c["activation"])
    # 1e-5 relative to the sum of magnitudes that each output adds up (summation order differs).
    mag = F.conv2d(x.abs(), w.abs(), None if b is None else b.abs(), c["stride"], c["padding"],
                   c["dilation"], c["groups"])
    assert y.shape == ref.shape
    assert bool(((y - ref).abs() <= 1e-5 * mag + 1e-6).all()), c
    fmt = torch.channels_last if c["channels_last"] else torch.contiguous_format
    assert y.is_contiguous(memory_format=fmt)
    wu, bu = conv.unpack()
    assert torch.equal(wu, w)


@pytest.mark.parametrize("case", cases(40, seed=1), ids=lambda c: f"g{c['groups']}k{c['k'][0]}x{c['k'][1]}")
def test_int8_grid(backend, case):
    check_int8(backend, case)


def depthwise_cases():
    """Static int8 depthwise convolutions around qpack's own oneDNN-backend kernel (64
    channels and more): channel counts on and off its 64- and 32-channel blocks (and below 64,
    on oneDNN's kernel), windows up to 8x8 (and 9x9, past it), strides, dilations, asymmetric
    padding, batches."""
    rng = random.Random(7)
    out = []
    for ch in (1, 32, 63, 64, 65, 80, 96, 100, 127, 128, 144, 160, 200, 255, 264):
        k = rng.choice([(3, 3), (3, 3), (5, 5), (7, 7), (1, 3), (8, 8), (9, 9)])
        stride, dilation = (rng.randint(1, 2), rng.randint(1, 2)), (rng.choice([1, 1, 2]),) * 2
        padding = (rng.randint(0, k[0] // 2), rng.randint(0, k[1] // 2))
        eff = [d * (kk - 1) + 1 for d, kk in zip(dilation, k)]
        hw = (max(1, eff[0] - 2 * padding[0]) + rng.randint(0, 9), max(1, eff[1] - 2 * padding[1]) + rng.randint(0, 9))
        out.append(dict(batch=rng.randint(1, 3), cin=ch, cout=ch, groups=ch, k=k, stride=stride, padding=padding,
                        dilation=dilation, hw=hw, bias=rng.random() < 0.7, per_channel=rng.random() < 0.7,
                        activation=rng.choice(ACTIVATIONS), channels_last=True))
    return out


@pytest.mark.parametrize("case", depthwise_cases(), ids=lambda c: f"c{c['cin']}k{c['k'][0]}x{c['k'][1]}")
def test_int8_depthwise_channels_last_matches_nchw(case):
    """oneDNN backend, static int8 depthwise (qpack's kernel on AVX-512 VNNI CPUs; NCHW data
    reordered around it): channels-last and NCHW data within 1 of PyTorch's x86 engine, and of
    each other."""
    conv = check_int8("onednn", case)
    w, ws, b, x = make_int8(case)
    nhwc = conv(x, scale=0.04, zero_point=117)
    nchw = conv(x.contiguous(), scale=0.04, zero_point=117)
    assert nhwc.is_contiguous(memory_format=torch.channels_last) and nchw.is_contiguous()
    assert (nhwc.to(torch.int32) - nchw.to(torch.int32)).abs().max().item() <= 1, case


def dense3x3_cases():
    """3x3 dense depthwise convolutions, MobileNet's, around qpack's own kernel: channel
    counts on and off its 64- and 32-channel blocks (whole blocks load and store without a
    mask), strides 1 to 3, rows of 3 columns and more, paddings 0 and 1 and asymmetric,
    batches."""
    rng = random.Random(13)
    out = []
    for ch in (64, 65, 80, 96, 100, 128, 144, 160, 200):
        for stride in ((1, 1), (2, 2), (1, 2), (3, 1)):
            padding = rng.choice([(1, 1), (0, 0), (1, 0), (0, 1)])
            hw = rng.choice([(rng.randint(3, 12), rng.randint(3, 12)), (3, 3), (5, 3)])
            out.append(dict(batch=rng.randint(1, 2), cin=ch, cout=ch, groups=ch, k=(3, 3), stride=stride,
                            padding=padding, dilation=(1, 1), hw=hw, bias=rng.random() < 0.7,
                            per_channel=rng.random() < 0.7, activation=rng.choice(ACTIVATIONS), channels_last=True))
    return out


@pytest.mark.parametrize("case", dense3x3_cases(),
                         ids=lambda c: f"c{c['cin']}s{c['stride'][0]}{c['stride'][1]}p{c['padding'][0]}{c['padding'][1]}")
def test_int8_depthwise_3x3_matches_reference_and_onednn(case, monkeypatch):
    """qpack's 3x3 depthwise kernel: within 1 of the float reference
    (dequantize, float convolution, requantize; PyTorch's x86 engine is 24 to 67 off both
    kernels on some padded ones without bias) and of oneDNN's own kernel on the same weights
    (QPACK_ONEDNN_OWN_DEPTHWISE=0 when made)."""
    torch.manual_seed(case["cin"] + 10 * case["stride"][0])
    np.random.seed(case["cin"])
    w, ws, b, x = make_int8(case)

    def make():
        return qpack.PackedConv2d(w, b, case["stride"], case["padding"], case["dilation"], case["groups"],
                                  backend="onednn", weight_scale=ws, output_scale=0.25, output_zero_point=98,
                                  activation=case["activation"])
    own = make()(x, scale=0.04, zero_point=117)
    ref = float_qconv(x, 0.04, 117, w, ws, b, case["padding"], case["groups"], 0.25, 98, case["stride"],
                      case["dilation"], case["activation"])
    assert own.shape == ref.shape
    assert (own.to(torch.int32) - ref).abs().max().item() <= 1, case
    monkeypatch.setenv("QPACK_ONEDNN_OWN_DEPTHWISE", "0")
    dnnl = make()(x, scale=0.04, zero_point=117)
    assert own.shape == dnnl.shape
    assert (own.to(torch.int32) - dnnl.to(torch.int32)).abs().max().item() <= 1, case


def pointwise_cases():
    """Static int8 1x1 convolutions around qpack's own oneDNN-backend kernel: input channels
    from 1 to 576 (it reads 4 at a time: off multiples of 4 the buffer's last pixel comes
    from a padded copy), outputs on and off its 16-channel blocks, strides 1 and 2, batches,
    every activation, bias or none, per-tensor or per-channel weight scales; a first layer
    over 3 channels (oneDNN's kernel on both sides)."""
    rng = random.Random(11)
    out = []
    for cin, cout, k, pad in ((4, 8, 1, 0), (16, 96, 1, 0), (24, 144, 1, 0), (32, 16, 1, 0), (32, 192, 1, 0),
                              (40, 24, 1, 0), (64, 100, 1, 0), (96, 576, 1, 0), (144, 24, 1, 0),
                              (160, 960, 1, 0), (256, 33, 1, 0), (576, 96, 1, 0), (6, 32, 1, 0), (3, 17, 1, 0),
                              (1, 48, 1, 0), (5, 40, 1, 0), (3, 32, 3, 1)):
        stride = rng.choice([(1, 1), (1, 1), (2, 2), (1, 2)])
        hw = (rng.randint(k, k + 16), rng.randint(k, k + 16))
        out.append(dict(batch=rng.randint(1, 3), cin=cin, cout=cout, groups=1, k=(k, k), stride=stride,
                        padding=(pad, pad), dilation=(1, 1), hw=hw, bias=rng.random() < 0.7,
                        per_channel=rng.random() < 0.7, activation=rng.choice(ACTIVATIONS),
                        channels_last=True))
    return out


@pytest.mark.parametrize("own", ["1", "0"])
@pytest.mark.parametrize("case", pointwise_cases(), ids=lambda c: f"{c['cin']}to{c['cout']}k{c['k'][0]}s{c['stride'][0]}")
def test_int8_pointwise_matches_torch(case, own, monkeypatch):
    """oneDNN backend, static int8 1x1: qpack's kernel (on AVX-512 VNNI CPUs, where it is the
    faster one) and oneDNN's (QPACK_ONEDNN_OWN_POINTWISE=0, read when a convolution is made)
    within 1 of PyTorch's x86 engine, channels-last and NCHW data, on two input shapes through
    the same packed weight."""
    monkeypatch.setenv("QPACK_ONEDNN_OWN_POINTWISE", own)
    check_int8("onednn", case)  # against torch; unpack after release
    w, ws, b, x = make_int8(case)
    conv = qpack.PackedConv2d(w, b, case["stride"], case["padding"], 1, 1, backend="onednn", weight_scale=ws,
                              output_scale=0.25, output_zero_point=98, activation=case["activation"])
    big = torch.randint(0, 256, (1, case["cin"], 20, 23), dtype=torch.uint8)
    for data in (x, big.contiguous(memory_format=torch.channels_last)):
        nhwc = conv(data, scale=0.04, zero_point=117)
        nchw = conv(data.contiguous(), scale=0.04, zero_point=117)
        # (one input channel: both layouts are the same bytes, read as NCHW)
        assert nhwc.is_contiguous(memory_format=torch.channels_last) or case["cin"] == 1
        assert nchw.is_contiguous()
        ref = torch_qconv(ENGINE["onednn"], data, 0.04, 117, w, ws, b, case["stride"], case["padding"],
                          (1, 1), 1, 0.25, 98, case["activation"])
        for y in (nhwc, nchw):
            assert (y.to(torch.int32) - ref).abs().max().item() <= 1, case


def window_cases():
    """Static int8 windows over 1 to 3 channels, where qpack's own kernel copies no taps (a
    window row's channels, read 4 at a time, take fewer groups than its taps): ResNet's 7x7
    stem, 5x5 and 3x3 over 1 or 2 channels, a 4x4 stride-4 patch embedding, a 3x5 kernel, with
    and without padding, batches, every activation; and two shapes that stay on oneDNN's kernel
    (3x3 over 3 channels, 7x1 over 3)."""
    rng = random.Random(12)
    out = []
    for cin, cout, k, stride, pad in ((3, 64, (7, 7), 2, 3), (3, 24, (5, 5), 2, 2), (1, 32, (3, 3), 1, 1),
                                      (2, 40, (3, 3), 1, 0), (3, 96, (4, 4), 4, 0), (2, 17, (3, 5), 1, 2),
                                      (1, 70, (5, 5), 3, 4), (3, 32, (3, 3), 2, 1), (3, 16, (7, 1), 1, 3)):
        hw = (rng.randint(k[0] + 1, k[0] + 30), rng.randint(k[1] + 1, k[1] + 30))
        out.append(dict(batch=rng.randint(1, 3), cin=cin, cout=cout, groups=1, k=k, stride=(stride, stride),
                        padding=(pad, pad), dilation=(1, 1), hw=hw, bias=rng.random() < 0.7,
                        per_channel=rng.random() < 0.7, activation=rng.choice(ACTIVATIONS),
                        channels_last=True))
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", window_cases(), ids=lambda c: f"{c['cin']}to{c['cout']}k{c['k'][0]}x{c['k'][1]}")
def test_int8_window_matches_torch(case, threads, monkeypatch):
    """oneDNN backend, static int8 windows over few channels: qpack's kernel (on AVX-512 VNNI
    CPUs) and oneDNN's (QPACK_ONEDNN_OWN_WINDOW=0) within 1 of PyTorch's x86 engine, input
    zero points 0 and 117 (the padded taps read it), channels-last and NCHW data, on 1 and 2
    threads; the weights unpack bit-exactly from either packed form, after release too."""
    check_int8("onednn", case)  # against torch; unpack after release
    w, ws, b, x = make_int8(case)
    before = qpack.get_num_threads()
    qpack.set_num_threads(threads)
    try:
        ys = {}
        for own in ("1", "0"):
            monkeypatch.setenv("QPACK_ONEDNN_OWN_WINDOW", own)
            conv = qpack.PackedConv2d(w, b, case["stride"], case["padding"], 1, 1, backend="onednn",
                                      weight_scale=ws, output_scale=0.25, output_zero_point=98,
                                      activation=case["activation"], retain=False)
            assert torch.equal(conv.unpack()[0], w)
            for zp in (0, 117):
                ref = torch_qconv(ENGINE["onednn"], x, 0.04, zp, w, ws, b, case["stride"], case["padding"],
                                  (1, 1), 1, 0.25, 98, case["activation"])
                nhwc = conv(x, scale=0.04, zero_point=zp)
                nchw = conv(x.contiguous(), scale=0.04, zero_point=zp)
                assert nchw.is_contiguous()
                for y in (nhwc, nchw):
                    assert (y.to(torch.int32) - ref).abs().max().item() <= 1, (case, own, zp)
                ys[own, zp] = nhwc.to(torch.int32)
        for zp in (0, 117):
            assert (ys["1", zp] - ys["0", zp]).abs().max().item() <= 1
    finally:
        qpack.set_num_threads(before)


@pytest.mark.parametrize("case", cases(40, seed=2), ids=lambda c: f"g{c['groups']}k{c['k'][0]}x{c['k'][1]}")
def test_fp32_grid(case):
    check_fp32(case)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_int8_wide_sweep(backend, seed):
    for c in cases(60, seed=100 + seed):
        check_int8(backend, c, release=bool(seed % 2))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_fp32_wide_sweep(seed):
    for c in cases(80, seed=200 + seed):
        check_fp32(c)


def test_qnnpack_layouts_depthwise_grouped_gemm_unpack():
    """Each QNNPACK packed layout (dw 3x3, dw 5x5, grouped conv, 1x1 gemm) inverts exactly."""
    if "qnnpack" not in [b for b in ("onednn", "qnnpack") if qpack.backends()[b]["available"]]:
        pytest.skip("QNNPACK is not available")
    base = dict(batch=1, bias=True, per_channel=True, activation=None, channels_last=False,
                stride=(1, 1), dilation=(1, 1))
    for cin, cout, groups, k, pad in [(24, 24, 24, 3, 1), (13, 13, 13, 5, 2), (12, 20, 4, 3, 0),
                                      (37, 19, 1, 1, 0), (9, 33, 1, 2, 1)]:
        check_int8("qnnpack", dict(base, cin=cin, cout=cout, groups=groups, k=(k, k),
                                   padding=(pad, pad), hw=(9, 8)))


def test_same_padding_even_kernel(backend):
    """padding='same' with an even kernel pads asymmetrically, like torch."""
    w = torch.randint(-127, 128, (6, 4, 2, 4), dtype=torch.int8)
    b = torch.randn(6)
    x = torch.randint(0, 256, (2, 4, 7, 9), dtype=torch.uint8)
    conv = qpack.PackedConv2d(w, b, padding="same", backend=backend, weight_scale=0.01,
                              output_scale=0.2, output_zero_point=128)
    y = conv(x, scale=0.05, zero_point=100)
    ref = float_qconv(x, 0.05, 100, w, [0.01], b, "same", 1, 0.2, 128)
    assert y.shape == ref.shape == (2, 6, 7, 9)
    assert (y.to(torch.int32) - ref).abs().max().item() <= 1
    wf = torch.randn(6, 4, 2, 4)
    fconv = qpack.PackedConv2d(wf, padding="same", dilation=2)
    xf = torch.randn(1, 4, 7, 9)
    torch.testing.assert_close(fconv(xf), F.conv2d(xf, wf, padding="same", dilation=2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("padding", [0, 2, "same", "valid"])
def test_conv1d(backend, padding):
    w = torch.randint(-127, 128, (12, 4, 3), dtype=torch.int8)
    b = torch.randn(12)
    x = torch.randint(0, 256, (3, 8, 20), dtype=torch.uint8)
    stride = 1 if padding == "same" else 2
    conv = qpack.PackedConv1d(w, b, stride, padding, 1, 2, backend=backend, weight_scale=0.01,
                              output_scale=0.3, output_zero_point=10, activation="relu")
    y = conv(x, scale=0.05, zero_point=128)
    ref = float_qconv(x, 0.05, 128, w, [0.01], b, padding if isinstance(padding, str) else padding, 2, 0.3, 10)
    if stride == 2:
        ref = ref[:, :, ::2] if padding == 0 else None
    if ref is not None:
        assert y.shape == ref.shape
        assert (y.to(torch.int32) - ref.clamp(min=10)).abs().max().item() <= 1
    conv.release_original()
    assert torch.equal(conv.unpack()[0], w)
    wf = torch.randn(12, 4, 3)
    xf = torch.randn(3, 8, 20)
    fconv = qpack.PackedConv1d(wf, None, stride, padding, 2, 2)
    torch.testing.assert_close(fconv(xf), F.conv1d(xf, wf, None, stride, padding, 2, 2), rtol=1e-5, atol=1e-5)


def test_legacy_quantized_tensors(backend):
    torch.backends.quantized.engine = ENGINE[backend]
    wf = torch.randn(8, 4, 3, 3)
    qw = torch.quantize_per_channel(wf, torch.rand(8, dtype=torch.double) * 0.02 + 0.005,
                                    torch.zeros(8, dtype=torch.long), 0, torch.qint8)
    qx = torch.quantize_per_tensor(torch.randn(2, 4, 9, 9), 0.05, 128, torch.quint8)
    conv = qpack.PackedConv2d(qw, None, 1, 1, backend=backend, output_scale=0.1, output_zero_point=64)
    y = conv(qx)
    assert y.dtype == torch.quint8 and y.q_scale() == 0.1 and y.q_zero_point() == 64
    ref = torch_qconv(ENGINE[backend], qx.int_repr(), 0.05, 128, qw.int_repr(),
                      qw.q_per_channel_scales().tolist(), None, (1, 1), (1, 1), (1, 1), 1, 0.1, 64, None)
    assert (y.int_repr().int() - ref).abs().max().item() <= 1
    conv.release_original()
    wu, _ = conv.unpack()
    assert wu.dtype == torch.qint8 and torch.equal(wu.int_repr(), qw.int_repr())
    assert torch.equal(wu.q_per_channel_scales().float(), qw.q_per_channel_scales().float())


def test_numpy_without_torch_tensors(backend):
    w = np.random.randint(-127, 128, (8, 3, 3, 3)).astype(np.int8)
    x = np.random.randint(0, 256, (1, 3, 10, 10)).astype(np.uint8)
    conv = qpack.PackedConv2d(w, None, 1, 1, backend=backend, weight_scale=0.01, output_scale=0.2,
                              output_zero_point=0, input_scale=0.05, input_zero_point=3)
    y = conv(x)
    assert isinstance(y, np.ndarray) and y.shape == (1, 8, 10, 10) and y.dtype == np.uint8
    ref = torch_qconv(ENGINE[backend], torch.from_numpy(x), 0.05, 3, torch.from_numpy(w), [0.01],
                      None, (1, 1), (1, 1), (1, 1), 1, 0.2, 0, None)
    assert np.abs(y.astype(np.int32) - ref.numpy()).max() <= 1
    wu, bu = conv.unpack()
    assert isinstance(wu, np.ndarray) and (wu == w).all() and bu is None
    fconv = qpack.PackedConv2d(np.ones((2, 3, 1, 1), np.float32))
    np.testing.assert_allclose(fconv(x.astype(np.float32))[0, 1], x[0].sum(0).astype(np.float32), rtol=1e-5)


def test_new_input_scale_repacks_from_packed_form(backend):
    """After release, a new input scale still works (QNNPACK re-packs its int32 bias)."""
    w = torch.randint(-127, 128, (16, 8, 3, 3), dtype=torch.int8)
    b = torch.randn(16) * 3
    x = torch.randint(0, 256, (1, 8, 12, 12), dtype=torch.uint8)
    conv = qpack.PackedConv2d(w, b, 1, 1, backend=backend, weight_scale=0.01, output_scale=0.5,
                              output_zero_point=100, retain=False)
    assert not conv.has_original and conv.nbytes_original == 0 and conv.nbytes_packed > 0
    for si, zi in [(0.05, 128), (0.02, 7), (0.05, 128), (0.1, 0)]:
        y = conv(x, scale=si, zero_point=zi)
        ref = torch_qconv(ENGINE[backend], x, si, zi, w, [0.01], b, (1, 1), (1, 1), (1, 1), 1, 0.5, 100, None)
        assert (y.to(torch.int32) - ref).abs().max().item() <= 1
    assert torch.equal(conv.unpack()[0], w)
    if backend == "qnnpack":
        assert conv.stats["states_built"] >= 3


@pytest.mark.parametrize("k, wmax", [(3, 127), (3, 64), (1, 127)])
def test_zero_points_of_zero_share_the_packed_weights(k, wmax):
    """oneDNN runs a static int8 convolution whose input and / or output zero point is 0 on a
    primitive without them (faster on AVX2), reading the same packed bytes: every combination
    within a quantum of the float oracle, no state built past the first pack, no byte added."""
    g = torch.Generator().manual_seed(k + wmax)
    w = torch.randint(-wmax, wmax + 1, (24, 16, k, k), dtype=torch.int8, generator=g)
    b = torch.randn(24, generator=g)
    x = torch.randint(0, 256, (2, 16, 10, 10), dtype=torch.uint8, generator=g).contiguous(
        memory_format=torch.channels_last)
    made = {}
    for zo in (0, 90):
        conv = qpack.PackedConv2d(w, b, 1, k // 2, backend="onednn", weight_scale=0.01, output_scale=0.3,
                                  output_zero_point=zo, activation="relu" if zo == 0 else None)
        nbytes = conv.nbytes_packed
        for zi in (0, 7, 0):
            y = conv(x, scale=0.05, zero_point=zi)
            ref = float_qconv(x, 0.05, zi, w, [0.01], b, k // 2, 1, 0.3, zo, 1, 1, "relu" if zo == 0 else None)
            assert (y.to(torch.int32) - ref).abs().max().item() <= 1, (zo, zi)
        assert conv.stats["states_built"] == 1 and conv.nbytes_packed == nbytes, conv.stats
        made[zo] = conv
    assert torch.equal(made[0].unpack()[0], w)


def test_zero_points_of_zero_repack_where_their_kernel_wants_another_layout():
    """ResNet-18's 512->512 3x3 at 7x7: oneDNN's kernel without zero points wants another
    blocking than the one with them, so a run with zero points 0 re-packs the weights (not a
    second copy, no zero-point terms); zero points alternating after that stay within a quantum, and the weights
    unpack bit-exact."""
    g = torch.Generator().manual_seed(5)
    w = torch.randint(-127, 128, (512, 512, 3, 3), dtype=torch.int8, generator=g)
    x = torch.randint(0, 256, (1, 512, 7, 7), dtype=torch.uint8, generator=g).contiguous(
        memory_format=torch.channels_last)
    conv = qpack.PackedConv2d(w, None, 1, 1, backend="onednn", weight_scale=0.01, output_scale=0.3,
                              output_zero_point=0, retain=False)
    nbytes = conv.nbytes_packed
    for zi in (0, 7, 0, 7, 0):
        y = conv(x, scale=0.05, zero_point=zi)
        ref = float_qconv(x, 0.05, zi, w, [0.01], None, 1, 1, 0.3, 0, 1, 1, None)
        assert (y.to(torch.int32) - ref).abs().max().item() <= 1, zi
        assert conv.nbytes_packed <= nbytes  # one copy; without the zero-point terms where it runs without them
    assert torch.equal(conv.unpack()[0], w)


def test_batch_zero_and_unbatched(backend):
    w = torch.randint(-127, 128, (4, 2, 3, 3), dtype=torch.int8)
    conv = qpack.PackedConv2d(w, backend=backend, weight_scale=0.01, output_scale=0.1, output_zero_point=0)
    y = conv(torch.zeros(0, 2, 5, 5, dtype=torch.uint8), scale=0.1, zero_point=0)
    assert y.shape == (0, 4, 3, 3)
    y1 = conv(torch.full((2, 5, 5), 200, dtype=torch.uint8), scale=0.1, zero_point=0)
    assert y1.shape == (4, 3, 3)


def test_retain_policy_and_close(backend):
    w = torch.randint(-127, 128, (4, 2, 3, 3), dtype=torch.int8)
    kw = dict(backend=backend, weight_scale=0.01, output_scale=0.1, output_zero_point=0)
    with qpack.retain(True):
        kept = qpack.PackedConv2d(w, **kw)
        released = qpack.PackedConv2d(w, retain=False, **kw)
    assert kept.has_original and kept.nbytes_original == w.numel()
    assert not released.has_original
    x = torch.randint(0, 256, (1, 2, 6, 6), dtype=torch.uint8)
    with kept as c:
        c(x, scale=0.1, zero_point=0)
    assert kept.closed
    kept.close()  # idempotent
    for call in (lambda: kept(x, scale=0.1, zero_point=0), kept.unpack, kept.release_original,
                 lambda: kept.nbytes_packed):
        with pytest.raises(qpack.ClosedError):
            call()
    with pytest.raises(ValueError):
        with kept:
            pass
    assert torch.equal(released.unpack()[0], w)


def _bad_inputs(backend):
    w8 = torch.randint(-127, 128, (4, 2, 3, 3), dtype=torch.int8)
    q = dict(backend=backend, weight_scale=0.01, output_scale=0.1, output_zero_point=0)
    return [
        # (constructor kwargs, call, expected error class, message part)
        ("weight rank", lambda: qpack.PackedConv2d(torch.randn(4, 2, 3)), qpack.InvalidArgumentError, "4-D"),
        ("groups divide", lambda: qpack.PackedConv2d(torch.randn(6, 2, 3, 3), groups=4), qpack.InvalidArgumentError, "groups"),
        ("groups type", lambda: qpack.PackedConv2d(torch.randn(6, 2, 3, 3), groups=1.5), qpack.InvalidTypeError, "groups"),
        ("stride 0", lambda: qpack.PackedConv2d(torch.randn(4, 2, 3, 3), stride=0), qpack.InvalidArgumentError, "stride"),
        ("padding neg", lambda: qpack.PackedConv2d(torch.randn(4, 2, 3, 3), padding=-1), qpack.InvalidArgumentError, "padding"),
        ("same strided", lambda: qpack.PackedConv2d(torch.randn(4, 2, 3, 3), stride=2, padding="same"), qpack.InvalidArgumentError, "same"),
        ("weight dtype", lambda: qpack.PackedConv2d(torch.randn(4, 2, 3, 3).double()), qpack.InvalidTypeError, "float32 or int8"),
        ("no scale", lambda: qpack.PackedConv2d(w8, backend=backend, output_scale=0.1, output_zero_point=0), qpack.InvalidArgumentError, "weight_scale"),
        ("bad scale", lambda: qpack.PackedConv2d(w8, **dict(q, weight_scale=-1.0)), qpack.InvalidArgumentError, "scale"),
        ("nan scale", lambda: qpack.PackedConv2d(w8, **dict(q, weight_scale=float("nan"))), qpack.InvalidArgumentError, "scale"),
        ("scale count", lambda: qpack.PackedConv2d(w8, **dict(q, weight_scale=[0.1, 0.2])), qpack.InvalidArgumentError, "weight_scale"),
        ("out zp", lambda: qpack.PackedConv2d(w8, **dict(q, output_zero_point=300)), qpack.InvalidArgumentError, "output_zero_point"),
        ("bias shape", lambda: qpack.PackedConv2d(w8, torch.randn(3), **q), qpack.InvalidArgumentError, "bias"),
        ("activation", lambda: qpack.PackedConv2d(w8, activation="gelu", **q), qpack.InvalidArgumentError, "activation"),
        ("f32 on qnnpack", lambda: qpack.PackedConv2d(torch.randn(4, 2, 3, 3), backend="qnnpack"), qpack.UnsupportedError, "QNNPACK"),
    ]


def test_bad_construction(backend):
    for name, make, err, part in _bad_inputs(backend):
        with pytest.raises(err, match=part) as info:
            make()
        assert isinstance(info.value, qpack.Error), name
        assert isinstance(info.value, (ValueError, TypeError, NotImplementedError)), name


def test_bad_calls_leave_object_usable(backend):
    w = torch.randint(-127, 128, (4, 2, 3, 3), dtype=torch.int8)
    conv = qpack.PackedConv2d(w, None, 1, 0, backend=backend, weight_scale=0.01, output_scale=0.1,
                              output_zero_point=0)
    good = torch.randint(0, 256, (1, 2, 6, 6), dtype=torch.uint8)
    expected = conv(good, scale=0.1, zero_point=5)
    bad = [
        (lambda: conv(torch.randint(0, 256, (1, 3, 6, 6), dtype=torch.uint8), scale=0.1, zero_point=0), ValueError, "channels"),
        (lambda: conv(torch.randint(0, 256, (2, 1, 2, 6, 6), dtype=torch.uint8), scale=0.1, zero_point=0), ValueError, "4-D"),
        (lambda: conv(torch.randint(0, 256, (1, 2, 2, 2), dtype=torch.uint8), scale=0.1, zero_point=0), ValueError, "smaller than the dilated kernel"),
        (lambda: conv(good.float(), scale=0.1, zero_point=0), TypeError, "uint8"),
        (lambda: conv(good), ValueError, "no input scale"),
        (lambda: conv(good, scale=0.0, zero_point=0), ValueError, "scale"),
        (lambda: conv(good, scale=float("inf"), zero_point=0), ValueError, "scale"),
        (lambda: conv(good, scale=0.1, zero_point=256), ValueError, "zero_point"),
        (lambda: conv(good, scale=0.1, zero_point=1.5), TypeError, "zero_point"),
        (lambda: conv(good, scale=1e-40, zero_point=0), ValueError, "float32"),
    ]
    for call, builtin, part in bad:
        with pytest.raises(qpack.Error, match=part) as info:
            call()
        assert isinstance(info.value, builtin)
        assert torch.equal(conv(good, scale=0.1, zero_point=5), expected)
    fconv = qpack.PackedConv2d(torch.randn(4, 2, 3, 3))
    with pytest.raises(qpack.InvalidTypeError):
        fconv(good)
    with pytest.raises(qpack.InvalidArgumentError):
        fconv(torch.randn(1, 2, 6, 6), scale=0.1)
    assert fconv(torch.randn(1, 2, 6, 6)).shape == (1, 4, 4, 4)


def test_concurrent_runs_share_one_object(backend):
    w = torch.randint(-127, 128, (16, 8, 3, 3), dtype=torch.int8)
    conv = qpack.PackedConv2d(w, torch.randn(16), 1, 1, backend=backend, weight_scale=0.01,
                              output_scale=0.3, output_zero_point=50, retain=False)
    xs = [torch.randint(0, 256, (1, 8, 10, 10), dtype=torch.uint8) for _ in range(4)]
    scales = [0.05, 0.03]
    expected = {(i, s): conv(x, scale=s, zero_point=128) for (i, x), s in itertools.product(enumerate(xs), scales)}
    errors = []

    def worker(k):
        try:
            for r in range(20):
                i, s = (k + r) % len(xs), scales[(k * 7 + r) % 2]
                if not torch.equal(conv(xs[i], scale=s, zero_point=128), expected[(i, s)]):
                    errors.append((k, r))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize("cin,cout,k,groups", [(32, 192, 1, 1), (16, 16, 3, 16), (8, 24, 3, 1)])
def test_one_object_many_input_sizes_matches_torch(needs_torch, backend, cin, cout, k, groups):
    """Input sizes other than the one the weights were packed for: oneDNN may
    want another layout (qpack re-packs from the packed form); results must
    stay exact, and unpack must stay bit-exact after re-packing."""
    torch = needs_torch
    rng = np.random.default_rng(cin + cout)
    w = rng.integers(-127, 128, size=(cout, cin // groups, k, k), dtype=np.int8)
    b = rng.standard_normal(cout).astype(np.float32)
    conv = qpack.PackedConv2d(w, b, padding=k // 2, groups=groups, backend=backend, weight_scale=0.005,
                              output_scale=0.05, output_zero_point=10, retain=False)
    engine = "qnnpack" if backend == "qnnpack" else "x86"
    for size in (28, 12, 28, 20, 12, 7, 12):
        x = rng.integers(0, 256, size=(1, cin, size, size), dtype=np.uint8)
        y = np.asarray(conv(x, scale=0.02, zero_point=120)).astype(np.int32)
        ref = torch_qconv(engine, torch.from_numpy(x), 0.02, 120, torch.from_numpy(w), [0.005],
                          torch.from_numpy(b), (1, 1), (k // 2, k // 2), (1, 1), groups, 0.05, 10, None)
        assert np.abs(y - ref.contiguous().numpy()).max() <= 1, f"size {size}"
    np.testing.assert_array_equal(conv.unpack()[0], w)


def test_fp32_many_input_sizes(needs_torch):
    torch = needs_torch
    w, b = torch.randn(48, 16, 1, 1), torch.randn(48)
    conv = qpack.PackedConv2d(w, b, retain=False)
    for size in (28, 12, 5, 28, 40, 12):
        x = torch.randn(1, 16, size, size).contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(conv(x), torch.nn.functional.conv2d(x, w, b), rtol=1e-4, atol=1e-4)
    assert torch.equal(conv.unpack()[0], w)


def test_qnnpack_bias_that_does_not_fit_int32_is_an_error():
    w = np.ones((4, 8, 1, 1), np.int8)
    conv = qpack.PackedConv2d(w, np.full(4, 5.0, np.float32), backend="qnnpack", weight_scale=1e-4,
                              output_scale=0.1, output_zero_point=0)
    x = np.ones((1, 8, 2, 2), np.uint8)
    with pytest.raises(qpack.InvalidArgumentError, match="int32 bias"):
        conv(x, scale=1e-8, zero_point=0)
    assert np.asarray(conv(x, scale=0.01, zero_point=0)).max() == 50  # still usable
