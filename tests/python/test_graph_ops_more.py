"""Frozen graphs over LeakyReLU, PReLU, resizes (F.interpolate / nn.Upsample, nearest and
bilinear) and GELU: models with them lower to ONE core graph (they used to split it into
segments with PyTorch between), fp32 within 1e-5 relative of eager, int8 (both backends)
within two quanta of test_graph.py's per-edge reference; the vectorized GELU against
PyTorch over a wide range; bad node parameters give clear errors."""
import math

import numpy as np

import pytest

torch = pytest.importorskip("torch", reason="the graph tests freeze torch models")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import qpack  # noqa: E402
from qpack import _core  # noqa: E402
from qpack.torch import graph as G  # noqa: E402

from conftest import BACKENDS  # noqa: E402
from test_graph import rel_err  # noqa: E402
from test_graph_models import check_int8, plan  # noqa: E402  (one graph, two quanta of the per-edge reference)


def kinds(f):
    return [n["kind"] for n in G.runner_of(f)._spec["nodes"]]


def check_fp32(model, x):
    f = qpack.freeze(model, progress=False)
    assert plan(f) == "graph", (plan(f), qpack.graph_report(f))
    with torch.no_grad():
        y, ref = f(x), model(x)
        assert y.shape == ref.shape
        assert rel_err(y, ref) < 1e-5, rel_err(y, ref)
        if x.dim() == 4:  # a channels_last input (NHWC at the graph's edge) too
            assert rel_err(f(x.contiguous(memory_format=torch.channels_last)), ref) < 1e-5
    return f


def check_both(model, x, want_kinds):
    f = check_fp32(model, x)
    assert set(want_kinds) <= set(kinds(f)), kinds(f)
    report = qpack.graph_report(f)
    for k in want_kinds:
        assert k in report
    for backend in BACKENDS:
        f8 = check_int8(model, x, backend)
        spec = G.runner_of(f8)._spec
        assert sum(v[0] == "u8" for v in spec["values"]) >= len(spec["values"]) - 2  # u8 between ops
        assert set(want_kinds) <= set(kinds(f8)), kinds(f8)


# ---- models ------------------------------------------------------------------------------

class ConvLeakyConv(nn.Module):
    def __init__(self, functional=False):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 3, padding=1)
        self.act = nn.LeakyReLU(0.2)
        self.functional = functional

    def forward(self, x):
        y = self.c1(x)
        y = F.leaky_relu(y, negative_slope=0.1) if self.functional else self.act(y)
        return self.c2(y)


class ConvPReLU(nn.Module):
    def __init__(self, num_parameters):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 4, 1)
        self.act = nn.PReLU(num_parameters)
        with torch.no_grad():
            self.act.weight.copy_(torch.linspace(-0.5, 0.7, num_parameters))

    def forward(self, x):
        return self.c2(self.act(self.c1(x)))


class TopDown(nn.Module):
    """An FPN's top-down path: lateral 1x1s, nearest x2 upsample of the coarser level + add, 3x3 out."""

    def __init__(self, spelling="scale"):
        super().__init__()
        self.c3, self.c4, self.c5 = nn.Conv2d(3, 8, 3, 2, 1), nn.Conv2d(8, 16, 3, 2, 1), nn.Conv2d(16, 32, 3, 2, 1)
        self.l3, self.l4, self.l5 = nn.Conv2d(8, 8, 1), nn.Conv2d(16, 8, 1), nn.Conv2d(32, 8, 1)
        self.out3, self.out4 = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.spelling = spelling

    def upsample(self, top, lateral):
        if self.spelling == "module":
            return self.up(top)
        if self.spelling == "like":  # torchvision's FPN
            return F.interpolate(top, size=lateral.shape[-2:], mode="nearest")
        return F.interpolate(top, scale_factor=2.0, mode="nearest")

    def forward(self, x):
        c3 = self.c3(x)
        c4 = self.c4(c3)
        c5 = self.c5(c4)
        p5 = self.l5(c5)
        p4 = self.l4(c4) + self.upsample(p5, c4)
        p3 = self.l3(c3) + self.upsample(p4, c3)
        return self.out3(p3), self.out4(p4)


class BilinearHead(nn.Module):
    """A segmentation head: conv, ReLU, 1x1 to classes, bilinear back to the input size."""

    def __init__(self, align_corners, how="size"):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.Conv2d(8, 8, 3, 2, 1), nn.ReLU())
        self.cls = nn.Conv2d(8, 5, 1)
        self.align_corners, self.how = align_corners, how
        self.up = nn.UpsamplingBilinear2d(scale_factor=4)

    def forward(self, x):
        y = self.cls(self.body(x))
        if self.how == "module":  # UpsamplingBilinear2d: align_corners=True
            return self.up(y)
        if self.how == "scale":
            return F.interpolate(y, scale_factor=(4.0, 2.5), mode="bilinear", align_corners=self.align_corners)
        return F.interpolate(y, size=(23, 17), mode="bilinear", align_corners=self.align_corners)


class GeluMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 64), nn.Linear(64, 32), nn.Linear(32, 8)
        self.act = nn.GELU()

    def forward(self, x):
        return self.fc3(F.gelu(self.fc2(self.act(self.fc1(x)))))


# ---- one graph, fp32 and int8 ----------------------------------------------------------------

@pytest.mark.parametrize("functional", [False, True])
def test_conv_leaky_relu_conv_is_one_graph(functional):
    model, x = ConvLeakyConv(functional).eval(), torch.randn(2, 3, 11, 9)
    check_both(model, x, [])
    f = qpack.freeze(model, progress=False)  # fp32: the convolution's post-op (oneDNN's eltwise)
    assert "c1 backend=onednn +leaky_relu" in qpack.graph_report(f) and "activation" not in kinds(f)
    f8 = qpack.freeze(model, dtype="int8", example_inputs=[x], backend=BACKENDS[0], progress=False)
    assert "activation" in kinds(f8) and "+leaky_relu" in qpack.graph_report(f8)  # u8: a node


@pytest.mark.parametrize("num_parameters", [1, 6])
def test_prelu_with_one_or_c_slopes_is_one_graph(num_parameters):
    check_both(ConvPReLU(num_parameters).eval(), torch.randn(2, 3, 10, 7), ["prelu"])


@pytest.mark.parametrize("spelling", ["scale", "module", "like"])
def test_fpn_top_down_nearest_upsample_is_one_graph(spelling):
    torch.manual_seed(0)
    model = TopDown(spelling).eval()
    x = torch.randn(2, 3, 32, 24)
    f = qpack.freeze(model, progress=False)
    assert plan(f) == "graph", qpack.graph_report(f)
    assert kinds(f).count("resize_nearest") == 2
    with torch.no_grad():
        for y, ref in zip(f(x), model(x)):
            assert rel_err(y, ref) < 1e-5
    for backend in BACKENDS:
        calib = [torch.randn_like(x) for _ in range(3)] + [x]
        f8 = qpack.freeze(model, dtype="int8", example_inputs=calib, backend=backend, progress=False)
        assert plan(f8) == "graph", qpack.graph_report(f8)
        spec = G.runner_of(f8)._spec
        vals = spec["values"]
        for n in spec["nodes"]:  # a nearest resize keeps its input's qparams
            if n["kind"] == "resize_nearest":
                assert vals[n["output"]] == vals[n["inputs"][0]]
        with torch.no_grad():
            outs, refs = f8(x), model(x)
            for y, ref in zip(outs, refs):
                assert rel_err(y, ref) < 0.06, rel_err(y, ref)


def test_fpn_with_odd_sizes_takes_the_laterals_h_w():
    """size=lateral.shape[-2:] where x2 would not match (odd input): the lateral's H, W."""
    model = TopDown("like").eval()
    x = torch.randn(1, 3, 27, 21)
    f = qpack.freeze(model, progress=False)
    assert plan(f) == "graph"
    with torch.no_grad():
        for y, ref in zip(f(x), model(x)):
            assert y.shape == ref.shape and rel_err(y, ref) < 1e-5


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("how", ["size", "scale"])
def test_bilinear_head_is_one_graph(align_corners, how):
    torch.manual_seed(1)
    check_both(BilinearHead(align_corners, how).eval(), torch.randn(2, 3, 20, 16), ["resize_bilinear"])


def test_upsampling_bilinear2d_module_is_one_graph():
    torch.manual_seed(2)
    check_both(BilinearHead(True, "module").eval(), torch.randn(1, 3, 16, 12), ["resize_bilinear"])


def test_gelu_mlp_is_one_graph():
    torch.manual_seed(4)
    model = GeluMLP().eval()
    x = torch.randn(8, 16)
    f = check_fp32(model, x)
    # fp32: each GELU is part of the linear before it (oneDNN's post-op); u8: a table node
    assert kinds(f).count("activation") == 0
    assert [n.get("activation") for n in G.runner_of(f)._spec["nodes"]].count("gelu") == 2
    for backend in BACKENDS:
        f8 = check_int8(model, x, backend)
        assert kinds(f8).count("activation") == 2


_NAMES = {nn.GELU: "gelu", nn.SiLU: "silu", nn.Sigmoid: "sigmoid", nn.Hardswish: "hardswish",
          nn.Hardsigmoid: "hardsigmoid", nn.LeakyReLU: "leaky_relu", nn.Tanh: "tanh"}


class LinearAct(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(24, 48), act, nn.Linear(48, 8)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 3, 37, 200])
@pytest.mark.parametrize("act", [nn.GELU(), nn.SiLU(), nn.Sigmoid(), nn.Hardswish(), nn.Hardsigmoid(),
                                 nn.LeakyReLU(0.1), nn.Hardtanh(-0.5, 0.5), nn.ReLU(), nn.Tanh()],
                         ids=lambda a: type(a).__name__)
def test_linear_with_an_activation_is_one_node(act, rows, threads):
    """An f32 activation after a Linear is part of the linear node: oneDNN's post-op
    where its matmul runs (GELU, Hardswish, ...), qpack's vector loop right after the
    few-row kernels and for SiLU / Sigmoid; within 1e-5 of eager, over threads, a NaN
    row staying NaN. (ReLU and Hardtanh are not graph activations here: freeze fuses
    them into the layer as its clamp, and oneDNN's matmul clamps NaN into a number, as
    its convolutions do: a known difference from PyTorch, so their NaN row is left out.)"""
    torch.manual_seed(rows)
    model = LinearAct(act).eval()
    qpack.set_num_threads(threads)
    try:
        f = qpack.freeze(model, progress=False)
        assert kinds(f) == ["linear", "linear"], kinds(f)
        fused = G.runner_of(f)._spec["nodes"][0].get("activation")
        assert fused == (None if isinstance(act, (nn.ReLU, nn.Hardtanh)) else _NAMES[type(act)]), fused
        x = torch.randn(rows, 24) * 3
        if not isinstance(act, (nn.ReLU, nn.Hardtanh)):
            x[0, 5] = float("nan")
        with torch.no_grad():
            y, ref = f(x), model(x)
        assert torch.equal(torch.isnan(y), torch.isnan(ref))
        ok = ~torch.isnan(ref)
        assert torch.allclose(y[ok], ref[ok], rtol=1e-5, atol=1e-5), (y - ref)[ok].abs().max()
    finally:
        qpack.set_num_threads(1)


# ---- every size, scale and corner rule against F.interpolate ---------------------------------

def _resize_graph(kind, dtype, qp=(0.0, 0), qp_out=None, **params):
    qp_out = qp_out or qp
    node = dict(kind=kind, inputs=[0], output=1, **params)
    return _core.GraphHandle([(dtype,) + tuple(qp), (dtype,) + tuple(qp_out)], [node], [0], [1])


SIZES = [(5, 7), (4, 4), (2, 3), (13, 9), (1, 1)]
HOWS = [dict(scale_factor=2.0), dict(scale_factor=1.5), dict(scale_factor=(0.5, 3.0)), dict(size=(7, 11)),
        dict(size=(3, 2)), dict(size=(1, 1)), dict(size=(26, 18))]


@pytest.mark.parametrize("hw", SIZES)
@pytest.mark.parametrize("mode,align", [("nearest", None), ("bilinear", False), ("bilinear", True)])
def test_resize_f32_matches_interpolate(hw, mode, align):
    torch.manual_seed(5)
    x = torch.randn(2, 3, *hw)
    for how in HOWS:
        if "scale_factor" in how and min(int(h * s) for h, s in zip(hw, np.broadcast_to(how["scale_factor"], 2))) < 1:
            continue
        ref = F.interpolate(x, mode=mode, **how, **({} if align is None else {"align_corners": align}))
        params = dict(size=how["size"]) if "size" in how else dict(scale=tuple(np.broadcast_to(how["scale_factor"], 2)))
        if align is not None:
            params["align_corners"] = align
        g = _resize_graph("resize_" + mode, "f32", **params)
        y = torch.from_numpy(g.run([x.numpy()], ["nchw"], "nchw")[0])
        assert y.shape == ref.shape, (how, y.shape, ref.shape)
        assert torch.allclose(y, ref, rtol=1e-5, atol=1e-6), (how, float((y - ref).abs().max()))


@pytest.mark.parametrize("mode,align", [("nearest", None), ("bilinear", False), ("bilinear", True)])
def test_resize_u8_within_one_quantum(mode, align):
    torch.manual_seed(6)
    s_in, z_in = 0.05, 120
    s_out, z_out = (s_in, z_in) if mode == "nearest" else (0.04, 110)
    q = torch.randint(0, 256, (2, 5, 6, 9)).to(torch.uint8)
    real = (q.float() - z_in) * s_in
    for how in HOWS[:5]:
        extra = {} if align is None else {"align_corners": align}
        ref = torch.clamp(torch.round(F.interpolate(real, mode=mode, **how, **extra) / s_out) + z_out, 0, 255)
        params = dict(size=how["size"]) if "size" in how else dict(scale=tuple(np.broadcast_to(how["scale_factor"], 2)))
        params.update(extra)
        g = _resize_graph("resize_" + mode, "u8", (s_in, z_in), (s_out, z_out), **params)
        y = torch.from_numpy(g.run([q.numpy()], ["nchw"], "nchw")[0]).float()
        diff = float((y - ref).abs().max())
        assert diff <= (0 if mode == "nearest" else 1), (how, diff)


def test_prelu_and_leaky_relu_u8_within_one_quantum():
    torch.manual_seed(7)
    q = torch.randint(0, 256, (2, 4, 5, 3)).to(torch.uint8)
    s_in, z_in, s_out, z_out = 0.03, 100, 0.02, 60
    real = (q.float() - z_in) * s_in
    slopes = np.array([0.1, -0.3, 0.5, 2.0], np.float32)
    for node, fn in [(dict(kind="prelu", slopes=slopes), lambda v: F.prelu(v, torch.from_numpy(slopes))),
                     (dict(kind="activation", activation="leaky_relu", act_min=0.15),
                      lambda v: F.leaky_relu(v, 0.15))]:
        g = _core.GraphHandle([("u8", s_in, z_in), ("u8", s_out, z_out)], [dict(inputs=[0], output=1, **node)],
                              [0], [1])
        y = torch.from_numpy(g.run([q.numpy()], ["nchw"], "nchw")[0]).float()
        ref = torch.clamp(torch.round(fn(real) / s_out) + z_out, 0, 255)
        assert float((y - ref).abs().max()) <= 1, node["kind"]


def test_prelu_f32_rank_2_and_3():
    torch.manual_seed(8)
    slopes = np.random.RandomState(0).randn(6).astype(np.float32)
    for shape in [(4, 6), (2, 6, 9)]:
        x = torch.randn(shape)
        g = _core.GraphHandle([("f32", 0, 0)] * 2, [dict(kind="prelu", inputs=[0], output=1, slopes=slopes)], [0], [1])
        y = torch.from_numpy(g.run([x.numpy()], ["nchw"])[0])
        assert torch.equal(y, F.prelu(x, torch.from_numpy(slopes)))


# ---- GELU and SiLU vector paths ------------------------------------------------------------

def _act_graph(name):
    return _core.GraphHandle([("f32", 0, 0)] * 2, [dict(kind="activation", inputs=[0], output=1, activation=name)],
                             [0], [1])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act", ["gelu", "silu", "sigmoid", "hardswish"])
def test_an_f32_add_with_an_activation_matches_pytorch(act, threads):
    """add(a, b) with its activation fused (EfficientFormerV2's add then GELU) runs the
    activation's vector code over the sums (the scalar erf took 400 us on [1, 1024, 7, 7]):
    within 1e-5 of PyTorch, NaN staying NaN, over odd sizes and threads."""
    fn = {"gelu": F.gelu, "silu": F.silu, "sigmoid": torch.sigmoid, "hardswish": F.hardswish}[act]
    g = _core.GraphHandle([("f32", 0, 0)] * 3, [dict(kind="add", inputs=[0, 1], output=2, activation=act)],
                          [0, 1], [2])
    qpack.set_num_threads(threads)
    try:
        for n in (1, 17, 50177):
            a, b = torch.randn(n) * 4, torch.randn(n)
            a[0] = float("nan")
            y = torch.from_numpy(g.run([a.numpy(), b.numpy()], ["nchw", "nchw"])[0])
            ref = fn(a + b)
            assert torch.equal(y.isnan(), ref.isnan())
            ok = ~ref.isnan()
            assert torch.allclose(y[ok], ref[ok], rtol=1e-5, atol=1e-6), (act, n)
    finally:
        qpack.set_num_threads(1)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act", ["gelu", "silu", "hardswish"])
def test_a_u8_add_with_an_activation_within_one_quantum(act, threads):
    """A u8 add with its activation fused (FastViT's int8 graph: add then GELU) computes
    in float chunks with the activation's vector code (the scalar erf per value doubled
    the model's time): within one quantum of quantize(act(dequantize(a) +
    dequantize(b))), across chunk edges and threads."""
    fn = {"gelu": F.gelu, "silu": F.silu, "hardswish": F.hardswish}[act]
    (sa, za), (sb, zb), (sy, zy) = (0.05, 120), (0.03, 140), (0.04, 30)
    g = _core.GraphHandle([("u8", sa, za), ("u8", sb, zb), ("u8", sy, zy)],
                          [dict(kind="add", inputs=[0, 1], output=2, activation=act)], [0, 1], [2])
    rng = np.random.RandomState(17)
    qpack.set_num_threads(threads)
    try:
        for n in (1, 4097, 50177):
            a, b = rng.randint(0, 256, n).astype(np.uint8), rng.randint(0, 256, n).astype(np.uint8)
            y = g.run([a, b], ["nchw", "nchw"])[0].astype(np.int32)
            real = fn((torch.from_numpy(a).float() - za) * sa + (torch.from_numpy(b).float() - zb) * sb)
            ref = torch.clamp(torch.round(real / sy) + zy, 0, 255).numpy().astype(np.int32)
            assert np.abs(y - ref).max() <= 1, (act, n)
    finally:
        qpack.set_num_threads(1)


@pytest.mark.parametrize("n", [1, 7, 16, 33, 100003])
def test_vector_gelu_matches_pytorch(n):
    """Within 1e-6 of PyTorch's GELU in float64 (and within 1e-6 of its float32 GELU where
    that is itself within 1e-6 of the float64 one: its erf errs by up to ~1.05e-6 around
    |x| = 3.5), over [-60, 60], tails of every length, signed zeros and huge values."""
    x = torch.linspace(-60, 60, n) if n > 1 else torch.tensor([-3.5])
    x = torch.cat([x, torch.tensor([0.0, -0.0, 1e30, -1e30, 3.4e38, -3.4e38, 1e-30, -1e-30])])
    y = torch.from_numpy(_act_graph("gelu").run([x.numpy()], ["nchw"])[0])
    exact = F.gelu(x.double())
    assert float((y.double() - exact).abs().max()) <= 1e-6
    tol = 1e-6 + (F.gelu(x).double() - exact).abs()
    assert bool(((y.double() - F.gelu(x).double()).abs() <= tol).all())
    # relative accuracy where GELU is not tiny (in the negative tail x / sqrt 2 rounded to
    # float carries into exp(-z^2): ~1e-6 there, as in any float32 GELU)
    big = exact.abs() > 1e-3
    assert float(((y.double() - exact).abs() / exact.abs())[big].max()) < 2e-6
    # the sign of a zero result as the formula x / 2 (1 + erf(x / sqrt 2)) gives it
    # (-0 for x = -0 and where erf rounds to -1), as the core's scalar loop: PyTorch's
    # own float GELU gives -0 there with its AVX-512 kernel and +0 with its AVX2 one
    formula = 0.5 * x[-8:].double() * (1 + torch.erf(x[-8:].double() / math.sqrt(2)))
    assert torch.equal(torch.signbit(y[-8:]), torch.signbit(formula))


def test_vector_activations_at_infinities_and_nan():
    x = torch.tensor([float("-inf"), float("inf"), float("nan"), -100.0, 100.0] * 5)
    for name, fn in [("silu", F.silu), ("sigmoid", torch.sigmoid), ("gelu", None)]:
        y = torch.from_numpy(_act_graph(name).run([x.numpy()], ["nchw"])[0])
        ref = fn(x) if fn is not None else F.gelu(x.double()).float()  # float64: GELU(+inf) = inf
        assert torch.equal(torch.isnan(y), torch.isnan(ref)), (name, y, ref)
        ok = ~torch.isnan(ref)
        assert torch.allclose(y[ok], ref[ok], rtol=1e-6, atol=1e-30), (name, y, ref)
    silu = torch.from_numpy(_act_graph("silu").run([x.numpy()], ["nchw"])[0])
    assert bool(torch.isnan(silu[0]))  # SiLU(-inf) is NaN, as PyTorch's


# ---- bad parameters ------------------------------------------------------------------------

F32 = [("f32", 0, 0), ("f32", 0, 0)]
BAD = [
    (dict(kind="resize_nearest", size=(0, 0)), "output size"),
    (dict(kind="resize_nearest", size=(4, 0)), "output size"),
    (dict(kind="resize_bilinear", scale=(-1.0, 2.0)), "scale factors"),
    (dict(kind="resize_bilinear", scale=(float("nan"), 2.0)), "scale factors"),
    (dict(kind="resize_nearest", size=(4, 4), align_corners=True), "bilinear resizes only"),
    (dict(kind="prelu", slopes=np.array([np.inf], np.float32)), "finite"),
    (dict(kind="activation", activation="leaky_relu", act_min=float("nan")), "negative slope"),
]


@pytest.mark.parametrize("node,fragment", BAD, ids=[f"{b[0]['kind']}-{i}" for i, b in enumerate(BAD)])
def test_bad_parameters_give_clear_errors(node, fragment):
    with pytest.raises(qpack.InvalidArgumentError, match=fragment):
        _core.GraphHandle(F32, [dict(inputs=[0], output=1, **node)], [0], [1])


def test_bad_shapes_give_clear_errors_and_leave_the_graph_usable():
    g = _core.GraphHandle(F32, [dict(kind="prelu", inputs=[0], output=1, slopes=np.ones(3, np.float32))], [0], [1])
    with pytest.raises(qpack.InvalidArgumentError, match="as many channels as the slopes"):
        g.run([np.ones((1, 4, 2, 2), np.float32)], ["nchw"])
    np.testing.assert_array_equal(g.run([-np.ones((1, 3, 2, 2), np.float32)], ["nchw"])[0],
                                  -np.ones((1, 2, 2, 3), np.float32))
    r = _resize_graph("resize_nearest", "f32", scale=(0.25, 0.25))
    with pytest.raises(qpack.InvalidArgumentError, match="resize_nearest of .* to 0 x 0"):
        r.run([np.ones((1, 1, 3, 3), np.float32)], ["nchw"])
    assert r.run([np.ones((1, 1, 4, 8), np.float32)], ["nchw"])[0].shape == (1, 1, 2, 1)
    with pytest.raises(qpack.InvalidArgumentError, match="rank-4"):
        r.run([np.ones((2, 3), np.float32)], ["nchw"])
    with pytest.raises(qpack.InvalidArgumentError, match="prelu slopes"):
        _core.GraphHandle(F32, [dict(kind="prelu", inputs=[0], output=1, slopes=np.ones(0, np.float32))], [0], [1])
    with pytest.raises(qpack.InvalidArgumentError, match="1 or 2 input"):
        _core.GraphHandle([("f32", 0, 0)] * 4, [dict(kind="resize_nearest", inputs=[0, 1, 2], output=3,
                                                    size=(2, 2))], [0, 1, 2], [3])


def test_u8_nearest_resize_must_keep_its_qparams():
    with pytest.raises(qpack.InvalidArgumentError, match="keeps its input's u8 parameters"):
        _core.GraphHandle([("u8", 0.1, 3), ("u8", 0.2, 3)],
                          [dict(kind="resize_nearest", inputs=[0], output=1, size=(4, 4))], [0], [1])


def test_unsupported_interpolations_stay_in_pytorch():
    class Bicubic(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 1)

        def forward(self, x):
            return self.c2(F.interpolate(self.c1(x), scale_factor=2, mode="bicubic", align_corners=False))

    model = Bicubic().eval()
    x = torch.randn(1, 3, 5, 6)
    f = qpack.freeze(model, progress=False)
    assert plan(f) != "graph"
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5


def test_build_info_lists_the_new_node_kinds():
    nodes = qpack.build_info()["graph_nodes"]
    for k in ("prelu", "resize_nearest", "resize_bilinear", "constant", "pad", "permute_rows"):
        assert k in nodes


@pytest.mark.parametrize("make,kind", [(lambda: TopDown("like"), "resize_nearest"), (lambda: ConvPReLU(6), "prelu"),
                                       (lambda: BilinearHead(True), "resize_bilinear"),
                                       (lambda: PaddedStem(), "pad")])
def test_saved_models_with_the_new_nodes_reload(tmp_path, make, kind):
    torch.manual_seed(9)
    model = make().eval()
    f = qpack.freeze(model, progress=False)
    x = torch.randn(1, 3, 16, 16)
    path = tmp_path / "m.qpk"
    qpack.save(f, str(path))
    g = qpack.load(str(path))
    with torch.no_grad():
        for a, b in zip(_tuple(g(x)), _tuple(f(x))):
            assert torch.equal(a, b)
    from qpack import _file
    desc = _file.describe(str(path))  # the Python reader of the format knows the new kinds
    assert not desc["problems"], desc["problems"]
    assert kind in [n["kind"] for gr in desc["graphs"] for n in gr["nodes"]]
    # the C loader reads the graphs and validates them as qpack_graph_create does
    assert _core.ModelHandle(str(path)).info["num_graphs"] == 1


def _tuple(y):
    return y if isinstance(y, tuple) else (y,)


# ---- affine over the last dim, and of one value --------------------------------------------

@pytest.mark.parametrize("shape", [(5, 6), (2, 7, 6), (2, 3, 4, 6)])
def test_affine_over_the_last_dim(shape):
    """affine with dim -1 scales each value of the last dim (a layer scale on tokens), f32
    exact against PyTorch, u8 within one quantum; one value scales every element."""
    torch.manual_seed(9)
    x = torch.randn(shape)
    sc, sh = torch.randn(6), torch.randn(6)
    g = _core.GraphHandle(F32, [dict(kind="affine", inputs=[0], output=1, scale=sc.numpy(), shift=sh.numpy(),
                                     dim=-1)], [0], [1])
    y = torch.from_numpy(g.run([x.numpy()], ["nchw"], "nchw")[0])
    assert torch.allclose(y, x * sc + sh, rtol=1e-6, atol=1e-6)
    one = _core.GraphHandle(F32, [dict(kind="affine", inputs=[0], output=1, scale=np.float32([1.5]),
                                       shift=np.float32([-0.25]), dim=-1)], [0], [1])
    y1 = torch.from_numpy(one.run([x.numpy()], ["nchw"], "nchw")[0])
    assert torch.allclose(y1, x * 1.5 - 0.25, atol=1e-6)
    q = torch.randint(0, 256, shape).to(torch.uint8)
    s_in, z_in, s_out, z_out = 0.03, 120, 0.05, 128
    g8 = _core.GraphHandle([("u8", s_in, z_in), ("u8", s_out, z_out)],
                           [dict(kind="affine", inputs=[0], output=1, scale=sc.numpy(), shift=sh.numpy(), dim=-1)],
                           [0], [1])
    y8 = torch.from_numpy(g8.run([q.numpy()], ["nchw"], "nchw")[0]).float()
    ref = torch.clamp(torch.round(((q.float() - z_in) * s_in * sc + sh) / s_out) + z_out, 0, 255)
    assert float((y8 - ref).abs().max()) <= 1


def test_affine_over_the_last_dim_checks_its_input():
    g = _core.GraphHandle(F32, [dict(kind="affine", inputs=[0], output=1, scale=np.ones(6, np.float32),
                                     shift=np.zeros(6, np.float32), dim=-1)], [0], [1])
    with pytest.raises(qpack.InvalidArgumentError, match="last dim has as many values"):
        g.run([np.ones((2, 6, 5), np.float32)], ["nchw"])
    assert g.run([np.ones((2, 5, 6), np.float32)], ["nchw"])[0].shape == (2, 5, 6)  # still usable


class TokenScale(nn.Module):
    """Transformer blocks with a layer scale on tokens (CaiT's, BEiT's `gamma * x`: [C]),
    ResMLP's Affine (`alpha * x + beta`: [1, 1, C]) and StarReLU's one-value scale and bias."""

    def __init__(self, c=16):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(c, 2 * c), nn.Linear(2 * c, c)
        self.fc3, self.fc4 = nn.Linear(c, 2 * c), nn.Linear(2 * c, c)
        self.gamma = nn.Parameter(torch.rand(c) + 0.5)
        self.alpha, self.beta = nn.Parameter(torch.rand(1, 1, c) + 0.5), nn.Parameter(torch.randn(1, 1, c))
        self.s, self.b = nn.Parameter(torch.tensor([0.8])), nn.Parameter(torch.tensor([0.1]))
        self.head = nn.Linear(c, 4)

    def forward(self, t):
        t = t + self.gamma * self.fc2(F.gelu(self.fc1(t)))
        t = self.alpha * t + self.beta
        t = t + self.fc4(self.s * F.relu(self.fc3(t)) + self.b)
        return self.head(t)


class ChannelScaleAfterGroupNorm(nn.Module):
    """timm's metaformer: GroupNorm, pooling minus its input, `x * scale.view(C, 1, 1)`."""

    def __init__(self, c=8):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(3, c, 3, padding=1), nn.GroupNorm(1, c)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.scale = nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x):
        x = self.conv(x)
        y = self.norm(x)
        return x + (self.pool(y) - y) * self.scale.view(-1, 1, 1)


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_constant_scales_are_affine_nodes_and_run_in_the_core(dtype, tmp_path):
    """Each constant above is an affine node (over the last dim; of one value; over the
    channels), every segment runs in the core (no PyTorch fallback at run time, as when
    the constant was a graph input of another shape), the values match eager, and a
    saved model loads with the same values."""
    torch.manual_seed(10)
    for model, x in ((TokenScale().eval(), torch.randn(2, 5, 16)),
                     (ChannelScaleAfterGroupNorm().eval(), torch.randn(2, 3, 8, 8))):
        kw = dict(dtype="int8", example_inputs=[torch.randn_like(x) for _ in range(3)]) if dtype else {}
        f = qpack.freeze(model, progress=False, **kw)
        with torch.no_grad():
            assert rel_err(f(x), model(x)) < (0.1 if dtype else 1e-5)
        r = G.runner_of(f)
        assert all(s.fallback is None for s in r._segments), qpack.graph_report(f)
        affines = [n for s in r._segments for n in s.spec["nodes"] if n["kind"] == "affine"]
        assert affines and "mul" not in [n["kind"] for s in r._segments for n in s.spec["nodes"]]
        qpack.save(f, tmp_path / "m.qpk")
        with torch.no_grad():
            assert torch.equal(qpack.load(tmp_path / "m.qpk")(x), f(x))


# ---- GroupNorm -------------------------------------------------------------------------------

@pytest.mark.parametrize("threads", [1, 2])
def test_group_norm_node_matches_pytorch(threads):
    """A layer_norm node with groups is nn.GroupNorm: 1, some or every channel a group,
    ranks 2 to 4, within 1e-5 of F.group_norm over threads; channels that the groups do
    not divide, and kernel_w 0, are refused with a clear error."""
    qpack.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(15)
        for shape, groups in [((2, 8, 5, 6), 1), ((2, 8, 5, 6), 4), ((1, 12, 9, 9), 12), ((2, 6, 7), 3), ((3, 4), 2)]:
            c = shape[1]
            w, b = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g)
            x = torch.randn(*shape, generator=g) * 3 + 1
            h = _core.GraphHandle([("f32", 0, 0)] * 2, [dict(kind="layer_norm", inputs=[0], output=1, weight=w.numpy(),
                                                            bias=b.numpy(), eps=1e-5, groups=groups)], [0], [1])
            y = torch.from_numpy(h.run([x.numpy()], ["nchw"], out_layout="nchw")[0])
            assert torch.allclose(y, F.group_norm(x, groups, w, b, 1e-5), rtol=1e-5, atol=1e-5), (shape, groups)
    finally:
        qpack.set_num_threads(1)
    ones = np.ones(6, np.float32)
    h = _core.GraphHandle([("f32", 0, 0)] * 2, [dict(kind="layer_norm", inputs=[0], output=1, weight=ones, bias=ones,
                                                    eps=1e-5, groups=4)], [0], [1])
    with pytest.raises(qpack.InvalidArgumentError, match="multiple of the groups"):
        h.run([np.zeros((1, 6, 2, 2), np.float32)], ["nchw"])
    with pytest.raises(qpack.InvalidArgumentError, match="groups"):
        _core.GraphHandle([("f32", 0, 0)] * 2, [dict(kind="layer_norm", inputs=[0], output=1, weight=ones, bias=ones,
                                                    eps=1e-5, groups=0)], [0], [1])


class GroupNorm1(nn.GroupNorm):
    """timm's PoolFormer norm: a GroupNorm subclass whose forward calls F.group_norm."""

    def __init__(self, c):
        super().__init__(1, c)

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class PoolFormerBlock(nn.Module):
    """x + (pool(norm1(x)) - norm1(x)), then x + mlp(norm2(x)): PoolFormer's block."""

    def __init__(self, c=8):
        super().__init__()
        self.norm1, self.norm2 = GroupNorm1(c), nn.GroupNorm(2, c)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.fc1, self.fc2 = nn.Conv2d(c, 2 * c, 1), nn.Conv2d(2 * c, c, 1)

    def forward(self, x):
        y = self.norm1(x)
        x = x + (self.pool(y) - y)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


def _group_normed(*blocks):
    torch.manual_seed(16)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), *blocks).eval()
    for m in model.modules():
        if isinstance(m, nn.GroupNorm):
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.normal_(0, 0.2)
    return model


def test_group_norm_models_are_one_graph(tmp_path):
    """nn.GroupNorm and F.group_norm (timm's GroupNorm1) run in the graph (PoolFormer:
    25 segments before, one graph now): fp32 within 1e-5 of eager; int8 on every backend
    one graph within 0.1 of eager, and a GroupNorm alone within two quanta of the
    per-edge reference (chained through the blocks' second GroupNorm, a quantum of
    difference before it grows)."""
    model = _group_normed(PoolFormerBlock(), PoolFormerBlock())
    x = torch.randn(2, 3, 10, 10)
    f = qpack.freeze(model, progress=False)
    assert plan(f) == "graph" and kinds(f).count("layer_norm") == 4, kinds(f)
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5
        qpack.save(f, tmp_path / "gn.qpk")  # the node's groups in the model file
        assert torch.equal(qpack.load(tmp_path / "gn.qpk")(x), f(x))
    for backend in BACKENDS:
        f8 = qpack.freeze(model, dtype="int8", example_inputs=[torch.randn_like(x) for _ in range(3)] + [x],
                          backend=backend, progress=False)
        assert plan(f8) == "graph"
        with torch.no_grad():
            assert rel_err(f8(x), model(x)) < 0.1
        for norm in (GroupNorm1(8), nn.GroupNorm(2, 8)):
            check_int8(_group_normed(norm), x, backend)


# ---- zero / constant padding of an image: the pad node ------------------------------------

class PaddedStem(nn.Module):
    """timm's HGNetV2 stem: ``F.pad(x, (0, 1, 0, 1))`` before a 2x2 convolution and a 2x2 /
    1 max pool over the padded image (the zeros take part in its max), concatenated; then
    nn.ZeroPad2d and nn.ConstantPad2d (a value other than 0) of other sides, and a pad of W
    only."""

    def __init__(self):
        super().__init__()
        self.stem1 = nn.Conv2d(3, 8, 3, 2, 1)
        self.stem2a, self.stem2b = nn.Conv2d(8, 4, 2), nn.Conv2d(4, 8, 2)
        self.pool = nn.MaxPool2d(2, 1, ceil_mode=True)
        self.zero, self.const = nn.ZeroPad2d((2, 0, 1, 3)), nn.ConstantPad2d(1, -1.5)
        self.out = nn.Conv2d(16, 4, 3)

    def forward(self, x):
        x = F.relu(self.stem1(x))
        x = F.pad(x, (0, 1, 0, 1))
        x2 = self.stem2b(F.pad(self.stem2a(x), (0, 1, 0, 1)))
        y = torch.cat([self.pool(x), x2], dim=1)
        return self.out(F.pad(self.const(self.zero(y)), [1, 2], value=0.5))


def test_padding_an_image_is_the_pad_node():
    """Every pad of the model is a pad node of one graph, eager's values at two sizes (and
    channels_last), int8 on both backends within the per-edge reference."""
    torch.manual_seed(16)
    model = PaddedStem().eval()
    check_both(model, torch.randn(2, 3, 16, 16), ["pad"])
    f = qpack.freeze(model, progress=False)
    assert kinds(f).count("pad") == 5
    with torch.no_grad():
        x = torch.randn(1, 3, 21, 19)
        assert rel_err(f(x), model(x)) < 1e-5


@pytest.mark.parametrize("pad,mode", [((1, -1, 0, 0), "constant"), ((1, 1, 1, 1), "reflect"),
                                      ((1, 1, 1, 1, 1, 1), "constant")])
def test_pads_the_node_does_not_take_stay_in_pytorch(pad, mode):
    """A crop (a negative pad), another mode, or a pad of the channels too: PyTorch's, between
    graphs, with eager's values."""
    class Pad(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 4, 1), nn.Conv2d(4 + 2 * (len(pad) == 6), 4, 1)

        def forward(self, x):
            return self.c2(F.pad(self.c1(x), pad, mode=mode))
    torch.manual_seed(17)
    model = Pad().eval()
    f = qpack.freeze(model, progress=False)
    assert plan(f) != "graph"
    with torch.no_grad():
        x = torch.randn(1, 3, 6, 7)
        assert rel_err(f(x), model(x)) < 1e-5


def test_the_pad_node_f32_and_u8():
    """Through GraphHandle: f32 as F.pad of the value (any finite border); u8 its border that value
    quantized to the output's qparams, the image requantized where they differ (a border outside
    the input's range: its own calibrated range); bad pads refused, bad inputs leave it usable."""
    x = torch.randn(2, 3, 4, 5)
    g = _core.GraphHandle(F32, [dict(kind="pad", inputs=[0], output=1, padding=(1, 2, 0, 3), act_min=-0.25)],
                          [0], [1])
    got = torch.from_numpy(g.run([x.numpy()], ["nchw"], "nchw")[0])
    assert torch.equal(got, F.pad(x, (2, 3, 1, 0), value=-0.25))
    q = _core.GraphHandle([("u8", 0.5, 10), ("u8", 0.5, 10)],
                          [dict(kind="pad", inputs=[0], output=1, padding=(2, 0, 1, 1), act_min=1.2)], [0], [1])
    xq = np.arange(2 * 3 * 4 * 5, dtype=np.uint8).reshape(2, 3, 4, 5)
    got = q.run([xq], ["nchw"], "nchw")[0]
    want = np.pad(xq, ((0, 0), (0, 0), (2, 1), (0, 1)), constant_values=12)  # round(1.2 / 0.5) + 10
    np.testing.assert_array_equal(got, want)
    r = _core.GraphHandle([("u8", 0.5, 10), ("u8", 0.25, 40)],
                          [dict(kind="pad", inputs=[0], output=1, padding=(1, 1, 1, 1), act_min=-9.0)], [0], [1])
    got = r.run([xq], ["nchw"], "nchw")[0].astype(np.int32)
    inner = np.clip(np.rint((xq.astype(np.float64) - 10) * 2) + 40, 0, 255)  # 0.5 / 0.25 = 2
    np.testing.assert_array_equal(got[:, :, 1:-1, 1:-1], inner)
    assert (got[:, :, 0] == 4).all() and (got[:, :, :, -1] == 4).all()  # -9 / 0.25 + 40
    for bad, what in [(dict(padding=(-1, 0, 0, 0)), "pads"), (dict(act_min=float("inf")), "finite")]:
        with pytest.raises(qpack.InvalidArgumentError, match=what):
            _core.GraphHandle(F32, [dict(dict(kind="pad", inputs=[0], output=1, padding=(1, 1, 1, 1)), **bad)],
                              [0], [1])
    with pytest.raises(qpack.InvalidArgumentError, match="rank-4"):
        g.run([np.ones((2, 3, 4), np.float32)], ["nchw"])
    assert torch.equal(torch.from_numpy(g.run([x.numpy()], ["nchw"], "nchw")[0]), F.pad(x, (2, 3, 1, 0), value=-0.25))


# ---- TensorFlow's "SAME" padding (timm's Conv2dSame): a pad node and the convolution --------

class ConvSame(nn.Conv2d):
    """timm's Conv2dSame: no padding of its own, the input padded from its size as TensorFlow's
    "SAME" does (the odd pad after), then F.conv2d."""

    def forward(self, x):
        ih, iw = x.size()[-2:]
        ph = max((math.ceil(ih / self.stride[0]) - 1) * self.stride[0] + (self.kernel_size[0] - 1) + 1 - ih, 0)
        pw = max((math.ceil(iw / self.stride[1]) - 1) * self.stride[1] + (self.kernel_size[1] - 1) + 1 - iw, 0)
        x = F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])
        return F.conv2d(x, self.weight, self.bias, self.stride, (0, 0), self.dilation, self.groups)


class TFStem(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.bn1 = ConvSame(3, 8, 3, 2, bias=False), nn.BatchNorm2d(8)
        self.dw, self.bn2 = ConvSame(8, 8, 5, 2, groups=8, bias=False), nn.BatchNorm2d(8)
        self.pw, self.fc = nn.Conv2d(8, 16, 1), nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.stem(x)))
        x = F.relu(self.bn2(self.dw(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.pw(x), 1), 1))


def _tf_stem():
    torch.manual_seed(19)
    model = TFStem().eval()
    with torch.no_grad():  # trained-like statistics
        for bn in (model.bn1, model.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    return model


def test_same_padded_convolutions_are_a_pad_and_a_frozen_convolution():
    """Frozen with an example input, the TF-padded convolutions (their BatchNorm folded, their
    ReLU fused) and their pads are one graph (the pads constants of the example's shape, the
    input's too); another shape runs the layers (a FreezeWarning) with eager's values; without
    an example the layers are packed and run on their own; unfreeze gives nn.Conv2d back."""
    model = _tf_stem()
    x = torch.randn(2, 3, 17, 20)
    f = qpack.freeze(model, example_inputs=x, progress=False)
    assert isinstance(f.stem, qpack.torch.SamePadConv2d) and isinstance(f.stem.conv, qpack.torch.FrozenConv2d)
    assert plan(f) == "graph", qpack.graph_report(f)
    ks = kinds(f)
    assert ks.count("pad") == 2 and ks.count("conv2d") == 3 and "affine" not in ks
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5
        other = torch.randn(1, 3, 16, 16)
        with pytest.warns(qpack.torch.FreezeWarning, match="traced for inputs of shape"):
            assert rel_err(f(other), model(other)) < 1e-5
        g = qpack.freeze(model, progress=False, graph=False)
        assert isinstance(g.dw, qpack.torch.SamePadConv2d) and rel_err(g(other), model(other)) < 1e-5
        u = qpack.unfreeze(f)  # (the stem's fused ReLU after its nn.Conv2d)
        assert type(u.stem.conv[0]) is nn.Conv2d and rel_err(u(other), model(other)) < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_same_padded_convolutions_within_the_reference(backend):
    check_int8(_tf_stem(), torch.randn(2, 3, 17, 20), backend)


def test_a_convolution_padded_otherwise_is_not_taken_for_same():
    """A Conv2d subclass that pads by a fixed amount (not TensorFlow's rule) keeps its own forward."""
    class Fixed(nn.Conv2d):
        def forward(self, x):
            return F.conv2d(F.pad(x, (1, 1, 1, 1)), self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
    torch.manual_seed(20)
    model = nn.Sequential(Fixed(3, 4, 3, 2), nn.ReLU()).eval()
    f = qpack.freeze(model, progress=False)
    assert type(f[0]) is Fixed
    x = torch.randn(1, 3, 9, 9)
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-6


@pytest.mark.parametrize("channels", [3, 16, 19])
@pytest.mark.parametrize("kernel,stride,padding,ceil", [(2, 1, 0, True), (3, 1, 1, False), (3, (2, 1), 1, False),
                                                        (3, (1, 2), 0, True)])
def test_max_pools_of_stride_one_along_w_match_pytorch(channels, kernel, stride, padding, ceil):
    """The max pool node's rows of stride 1 along W (a pass per tap over the row, the border
    columns a window at a time) against F.max_pool2d, exactly, on odd sizes; int8 within the
    per-edge reference."""
    class Pool(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, channels, 3), nn.Conv2d(channels, 4, 1)

        def forward(self, x):
            return self.c2(F.max_pool2d(self.c1(x), kernel, stride, padding, ceil_mode=ceil))
    torch.manual_seed(21)
    model = Pool().eval()
    x = torch.randn(2, 3, 15, 18)
    f = check_fp32(model, x)
    assert "maxpool2d" in kinds(f)
    g = _core.GraphHandle(F32, [dict(kind="maxpool2d", inputs=[0], output=1, kernel=(kernel, kernel),
                                     stride=stride if isinstance(stride, tuple) else (stride, stride),
                                     padding=(padding,) * 4, ceil_mode=ceil)], [0], [1])
    t = torch.randn(2, channels, 13, 17)
    got = torch.from_numpy(g.run([t.numpy()], ["nchw"], "nchw")[0])
    assert torch.equal(got, F.max_pool2d(t, kernel, stride, padding, ceil_mode=ceil))
    check_int8(model, x, BACKENDS[0])


# ---- rows moved whole: MobileViT's unfold into patches and fold back (permute_rows) ------------

class PatchMixer(nn.Module):
    """MobileViT's block in small, in timm's spelling: a convolution, the image unfolded into
    patches ([B, C, H, W] -> [B * p * p, H W / p^2, C], after its `if new_h != H`, which makes
    the trace specialize to example shapes), a LayerNorm and a Linear over the rows, folded back
    to the image, a convolution."""

    def __init__(self, c=8, p=2):
        super().__init__()
        self.p = p
        self.conv1 = nn.Conv2d(3, c, 3, padding=1)
        self.norm = nn.LayerNorm(c)
        self.mlp = nn.Linear(c, c)
        self.conv2 = nn.Conv2d(c, 4, 1)

    def forward(self, x):
        x = self.conv1(x)
        ph = pw = self.p
        B, C, H, W = x.shape
        new_h, new_w = math.ceil(H / ph) * ph, math.ceil(W / pw) * pw
        nh, nw = new_h // ph, new_w // pw
        n, area = nh * nw, ph * pw
        if new_h != H or new_w != W:
            x = F.interpolate(x, size=(new_h, new_w), mode="bilinear", align_corners=False)
        x = x.reshape(B * C * nh, ph, nw, pw).transpose(1, 2)
        x = x.reshape(B, C, n, area).transpose(1, 3).reshape(B * area, n, -1)
        x = x + self.mlp(self.norm(x))
        x = x.contiguous().view(B, area, n, -1)
        x = x.transpose(1, 3).reshape(B * C * nh, nw, ph, pw)
        x = x.transpose(1, 2).reshape(B, C, nh * ph, nw * pw)
        return self.conv2(x)


@pytest.mark.parametrize("batch,hw", [(1, (8, 8)), (2, (6, 10))])
def test_unfolding_into_patches_and_back_is_one_graph(batch, hw):
    """The unfold and the fold are a permute_rows node each, in one graph with the layers,
    eager's values; the order is one sample's (H W rows) at batch 2 too; int8 on both backends
    within the per-edge reference."""
    torch.manual_seed(18)
    model = PatchMixer().eval()
    x = torch.randn(batch, 3, *hw)
    f = qpack.freeze(model, example_inputs=x, progress=False)
    assert plan(f) == "graph", qpack.graph_report(f)
    moves = [n for n in G.runner_of(f)._spec["nodes"] if n["kind"] == "permute_rows"]
    assert len(moves) == 2
    assert [len(n["rows"]) for n in moves] == [hw[0] * hw[1]] * 2
    assert moves[0]["kernel"] == (hw[0] * hw[1] // 4, 0) and moves[1]["kernel"] == hw
    assert "permute_rows" in qpack.graph_report(f)
    with torch.no_grad():
        ref = model(x)
        assert rel_err(f(x), ref) < 1e-5
        assert rel_err(f(x.contiguous(memory_format=torch.channels_last)), ref) < 1e-5
    for backend in BACKENDS:
        f8 = check_int8(model, x, backend)
        assert kinds(f8).count("permute_rows") == 2


def test_moves_inside_rows_stay_in_pytorch():
    """A reshape and transpose that move values within the rows (channels interleaved) is no
    row permutation: PyTorch runs it between graphs, with eager's values."""
    class Interleave(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 4, 1)

        def forward(self, x):
            y = self.c1(x)
            B, C, H, W = y.shape
            if H % 2:
                y = y[:, :, :-1]
            t = y.permute(0, 2, 3, 1).reshape(B, -1, 2, C // 2).transpose(2, 3).reshape(B, -1, C)
            return self.c2(t.transpose(1, 2).reshape(B, C, y.shape[2], W))
    torch.manual_seed(19)
    model = Interleave().eval()
    x = torch.randn(1, 3, 6, 5)
    f = qpack.freeze(model, example_inputs=x, progress=False)
    assert "permute_rows" not in [n["kind"] for s in G.runner_of(f)._segments for n in s.spec["nodes"]]
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5


def test_the_permute_rows_node_f32_and_u8():
    """Through GraphHandle: each block of R rows reordered (a copy of whole rows of C values,
    u8 bytes as they are), to tokens or to an image; a table that is no permutation, or rows
    the blocks do not divide, give clear errors and leave the graph usable."""
    x = torch.randn(2, 3, 2, 4)  # 8 pixels a sample, rows of 3 channels
    perm = torch.tensor([7, 0, 5, 2, 3, 4, 1, 6])
    rows = x.permute(0, 2, 3, 1).reshape(2, 8, 3)
    g = _core.GraphHandle(F32, [dict(kind="permute_rows", inputs=[0], output=1, rows=perm.numpy(), kernel=(4, 0))],
                          [0], [1])
    got = torch.from_numpy(g.run([x.numpy()], ["nchw"])[0])
    assert torch.equal(got, rows[:, perm].reshape(4, 4, 3))
    img = _core.GraphHandle([("u8", 0.5, 3), ("u8", 0.5, 3)],
                            [dict(kind="permute_rows", inputs=[0], output=1, rows=perm.numpy(), kernel=(4, 2))],
                            [0], [1])
    xq = np.arange(2 * 8 * 3, dtype=np.uint8).reshape(2, 8, 3)  # tokens [N, L, C]
    got = img.run([xq], ["nchw"], "nhwc")[0]
    np.testing.assert_array_equal(got, xq[:, perm.numpy()].reshape(2, 4, 2, 3))
    assert img.info()["nbytes_constants"] >= 8 * 4
    for table, what in [([0, 0, 1], "permutation"), ([0, 1.5], "permutation"), ([0, 2], "permutation"),
                        ([], "not empty")]:
        with pytest.raises(qpack.InvalidArgumentError, match=what):
            _core.GraphHandle(F32, [dict(kind="permute_rows", inputs=[0], output=1, rows=np.array(table, np.float32),
                                         kernel=(1, 0))], [0], [1])
    with pytest.raises(qpack.InvalidArgumentError, match="permute_rows"):
        g.run([np.ones((1, 3, 2, 3), np.float32)], ["nchw"])  # 6 rows: no block of 8
    with pytest.raises(qpack.InvalidArgumentError, match="rank-3"):
        g.run([np.ones((8, 3), np.float32)], ["nchw"])
    assert torch.equal(torch.from_numpy(g.run([x.numpy()], ["nchw"])[0]), rows[:, perm].reshape(4, 4, 3))


def test_saved_patch_mixer_reloads(tmp_path):
    """A graph with permute_rows nodes saved and loaded: the same outputs; the file reader and
    the C loader know the kind."""
    torch.manual_seed(20)
    model = PatchMixer().eval()
    x = torch.randn(1, 3, 8, 8)
    f = qpack.freeze(model, example_inputs=x, progress=False)
    path = tmp_path / "m.qpk"
    qpack.save(f, str(path))
    g = qpack.load(str(path))
    with torch.no_grad():
        assert torch.equal(g(x), f(x))
    from qpack import _file
    desc = _file.describe(str(path))
    assert not desc["problems"], desc["problems"]
    assert [n["kind"] for gr in desc["graphs"] for n in gr["nodes"]].count("permute_rows") == 2
    assert _core.ModelHandle(str(path)).info["num_graphs"] == 1
