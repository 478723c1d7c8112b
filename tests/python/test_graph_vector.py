"""The graph's vector code paths: fp32 sigmoid and SiLU nodes run a vectorized exp
(src/core/vec_math.cc) where the CPU has AVX2 or AVX-512, within DESIGN.md's 1e-5 relative
tolerance of PyTorch for every value, tail length and extreme input; NCHW <-> NHWC
conversions at the graph's edges go by AVX2 8x8 float blocks (SSE2 4x4 without AVX2) and
SSE2 16x16 byte blocks, with element loops at the edges of the blocks, exactly; dequantize
nodes exactly (AVX2, 8 values a step). The u8 activation table (AVX-512 VBMI, 64 bytes a step), the
per-channel u8 affine (BatchNorm the convolution cannot absorb, and the squeeze-excitation mul
through the same kernel) and the equal-shape u8 mul (AVX-512, 16 values a step) with masked
tails: each such node within one quantum of PyTorch given the node's own u8 inputs (the graph
returns them too), and equal to the scalar loops (QPACK_VEC_MATH=0) value for value."""
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import qpack
from qpack.torch.graph import runner_of

HERE = os.path.dirname(os.path.abspath(__file__))


class Act(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)  # the identity: the activation sees x exactly
        self.act = act

    def forward(self, x):
        return self.act(self.conv(x))


@pytest.mark.parametrize("act", [nn.Sigmoid(), nn.SiLU()], ids=["sigmoid", "silu"])
@pytest.mark.parametrize("hw", [(1, 1), (3, 7), (17, 13), (64, 96)])
def test_vector_activation_matches_torch(act, hw):
    torch.manual_seed(0)
    m = Act(act).eval()
    with torch.no_grad():
        m.conv.weight.copy_(torch.eye(3)[:, :, None, None])
        m.conv.bias.zero_()
    frozen = qpack.freeze(m, retain=False, progress=False)
    assert runner_of(frozen) is not None
    x = torch.randn(2, 3, *hw) * 40  # well past +-88, where exp saturates
    x.view(-1)[:4] = torch.tensor([0.0, -0.0, 88.5, -88.5])
    with torch.no_grad():
        ref, out = m(x), frozen(x)
    assert out.shape == ref.shape
    tol = 1e-5 * ref.abs() + 1e-30
    assert bool(((out - ref).abs() <= tol).all()), (out - ref).abs().max().item()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act", [nn.Sigmoid(), nn.SiLU()], ids=["sigmoid", "silu"])
@pytest.mark.parametrize("conv", [dict(k=1, s=1, g=1), dict(k=3, s=2, g=1), dict(k=3, s=1, g=96)],
                         ids=["1x1", "3x3s2", "depthwise"])
def test_conv_with_sigmoid_or_silu_runs_qpacks_activation(threads, act, conv):
    """oneDNN convolutions followed by Sigmoid or SiLU take the activation into the node
    (qpack's vector loop over the output, split over the threads, not oneDNN's eltwise
    post-op): within 1e-5 of PyTorch on real weights, NCHW and NHWC outputs, tensors
    large enough to split, a NaN input pixel giving NaN where PyTorch's does."""
    torch.manual_seed(threads)
    m = nn.Sequential(nn.Conv2d(96, 96, conv["k"], conv["s"], conv["k"] // 2, groups=conv["g"]), act).eval()
    qpack.set_num_threads(threads)
    try:
        frozen = qpack.freeze(m, retain=False, progress=False)
        name = type(act).__name__.lower()
        assert f"+{name}" in qpack.graph_report(frozen), qpack.graph_report(frozen)
        x = torch.randn(2, 96, 37, 29) * 3
        x[1, :, 5, 7] = float("nan")
        with torch.no_grad():
            ref = m(x)
            for out in (frozen(x), frozen(x.to(memory_format=torch.channels_last))):
                assert torch.equal(torch.isnan(out), torch.isnan(ref))
                ok = ~torch.isnan(ref)
                assert torch.allclose(out[ok], ref[ok], rtol=1e-5, atol=1e-5)
    finally:
        qpack.set_num_threads(1)


@pytest.mark.parametrize("dtype", [None, "int8"])
@pytest.mark.parametrize("c_in,c_out,hw", [(3, 16, (16, 16)), (17, 37, (19, 23)), (32, 64, (4, 4)),
                                            (20, 3, (33, 17)), (64, 16, (1, 1))])
def test_nchw_edges(dtype, c_in, c_out, hw):
    """A 1x1 conv between an NCHW input and an NCHW output: both conversions, every block
    shape and edge (channel and pixel counts on and off the 4 / 16 blocks)."""
    torch.manual_seed(c_in * 100 + c_out)
    m = nn.Sequential(nn.Conv2d(c_in, c_out, 1), nn.ReLU()).eval()
    x = torch.randn(2, c_in, *hw)
    kw = dict(dtype="int8", backend="onednn", example_inputs=[x]) if dtype else {}
    frozen = qpack.freeze(m, retain=False, progress=False, **kw)
    assert runner_of(frozen) is not None
    with torch.no_grad():
        ref, out = m(x), frozen(x)
    assert out.shape == ref.shape and out.is_contiguous()
    if dtype is None:
        assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
    else:  # a few output quanta of the int8 conv
        assert (out - ref).abs().max().item() <= 0.05 * ref.abs().max().item() + 1e-6


@pytest.mark.parametrize("threads", [1, 2])
def test_f32_edge_transposes_are_exact(threads):
    """A ReLU node between an NCHW input and an NCHW output: the input is transposed to
    NHWC and the output back (AVX2 8 x 8 blocks with strips of 64 columns for wide
    matrices, element loops at the blocks' edges, SSE2 without AVX2), value for value,
    on shapes on and off the blocks, tall and wide, with the rows split over threads."""
    from qpack import _core
    g = _core.GraphHandle([("f32", 0, 0)] * 2, [dict(kind="activation", inputs=[0], output=1, activation="relu")],
                          [0], [1])
    qpack.set_num_threads(threads)
    gen = torch.Generator().manual_seed(threads)
    for shape in [(1, 16, 4, 4), (2, 17, 5, 7), (1, 144, 56, 56), (3, 24, 1, 17), (1, 29, 3, 3),
                  (1, 576, 14, 14), (2, 32, 112, 9), (1, 200, 8, 1), (1, 65, 1, 130)]:
        x = torch.randn(*shape, generator=gen)
        y = g.run([x.numpy()], ["nchw"], "nchw")[0]
        assert y.shape == shape and torch.equal(torch.from_numpy(y), torch.relu(x)), shape
        y = g.run([x.numpy()], ["nchw"], "nhwc")[0]  # the NHWC value itself
        assert torch.equal(torch.from_numpy(y), torch.relu(x).permute(0, 2, 3, 1)), shape


@pytest.mark.parametrize("threads", [1, 2])
def test_quantize_of_an_nchw_input_equals_the_nhwc_one(threads):
    """A quantize node reading an NCHW input (quantized, then its bytes transposed into
    NHWC): the same bytes as the quantize of the same values given NHWC, extremes and ties
    included, on and off the transpose's blocks."""
    from qpack import _core
    qpack.set_num_threads(threads)
    gen = torch.Generator().manual_seed(7)
    for scale, zp in [(0.02, 128), (0.5, 0), (1e-3, 255)]:
        g = _core.GraphHandle([("f32", 0, 0), ("u8", scale, zp)], [dict(kind="quantize", inputs=[0], output=1)],
                              [0], [1])
        for shape in [(1, 144, 56, 56), (2, 17, 5, 7), (1, 3, 9, 11), (1, 16, 1, 1), (1, 40, 3, 130)]:
            x = torch.randn(*shape, generator=gen) * 200 * scale
            flat = x.view(-1)
            flat[::97] = float("inf")
            flat[1::89] = -float("inf")
            flat[2::83] = 1e30
            flat[3::79] = 0.5 * scale  # a tie: half to even
            nchw = g.run([x.numpy()], ["nchw"], "nhwc")[0]
            nhwc = g.run([x.permute(0, 2, 3, 1).contiguous().numpy()], ["nhwc"], "nhwc")[0]
            assert nchw.shape == nhwc.shape and (nchw == nhwc).all(), (scale, shape)


_SSE2_EDGES = """
import sys, torch, qpack
from qpack import _core
qpack.set_num_threads(int(sys.argv[1]))
g = _core.GraphHandle([("f32", 0, 0)] * 2, [dict(kind="activation", inputs=[0], output=1, activation="relu")],
                      [0], [1])
gen = torch.Generator().manual_seed(3)
for shape in [(1, 16, 4, 4), (2, 17, 5, 7), (1, 144, 56, 56), (1, 29, 3, 3), (1, 65, 1, 130)]:
    x = torch.randn(*shape, generator=gen)
    y = torch.from_numpy(g.run([x.numpy()], ["nchw"], "nchw")[0])
    assert torch.equal(y, torch.relu(x)), shape
print("ok")
"""


@pytest.mark.parametrize("threads", ["1", "2"])
def test_f32_edge_transposes_without_vector_code_are_exact(threads):
    """QPACK_VEC_MATH=0: the SSE2 4 x 4 blocks (what runs without AVX2), value for value."""
    env = dict(os.environ, QPACK_VEC_MATH="0")
    r = subprocess.run([sys.executable, "-c", _SSE2_EDGES, threads], env=env, capture_output=True, text=True,
                       cwd="/tmp")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


_DEQUANTIZE_TO_NCHW = """
import sys, torch, qpack
from qpack import _core
qpack.set_num_threads(int(sys.argv[1]))
gen = torch.Generator().manual_seed(11)
for scale, zp in [(0.0371, 131), (1e-3, 0), (2.5, 255)]:
    values = [("f32", 0, 0), ("u8", scale, zp), ("f32", 0, 0)]
    g = _core.GraphHandle(values, [dict(kind="quantize", inputs=[0], output=1),
                                   dict(kind="dequantize", inputs=[1], output=2)], [0], [2])
    q = _core.GraphHandle(values[:2], [dict(kind="quantize", inputs=[0], output=1)], [0], [1])
    for shape in [(1, 64, 56, 56), (2, 17, 5, 7), (1, 16, 1, 1), (1, 40, 3, 130), (3, 24, 9, 9), (1, 200, 8, 1)]:
        x = torch.randn(*shape, generator=gen) * 100 * scale
        b = torch.from_numpy(q.run([x.numpy()], ["nchw"], "nhwc")[0]).to(torch.int32)  # NHWC bytes
        ref = ((b - zp).to(torch.float32) * torch.tensor(scale, dtype=torch.float32)).permute(0, 3, 1, 2)
        nchw = torch.from_numpy(g.run([x.numpy()], ["nchw"], "nchw")[0])  # written NCHW by the node
        assert nchw.shape == shape and torch.equal(nchw, ref), (scale, shape)
        back = torch.from_numpy(g.run([x.numpy()], ["nchw"], "nhwc")[0])  # and transposed back
        assert torch.equal(back, ref.permute(0, 2, 3, 1)), (scale, shape)
        xl = x.permute(0, 2, 3, 1).contiguous().numpy()  # an NHWC input: the node writes NHWC
        assert torch.equal(torch.from_numpy(g.run([xl], ["nhwc"], "nchw")[0]), ref), (scale, shape)
print("ok")
"""


@pytest.mark.parametrize("vec", ["1", "0"])
@pytest.mark.parametrize("threads", ["1", "2"])
def test_dequantize_of_a_graph_output_to_nchw_is_exact(vec, threads):
    """A dequantize whose output only the caller reads, in a graph given NCHW: it writes
    NCHW itself, dequantizing on the way through the transpose (AVX2 8 x 8 blocks, element
    loops at their edges; QPACK_VEC_MATH=0: elements only): (q - zero_point) * scale of the
    same bytes, value for value, as given NHWC or transposed back."""
    env = dict(os.environ, QPACK_VEC_MATH=vec)
    r = subprocess.run([sys.executable, "-c", _DEQUANTIZE_TO_NCHW, threads], env=env, capture_output=True,
                       text=True, cwd="/tmp")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.parametrize("n", [1, 7, 8, 9, 64, 1000, 100003])
def test_dequantize_is_exact(n):
    """(q - zero_point) * scale in float, vector (AVX2, 8 a step) and tail alike."""
    from qpack import _core
    for scale, zp in [(0.0371, 131), (1e-3, 0), (2.5, 255)]:
        g = _core.GraphHandle([("u8", scale, zp), ("f32", 0, 0)], [dict(kind="dequantize", inputs=[0], output=1)],
                              [0], [1])
        q = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))
        y = torch.from_numpy(g.run([q.numpy()], ["nchw"])[0])
        assert torch.equal(y, (q.to(torch.int32) - zp).to(torch.float32) * torch.tensor(scale, dtype=torch.float32))


@pytest.mark.parametrize("c,hw", [(3, (40, 40)), (24, (17, 21)), (48, (32, 32))])
def test_nchw_input_to_pooling_int8(c, hw):
    """An int8 graph whose input feeds a max pool first: the quantized input is transposed
    as bytes (16x16 blocks)."""
    torch.manual_seed(c)
    m = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(c, 8, 3, padding=1)).eval()
    x = torch.randn(1, c, *hw)
    frozen = qpack.freeze(m, dtype="int8", backend="onednn", example_inputs=[x], retain=False, progress=False)
    assert runner_of(frozen) is not None
    with torch.no_grad():
        ref, out = m(x), frozen(x)
    assert out.shape == ref.shape
    assert (out - ref).abs().max().item() <= 0.05 * ref.abs().max().item()


# ---- u8 nodes: the activation table, the per-channel affine, the mul ------------------------

def u8_nodes_match_torch(f, outs, kind, ref):
    """Every `kind` node whose inputs and output the graph returns (dequantized): its output
    within one quantum of ref(node, *float inputs) requantized to the output's parameters, on
    the u8 codes the graph gave its inputs. Returns how many nodes it checked."""
    spec = runner_of(f)._spec
    vals = spec["values"]
    deq = {n["output"]: n["inputs"][0] for n in spec["nodes"] if n["kind"] == "dequantize"}
    held = {deq[o]: t for o, t in zip(spec["outputs"], outs)}
    checked = 0
    for n in spec["nodes"]:
        if n["kind"] != kind or n["output"] not in held or any(v not in held for v in n["inputs"]):
            continue
        _, s, zp = vals[n["output"]]
        want = torch.clamp(torch.round(ref(n, *[held[v].double() for v in n["inputs"]]) / s) + zp, 0, 255)
        got = torch.round(held[n["output"]].double() / s) + zp
        assert got.shape == want.shape
        err = (got - want).abs().max().item()
        assert err <= 1, (kind, err, int((got != want).sum()), got.numel())
        checked += 1
    return checked


def freeze8(m, x):
    calib = [torch.randn_like(x) for _ in range(2)] + [x]
    f = qpack.freeze(m, dtype="int8", backend="onednn", example_inputs=calib, retain=False, progress=False)
    # one graph whose outputs are the model's, in order (u8_nodes_match_torch pairs them)
    assert runner_of(f) is not None and runner_of(f)._gm is None, qpack.graph_report(f)
    return f


class ActU8(nn.Module):
    """conv -> act; returns both, so the activation's u8 input is known."""

    def __init__(self, c, act):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 1)
        self.act = act

    def forward(self, x):
        y = self.conv(x)
        return y, self.act(y)


ACTS = {"hardswish": nn.Hardswish(), "sigmoid": nn.Sigmoid(), "silu": nn.SiLU(), "gelu": nn.GELU()}


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("shape", [(1, 3, 1, 1), (1, 5, 3, 3), (2, 3, 7, 9), (1, 16, 37, 29)])
def test_u8_activation_table_matches_torch(act, shape):
    """3, 45, 378 and 17168 values: within, at and past the 64-byte steps, masked tails."""
    m = ActU8(shape[1], ACTS[act]).eval()
    x = torch.randn(*shape) * 3
    f = freeze8(m, x)
    with torch.no_grad():
        outs = f(x)
    fn = ACTS[act]
    assert u8_nodes_match_torch(f, outs, "activation", lambda n, a: fn(a)) == 1


class SEU8(nn.Module):
    """conv -> relu (big), squeeze-excitation scale (small, [N, C, 1, 1]), big * small, and
    an equal-shape product big * sigmoid(conv2(big)); returns every operand."""

    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, c, 1)
        self.fc = nn.Conv2d(c, c, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x):
        big = torch.relu(self.conv(x))
        small = self.gate(self.fc(big.mean((2, 3), keepdim=True)))
        other = torch.sigmoid(self.conv2(big))
        return big, small, other, big * small, big * other  # the order the graph emits them


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("c,hw", [(3, (5, 7)), (17, (9, 4)), (240, (14, 14)), (16, (1, 1))])
def test_u8_mul_matches_torch(layout, c, hw):
    """The per-channel mul ([N, C, H, W] by [N, C, 1, 1]; C off and on the 16-lane vectors)
    and the equal-shape mul, on NCHW and channels-last inputs."""
    torch.manual_seed(c)
    m = SEU8(c).eval()
    x = torch.randn(2, c, *hw)
    f = freeze8(m, x)
    if layout == "nhwc":
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        outs = f(x)
        ref = m(x)
    assert u8_nodes_match_torch(f, outs, "mul", lambda n, a, b: a * b) == 2
    for o, r in zip(outs, ref):  # and the model: a few quanta of the int8 graph
        assert (o - r).abs().max().item() <= 0.05 * r.abs().max().item() + 1e-6


def affine_ref(n, a):
    shape = [1, -1] + [1] * (a.dim() - 2)
    return a * torch.from_numpy(n["scale"]).double().view(shape) + torch.from_numpy(n["shift"]).double().view(shape)


class BNU8(nn.Module):
    """conv -> relu -> BatchNorm (not folded into the convolution: an affine node), 2-D or 1-D."""

    def __init__(self, c, dims):
        super().__init__()
        conv, bn = (nn.Conv2d, nn.BatchNorm2d) if dims == 2 else (nn.Conv1d, nn.BatchNorm1d)
        self.conv = conv(c, c, 3, padding=1)
        self.bn = bn(c)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(-2.0, 2.0)
            self.bn.bias.uniform_(-1.0, 1.0)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return y, self.bn(y)


@pytest.mark.parametrize("c,size", [(3, (5, 7)), (17, (9, 4)), (72, (14, 14)), (16, (3, 3)),
                                    (5, (37,)), (24, (16,))])
def test_u8_affine_matches_torch(c, size):
    """NHWC rows of C channels (rank 4) and runs of L values per channel (rank 3, [N, C, L])."""
    torch.manual_seed(c)
    m = BNU8(c, len(size)).eval()
    x = torch.randn(2, c, *size)
    f = freeze8(m, x)
    with torch.no_grad():
        outs = f(x)
    assert u8_nodes_match_torch(f, outs, "affine", affine_ref) == 1


_SCALAR_VS_VECTOR = """
import json, sys, torch, qpack
import test_graph_vector as T
torch.manual_seed(0)
out = {}
for name, m, x in [
        ("act", T.ActU8(5, torch.nn.Hardswish()), torch.randn(2, 5, 13, 11) * 3),
        ("mul", T.SEU8(17), torch.randn(2, 17, 9, 7)),
        ("affine", T.BNU8(19, 2), torch.randn(2, 19, 6, 5)),
        ("affine1d", T.BNU8(5, 1), torch.randn(2, 5, 37))]:
    f = T.freeze8(m.eval(), x)
    with torch.no_grad():
        out[name] = [t.flatten().tolist() for t in f(x)]
json.dump(out, sys.stdout)
"""


def test_u8_scalar_loops_give_the_vector_values():
    """QPACK_VEC_MATH=0 (the scalar loops) and the vector code: the same graphs (same seed,
    same calibration) give the same outputs, value for value."""
    runs = []
    for flag in ("0", "1"):
        env = dict(os.environ, QPACK_VEC_MATH=flag)
        env["PYTHONPATH"] = os.pathsep.join([HERE, env.get("PYTHONPATH", "")])
        r = subprocess.run([sys.executable, "-c", _SCALAR_VS_VECTOR], env=env, capture_output=True, text=True,
                           cwd="/tmp")
        assert r.returncode == 0, r.stderr
        runs.append(json.loads(r.stdout))
    assert runs[0].keys() == runs[1].keys()
    for name in runs[0]:
        assert runs[0][name] == runs[1][name], name


_MAX_POOL = """
import sys, torch, qpack
import torch.nn.functional as F
from qpack import _core
qpack.set_num_threads(int(sys.argv[1]))
gen = torch.Generator().manual_seed(5)
out = []
for dtype in ["f32", "u8"]:
    for c in [3, 16, 17, 64, 80, 130]:
        for k, s, p, ceil in [(3, 2, 1, False), (2, 2, 0, False), (3, 1, 1, False), (3, 2, 0, True), (5, 3, 2, False)]:
            v = ("f32", 0, 0) if dtype == "f32" else ("u8", 0.1, 7)
            g = _core.GraphHandle([v, v], [dict(kind="maxpool2d", inputs=[0], output=1, kernel=(k, k), stride=(s, s),
                                                padding=(p, p, p, p), ceil_mode=ceil)], [0], [1])
            x = torch.randn(2, 19, 23, c, generator=gen)  # NHWC
            if dtype == "u8":
                x = torch.randint(0, 256, x.shape, dtype=torch.uint8, generator=gen)
            y = torch.from_numpy(g.run([x.numpy()], ["nhwc"], "nhwc")[0])
            ref = F.max_pool2d(x.permute(0, 3, 1, 2).float(), k, s, p, ceil_mode=ceil).permute(0, 2, 3, 1)
            assert torch.equal(y.float(), ref), (dtype, c, k, s, p, ceil)
            out.append(y)
torch.save(out, sys.argv[2])
print("ok")
"""


@pytest.mark.parametrize("threads", ["1", "2"])
def test_max_pool_vector_and_scalar_agree_with_torch(threads, tmp_path):
    """NHWC max pooling, u8 and f32: the AVX-512 window kernel (a vector of channels per
    step, a masked tail: 3, 17, 80, 130 channels) and the scalar loops (QPACK_VEC_MATH=0)
    both equal PyTorch's max_pool2d, value for value, and each other."""
    outs = []
    for vec in ["1", "0"]:
        path = str(tmp_path / f"max_pool_{vec}.pt")
        env = dict(os.environ, QPACK_VEC_MATH=vec)
        r = subprocess.run([sys.executable, "-c", _MAX_POOL, threads, path], env=env, capture_output=True,
                           text=True, cwd="/tmp")
        assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
        outs.append(torch.load(path))
    assert len(outs[0]) == len(outs[1]) == 60
    assert all(torch.equal(a, b) for a, b in zip(*outs))


_QUANTIZE_TO_NHWC = """
import sys, torch, qpack
from qpack import _core
qpack.set_num_threads(int(sys.argv[1]))
gen = torch.Generator().manual_seed(3)
for scale, zp in [(0.0371, 131), (1e-3, 0), (2.5, 255)]:
    g = _core.GraphHandle([("f32", 0, 0), ("u8", scale, zp)], [dict(kind="quantize", inputs=[0], output=1)], [0], [1])
    for shape in [(1, 3, 224, 224), (2, 3, 5, 7), (1, 1, 4, 4), (3, 2, 1, 17), (1, 4, 33, 9), (1, 3, 1, 1)]:
        x = torch.randn(*shape, generator=gen) * 150 * scale
        x.view(-1)[0] = 0.5 * scale  # a half: to even
        q = torch.from_numpy(g.run([x.numpy()], ["nchw"], "nhwc")[0])
        inv = 1.0 / torch.tensor(scale, dtype=torch.float32)  # in float, as the core
        ref = (torch.round(x * inv) + zp).clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        assert q.shape == ref.shape and torch.equal(q, ref), (scale, shape)
print("ok")
"""


@pytest.mark.parametrize("vec", ["1", "0"])
@pytest.mark.parametrize("threads", ["1", "2"])
def test_quantize_of_a_few_channels_to_nhwc_is_exact(vec, threads):
    """A quantize node given NCHW floats of 1 to 4 channels (an image) and asked for NHWC
    bytes: interleaved by one byte permute per 16 pixels where the CPU has AVX-512 VBMI
    (masked tails: 5 x 7, 1 x 17 pixels), else quantized and transposed; both round half to
    even as PyTorch, value for value."""
    env = dict(os.environ, QPACK_VEC_MATH=vec)
    r = subprocess.run([sys.executable, "-c", _QUANTIZE_TO_NHWC, threads], env=env, capture_output=True,
                       text=True, cwd="/tmp")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
