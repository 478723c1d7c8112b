"""oneDNN int8 on ISAs without VNNI (AVX2, AVX-512 without VNNI) is exact.

There oneDNN's u8 x s8 kernels add pairs of products in saturating int16
(vpmaddubsw); qpack splits the activations so that nothing saturates. oneDNN
reads ONEDNN_MAX_CPU_ISA once, at first use, so each ISA runs this file as a
script in a fresh process. PyTorch's oneDNN-backed engines (x86, onednn) read
the same variable and then saturate themselves, so the oracles here are exact
ones: QNNPACK's engine for linear, a float64 reference for convolution.
"""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import qpack

NON_VNNI = ("sse41", "avx", "avx2", "avx512_core")


@pytest.mark.skipif(not qpack.backends()["onednn"]["available"], reason="oneDNN is not built")
@pytest.mark.parametrize("max_isa", ["AVX2", "AVX512_CORE"])
def test_onednn_int8_exact_without_vnni(needs_torch, max_isa):
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA=max_isa, OMP_NUM_THREADS="2")
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                          timeout=600)
    print(proc.stdout)  # the ISA oneDNN used and the worst differences (pytest -s, -rP)
    assert proc.returncode == 0, f"ONEDNN_MAX_CPU_ISA={max_isa}:\n{proc.stdout}\n{proc.stderr}"


# ---- the child process ---------------------------------------------------------

def _linear_checks(torch):
    from _oracle import dynamic_linear, static_linear

    rng = np.random.default_rng(7)
    worst_static = worst_dynamic = 0.0
    for m, k, n in [(1, 1, 1), (3, 5, 7), (6, 17, 33), (5, 131, 67), (8, 256, 96), (2, 1000, 40)]:
        for per_channel in (False, True):
            w = rng.integers(-127, 128, size=(n, k), dtype=np.int8)
            ws = (rng.random(n if per_channel else 1) * 0.02 + 0.002).astype(np.float32)
            b = rng.standard_normal(n).astype(np.float32)
            x = rng.integers(0, 256, size=(m, k), dtype=np.uint8)
            x[0] = 255  # the worst case for saturation
            # narrow inputs (bytes and zero point below 128) run the fused primitive: at worst
            # 2 * 127 * 128 per pair, weights -128 and 127 in turn, inputs 127
            narrow = np.minimum(x, 127)
            narrow[0] = 127
            wn = np.where(np.arange(k) % 2 == 0, -128, 127).astype(np.int8)[None].repeat(n, 0)
            cases = [(x, w, zp) for zp in (0, 1, 117, 255)] + [(narrow, w, 0), (narrow, wn, 0), (narrow, wn, 127)]
            for relu in (False, True):
                for x, w, in_zp in cases:
                    out_s, out_zp = 0.2 + 0.01 * k, 93
                    lin = qpack.PackedLinear(w, b, backend="onednn", weight_scale=ws,
                                             activation="relu" if relu else None,
                                             output_scale=out_s, output_zero_point=out_zp)
                    y = lin(x, scale=0.04, zero_point=in_zp)
                    ref = static_linear(torch, "qnnpack", w, ws, b, x, 0.04, in_zp, out_s, out_zp,
                                        relu=relu)
                    diff = np.abs(y.astype(np.int32) - ref.astype(np.int32)).max()
                    assert diff <= 1, (m, k, n, per_channel, relu, in_zp, diff)
                    worst_static = max(worst_static, diff)
            xf = (rng.standard_normal((m, k)) * 3).astype(np.float32)
            lin = qpack.PackedLinear(w, b, backend="onednn", weight_scale=ws[:1], dynamic=True)
            ref = dynamic_linear(torch, "qnnpack", w, ws[:1], b, xf)
            tol = 1e-5 * max(1.0, float(np.abs(ref).max()))
            np.testing.assert_allclose(lin(xf), ref, rtol=1e-5, atol=tol)
            worst_dynamic = max(worst_dynamic, float(np.abs(lin(xf) - ref).max()))
    return f"linear static max diff {worst_static} quanta, dynamic max abs diff {worst_dynamic:.2e}"


def _few_rows_checks(torch):
    """Narrow weights and batches of up to 16 rows run on qpack's own kernel (gemv_u8.h):
    within a quantum of PyTorch's and of a batch of 17 (oneDNN's matmul) run on the same
    rows; dynamic within float rounding of PyTorch's. K and N off the kernel's blocks of 32
    inputs and 4 outputs, odd row counts, and weights at +-64 on inputs of 255 (the largest
    int16 pair sums)."""
    from _oracle import dynamic_linear, static_linear

    rng = np.random.default_rng(5)
    worst, checked = 0, 0
    for k, n in [(1, 1), (31, 3), (32, 4), (65, 13), (1000, 257), (512, 512)]:
        w = rng.integers(-64, 65, size=(n, k), dtype=np.int8)
        w[: n // 2] = np.where(w[: n // 2] < 0, -64, 64)
        ws = (rng.random(n) * 0.02 + 0.002).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        x = rng.integers(0, 256, size=(17, k), dtype=np.uint8)
        x[0] = 255
        for relu in (False, True):
            for in_zp in (0, 117, 255):
                out_s, out_zp = 0.05 * np.sqrt(k), 93
                lin = qpack.PackedLinear(w, b, backend="onednn", weight_scale=ws,
                                         activation="relu" if relu else None,
                                         output_scale=out_s, output_zero_point=out_zp)
                batch = lin(x, scale=0.04, zero_point=in_zp)
                ref = static_linear(torch, "qnnpack", w, ws, b, x, 0.04, in_zp, out_s, out_zp, relu=relu)
                for m in (1, 2, 5, 16):
                    rows = np.concatenate([lin(x[i:i + m], scale=0.04, zero_point=in_zp)
                                           for i in range(0, 17 - 17 % m, m)]).astype(np.int32)
                    for other in (batch[: len(rows)], ref[: len(rows)]):
                        diff = np.abs(rows - other.astype(np.int32)).max()
                        assert diff <= 1, (k, n, m, relu, in_zp, diff)
                        worst = max(worst, diff)
                diff = np.abs(batch.astype(np.int32) - ref.astype(np.int32)).max()
                assert diff <= 1, (k, n, relu, in_zp, diff)
                assert lin.stats["split_runs"] == 0, lin.stats
                worst, checked = max(worst, diff), checked + 1
        xf = (rng.standard_normal((9, k)) * 3).astype(np.float32)
        dyn = qpack.PackedLinear(w, b, backend="onednn", weight_scale=ws[:1], dynamic=True)
        ref = dynamic_linear(torch, "qnnpack", w, ws[:1], b, xf)
        np.testing.assert_allclose(dyn(xf), ref, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(ref).max())))
    return f"few rows on narrow weights: {checked} static cases max diff {worst} quanta"


def _conv_checks(torch):
    from test_conv import cases, float_qconv, make_int8

    worst, count = 0, 0
    for case in cases(40, seed=1) + cases(60, seed=100):
        w, ws, b, x = make_int8(case)
        for zi in (0, 117, 255):
            si, so, zo = 0.04, 0.25, 98
            conv = qpack.PackedConv2d(w, b, case["stride"], case["padding"], case["dilation"],
                                      case["groups"], backend="onednn", weight_scale=ws,
                                      output_scale=so, output_zero_point=zo,
                                      activation=case["activation"])
            y = conv(x, scale=si, zero_point=zi)
            ref = float_qconv(x, si, zi, w, ws, b, case["padding"], case["groups"], so, zo,
                              case["stride"], case["dilation"], case["activation"])
            diff = (y.to(torch.int32) - ref).abs().max().item() if y.numel() else 0
            assert diff <= 1, (case, zi, diff)
            worst, count = max(worst, diff), count + 1
    # Worst cases for int16 pair sums: inputs mostly 255, weights +-127/-128
    # (depthwise runs unsplit: this checks that oneDNN's kernel stays exact).
    gen = torch.Generator().manual_seed(3)
    for cin, cout, groups, k, stride in [(24, 24, 24, 3, 1), (16, 16, 16, 5, 2), (16, 8, 1, 3, 1),
                                         (8, 12, 2, 3, 1), (32, 16, 1, 1, 1)]:
        w = torch.where(torch.rand(cout, cin // groups, k, k, generator=gen) < 0.5,
                        torch.tensor(127, dtype=torch.int8), torch.tensor(-128, dtype=torch.int8))
        x = torch.randint(0, 256, (2, cin, 9, 9), dtype=torch.uint8, generator=gen)
        x[torch.rand(x.shape, generator=gen) < 0.7] = 255
        ws, si, zi, zo = [0.02], 0.04, 3, 128
        so = (cin // groups) * k * k * 255 * 128 * si * ws[0] / 100  # outputs within +-100 quanta
        conv = qpack.PackedConv2d(w, None, stride, k // 2, 1, groups, backend="onednn",
                                  weight_scale=ws, output_scale=so, output_zero_point=zo)
        # the same with inputs below 128 (the fused primitive, 127 where the wide ones are 255)
        for xs, z in ((x, zi), (x.clamp(max=127), zi), (x.clamp(max=127), 127)):
            y = conv(xs, scale=si, zero_point=z)
            ref = float_qconv(xs, si, z, w, ws, None, k // 2, groups, so, zo, stride)
            diff = (y.to(torch.int32) - ref).abs().max().item()
            assert diff <= 1, (cin, cout, groups, k, stride, z, diff)
            worst, count = max(worst, diff), count + 1
    # Strided 1x1 convolutions without padding: oneDNN 3.2's AVX2 kernel gathers their
    # pixels itself and, on 2 threads with input channels off a multiple of 16, returned
    # wrong values that changed from run to run; qpack gathers them (conv.cc), also where
    # the input or the weights (within [-64, 64]) are narrow and it runs fused.
    for cin, stride, nhwc, n, wmax in [(8, (2, 2), True, 1, 127), (24, (1, 2), True, 3, 127),
                                       (24, (2, 2), False, 2, 127), (40, (2, 1), True, 2, 127),
                                       (56, (2, 2), False, 1, 127), (64, (2, 2), True, 2, 127),
                                       (8, (2, 2), True, 1, 64), (24, (1, 2), True, 3, 64),
                                       (24, (2, 2), False, 2, 64), (40, (2, 1), True, 2, 64)]:
        w = torch.randint(-wmax, wmax + 1, (144, cin, 1, 1), dtype=torch.int8, generator=gen)
        x = torch.randint(0, 256, (n, cin, 15, 8), dtype=torch.uint8, generator=gen)
        if nhwc:
            x = x.contiguous(memory_format=torch.channels_last)
        conv = qpack.PackedConv2d(w, None, stride, 0, 1, 1, backend="onednn", weight_scale=[0.01],
                                  output_scale=0.25, output_zero_point=98)
        ref = float_qconv(x, 0.04, 117, w, [0.01], None, 0, 1, 0.25, 98, stride)
        for _ in range(3):
            diff = (conv(x, scale=0.04, zero_point=117).to(torch.int32) - ref).abs().max().item()
            assert diff <= 1, (cin, stride, nhwc, n, diff)
            worst, count = max(worst, diff), count + 1
    return f"conv {count} cases max diff {worst} quanta"


def _narrow_weight_checks(torch, tmp):
    """Weights within [-64, 64] run fused whatever the input (stats: no split run), and exact
    on all-255 inputs with every weight at +-64 (the largest pair sums, 2 * 255 * 64); one
    weight of 65 brings the split back. So after a save and load, and for a strided 1x1
    (whose pixels qpack gathers in every mode)."""
    from test_conv import float_qconv

    gen = torch.Generator().manual_seed(11)
    checked = 0
    for wmax in (64, 65):
        sign = torch.where(torch.rand(40, 72, generator=gen) < 0.5, 1, -1)
        w = (sign * 64).to(torch.int8)
        w[0, 0] = wmax
        x = torch.full((3, 72), 255, dtype=torch.uint8)
        x[1] = torch.randint(0, 256, (72,), dtype=torch.uint8, generator=gen)
        so = 72 * 255 * 64 * 0.04 * 0.01 / 100
        lin = qpack.PackedLinear(w, None, backend="onednn", weight_scale=[0.01], output_scale=so,
                                 output_zero_point=128)
        acc = (x.double() - 3) @ w.double().T
        ref = (acc * 0.04 * 0.01 / so + 128).round().clamp(0, 255)
        for packed in (lin, _reloaded(lin, tmp / f"linear{wmax}.qpack")):
            y = packed(x, scale=0.04, zero_point=3)
            assert (y.double() - ref).abs().max() <= 1, wmax
            assert (packed.stats["split_runs"] == 0) == (wmax == 64), (wmax, packed.stats)
            checked += 1
        for stride, k in ((1, 3), (2, 1)):
            wc = torch.where(torch.rand(16, 24, k, k, generator=gen) < 0.5, 64, -64).to(torch.int8)
            wc[0, 0, 0, 0] = wmax
            xc = torch.randint(0, 256, (2, 24, 9, 9), dtype=torch.uint8, generator=gen)
            xc[torch.rand(xc.shape, generator=gen) < 0.7] = 255
            so = 24 * k * k * 255 * 64 * 0.04 * 0.01 / 100
            conv = qpack.PackedConv2d(wc, None, stride, k // 2, 1, 1, backend="onednn", weight_scale=[0.01],
                                      output_scale=so, output_zero_point=128)
            ref = float_qconv(xc, 0.04, 3, wc, [0.01], None, k // 2, 1, so, 128, stride)
            for packed in (conv, _reloaded(conv, tmp / f"conv{wmax}{k}.qpack")):
                for _ in range(3):  # the strided 1x1 on 2 threads: oneDNN's own gather was wrong
                    diff = (packed(xc, scale=0.04, zero_point=3).to(torch.int32) - ref).abs().max().item()
                    assert diff <= 1, (wmax, stride, k, diff)
                assert (packed.stats["split_runs"] == 0) == (wmax == 64), (wmax, k, packed.stats)
                checked += 1
    # depthwise: narrow weights run qpack's AVX2 kernel (pairs in int16), wide ones oneDNN's;
    # both exact, also at +-64 weights on inputs of 255 (the largest pair sums)
    worst = 0
    for c, k, stride, pad, dil, size, nhwc in [(144, 3, 1, 1, 1, 20, True), (144, 3, 2, 1, 1, 21, True),
                                               (120, 5, 1, 2, 1, 14, True), (40, 5, 2, 2, 1, 14, True),
                                               (32, 3, 1, 1, 1, 20, False), (24, 3, 2, 0, 1, 11, True),
                                               (16, 7, 1, 3, 2, 12, True), (960, 3, 1, 1, 1, 7, True),
                                               (20, 3, 1, 1, 1, 9, True), (200, 3, 1, 1, 1, 6, True)]:
        for wmax in (64, 127):
            w, x, b, ws = _extreme_case(torch, gen, (c, 1, k, k), c, size, nhwc, wmax)
            so = k * k * 255 * 64 * 0.04 * 0.005 / 60
            conv = qpack.PackedConv2d(w, b, stride, pad, dil, c, backend="onednn", weight_scale=ws,
                                      output_scale=so, output_zero_point=100, activation="relu")
            ref = float_qconv(x, 0.04, 7, w, ws, b, pad, c, so, 100, stride, dil, "relu")
            diff = (conv(x, scale=0.04, zero_point=7).to(torch.int32) - ref).abs().max().item()
            assert diff <= 1, (c, k, stride, pad, dil, size, nhwc, wmax, diff)
            worst, checked = max(worst, diff), checked + 1
    # 1x1 with own kernels allowed and not (QPACK_ONEDNN_OWN_POINTWISE): narrow weights run
    # fused, wide ones split; exact at every output count (tails of 8-24 past 32), inputs not
    # a multiple of 4, strides (gathered pixels), NCHW input, on 2 threads
    pw_worst = 0
    for ci, co, size, stride, nhwc in [(16, 96, 15, 1, True), (24, 144, 9, 1, True), (5, 40, 7, 1, True),
                                       (13, 72, 11, 2, True), (64, 200, 6, 1, False), (32, 16, 9, 1, True),
                                       (3, 32, 5, 1, True), (96, 24, 7, 1, True), (33, 1000, 3, 1, True)]:
        for wmax in (64, 127):
            w, x, b, ws = _extreme_case(torch, gen, (co, ci, 1, 1), ci, size, nhwc, wmax)
            so = ci * 255 * 64 * 0.04 * 0.005 / 60
            ref = float_qconv(x, 0.04, 9, w, ws, b, 0, 1, so, 90, stride, 1, "relu6")
            for own in ("1", "0"):
                os.environ["QPACK_ONEDNN_OWN_POINTWISE"] = own
                try:
                    conv = qpack.PackedConv2d(w, b, stride, 0, 1, 1, backend="onednn", weight_scale=ws,
                                              output_scale=so, output_zero_point=90, activation="relu6")
                finally:
                    del os.environ["QPACK_ONEDNN_OWN_POINTWISE"]
                for _ in range(2):  # 2 threads: pixels split between them
                    diff = (conv(x, scale=0.04, zero_point=9).to(torch.int32) - ref).abs().max().item()
                    assert diff <= 1, (ci, co, size, stride, nhwc, wmax, own, diff)
                pw_worst, checked = max(pw_worst, diff), checked + 1
    return (f"narrow weights: {checked} packed objects fused at [-64, 64], split at 65; depthwise "
            f"max diff {worst} quanta, 1x1 max diff {pw_worst}")


def _extreme_case(torch, gen, wshape, ci, size, nhwc, wmax):
    """Weights in [-wmax, wmax], the first half of the outputs' all at +-wmax, on a batch of 2
    whose inputs are 255 at half the places (the largest pair sums); bias and scales."""
    co = wshape[0]
    w = torch.randint(-wmax, wmax + 1, wshape, dtype=torch.int8, generator=gen)
    w[:co // 2] = torch.where(w[:co // 2] < 0, -wmax, wmax).to(torch.int8)
    x = torch.randint(0, 256, (2, ci, size, size), dtype=torch.uint8, generator=gen)
    x[torch.rand(x.shape, generator=gen) < 0.5] = 255
    if nhwc:
        x = x.contiguous(memory_format=torch.channels_last)
    return w, x, torch.randn(co, generator=gen), (torch.rand(co, generator=gen) * 0.01 + 0.001).tolist()


def _reloaded(packed, path):
    packed.save(str(path))
    return qpack.load(str(path))


def _child():
    import torch

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    torch.set_num_threads(1)
    version = qpack.backends()["onednn"]["version"]
    isa = version.split("isa=")[1].split()[0].rstrip(";,")
    print(f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA')}: oneDNN used isa={isa}")
    assert isa in NON_VNNI, f"expected an ISA without VNNI, oneDNN reports {version}"
    assert qpack.backends()["onednn"]["int8_input_max"] == 127
    print(_linear_checks(torch))
    print(_few_rows_checks(torch))
    print(_conv_checks(torch))
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        print(_narrow_weight_checks(torch, pathlib.Path(tmp)))


if __name__ == "__main__":
    _child()
