"""Patterns of models from other packages that freeze had to learn: a layer its parent
reads itself (nn.MultiheadAttention's out_proj, as torchvision's ViT uses it), shape
arithmetic between ops (ViT's n_h * n_w), and a forward that caches a tensor in its
module (timm's LeViT keeps attention biases in a dict keyed by str(x.device)): each
freezes fp32 and int8, runs, and matches eager."""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qpack
from qpack.torch import FreezeWarning
from qpack.torch import graph as G

from test_graph import randomize_bn, rel_err


def int8_kw(dtype, x):
    """freeze keywords: none for fp32; for int8, three random calibration batches like x."""
    return dict(dtype="int8", example_inputs=[torch.randn_like(x) for _ in range(3)]) if dtype else {}


class AttentionBlock(nn.Module):
    """Patch embedding, nn.MultiheadAttention, an MLP, a head."""

    def __init__(self, c=32):
        super().__init__()
        self.embed = nn.Conv2d(3, c, 4, 4)
        self.attn = nn.MultiheadAttention(c, 4, batch_first=True)
        self.norm = nn.LayerNorm(c)
        self.fc1, self.fc2, self.head = nn.Linear(c, 2 * c), nn.Linear(2 * c, c), nn.Linear(c, 10)

    def forward(self, x):
        n, c, h, w = self.embed(x).shape
        t = self.embed(x).reshape(n, c, h * w).permute(0, 2, 1)  # the size arithmetic of ViT's _process_input
        t = t + self.attn(t, t, t, need_weights=False)[0]
        t = t + self.fc2(F.gelu(self.fc1(self.norm(t))))
        return self.head(t.mean(1))


class Cached(nn.Module):
    """A forward that caches a tensor in the module by a key made from the input."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1)
        self.bias = nn.Parameter(torch.randn(8, 1, 1))
        self.cache = {}

    def forward(self, x):
        key = str(x.device)
        if key not in self.cache:
            self.cache[key] = self.bias * 2
        return self.c2(F.relu(self.c1(x)) + self.cache[key])


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_multihead_attention_is_frozen_whole(dtype):
    """nn.MultiheadAttention reads its out_proj's weight itself: it is frozen whole (both
    projections packed, test_attention.py), never its out_proj alone."""
    torch.manual_seed(0)
    model = AttentionBlock().eval()
    x = torch.randn(2, 3, 32, 32)
    kw = int8_kw(dtype, x)
    f = qpack.freeze(model, progress=False, **kw)
    assert type(f.attn) is qpack.torch.FrozenMultiheadAttention
    # (int8: static, calibrated in the graph where the attention is a node of it)
    assert f.attn.out_proj.mode == ("f32" if dtype is None else "int8_static")
    with torch.no_grad():  # int8: a small random transformer, 3 calibration batches (a broken one is ~1)
        assert rel_err(f(x), model(x)) < (1e-5 if dtype is None else 0.25)
    assert "layer_norm" in (qpack.graph_report(f) or "")


def test_shape_arithmetic_stays_in_pytorch():
    """h * w of sizes is no tensor: no graph node takes it (an int8 freeze calibrates
    every graph value, and a size has no range)."""
    torch.manual_seed(1)
    model = AttentionBlock().eval()
    x = torch.randn(1, 3, 32, 32)
    f = qpack.freeze(model, dtype="int8", example_inputs=[torch.randn_like(x) for _ in range(2)], progress=False)
    report = qpack.graph_report(f) or ""
    assert " u8 " in report, report  # int8 graphs (a size taken as a graph value failed calibration)
    runner = G.runner_of(f)
    for seg in runner._segments:
        names = [n["fx"].name for n in seg.spec["nodes"] if "fx" in n]
        assert not any(n.startswith(("floordiv", "getattr", "getitem")) for n in names), names
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 0.25


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_a_forward_that_caches_into_its_module(dtype):
    torch.manual_seed(2)
    model = Cached().eval()
    x = torch.randn(2, 3, 9, 7)
    with torch.no_grad():
        ref = model(x)
    kw = int8_kw(dtype, x)
    f = qpack.freeze(model, progress=False, **kw)
    for m in (model, f):  # tracing left no fx proxy in either module's cache
        assert all(not isinstance(v, torch.fx.Proxy) for v in m.cache.values()), m.cache
    with torch.no_grad():
        assert rel_err(f(x), ref) < (1e-5 if dtype is None else 0.1)
        assert rel_err(copy.deepcopy(f)(x), f(x)) == 0
        assert torch.equal(model(x), ref)


class ReadsTheDevice(nn.Module):
    """A forward that passes x.device.type on as a string (timm's EfficientViT:
    torch.autocast(device_type=v.device.type, enabled=False) around its attention)
    and makes a constant on x.device."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = F.relu(self.c1(x))
        with torch.autocast(device_type=y.device.type, enabled=False):
            y = y.float() + torch.ones(1, device=y.device)
        return self.c2(y)


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_a_forward_that_reads_the_device_traces_whole(dtype):
    """The trace's values are on the CPU: the model freezes as one graph, no per-submodule
    fallback (which warns) and matches eager."""
    torch.manual_seed(3)
    model = ReadsTheDevice().eval()
    x = torch.randn(2, 3, 9, 7)
    with torch.no_grad():
        ref = model(x)
    kw = int8_kw(dtype, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FreezeWarning)
        f = qpack.freeze(model, progress=False, **kw)
    assert "1 graph(s)" in qpack.graph_report(f) and "submodule" not in qpack.graph_report(f)
    with torch.no_grad():
        assert rel_err(f(x), ref) < (1e-5 if dtype is None else 0.1)


class SplitAcrossSegments(nn.Module):
    """CSPNet's split: a channel slice read by an op the graph does not run (torch.roll)
    and by the next segment itself."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 1)
        with torch.no_grad():
            self.c1.weight[4:] *= 10  # the slice's own range is well inside its input's

    def forward(self, x):
        y = F.relu(self.c1(x))
        a = y[:, :4]
        return self.c2(torch.cat([torch.roll(a, 1, 2), a], 1))


def test_a_channel_slice_read_by_the_next_segment_keeps_its_input_qparams():
    """The slice's u8 parameters are its input's in the segment that makes it, and the
    segment that reads it takes the same ones (an int8 freeze ran layer by layer before)."""
    torch.manual_seed(3)
    model = SplitAcrossSegments().eval()
    x = torch.randn(2, 3, 10, 9)
    f = qpack.freeze(model, dtype="int8", example_inputs=[torch.randn_like(x) for _ in range(3)], progress=False)
    report = qpack.graph_report(f) or ""
    assert "channel_range" in report and "segment" in report, report
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 0.1


def test_reading_a_frozen_layers_weight_works_or_says_what_to_do():
    """Code that reads .weight of a frozen Linear or convolution gets a PackedWeight (its .t()
    unpacks for the call; its dtype and shape need nothing unpacked); a layer can also be kept
    unfrozen (a Rule converting to None), which works."""
    from qpack.torch import Rule

    class ReadsWeight(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.out = nn.Linear(6, 6), nn.Linear(6, 3)

        def forward(self, x):
            return self.out(F.linear(x, self.fc.weight.t()))  # reads its layer's weight itself

    torch.manual_seed(4)
    model = ReadsWeight().eval()
    x = torch.randn(2, 6)
    f = qpack.freeze(model, progress=False)
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5
    # a convolution's .weight / .bias too (transformers' ViT reads weight.dtype): metadata without
    # values held; an op on the weight gets it unpacked for that call; in place it raises
    src = nn.Conv2d(3, 4, 3).eval()
    conv = qpack.freeze(src, progress=False, retain=False)
    w = conv.weight
    assert w.shape == (4, 3, 3, 3) and w.dtype == torch.float32 and w.device.type == "cpu"
    assert torch.equal(conv.bias, src.bias.detach()) and conv.unpack()[0].shape == (4, 3, 3, 3)
    img = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        assert rel_err(F.conv2d(img, conv.weight, conv.bias), src(img)) < 1e-6
        with pytest.raises(qpack.UnsupportedError, match="in place"):
            conv.weight.mul_(2)
    assert qpack.freeze(nn.Conv2d(3, 4, 3, bias=False).eval(), progress=False).bias is None
    f = qpack.freeze(model, progress=False, mapping={nn.Linear: Rule(lambda m, ctx, **kw: None)})
    with torch.no_grad():
        assert torch.equal(f(x), model(x))


@torch.fx.wrap
def _windows(x):
    """Stands for Swin's shifted-window attention: a function fx does not look into, so
    the rank of what it returns is unknown to the trace."""
    return torch.roll(x, (1, 1), dims=(1, 2)) * 0.5


class SwinLike(nn.Module):
    """torchvision's Swin blocks: [B, H, W, C] values, LayerNorm and an MLP over the last
    dim, residual adds, between calls the trace cannot see into."""

    def __init__(self, c=24, blocks=2):
        super().__init__()
        self.embed = nn.Conv2d(3, c, 4, 4)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(dict(norm1=nn.LayerNorm(c), norm2=nn.LayerNorm(c), fc1=nn.Linear(c, 3 * c),
                               fc2=nn.Linear(3 * c, c))) for _ in range(blocks))
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        x = self.embed(x).permute(0, 2, 3, 1)
        for b in self.blocks:
            x = x + _windows(b["norm1"](x))
            x = x + b["fc2"](F.gelu(b["fc1"](b["norm2"](x))))
        return self.head(x.mean((1, 2)))


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_rank4_rows_run_in_the_core(dtype):
    """A segment whose ops all work on rows of the last dim (linear, LayerNorm over the
    last dim, activations, add) takes Swin's rank-4 [B, H, W, C] values as rows: it runs
    in the core (before, the core refused the rank-4 linear at run time and every call ran
    the segment's ops in PyTorch, int8 layer by layer), and matches eager."""
    torch.manual_seed(0)
    model = SwinLike().eval()
    x = torch.randn(2, 3, 32, 32)
    kw = dict(dtype="int8", example_inputs=[torch.randn(2, 3, 32, 32) for _ in range(3)]) if dtype else {}
    frozen = qpack.freeze(model, progress=False, **kw)
    with torch.no_grad():
        ref, got = model(x), frozen(x)
    assert rel_err(got, ref) < (0.05 if dtype else 1e-5)
    segs = G.runner_of(frozen)._segments
    rows = [s for s in segs if s.rowwise]
    assert rows and any(n["kind"] == "linear" for s in rows for n in s.spec["nodes"])
    assert all(s.fallback is None for s in segs)
    assert sum(s.graph().info()["runs"] for s in rows) >= len(rows)
    assert "in PyTorch instead" not in qpack.graph_report(frozen)


def test_a_segment_that_cannot_take_its_inputs_says_so_in_the_report():
    """A segment whose inputs the core cannot take (here float64 from a PyTorch op) runs
    its ops in PyTorch, with the same values, and graph_report names why."""

    class Doubles(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 1)

        def forward(self, x):
            y = _windows(self.c(x)).double()
            return F.relu(y) + y

    torch.manual_seed(0)
    model = Doubles().eval()
    frozen = qpack.freeze(model, progress=False)
    x = torch.randn(1, 3, 6, 6)
    with torch.no_grad():
        got = frozen(x)
        assert got.dtype == torch.float64 and torch.allclose(got, model(x), atol=1e-5)
    assert "ran its ops in PyTorch instead" in qpack.graph_report(frozen)
    assert "float32" in qpack.graph_report(frozen)


class PositionEmbedded(nn.Module):
    """ViT's start: patch embedding, tokens plus a [1, N, C] position embedding, an MLP."""

    def __init__(self, c=16, n=16):
        super().__init__()
        self.embed = nn.Conv2d(3, c, 4, 4)
        self.pos = nn.Parameter(torch.randn(1, n, c))
        self.norm, self.fc, self.head = nn.LayerNorm(c), nn.Linear(c, c), nn.Linear(c, 4)

    def forward(self, x):
        t = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(F.gelu(self.fc(self.norm(t))))


@pytest.mark.parametrize("batch", [1, 3])
def test_a_constant_broadcast_over_the_batch_stays_in_pytorch(batch):
    """A constant of another shape than the last dim's (ViT's position embedding) is added
    in PyTorch: as a graph input it ran only at batch 1 (other batches fell back to
    PyTorch at every call). No segment falls back, at any batch."""
    torch.manual_seed(3)
    model = PositionEmbedded().eval()
    frozen = qpack.freeze(model, progress=False)
    x = torch.randn(batch, 3, 16, 16)
    with torch.no_grad():
        assert rel_err(frozen(x), model(x)) < 1e-5
    assert "in PyTorch instead" not in qpack.graph_report(frozen)


def _frozen_as_eager(model, x, dtype):
    """model frozen fp32 (dtype None) or static int8 (calibrated on 3 batches of x's
    shape), its output on x checked against eager's (1e-5, int8 5e-2)."""
    kw = int8_kw(dtype, x)
    frozen = qpack.freeze(model, progress=False, **kw)
    with torch.no_grad():
        assert rel_err(frozen(x), model(x)) < (0.05 if dtype else 1e-5)
    return frozen


class TokenBatchNorm(nn.Module):
    """LeViT's LinearNorm and its attention: a Linear then BatchNorm1d over the flattened
    tokens (``bn(x.flatten(0, 1)).reshape_as(x)``), and a bias table gathered by an index
    buffer at every call (``biases[:, idxs]``) added to the attention scores."""

    def __init__(self, c=16, heads=2, n=16):
        super().__init__()
        self.embed = nn.Conv2d(3, c, 4, 4)
        self.qkv, self.bn_qkv = nn.Linear(c, 3 * c, bias=False), nn.BatchNorm1d(3 * c)
        self.proj, self.bn_proj = nn.Linear(c, c, bias=False), nn.BatchNorm1d(c)
        self.biases = nn.Parameter(torch.randn(heads, 7))
        self.register_buffer("idxs", torch.randint(0, 7, (n, n)))
        self.heads = heads

    def forward(self, x):
        t = self.embed(x).flatten(2).transpose(1, 2)
        b, n, c = t.shape
        qkv = self.qkv(t)
        qkv = self.bn_qkv(qkv.flatten(0, 1)).reshape_as(qkv)
        q, k, v = qkv.view(b, n, self.heads, -1).split([c // 2] * 3, dim=3)
        q, k, v = q.permute(0, 2, 1, 3), k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3)
        attn = (q @ k) * 0.5 + self.biases[:, self.idxs]
        t = t + (attn.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c)
        y = self.proj(F.hardswish(t))
        return t + self.bn_proj(y.flatten(0, 1)).reshape_as(y)


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_token_batch_norm_and_a_gathered_bias_table_run_in_the_core(dtype):
    """LeViT's BatchNorm1d over flattened tokens becomes an affine over the last dim in the
    Linear's segment (before, flatten(0, 1), the BatchNorm and reshape_as ran in PyTorch:
    48 segments on timm's levit_128s); its bias table gathered by an index buffer becomes
    a constant computed at freeze (no index op left); eager's values either way."""
    torch.manual_seed(0)
    model = randomize_bn(TokenBatchNorm(), (nn.BatchNorm1d,)).eval()
    x = torch.randn(2, 3, 16, 16)
    frozen = _frozen_as_eager(model, x, dtype)
    runner = G.runner_of(frozen)
    code = runner._gm.code
    assert not any(s in code for s in ("self.idxs", ".flatten(0, 1)", ".reshape_as(", "self.bn_"))
    assert "scaled_dot_product_attention" in code and "softmax" not in code and "matmul" not in code
    kinds = [n["kind"] for s in runner._segments for n in s.spec["nodes"]]
    assert kinds.count("affine") == 2 and "in PyTorch instead" not in qpack.graph_report(frozen)
    model.biases.data.mul_(-3.0)  # a snapshot: the folded table does not follow the source
    with torch.no_grad():
        assert rel_err(frozen(x), model(x)) > 1e-3


def test_batch_norm_over_another_dim_after_flatten_stays_in_pytorch():
    """flatten(0, 1) of a rank-4 value leaves [B * H, W, C]: BatchNorm1d then normalizes W,
    not the last dim (here W == C, so eager runs): not rewritten, eager's values; an index
    by a basic slice stays a view (not a constant copy of the module's tensor)."""

    class Rank4(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.bn = nn.Conv2d(3, 4, 1), nn.BatchNorm1d(4)
            self.table = nn.Parameter(torch.randn(8))

        def forward(self, x):
            y = self.c(x).permute(0, 2, 3, 1)  # [B, H, 4, 4]
            return self.bn(y.flatten(0, 1)).reshape_as(y) + self.table[:4]

    torch.manual_seed(0)
    model = randomize_bn(Rank4(), (nn.BatchNorm1d,)).eval()
    frozen = qpack.freeze(model, progress=False)
    x = torch.randn(2, 3, 5, 4)
    with torch.no_grad():
        assert rel_err(frozen(x), model(x)) < 1e-5
    runner = G.runner_of(frozen)
    code = runner._gm.code if runner._gm is not None else ""
    assert "flatten(0, 1)" in code and "table" in code


class SpelledAttention(nn.Module):
    """timm's unfused attention, ``(q * scale) @ k.transpose(-2, -1)``, softmax, ``@ v``;
    with ``weights`` the softmax is returned too (then it must stay as spelled)."""

    def __init__(self, c=16, heads=2, weights=False):
        super().__init__()
        self.qkv, self.proj, self.heads, self.weights = nn.Linear(c, 3 * c), nn.Linear(c, c), heads, weights

    def forward(self, t):
        b, n, c = t.shape
        q, k, v = self.qkv(t).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = ((q * 0.3) @ k.transpose(-2, -1)).softmax(dim=-1)
        y = self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))
        return (y, attn) if self.weights else y


@pytest.mark.parametrize("weights", [False, True])
def test_spelled_out_attention_runs_as_one_call(weights):
    """softmax((q * c) @ k^T) @ v becomes one attention (the core's node, its heads split
    from the qkv projection) where its intermediates are read by the next op only; with
    the weights returned it stays as spelled. Eager's values either way."""
    torch.manual_seed(4)
    model = SpelledAttention(weights=weights).eval()
    x = torch.randn(2, 9, 16)
    frozen = qpack.freeze(model, progress=False)
    with torch.no_grad():
        got, ref = frozen(x), model(x)
    for a, b in zip(got if weights else [got], ref if weights else [ref]):
        assert rel_err(a, b) < 1e-5
    runner = G.runner_of(frozen)
    if weights:
        assert "softmax" in runner._gm.code and "scaled_dot_product_attention" not in runner._gm.code
    else:  # one attention node of the one graph (test_graph_attention.py)
        assert runner._gm is None and "attention" in [n["kind"] for n in runner._spec["nodes"]]


class RepMixerLike(nn.Module):
    """FastViT's RepMixer: x + layer_scale * (mixer(x) - norm(x)), with BatchNorm run as
    F.batch_norm over the module's tensors (timm's BatchNormAct2d-style forward)."""

    def __init__(self, c=8):
        super().__init__()
        self.embed, self.mixer = nn.Conv2d(3, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.bn = nn.BatchNorm2d(c)
        self.gamma = nn.Parameter(torch.rand(c, 1, 1) + 0.5)

    def forward(self, x):
        x = self.embed(x)
        normed = F.batch_norm(x, self.bn.running_mean, self.bn.running_var, self.bn.weight, self.bn.bias,
                              False, 0.0, self.bn.eps)
        y = x + self.gamma * (self.mixer(x) - normed)
        return torch.cumsum(y, 1)  # an op the core does not run: PyTorch after the graph


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_a_difference_of_two_values_runs_in_the_core(dtype):
    """a - b of two values becomes an add of a and b * -1 in the graph (before, every
    such sub split FastViT into a segment per block, 11 in all); the BatchNorm's tensors
    that only the graph reads are no longer looked up at every call; eager's values."""
    torch.manual_seed(2)
    model = randomize_bn(RepMixerLike()).eval()
    runner = G.runner_of(_frozen_as_eager(model, torch.randn(2, 3, 10, 10), dtype))
    assert len(runner._segments) == 1 and "cumsum" in runner._gm.code
    assert "running_mean" not in runner._gm.code and "gamma" not in runner._gm.code
    kinds = [n["kind"] for n in runner._segments[0].spec["nodes"]]
    assert "add" in kinds and "affine" in kinds, kinds


def test_a_difference_with_a_size_or_a_constant_is_left_as_it_was():
    """x.shape[-1] - 1 (sizes) and x - a module tensor of another shape stay PyTorch's:
    eager's values."""

    class Sizes(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 1)
            self.offset = nn.Parameter(torch.randn(1, 4, 1, 1))

        def forward(self, x):
            y = self.c(x) - self.offset
            return y[..., : x.shape[-1] - 1]

    torch.manual_seed(3)
    model = Sizes().eval()
    frozen = qpack.freeze(model, progress=False)
    x = torch.randn(1, 3, 5, 6)
    with torch.no_grad():
        assert rel_err(frozen(x), model(x)) < 1e-6


class MobileOneLike(nn.Module):
    """timm's MobileOneBlock before reparameterization: scale_out + identity_out with
    identity_out = 0, the kxk branch added in place, act(se(out)) with se an Identity."""

    def __init__(self, c=8):
        super().__init__()
        self.scale, self.kxk = nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 3, padding=1)
        self.se, self.act = nn.Identity(), nn.GELU()

    def forward(self, x):
        identity_out = 0
        out = self.scale(x) + identity_out
        out += self.kxk(x)
        return self.act(self.se(out))


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_plus_zero_is_no_node_and_an_activation_after_identity_fuses_into_the_add(dtype):
    """x + 0 is x (no affine node); the activation after the add, through an Identity,
    is the add's own (one pass over the value, not two); eager's values."""
    torch.manual_seed(6)
    frozen = _frozen_as_eager(nn.Sequential(nn.Conv2d(3, 8, 1), MobileOneLike()).eval(), torch.randn(2, 3, 9, 9),
                              dtype)
    nodes = G.runner_of(frozen)._spec["nodes"]
    assert [n["kind"] for n in nodes if n["kind"] not in ("quantize", "dequantize")] == \
        ["conv2d", "conv2d", "conv2d", "add"], nodes
    assert [n.get("activation") for n in nodes if n["kind"] == "add"] == ["gelu"]


class StarReLUBlock(nn.Module):
    """MetaFormer's StarReLU: s * relu(x) ** 2 + b (learned one-value s and b), then a
    1x1 convolution; x.square() and torch.pow(x, 2) spell the square too."""

    def __init__(self, c=8):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, c, 3, padding=1), nn.Conv2d(c, c, 1)
        self.s, self.b = nn.Parameter(torch.tensor([0.8])), nn.Parameter(torch.tensor([-0.1]))

    def forward(self, x):
        y = self.s * F.relu(self.c1(x)) ** 2 + self.b
        return self.c2(y).square() + torch.pow(y, 2)


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_a_square_runs_in_the_core(dtype):
    """x ** 2 becomes x * x, the core's mul node (PoolFormerV2's StarReLU split it into
    13 segments: now one graph); eager's values."""
    torch.manual_seed(7)
    frozen = _frozen_as_eager(StarReLUBlock().eval(), torch.randn(2, 3, 8, 8), dtype)
    assert G.runner_of(frozen)._gm is None
    assert [n["kind"] for n in G.runner_of(frozen)._spec["nodes"]].count("mul") == 3


class Contiguous(nn.Module):
    """CSPNet's x.contiguous() between convolutions, and a .float() on a float value."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 4, 1)

    def forward(self, x):
        return self.b(F.relu(self.a(x)).contiguous()).float()


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_contiguous_and_float_are_no_ops_in_the_graph(dtype):
    """x.contiguous() and x.float() of a graph value are that value (CSPResNet-50 ran as 5
    segments around its contiguous() calls: now one graph); eager's values."""
    torch.manual_seed(8)
    frozen = _frozen_as_eager(Contiguous().eval(), torch.randn(2, 3, 8, 8), dtype)
    assert G.runner_of(frozen)._gm is None


class StdConv2d(nn.Conv2d):
    """timm's StdConv2d (BiT, NF-ResNet): the weight standardized in forward, then F.conv2d."""

    def forward(self, x):
        w = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None, training=True, momentum=0.0,
                         eps=1e-6).reshape_as(self.weight)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class PadsFirst(nn.Conv2d):
    """Pads its input before the convolution: not a plain conv of x, nor TensorFlow's "SAME"
    padding (timm's Conv2dSame, frozen as SamePadConv2d: test_graph_ops_more.py)."""

    def forward(self, x):
        return F.conv2d(F.pad(x, (2, 0, 2, 0)), self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_a_conv_whose_forward_makes_its_weight_is_packed_with_that_weight(dtype):
    """A Conv2d subclass whose forward is one F.conv2d of its input with a weight made from
    its parameters (weight standardization) is frozen with the weight it makes (timm's
    nf_resnet50 and resnetv2_50x1_bit ran their convolutions in PyTorch: 120 ms against
    ORT's 46); one that does something to its input first stays as it is; eager's values;
    unfreeze gives an nn.Conv2d computing the same."""
    torch.manual_seed(9)
    model = nn.Sequential(StdConv2d(3, 8, 3, padding=1), nn.ReLU(), StdConv2d(8, 8, 1, bias=False),
                          PadsFirst(8, 4, 3)).eval()
    x = torch.randn(2, 3, 8, 8)
    frozen = _frozen_as_eager(model, x, dtype)
    assert isinstance(frozen[0], qpack.torch.FrozenConv2d) and isinstance(frozen[2], qpack.torch.FrozenConv2d)
    assert type(frozen[3]) is PadsFirst
    if dtype is None:
        with torch.no_grad():
            assert rel_err(qpack.unfreeze(frozen)(x), model(x)) < 1e-5
