"""Static int8 convolutions on qpack's own oneDNN-backend kernels against oneDNN 3.2's
kernels on the same packed weights, and PyTorch's x86 quantized conv: MobileNetV2's ten
depthwise shapes (src/backends/onednn/depthwise_u8.cc), its 1x1 shapes with ResNet-18's
strided 1x1 (pointwise_u8.cc), and first layers over 1-3 channels (pointwise_u8.cc's windows,
"same" padding); batch 1, uint8 channels-last in and out, fused ReLU6.

    .venv/bin/python bench/bench_own_kernels.py [--kind depthwise|pointwise|window|all] [--reps N] [--threads 1]

oneDNN's kernel runs the convolutions made while QPACK_ONEDNN_OWN_DEPTHWISE=0,
QPACK_ONEDNN_OWN_POINTWISE=0 or QPACK_ONEDNN_OWN_WINDOW=0 (read when a convolution is made);
where qpack keeps oneDNN's kernel anyway (below 64 channels depthwise; blocks of 16 outputs,
or many inputs over few pixels, 1x1; 3x3 windows over 3 channels) both columns run it. Medians over rounds that alternate the three
configurations, so other load on the machine hits all of them alike.
"""
import argparse
import os
import statistics
import time
import warnings

import torch

import qpack

warnings.filterwarnings("ignore")

# kind -> [((in channels, out channels, input size, kernel, stride), times in the model)]
SHAPES = {
    "depthwise": [((c, c, h, 3, s), n) for c, h, s, n in (
        (32, 112, 1, 1), (96, 112, 2, 1), (144, 56, 1, 1), (144, 56, 2, 1), (192, 28, 1, 2),
        (192, 28, 2, 1), (384, 14, 1, 4), (576, 14, 1, 2), (576, 14, 2, 1), (960, 7, 1, 3))],
    "pointwise": [((ci, co, h, 1, s), n) for ci, co, h, s, n in (
        (32, 16, 112, 1, 1), (16, 96, 112, 1, 1), (96, 24, 56, 1, 1), (24, 144, 56, 1, 2),
        (144, 24, 56, 1, 1), (144, 32, 28, 1, 1), (32, 192, 28, 1, 3), (192, 32, 28, 1, 2),
        (192, 64, 14, 1, 1), (64, 384, 14, 1, 4), (384, 64, 14, 1, 3), (384, 96, 14, 1, 1),
        (96, 576, 14, 1, 3), (576, 96, 14, 1, 2), (576, 160, 7, 1, 1), (160, 960, 7, 1, 3),
        (960, 160, 7, 1, 2), (960, 320, 7, 1, 1), (320, 1280, 7, 1, 1),
        # ResNet-18's downsampling 1x1 (not in MobileNetV2: counted 0)
        (64, 128, 56, 2, 0), (128, 256, 28, 2, 0), (256, 512, 14, 2, 0))],
    # windows over 1-3 channels (pointwise_u8.h): ResNet's 7x7 stem, other first layers,
    # MobileNetV2's 3x3 stem (oneDNN's kernel in both columns); counted in ResNet-18
    "window": [((ci, co, h, k, s), n) for ci, co, h, k, s, n in (
        (3, 64, 224, 7, 2, 1), (3, 24, 224, 5, 2, 0), (1, 32, 112, 3, 1, 0), (2, 64, 56, 3, 1, 0),
        (3, 96, 224, 4, 4, 0), (3, 32, 224, 3, 2, 0))],
}
NARROW_ONLY = qpack.backends()["onednn"].get("int8_input_max", 255) == 127
ENV = {"depthwise": "QPACK_ONEDNN_OWN_DEPTHWISE", "pointwise": "QPACK_ONEDNN_OWN_POINTWISE",
       "window": "QPACK_ONEDNN_OWN_WINDOW"}


def medians_us(fns, reps, rounds=10):
    """Median wall time of each fn, timed in alternating rounds."""
    ts = [[] for _ in fns]
    for fn in fns:
        for _ in range(5):
            fn()
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            for _ in range(max(1, reps // rounds)):
                t = time.perf_counter()
                fn()
                ts[i].append(time.perf_counter() - t)
    return [statistics.median(t) * 1e6 for t in ts]


def case(kind, shape):
    ci, co, h, k, s = shape
    g = torch.Generator().manual_seed(ci * 1000 + co + h)
    groups = ci if kind == "depthwise" else 1
    # without VNNI qpack's kernels take narrow weights (within [-64, 64], freeze's default
    # reduce_range="weights" there): wider ones run split on oneDNN in both columns
    wmax = 64 if NARROW_ONLY else 127
    w = torch.randint(-wmax, wmax + 1, (co, ci // groups, k, k), dtype=torch.int8, generator=g)
    ws = (torch.rand(co, generator=g) * 0.01 + 0.002).tolist()
    b = torch.randn(co, generator=g)
    x = torch.randint(0, 256, (1, ci, h, h), dtype=torch.uint8, generator=g).contiguous(
        memory_format=torch.channels_last)
    return w, ws, b, x, groups, k // 2


def qpack_conv(kind, shape, own):
    w, ws, b, x, groups, pad = case(kind, shape)
    os.environ[ENV[kind]] = "1" if own else "0"
    try:
        conv = qpack.PackedConv2d(w, b, shape[4], pad, 1, groups, backend="onednn", weight_scale=ws,
                                  activation="relu6", output_scale=0.05, output_zero_point=0, retain=False)
    finally:
        del os.environ[ENV[kind]]
    return lambda: conv(x, scale=0.03, zero_point=0)


def torch_conv(kind, shape):
    w, ws, b, x, groups, pad = case(kind, shape)
    s = shape[4]
    qw = torch._make_per_channel_quantized_tensor(w, torch.tensor(ws, dtype=torch.double),
                                                  torch.zeros(len(ws), dtype=torch.long), 0)
    packed = torch.ops.quantized.conv2d_prepack(qw, b, [s, s], [pad, pad], [1, 1], groups)
    qx = torch._make_per_tensor_quantized_tensor(x, 0.03, 0)
    return lambda: torch.ops.quantized.conv2d_relu(qx, packed, 0.05, 0)


def table(kind, reps, threads):
    print(f"int8 {kind} + ReLU6, batch 1, channels-last u8, {threads} thread(s), median of {reps} (µs)\n")
    print(f"{'shape':<24} {'x in model':>9} {'qpack kernel':>13} {'oneDNN kernel':>14} "
          f"{'torch x86':>10} {'oneDNN/qpack':>13}")
    tot = [0.0, 0.0, 0.0]
    for shape, n in SHAPES[kind]:
        times = medians_us([qpack_conv(kind, shape, True), qpack_conv(kind, shape, False),
                            torch_conv(kind, shape)], reps)
        tot = [t + n * v for t, v in zip(tot, times)]
        ci, co, h, k, s = shape
        name = f"{ci} @{h}² s{s}" if kind == "depthwise" else f"{ci}->{co} @{h}² s{s}"
        print(f"{name:<24} {n:>9} {times[0]:>13.1f} {times[1]:>14.1f} {times[2]:>10.1f} "
              f"{times[1] / times[0]:>13.2f}")
    model = "ResNet-18" if kind == "window" else "MobileNetV2"
    print(f"{model + ' total':<24} {'':>9} {tot[0]:>13.1f} {tot[1]:>14.1f} {tot[2]:>10.1f} "
          f"{tot[1] / tot[0]:>13.2f}\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", choices=["depthwise", "pointwise", "window", "all"], default="all")
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    qpack.set_num_threads(args.threads)
    torch.backends.quantized.engine = "x86"
    for kind in (["depthwise", "pointwise", "window"] if args.kind == "all" else [args.kind]):
        table(kind, args.reps, args.threads)


if __name__ == "__main__":
    main()
