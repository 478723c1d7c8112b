"""Multi-head attention as one node of the core's graph (QPACK_NODE_ATTENTION): a split
into heads (timm's packed qkv reshape / permute / unbind, separate projections viewed
and transposed, nanoGPT's split of one projection), scaled_dot_product_attention and the merge back into rows are one
``attention`` node reading the heads where they are, so a transformer block is one
graph, fp32 and int8. PyTorch's own modules and F.scaled_dot_product_attention are the
oracle; the int8 node is checked against the per-edge reference."""
import io
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qpack
from qpack import _core
from qpack.torch import graph as G

from test_graph import BACKENDS, per_edge_reference, rel_err

pytestmark = pytest.mark.skipif("onednn" not in qpack.backends(), reason="the oneDNN backend is not built")


class PackedQKV(nn.Module):
    """timm's Attention: one qkv Linear, ``reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4)``,
    ``unbind(0)`` (``indexed``: ``qkv[0], qkv[1], qkv[2]``, older timm), q_norm / k_norm
    Identity, the mask and causality forward arguments with defaults."""

    def __init__(self, c=32, heads=4, indexed=False, scale=None):
        super().__init__()
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.q_norm, self.k_norm = nn.Identity(), nn.Identity()
        self.heads, self.indexed, self.scale = heads, indexed, scale

    def forward(self, x, attn_mask=None, is_causal=False):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = (qkv[0], qkv[1], qkv[2]) if self.indexed else qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=self.scale)
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


class Separate(nn.Module):
    """Three projections (v of another width per head), ``view(B, -1, H, D).transpose(1, 2)``
    each, the merge by ``permute(0, 2, 1, 3).contiguous().view(...)`` or ``flatten(2)``;
    causal where asked."""

    def __init__(self, c=24, heads=3, dv=10, causal=False, flat=False):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(c, c), nn.Linear(c, c), nn.Linear(c, heads * dv)
        self.proj = nn.Linear(heads * dv, c)
        self.heads, self.dv, self.causal, self.flat = heads, dv, causal, flat

    def forward(self, x):
        b, n, c = x.shape
        q = self.q(x).view(b, -1, self.heads, c // self.heads).transpose(1, 2)
        k = self.k(x).view(b, -1, self.heads, c // self.heads).permute(0, 2, 1, 3)
        v = self.v(x).view(b, n, self.heads, self.dv).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        if self.flat:
            return self.proj(y.transpose(1, 2).flatten(2))
        return self.proj(y.permute(0, 2, 1, 3).contiguous().view(b, n, self.heads * self.dv))


class NanoGPT(nn.Module):
    """nanoGPT's CausalSelfAttention: one c_attn Linear split (or chunked) along the last
    dim into q, k and v, each ``view(B, T, H, C // H).transpose(1, 2)``, causal."""

    def __init__(self, c=32, heads=4, chunk=False):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.heads, self.c, self.chunk = heads, c, chunk

    def forward(self, x):
        b, t, c = x.size()
        qkv = self.c_attn(x)
        q, k, v = qkv.chunk(3, dim=-1) if self.chunk else qkv.split(self.c, dim=2)
        q, k, v = (a.view(b, t, self.heads, c // self.heads).transpose(1, 2) for a in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Grouped(nn.Module):
    """LeViT's attention: each head's q, k, v side by side in the projection
    (``view(B, N, H, -1).split([kd, kd, vd], dim=3)``), k permuted to [B, H, D, N], spelled
    out with a bias table as the mask, the projection's BatchNorm over its tokens after it."""

    def __init__(self, c=32, heads=4, kd=6, vd=10, tokens=10, permuted=False):
        super().__init__()
        self.permuted = permuted  # EfficientFormer's: heads moved forward, then split
        self.embed = nn.Conv1d(c, c, 1)  # tokens from a convolution, as LeViT's stem makes them
        self.qkv = nn.Linear(c, heads * (2 * kd + vd))
        self.bn = nn.BatchNorm1d(heads * (2 * kd + vd))
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
        self.proj = nn.Linear(heads * vd, c)
        self.register_buffer("bias", torch.randn(heads, tokens, tokens))
        self.heads, self.kd, self.vd, self.scale = heads, kd, vd, kd ** -0.5

    def forward(self, x):
        x = self.embed(x.transpose(1, 2)).transpose(1, 2)
        b, n, c = x.shape
        t = self.qkv(x)
        t = self.bn(t.flatten(0, 1)).reshape_as(t)
        if self.permuted:
            q, k, v = t.reshape(b, n, self.heads, -1).permute(0, 2, 1, 3).split([self.kd, self.kd, self.vd], dim=3)
            k = k.transpose(-2, -1)
        else:
            q, k, v = t.view(b, n, self.heads, -1).split([self.kd, self.kd, self.vd], dim=3)
            q, k, v = q.permute(0, 2, 1, 3), k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3)
        attn = (q @ k * self.scale + self.bias).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, self.heads * self.vd))


class HandWritten(nn.Module):
    """Attention as people write it by hand: ``(q @ k.transpose(-2, -1)) * scale`` then
    ``.softmax(dim=-1)`` and ``@ v`` (``hf``: transformers' older spelling, ``torch.matmul``,
    ``/ math.sqrt(d)``, ``F.softmax``, ``permute(0, 2, 1, 3).contiguous().view``)."""

    def __init__(self, c=32, heads=4, hf=False):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(c, c) for _ in range(4))
        self.heads, self.hf, self.d = heads, hf, c // heads

    def forward(self, x):
        b, n, c = x.shape
        d = self.d
        q, k, v = (m(x).reshape(b, n, self.heads, d).permute(0, 2, 1, 3) for m in (self.q, self.k, self.v))
        if self.hf:
            p = F.softmax(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d), dim=-1)
            return self.o(torch.matmul(p, v).permute(0, 2, 1, 3).contiguous().view(b, n, c))
        attn = ((q @ k.transpose(-2, -1)) * d ** -0.5).softmax(dim=-1)
        return self.o((attn @ v).transpose(1, 2).reshape(b, n, c))


class CausalFill(nn.Module):
    """nanoGPT's slow path: a lower-triangular buffer sliced to the tokens, masked_fill with
    -inf where it is 0 (``tril``: else a buffer with zeros elsewhere, which is no causal
    mask); ``size_scale``: the scale computed from k's size, as nanoGPT writes it."""

    def __init__(self, c=32, heads=4, tril=True, size_scale=False):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        mask = torch.ones(16, 16).tril() if tril else (torch.rand(16, 16) > 0.3).float()
        mask[:, 0] = 1  # every query sees a key
        self.register_buffer("bias", mask.view(1, 1, 16, 16))
        self.heads, self.c, self.size_scale = heads, c, size_scale

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(self.c, dim=2)
        q, k, v = (a.view(b, t, self.heads, c // self.heads).transpose(1, 2) for a in (q, k, v))
        scale = 1.0 / math.sqrt(k.size(-1)) if self.size_scale else (self.c // self.heads) ** -0.5
        att = (q @ k.transpose(-2, -1)) * scale
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    """A pre-norm transformer block whose attention adds a constant position bias
    ([H, N, N] buffer, or [N, N] shared by the heads) as its mask."""

    def __init__(self, c=32, heads=4, tokens=10, shared_bias=False):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.attn = PackedQKV(c, heads)
        self.fc1, self.fc2 = nn.Linear(c, 2 * c), nn.Linear(2 * c, c)
        self.register_buffer("bias", torch.randn(tokens, tokens) if shared_bias else torch.randn(heads, tokens, tokens))

    def forward(self, x):
        x = x + self.attn(self.norm1(x), self.bias)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


CASES = {
    "packed": lambda: PackedQKV(),
    "packed-indexed-scaled": lambda: PackedQKV(indexed=True, scale=0.3),
    "separate": lambda: Separate(),
    "separate-causal-flat": lambda: Separate(causal=True, flat=True),
    "nanogpt": lambda: NanoGPT(),
    "nanogpt-chunk": lambda: NanoGPT(chunk=True),
    "grouped": lambda: Grouped(),
    "grouped-permuted": lambda: Grouped(permuted=True),
    "causal-fill": lambda: CausalFill(),
    "hand-written": lambda: HandWritten(),
    "hand-written-hf": lambda: HandWritten(hf=True),
    "block-bias": lambda: Block(),
    "block-shared-bias": lambda: Block(shared_bias=True),
}


def build(name, seed=0):
    torch.manual_seed(seed)
    return CASES[name]().eval()


def attention_nodes(f):
    runner = G.runner_of(f)
    assert runner is not None and runner.num_segments == 1, "the model should be one core graph"
    return [n for n in runner._spec["nodes"] if n["kind"] == "attention"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_is_one_node_of_one_graph_fp32(name):
    model = build(name)
    x = torch.randn(2, 10, 32 if "separate" not in name else 24)
    f = qpack.freeze(model, progress=False)
    nodes = attention_nodes(f)
    assert len(nodes) == 1
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5
        x7 = x[:, :7] if "block" not in name and not name.startswith("grouped") else x  # other token counts (a bias fixes them)
        assert rel_err(f(x7), model(x7)) < 1e-5
    assert "attention" in (qpack.graph_report(f) or "")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["packed", "separate-causal-flat", "nanogpt", "grouped", "grouped-permuted",
                                  "hand-written-hf", "causal-fill", "block-bias"])
def test_int8_attention_node_within_one_quantum_of_its_reference(backend, name):
    model = build(name, seed=1)
    c = 32 if "separate" not in name else 24
    calib = [torch.randn(2, 10, c) for _ in range(3)]
    f = qpack.freeze(model, dtype="int8", example_inputs=calib, backend=backend, progress=False)
    assert len(attention_nodes(f)) == 1
    spec = G.runner_of(f)._spec
    node = next(n for n in spec["nodes"] if n["kind"] == "attention")
    assert all(spec["values"][v][0] == "u8" for v in node["inputs"] + [node["output"]])
    x = calib[1]
    # (grouped's first transpose runs in PyTorch: the graph's input is its result)
    assert_within_reference(f, model, x, x.transpose(1, 2) if name.startswith("grouped") else x)


def assert_within_reference(f, model, x, graph_input):
    """The int8 graph's output within a quantum (two: one op more) of the per-edge reference,
    and within 10 % of the fp32 model."""
    spec = G.runner_of(f)._spec
    with torch.no_grad():
        ref, y = per_edge_reference(f, graph_input), f(x)
        out_s = spec["values"][spec["nodes"][-1]["inputs"][0]][1]
        assert float((y - ref).abs().max()) <= 2 * out_s + 1e-6
        assert rel_err(y, model(x)) < 0.1


def assert_int8_within_reference(model, shape, attentions, backend):
    """model frozen to static int8 on three batches of ``shape``: one graph with
    ``attentions`` attention nodes, within reach of the reference on the second batch."""
    calib = [torch.randn(*shape) for _ in range(3)]
    f = qpack.freeze(model, dtype="int8", example_inputs=calib, backend=backend, progress=False)
    assert len(attention_nodes(f)) == attentions
    assert_within_reference(f, model, calib[1], calib[1])


def test_arguments_other_than_the_traced_defaults_run_the_models_forward():
    """Traced with attn_mask None and is_causal False; a call passing others gets them."""
    model = build("packed")
    f = qpack.freeze(model, progress=False)
    assert len(attention_nodes(f)) == 1 or G.runner_of(f)._gm is not None
    x = torch.randn(2, 6, 32)
    mask = torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        assert rel_err(f(x, mask), model(x, mask)) < 1e-5
        assert rel_err(f(x, None, True), model(x, None, True)) < 1e-5
        assert rel_err(f(x, attn_mask=mask), model(x, attn_mask=mask)) < 1e-5
        assert rel_err(f(x, None, False), model(x)) < 1e-5


@pytest.mark.parametrize("kind", ["not-tril", "size-scale"])
def test_masks_and_scales_the_node_does_not_take_keep_their_spelling(kind):
    """A 0/1 buffer that is no lower triangle is no causal mask, and a scale computed from
    a size stays PyTorch's arithmetic: the spelled-out ops run as written (the model traces:
    its buffer indexed by a traced size), eager's values at every token count."""
    torch.manual_seed(7)
    model = CausalFill(tril=kind != "not-tril", size_scale=kind == "size-scale").eval()
    f = qpack.freeze(model, progress=False)
    runner = G.runner_of(f)
    assert runner is not None and runner._gm is not None and "masked_fill" in runner._gm.code
    with torch.no_grad():
        for t in (10, 5):
            x = torch.randn(2, t, 32)
            assert rel_err(f(x), model(x)) < 1e-5


class Computed(nn.Module):
    """A mask computed from the input, and dropout in training: stays PyTorch's call."""

    def __init__(self):
        super().__init__()
        self.inner = PackedQKV()

    def forward(self, x):
        return self.inner(x, (x[:, :, :1] * x[:, :, :1].transpose(1, 2) > 0).unsqueeze(1))


def test_a_mask_computed_from_the_input_stays_a_pytorch_call():
    model = Computed().eval()
    x = torch.randn(2, 6, 32)
    f = qpack.freeze(model, progress=False)
    runner = G.runner_of(f)
    assert runner._gm is not None and "scaled_dot_product_attention" in runner._gm.code
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5


def test_saved_and_loaded_with_threads(tmp_path):
    model = build("block-bias")
    f = qpack.freeze(model, progress=False)
    x = torch.randn(3, 10, 32)
    path = tmp_path / "block.qpk"
    qpack.save(f, path)
    g = qpack.load(path)
    before = qpack.get_num_threads()
    try:
        with torch.no_grad():
            qpack.set_num_threads(1)
            one = g(x)
            qpack.set_num_threads(2)
            two = g(x)
    finally:
        qpack.set_num_threads(before)
    with torch.no_grad():
        assert torch.equal(one, two) and rel_err(one, model(x)) < 1e-5
    buf = io.BytesIO()
    torch.save(f, buf)
    buf.seek(0)
    h = torch.load(buf, weights_only=False)
    with torch.no_grad():
        assert rel_err(h(x), model(x)) < 1e-5


@pytest.mark.parametrize("name", ["block-bias", "nanogpt"])
def test_the_file_reader_reads_attention_nodes(name, tmp_path):
    """qpack's own .qpk reader (qpack inspect) reads a saved graph's attention node: its three
    inputs and its mask (block-bias: [H, L, S] floats), no problem found."""
    from qpack import _file
    f = qpack.freeze(build(name), progress=False)
    path = tmp_path / "m.qpk"
    qpack.save(f, path)
    d = _file.describe(str(path))
    assert d["problems"] == []
    nodes = [n for g in d["graphs"] for n in g["nodes"] if n["kind"] == "attention"]
    assert len(nodes) == 1 and len(nodes[0]["inputs"]) == 3
    assert nodes[0]["num_affine"] == (4 * 10 * 10 if name == "block-bias" else 0)


# ---- the node through the C API: parameters and errors --------------------------------------

def one_node(**params):
    node = dict(kind="attention", inputs=[0, 0, 0], output=1, heads=2, head_dim=4, offsets=(0, 8, 16), scale=0.5)
    node.update(params)
    return _core.GraphHandle([("f32", 0.0, 0), ("f32", 0.0, 0)], [node], [0], [1])


def run(g, x):
    return torch.from_numpy(g.run([x.contiguous().numpy()], ["nchw"], "nchw")[0])


def reference(x, heads, d, dv, offsets, scale, mask=None, causal=False):
    b, n = x.shape[:2]

    def split(at, w):
        return x[..., at:at + heads * w].reshape(b, n, heads, w).transpose(1, 2)
    y = F.scaled_dot_product_attention(split(offsets[0], d), split(offsets[1], d), split(offsets[2], dv),
                                       attn_mask=mask, is_causal=causal, scale=scale)
    return y.transpose(1, 2).reshape(b, n, heads * dv)


@pytest.mark.parametrize("causal", [False, True])
def test_the_node_reads_heads_where_they_are(causal):
    torch.manual_seed(3)
    x = torch.randn(3, 5, 30)  # q at 2, k at 12, v (3 wide) at 21: rows with more than the heads
    g = one_node(head_dim=4, value_dim=3, offsets=(2, 12, 21), causal=causal)
    assert torch.allclose(run(g, x), reference(x, 2, 4, 3, (2, 12, 21), 0.5, causal=causal), atol=2e-6)
    # heads in groups (LeViT's): q and k heads 10 apart, v heads 7 apart
    g = one_node(head_dim=3, value_dim=2, offsets=(0, 3, 6), head_strides=(10, 7), causal=causal)
    q = torch.stack([x[..., i * 10:i * 10 + 3] for i in range(2)], 1)
    k = torch.stack([x[..., 3 + i * 10:3 + i * 10 + 3] for i in range(2)], 1)
    v = torch.stack([x[..., 6 + i * 7:6 + i * 7 + 2] for i in range(2)], 1)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.5).transpose(1, 2).flatten(2)
    assert torch.allclose(run(g, x), want, atol=2e-6)
    mask = torch.randn(2, 5, 5)
    mask[:, :, 0] = float("-inf")
    g = one_node(mask=mask.numpy())
    assert torch.allclose(run(g, x[..., :24]), reference(x[..., :24], 2, 4, 4, (0, 8, 16), 0.5, mask), atol=2e-6)


def test_window_masks_after_the_heads_bias():
    """mask_windows = G: the mask is the heads' [H, L, S] then G windows' [L, S], sample n
    adding window n % G's after its head's (Swin's bias and shifted windows, each held
    once): PyTorch's attention with their sums, and the node of the summed [G, H, L, S]."""
    torch.manual_seed(5)
    x = torch.randn(6, 5, 24)  # two images of 3 windows
    bias, win = torch.randn(2, 5, 5), torch.randn(3, 5, 5)
    win[1, :, 0] = win[2, :, 3] = float("-inf")
    g = one_node(mask=torch.cat([bias, win]).numpy(), mask_windows=3)
    want = reference(x, 2, 4, 4, (0, 8, 16), 0.5, bias.unsqueeze(0) + win.repeat(2, 1, 1).unsqueeze(1))
    assert torch.allclose(run(g, x), want, atol=2e-6)
    summed = one_node(mask=(bias.unsqueeze(0) + win.unsqueeze(1)).numpy())
    assert torch.allclose(run(g, x), run(summed, x), atol=1e-6)
    causal = one_node(mask=torch.cat([bias, win]).numpy(), mask_windows=3, causal=True)
    want = reference(x, 2, 4, 4, (0, 8, 16), 0.5, bias.unsqueeze(0) + win.repeat(2, 1, 1).unsqueeze(1)
                     + torch.full((5, 5), float("-inf")).triu(1))
    assert torch.allclose(run(causal, x), want, atol=2e-6)
    # errors: a count that is not whole, or not in [0, 2^20]; a mask of another length;
    # a batch the windows do not divide (at run: the graph stays usable)
    for windows in (2.5, -1, 2 ** 21, float("nan")):
        with pytest.raises(_core.InvalidArgumentError, match="window mask count"):
            one_node(mask=torch.cat([bias, win]).numpy(), mask_windows=windows)
    with pytest.raises(_core.InvalidArgumentError, match="window mask count"):
        one_node(mask=np.append(torch.cat([bias, win]).numpy(), np.float32(0)), mask_windows=3)
    with pytest.raises(_core.InvalidArgumentError, match="windows' for a batch of G's multiples"):
        run(g, x[:4])
    with pytest.raises(_core.InvalidArgumentError, match=r"not \(H \+ G\) x L x S"):
        run(g, x[:, :4])
    assert torch.allclose(run(g, x), run(summed, x), atol=1e-6)


def test_bad_parameters_and_inputs_raise_and_leave_the_graph_usable():
    for bad, what in [(dict(heads=0), "heads"), (dict(head_dim=0), "head dim"), (dict(scale=float("nan")), "scale"),
                      (dict(offsets=(-1, 0, 0)), "start"), (dict(mask=np.array([np.nan], np.float32)), "NaN"),
                      (dict(head_strides=(-1, 4)), "head strides"),
                      (dict(inputs=[0, 0]), "3 input")]:
        with pytest.raises(_core.InvalidArgumentError, match=what):
            one_node(**bad)
    g = one_node()
    x = torch.randn(2, 5, 24)
    for wrong in (torch.randn(2, 5, 23), torch.randn(2, 5, 4, 6)):
        with pytest.raises(_core.InvalidArgumentError, match="attention"):
            run(g, wrong)
    with pytest.raises(_core.InvalidArgumentError, match="mask holds 3 values"):
        run(one_node(mask=np.zeros(3, np.float32)), x)
    with pytest.raises(_core.InvalidTypeError):
        _core.GraphHandle([("u8", 0.1, 0), ("f32", 0.0, 0)],
                          [dict(kind="attention", inputs=[0, 0, 0], output=1, heads=2, head_dim=4)], [0], [1])
    assert torch.allclose(run(g, x), reference(x, 2, 4, 4, (0, 8, 16), 0.5), atol=2e-6)


class MHABlock(nn.Module):
    """nn.MultiheadAttention on one value, as torchvision's ViT calls it."""

    def __init__(self, batch_first=True):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=batch_first)

    def forward(self, x):
        y = self.norm(x)
        return x + self.attn(y, y, y, need_weights=False)[0]


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_self_attention_is_its_projections_and_a_node(batch_first):
    """batch_first self-attention without masks: in_proj, an attention node, out_proj in
    the graph; [L, N, E] inputs keep the module's own call; an unbatched [L, E] input
    runs PyTorch's way (the core's node takes rank 3). Eager's values each time."""
    torch.manual_seed(5)
    model = MHABlock(batch_first).eval()
    f = qpack.freeze(model, progress=False)
    runner = G.runner_of(f)
    kinds = [n["kind"] for seg in (runner._segments if runner is not None else []) for n in seg.spec["nodes"]]
    assert ("attention" in kinds) == batch_first and kinds.count("linear") == (2 if batch_first else 0)
    x = torch.randn(3, 7, 32)
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5
        if batch_first:
            assert rel_err(f(x[0]), model(x[0])) < 1e-5


# ---- images and their tokens: hybrid models (PVT) in one graph --------------------------------

class PVTLike(nn.Module):
    """timm's PVT-v2 in small: a patch embedding to tokens through a channels-last LayerNorm
    (``permute(0, 2, 3, 1)``, LayerNorm, ``reshape(B, -1, C)``), spatial-reduction attention
    (tokens -> image ``permute(0, 2, 1).reshape(B, C, H, W)``, a strided conv, image -> tokens
    ``reshape(B, C, -1).permute(0, 2, 1)``, k and v of the reduced tokens), an MLP with a
    depthwise conv between ``transpose(1, 2).view(B, -1, H, W)`` and ``flatten(2).transpose(1,
    2)``, and the stage's end ``reshape(B, H, W, -1).permute(0, 3, 1, 2)``."""

    def __init__(self, c=32, heads=2):
        super().__init__()
        self.embed, self.embed_norm = nn.Conv2d(3, c, 4, 4), nn.LayerNorm(c)
        self.norm1, self.norm2, self.sr_norm = nn.LayerNorm(c), nn.LayerNorm(c), nn.LayerNorm(c)
        self.q, self.kv, self.o = nn.Linear(c, c), nn.Linear(c, 2 * c), nn.Linear(c, c)
        self.sr = nn.Conv2d(c, c, 2, 2)
        self.fc1, self.fc2 = nn.Linear(c, 2 * c), nn.Linear(2 * c, c)
        self.dw = nn.Conv2d(2 * c, 2 * c, 3, padding=1, groups=2 * c)
        self.head = nn.Conv2d(c, 8, 1)
        self.heads = heads

    def forward(self, x):
        x = self.embed_norm(self.embed(x).permute(0, 2, 3, 1))
        b, h, w, c = x.shape
        x = x.reshape(b, -1, c)
        y = self.norm1(x)
        b, n, c = y.shape
        q = self.q(y).reshape(b, n, self.heads, -1).permute(0, 2, 1, 3)
        r = self.sr(y.permute(0, 2, 1).reshape(b, c, h, w)).reshape(b, c, -1).permute(0, 2, 1)
        k, v = self.kv(self.sr_norm(r)).reshape(b, -1, 2, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        x = x + self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))
        z = self.fc1(self.norm2(x)).transpose(1, 2).view(b, -1, h, w)
        x = x + self.fc2(F.gelu(self.dw(z)).flatten(2).transpose(1, 2))
        return self.head(x.reshape(b, h, w, -1).permute(0, 3, 1, 2))


def test_images_and_tokens_of_a_hybrid_model_are_one_graph():
    """Every move between the image and its tokens is a transpose node (the NHWC bytes as they
    are), so the PVT-like model is one graph with one attention node; eager's values at two
    image sizes (H, W are the patch embedding's at each)."""
    torch.manual_seed(9)
    model = PVTLike().eval()
    f = qpack.freeze(model, progress=False)
    assert len(attention_nodes(f)) == 1  # (one graph)
    kinds = [n["kind"] for n in G.runner_of(f)._spec["nodes"]]
    assert kinds.count("transpose") == 6
    with torch.no_grad():
        for size in (32, 48):
            x = torch.randn(2, 3, size, size)
            assert rel_err(f(x), model(x)) < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_images_and_tokens_within_one_quantum_of_the_reference(backend):
    torch.manual_seed(10)
    assert_int8_within_reference(PVTLike().eval(), (2, 3, 32, 32), 1, backend)


class BoTLike(nn.Module):
    """BoTNet's bottleneck attention (timm's BottleneckAttn): heads split off the batch
    (``reshape(B * heads, d, -1)``), the attention spelled out with a position term computed
    from q, the heads' outputs put back with ``(attn @ v).transpose(-1, -2).reshape(B, C, H,
    W)``, a BatchNorm after: the reshape regroups the batch, so it is not the tokens' own
    image."""

    def __init__(self, c=32, heads=4, hw=64):
        super().__init__()
        self.conv, self.qkv = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, 3 * c, 1)
        self.norm, self.heads, self.c = nn.BatchNorm2d(c), heads, c
        self.rel = nn.Parameter(torch.randn(c // heads, hw) * 0.1)
        self.norm.running_mean.uniform_(-0.5, 0.5)
        self.norm.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        x = self.conv(x)
        b, c, h, w = x.shape
        q, k, v = torch.split(self.qkv(x), [c, c, c], dim=1)
        q = q.reshape(b * self.heads, c // self.heads, -1).transpose(-1, -2)
        k = k.reshape(b * self.heads, c // self.heads, -1)
        v = v.reshape(b * self.heads, c // self.heads, -1).transpose(-1, -2)
        attn = ((q @ k) * (c // self.heads) ** -0.5 + q @ self.rel).softmax(dim=-1)
        out = (attn @ v).transpose(-1, -2).reshape(b, self.c, h, w)  # (its channels by number)
        return F.relu(self.norm(out)) + x


def test_heads_put_back_from_a_regrouped_batch_are_not_the_tokens_image():
    """BoTNet's merge of heads split off the batch stays what it is (it had been taken for
    tokens [B heads, H W, d] back to their image, [B heads, d, H, W], which the BatchNorm
    then refused): eager's values, fp32 and int8."""
    torch.manual_seed(11)
    model = BoTLike().eval()
    x = torch.randn(2, 32, 8, 8)
    with torch.no_grad():
        ref = model(x)
        assert rel_err(qpack.freeze(model, progress=False)(x), ref) < 1e-5
        f8 = qpack.freeze(model, dtype="int8", example_inputs=[torch.randn(2, 32, 8, 8) for _ in range(2)],
                          progress=False)
        assert rel_err(f8(x), ref) < 0.1


class MQALike(nn.Module):
    """MobileNetV4's multi-query attention (timm's MultiQueryAttention2d): q the heads of a
    1x1 conv's channels (``reshape(B, H, D, -1).transpose(-1, -2)``), k and v one head each
    from a stride-2 depthwise conv, BatchNorm and 1x1 conv (``reshape(B, C, -1).transpose(1,
    2).unsqueeze(1)``), every q head reading them, the heads merged back into the image
    (``transpose(1, 2).reshape(B, H, W, -1).permute(0, 3, 1, 2)``), a 1x1 conv out; after a
    conv, as in the network."""

    def __init__(self, c=24, heads=4, d=8, dv=6):
        super().__init__()
        self.heads, self.d = heads, d
        self.stem = nn.Conv2d(c, c, 3, padding=1)
        self.q = nn.Conv2d(c, heads * d, 1, bias=False)
        self.k = nn.Sequential(nn.Conv2d(c, c, 3, 2, 1, groups=c, bias=False), nn.BatchNorm2d(c), nn.Conv2d(c, d, 1))
        self.v = nn.Sequential(nn.Conv2d(c, c, 3, 2, 1, groups=c, bias=False), nn.BatchNorm2d(c), nn.Conv2d(c, dv, 1))
        self.out = nn.Conv2d(heads * dv, c, 1)
        for bn in (self.k[1], self.v[1]):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        x = self.stem(x)
        b, _, h, w = x.shape
        q = self.q(x)
        q = q.reshape(q.shape[0], self.heads, self.d, -1).transpose(-1, -2).contiguous()
        k, v = self.k(x), self.v(x)
        k = k.reshape(k.shape[0], k.shape[1], -1).transpose(1, 2).unsqueeze(1).contiguous()
        v = v.reshape(v.shape[0], v.shape[1], -1).transpose(1, 2).unsqueeze(1).contiguous()
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0)
        o = o.transpose(1, 2).reshape(o.shape[0], h // 1, w // 1, o.shape[-1] * self.heads)
        return x + self.out(o.permute(0, 3, 1, 2).contiguous())


def test_multi_query_attention_over_an_images_pixels_is_one_node(tmp_path):
    """MobileNetV4's multi-query attention is one attention node whose heads all read k's and
    v's one head (multi_query), in one graph with the convolutions: eager's values at two
    image sizes; pickled, and saved as a .qpk file (which qpack's reader finds no problem
    in), it loads and gives them too."""
    torch.manual_seed(12)
    model = MQALike().eval()
    f = qpack.freeze(model, progress=False)
    (node,) = attention_nodes(f)
    assert node["multi_query"] and (node["heads"], node["head_dim"], node["value_dim"]) == (4, 8, 6)
    with torch.no_grad():
        for size in (8, 12):
            x = torch.randn(2, 24, size, size)
            assert rel_err(f(x), model(x)) < 1e-5
        buf = io.BytesIO()
        torch.save(f, buf)
        buf.seek(0)
        assert rel_err(torch.load(buf, weights_only=False)(x), model(x)) < 1e-5
        from qpack import _file
        qpack.save(f, tmp_path / "m.qpk")
        assert _file.describe(str(tmp_path / "m.qpk"))["problems"] == []
        assert rel_err(qpack.load(tmp_path / "m.qpk")(x), model(x)) < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_multi_query_attention_within_one_quantum_of_the_reference(backend):
    torch.manual_seed(13)
    assert_int8_within_reference(MQALike().eval(), (2, 24, 8, 8), 1, backend)


def test_the_multi_query_node_through_the_c_api():
    """pad_right = -1 (multi_query): every head of q reads k's and v's one head, PyTorch's
    attention with k and v expanded over the heads; k narrower than its head is refused at
    run and the graph stays usable."""
    torch.manual_seed(14)
    q, kv = torch.randn(2, 5, 12), torch.randn(2, 7, 7)  # q: 3 heads of 4; k 4 wide at 0, v 3 at 4
    f32 = ("f32", 0.0, 0)
    node = dict(kind="attention", inputs=[0, 1, 1], output=2, heads=3, head_dim=4, value_dim=3,
                offsets=(0, 0, 4), scale=0.5, multi_query=True)
    g = _core.GraphHandle([f32, f32, f32], [node], [0, 1], [2])

    def run2(a, b):
        return torch.from_numpy(g.run([a.numpy(), b.numpy()], ["nchw", "nchw"], "nchw")[0])
    want = F.scaled_dot_product_attention(q.reshape(2, 5, 3, 4).transpose(1, 2),
                                          kv[..., :4].unsqueeze(1).expand(2, 3, 7, 4),
                                          kv[..., 4:].unsqueeze(1).expand(2, 3, 7, 3), scale=0.5)
    assert torch.allclose(run2(q, kv), want.transpose(1, 2).reshape(2, 5, 9), atol=2e-6)
    assert torch.allclose(G.heads_attention(q, kv, kv, 3, 4, 3, (0, 0, 4), 0.5, multi_query=True),
                          run2(q, kv), atol=2e-6)
    with pytest.raises(_core.InvalidArgumentError, match="one k and v head"):
        run2(q, kv[..., :3].contiguous())
    assert torch.allclose(run2(q, kv), want.transpose(1, 2).reshape(2, 5, 9), atol=2e-6)


def test_the_transpose_node_between_images_and_tokens():
    """Through GraphHandle: an image's tokens, tokens back to the image of a second input's H
    and W (its data unread), both ways bit-exact; tokens that are not H x W are refused and the
    graph still runs."""
    f32 = ("f32", 0.0, 0)
    g = _core.GraphHandle([f32, f32], [dict(kind="transpose", inputs=[0], output=1)], [0], [1])
    x = torch.randn(2, 5, 3, 4)
    assert torch.equal(torch.from_numpy(g.run([x.numpy()], ["nchw"], "nchw")[0]), x.flatten(2).transpose(1, 2))
    back = _core.GraphHandle([f32, f32, f32], [dict(kind="transpose", inputs=[0, 1], output=2)], [0, 1], [2])
    t = torch.randn(2, 12, 5)
    like = torch.randn(1, 1, 3, 4)
    got = torch.from_numpy(back.run([t.numpy(), like.numpy()], ["nchw", "nchw"], "nchw")[0])
    assert torch.equal(got, t.transpose(1, 2).reshape(2, 5, 3, 4))
    with pytest.raises(_core.InvalidArgumentError, match="H W"):
        back.run([torch.randn(2, 11, 5).numpy(), like.numpy()], ["nchw", "nchw"], "nchw")
    got = torch.from_numpy(back.run([t.numpy(), like.numpy()], ["nchw", "nchw"], "nchw")[0])
    assert torch.equal(got, t.transpose(1, 2).reshape(2, 5, 3, 4))


class CascadedHeads(nn.Module):
    """timm's EfficientViT-M attention: heads over an image's pixels, each on a channel
    group plus the previous head's output (cascaded), q through a depthwise convolution,
    ``q.flatten(2).transpose(-2, -1) @ k.flatten(2)`` plus a position bias gathered from a
    table and indexed by head, ``v.flatten(2) @ attn.transpose(-2, -1)`` viewed back as the
    image (``view(B, -1, H, W)`` of the qkv convolution first)."""

    def __init__(self, dim=16, heads=2, kd=4, vd=8, res=5):
        super().__init__()
        self.kd, self.vd, self.scale = kd, vd, kd ** -0.5
        self.stem = nn.Conv2d(dim, dim, 1)  # (the block's input of known rank, as in the model)
        self.qkvs = nn.ModuleList(nn.Conv2d(dim // heads, 2 * kd + vd, 1) for _ in range(heads))
        self.dws = nn.ModuleList(nn.Conv2d(kd, kd, 3, 1, 1, groups=kd) for _ in range(heads))
        self.proj = nn.Sequential(nn.ReLU(), nn.Conv2d(vd * heads, dim, 1))
        points = [(i, j) for i in range(res) for j in range(res)]
        offsets, idxs = {}, []
        for p in points:
            for q in points:
                idxs.append(offsets.setdefault((abs(p[0] - q[0]), abs(p[1] - q[1])), len(offsets)))
        self.attention_biases = nn.Parameter(torch.randn(heads, len(offsets)))
        self.register_buffer("idxs", torch.tensor(idxs).view(len(points), len(points)), persistent=False)

    def forward(self, x):
        x = self.stem(x)
        B, C, H, W = x.shape
        feats_in = x.chunk(len(self.qkvs), dim=1)
        bias = self.attention_biases[:, self.idxs]
        out, feat = [], feats_in[0]
        for i, (qkv, dw) in enumerate(zip(self.qkvs, self.dws)):
            if i > 0:
                feat = feat + feats_in[i]
            feat = qkv(feat)
            q, k, v = feat.view(B, -1, H, W).split([self.kd, self.kd, self.vd], dim=1)
            q = dw(q)
            q, k, v = q.flatten(2), k.flatten(2), v.flatten(2)
            q = q * self.scale
            attn = (q.transpose(-2, -1) @ k + bias[i]).softmax(dim=-1)
            feat = (v @ attn.transpose(-2, -1)).view(B, self.vd, H, W)
            out.append(feat)
        return self.proj(torch.cat(out, 1))


def test_attention_over_an_images_pixels_is_the_graphs_node():
    """Each cascaded head is one attention node of one graph (it had been 11 PyTorch ops
    between graphs: timm's efficientvit_m0 80 -> 8 graphs), eager's values."""
    torch.manual_seed(11)
    model = CascadedHeads().eval()
    f = qpack.freeze(model, progress=False)
    runner = G.runner_of(f)
    assert runner.num_segments == 1, qpack.graph_report(f)
    assert len(attention_nodes(f)) == 2
    x = torch.randn(2, 16, 5, 5)
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_attention_over_an_images_pixels_within_one_quantum(backend):
    torch.manual_seed(12)
    assert_int8_within_reference(CascadedHeads().eval(), (2, 16, 5, 5), 2, backend)


def test_a_view_of_an_image_as_another_size_is_not_taken_for_itself():
    """view(B, -1, H, W) with another value's H and W is the image itself only where the
    image has them: a strided convolution's output viewed with its input's H and W keeps
    PyTorch's view (and its values)."""
    class Strided(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 16, 3, 2, 1)

        def forward(self, x):
            B, C, H, W = x.shape
            return self.conv(x).view(B, -1, H, W) * 2

    torch.manual_seed(13)
    model = Strided().eval()
    f = qpack.freeze(model, progress=False)
    x = torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        y = f(x)
        assert y.shape == (2, 4, 6, 6)
        assert rel_err(y, model(x)) < 1e-5


class ImageHeads(nn.Module):
    """timm's Visformer attention: heads of a 1x1 convolution's channels
    (``qkv(x).reshape(B, 3, H, D, -1).permute(1, 0, 2, 4, 3).unbind(0)``), attention spelled
    out with an eval Dropout after the softmax, merged back into an image
    (``permute(0, 1, 3, 2).reshape(B, -1, H, W)``)."""

    def __init__(self, c=16, heads=2):
        super().__init__()
        self.stem = nn.Conv2d(c, c, 1)
        self.qkv, self.proj = nn.Conv2d(c, 3 * c, 1, bias=False), nn.Conv2d(c, c, 1)
        self.drop = nn.Dropout(0.1)
        self.heads, self.d = heads, c // heads

    def forward(self, x):
        x = self.stem(x)
        B, C, H, W = x.shape
        q, k, v = self.qkv(x).reshape(B, 3, self.heads, self.d, -1).permute(1, 0, 2, 4, 3).unbind(0)
        attn = self.drop(((q @ k.transpose(-2, -1)) * self.d ** -0.5).softmax(dim=-1))
        return self.proj((attn @ v).permute(0, 1, 3, 2).reshape(B, -1, H, W))


def test_heads_of_an_images_channels_are_the_graphs_attention():
    """One graph with one attention node (timm's visformer_tiny 18 -> 4 graphs), eager's
    values at two sizes."""
    torch.manual_seed(16)
    model = ImageHeads().eval()
    f = qpack.freeze(model, progress=False)
    assert len(attention_nodes(f)) == 1
    with torch.no_grad():
        for size in (5, 6):
            x = torch.randn(2, 16, size, size)
            assert rel_err(f(x), model(x)) < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_heads_of_an_images_channels_within_one_quantum(backend):
    torch.manual_seed(17)
    assert_int8_within_reference(ImageHeads().eval(), (2, 16, 5, 5), 1, backend)


# ---- class tokens and position embeddings: constants over the batch (ViT) ---------------------

class ViTLike(nn.Module):
    """timm's VisionTransformer in small: a patch embedding to tokens, prefix tokens (the class
    token, and DeiT's distillation token with ``distilled``) ``expand``ed over the batch and
    concatenated before them, the position embedding added, a block, the class token's row
    ``x[:, 0]`` into the head (``x[:, 0, :]`` and the distillation token's ``x[:, 1]`` averaged
    in with ``distilled``). ``torchvision``: its patch tokens as torchvision's ViT spells them,
    ``reshape(n, C, (h // p) * (w // p)).permute(0, 2, 1)`` of the sizes of the image."""

    def __init__(self, c=32, heads=4, distilled=False, image=32, patch=8, torchvision=False):
        super().__init__()
        self.embed = nn.Conv2d(3, c, patch, patch)
        self.c, self.patch, self.torchvision = c, patch, torchvision
        n = (image // patch) ** 2
        self.cls_token = nn.Parameter(torch.randn(1, 1, c))
        self.dist_token = nn.Parameter(torch.randn(1, 1, c)) if distilled else None
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1 + distilled, c))
        self.norm1, self.norm = nn.LayerNorm(c), nn.LayerNorm(c)
        self.attn = PackedQKV(c, heads)
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        if self.torchvision:
            n, _, h, w = x.shape
            x = self.embed(x).reshape(n, self.c, (h // self.patch) * (w // self.patch)).permute(0, 2, 1)
        else:
            x = self.embed(x).flatten(2).transpose(1, 2)
        prefix = [self.cls_token.expand(x.shape[0], -1, -1)]
        if self.dist_token is not None:
            prefix.append(self.dist_token.expand(x.shape[0], -1, -1))
        x = torch.cat(prefix + [x], dim=1)
        x = x + self.pos_embed
        x = x + self.attn(self.norm1(x))
        x = self.norm(x)
        if self.dist_token is not None:
            return (self.head(x[:, 0, :]) + self.head(x[:, 1])) / 2
        return self.head(x[:, 0])


@pytest.mark.parametrize("distilled,torchvision", [(False, False), (True, False), (False, True)])
def test_class_tokens_and_position_embedding_are_in_the_graph(distilled, torchvision):
    """The prefix tokens and the position embedding are constant nodes over the batch (the
    tokens concatenated after them, the embedding added), the class token's row a
    channel_range: the whole ViT-like model is one graph, eager's values at batches 1 and 3."""
    torch.manual_seed(11)
    model = ViTLike(distilled=distilled, torchvision=torchvision).eval()
    f = qpack.freeze(model, progress=False)
    assert len(attention_nodes(f)) == 1  # (one graph)
    kinds = [n["kind"] for n in G.runner_of(f)._spec["nodes"]]
    assert kinds.count("constant") == 2 + distilled and kinds.count("channel_range") == 1 + distilled
    # the graph's own copies: the tokens, the embedding, two LayerNorms' weight and bias (and the
    # distilled head's mean, a per-channel affine of its 10 outputs)
    held = (model.cls_token.numel() * (1 + distilled) + model.pos_embed.numel() + 4 * 32 + 20 * distilled) * 4
    assert G.runner_of(f).info()["nbytes_constants"] == held
    assert f"constants {held} B" in qpack.graph_report(f)
    with torch.no_grad():
        for batch in (1, 3):
            x = torch.randn(batch, 3, 32, 32)
            assert rel_err(f(x), model(x)) < 1e-5
        # another image size: the position embedding does not fit its tokens; the graph cannot
        # plan it and runs the model's forward, which raises PyTorch's error
        with pytest.raises(RuntimeError, match="size of tensor"):
            f(torch.randn(1, 3, 40, 40))
        assert rel_err(f(x), model(x)) < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_class_tokens_within_one_quantum_of_the_reference(backend):
    torch.manual_seed(12)
    model = ViTLike(distilled=True).eval()
    assert_int8_within_reference(model, (2, 3, 32, 32), 1, backend)
    f = qpack.freeze(model, dtype="int8", example_inputs=[torch.randn(2, 3, 32, 32)], backend=backend,
                     progress=False)
    spec = G.runner_of(f)._spec
    consts = [n for n in spec["nodes"] if n["kind"] == "constant"]
    assert len(consts) == 3 and all(spec["values"][n["output"]][0] == "u8" for n in consts)


def test_a_bias_of_the_last_dim_stays_an_affine_node():
    """x + b of rows [N, C] and b [1, C] is the affine node over the last dim, not a constant
    table and an add."""
    class Bias(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 8, 4), nn.Linear(8, 4)
            self.b = nn.Parameter(torch.randn(1, 8))

        def forward(self, x):
            return self.fc(torch.flatten(self.conv(x), 1) + self.b)  # rows of a known rank
    torch.manual_seed(18)
    model = Bias().eval()
    f = qpack.freeze(model, progress=False)
    kinds = [n["kind"] for n in G.runner_of(f)._spec["nodes"]]
    assert "affine" in kinds and "constant" not in kinds and "add" not in kinds
    x = torch.randn(3, 3, 4, 4)
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5


def test_a_constant_that_is_not_one_sample_stays_in_pytorch():
    """A table of another batch than 1, or one broadcast along a dim of 1 (not the value's
    shape), is not the constant node's: PyTorch adds it between graphs, with eager's values."""
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)
            self.along = nn.Parameter(torch.randn(1, 5, 1))
            self.two = nn.Parameter(torch.randn(2, 5, 8))

        def forward(self, x):
            return self.fc2(self.fc1(x) + self.along) + self.two
    torch.manual_seed(13)
    model = Odd().eval()
    f = qpack.freeze(model, progress=False)
    runner = G.runner_of(f)
    kinds = [n["kind"] for seg in runner._segments for n in seg.spec["nodes"]]
    assert "linear" in kinds and "constant" not in kinds and runner.num_segments == 2
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5


def test_patch_counts_of_another_convolution_are_not_taken_for_its_size():
    """``reshape(n, C, (h // p) * (w // p))`` after a convolution whose padding makes its output
    another size than h // p is no image-to-tokens move: it stays PyTorch's (and raises as PyTorch
    does where the sizes differ)."""
    class Padded(ViTLike):
        def __init__(self):
            super().__init__(torchvision=True)
            self.embed = nn.Conv2d(3, 32, 8, 8, padding=4)
    torch.manual_seed(15)
    model = Padded().eval()
    f = qpack.freeze(model, progress=False)
    runner = G.runner_of(f)
    assert runner.num_segments == 2 and ".reshape(" in runner._gm.code
    with pytest.raises(RuntimeError, match="invalid for input of size"):
        f(torch.randn(1, 3, 32, 32))


def test_the_constant_node_repeats_its_table_over_the_batch():
    """Through GraphHandle: [rows] and [rows, columns] tables, f32 exact and u8 quantized when the
    graph is created (round half to even); its input only gives the batch. Bad tables are
    refused, and a made graph runs after a bad input."""
    f32 = ("f32", 0.0, 0)
    table = np.arange(12, dtype=np.float32).reshape(3, 4) / 8 - 0.5
    g = _core.GraphHandle([f32, f32], [dict(kind="constant", inputs=[0], output=1, table=table)], [0], [1])
    x = torch.randn(5, 7)
    got = torch.from_numpy(g.run([x.numpy()], ["nchw"], "nchw")[0])
    assert torch.equal(got, torch.from_numpy(table).expand(5, 3, 4))
    rows = _core.GraphHandle([f32, f32], [dict(kind="constant", inputs=[0], output=1, table=table[0])], [0], [1])
    assert torch.equal(torch.from_numpy(rows.run([x.numpy()], ["nchw"], "nchw")[0]),
                       torch.from_numpy(table[0]).expand(5, 4))
    scale, zp = 0.25, 3
    q = _core.GraphHandle([("u8", 0.5, 0), ("u8", scale, zp)],
                          [dict(kind="constant", inputs=[0], output=1, table=table)], [0], [1])
    got = q.run([np.zeros((2, 6), np.uint8)], ["nchw"], "nchw")[0]
    want = np.clip(np.rint(table / scale) + zp, 0, 255).astype(np.uint8)  # the core's rule (qpack.h)
    assert np.array_equal(got, np.broadcast_to(want, (2, 3, 4)))
    for bad, what in [(np.zeros((0,), np.float32), "table"), (np.zeros((2, 2, 2), np.float32), "table"),
                      (np.array([np.inf], np.float32), "finite")]:
        with pytest.raises(_core.InvalidArgumentError, match=what):
            _core.GraphHandle([f32, f32], [dict(kind="constant", inputs=[0], output=1, table=bad)], [0], [1])
    with pytest.raises(_core.InvalidArgumentError, match="1 to 4 dims"):
        g.run([np.zeros((), np.float32)], ["nchw"], "nchw")
    assert torch.equal(torch.from_numpy(g.run([x.numpy()], ["nchw"], "nchw")[0]),
                       torch.from_numpy(table).expand(5, 3, 4))


def test_saved_class_tokens_load_and_read(tmp_path):
    """A ViT-like graph saved to a .qpk file: loaded, the same values; qpack's reader reads its
    constant nodes (their tables' values) with no problem found."""
    from qpack import _file
    torch.manual_seed(14)
    model = ViTLike(distilled=True).eval()
    f = qpack.freeze(model, progress=False)
    path = tmp_path / "vit.qpk"
    qpack.save(f, path)
    g = qpack.load(path)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(g(x), f(x))
    d = _file.describe(str(path))
    assert d["problems"] == []
    consts = [n for gr in d["graphs"] for n in gr["nodes"] if n["kind"] == "constant"]
    assert sorted(n["num_affine"] for n in consts) == [32, 32, 18 * 32]
