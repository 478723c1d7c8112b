"""Static int8 depthwise convolutions on the oneDNN backend: qpack's own kernel
(src/backends/onednn/depthwise_u8.cc) against oneDNN 3.2's kernel on the same
packed weights, and PyTorch's x86 quantized conv, on MobileNetV2's ten
depthwise shapes (batch 1, uint8 channels-last in and out, fused ReLU6).

    .venv/bin/python bench/bench_depthwise.py [--reps N] [--threads 1]

oneDNN's kernel runs the convolutions made while QPACK_ONEDNN_OWN_DEPTHWISE=0
(read when a convolution is made). Medians over rounds that alternate the
three configurations, so other load on the machine hits all of them alike.
"""
import argparse
import os
import statistics
import time
import warnings

import torch

import qpack

warnings.filterwarnings("ignore")

# (channels, input size, stride): MobileNetV2 at 224x224
SHAPES = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 2),
          (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1)]
# how often each shape occurs in MobileNetV2
COUNT = {(32, 112, 1): 1, (96, 112, 2): 1, (144, 56, 1): 1, (144, 56, 2): 1, (192, 28, 1): 2,
         (192, 28, 2): 1, (384, 14, 1): 4, (576, 14, 1): 2, (576, 14, 2): 1, (960, 7, 1): 3}


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


def case(c, h, stride):
    g = torch.Generator().manual_seed(c * 1000 + h)
    w = torch.randint(-127, 128, (c, 1, 3, 3), dtype=torch.int8, generator=g)
    ws = (torch.rand(c, generator=g) * 0.01 + 0.002).tolist()
    b = torch.randn(c, generator=g)
    x = torch.randint(0, 256, (1, c, h, h), dtype=torch.uint8, generator=g).contiguous(
        memory_format=torch.channels_last)
    return w, ws, b, x


def qpack_conv(c, h, s, own):
    w, ws, b, x = case(c, h, s)
    os.environ["QPACK_ONEDNN_OWN_DEPTHWISE"] = "1" if own else "0"
    try:
        conv = qpack.PackedConv2d(w, b, s, 1, 1, c, backend="onednn", weight_scale=ws, activation="relu6",
                                  output_scale=0.05, output_zero_point=0, retain=False)
    finally:
        del os.environ["QPACK_ONEDNN_OWN_DEPTHWISE"]
    return lambda: conv(x, scale=0.03, zero_point=0)


def torch_conv(c, h, s):
    w, ws, b, x = case(c, h, s)
    qw = torch._make_per_channel_quantized_tensor(w, torch.tensor(ws, dtype=torch.double),
                                                  torch.zeros(c, dtype=torch.long), 0)
    packed = torch.ops.quantized.conv2d_prepack(qw, b, [s, s], [1, 1], [1, 1], c)
    qx = torch._make_per_tensor_quantized_tensor(x, 0.03, 0)
    return lambda: torch.ops.quantized.conv2d_relu(qx, packed, 0.05, 0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    qpack.set_num_threads(args.threads)
    torch.backends.quantized.engine = "x86"
    own, onednn, peer = {}, {}, {}
    for c, h, st in SHAPES:
        k = f"{c},{h},{st}"
        own[k], onednn[k], peer[k] = medians_us(
            [qpack_conv(c, h, st, True), qpack_conv(c, h, st, False), torch_conv(c, h, st)], args.reps)
    print(f"int8 depthwise 3x3 + ReLU6, batch 1, channels-last u8, {args.threads} thread(s), "
          f"median of {args.reps} (µs)\n")
    print(f"{'shape':<20} {'x in MNv2':>9} {'qpack kernel':>13} {'oneDNN kernel':>14} "
          f"{'torch x86':>10} {'oneDNN/qpack':>13}")
    tot = {"own": 0.0, "onednn": 0.0, "torch": 0.0}
    for c, h, s in SHAPES:
        k = f"{c},{h},{s}"
        n = COUNT[(c, h, s)]
        tot["own"] += n * own[k]
        tot["onednn"] += n * onednn[k]
        tot["torch"] += n * peer[k]
        shape = f"{c} @{h}² s{s}" + (" *" if c < 64 else "")
        print(f"{shape:<20} {n:>9} {own[k]:>13.1f} {onednn[k]:>14.1f} {peer[k]:>10.1f} "
              f"{onednn[k] / own[k]:>13.2f}")
    print("* below 64 channels qpack keeps oneDNN's kernel (both columns run it)")
    print(f"{'MobileNetV2 total':<20} {'':>9} {tot['own']:>13.1f} {tot['onednn']:>14.1f} {tot['torch']:>10.1f} "
          f"{tot['onednn'] / tot['own']:>13.2f}")


if __name__ == "__main__":
    main()
