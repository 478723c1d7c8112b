"""nn.MultiheadAttention frozen (qpack.torch.FrozenMultiheadAttention): its two projections
packed (fp32, or int8 dynamic), attention in PyTorch. PyTorch's own module is the oracle for
every argument of its forward; what freeze keeps as it is, lifetimes, saving, errors."""
import copy
import io
import pickle
import warnings

import pytest
import torch
from torch import nn

import qpack
from qpack.torch import FreezeWarning, FrozenMultiheadAttention

pytestmark = pytest.mark.skipif("onednn" not in qpack.backends(), reason="the oneDNN backend is not built")

E, H = 32, 4


def mha(batch_first=True, bias=True, seed=0, **kw):
    torch.manual_seed(seed)
    m = nn.MultiheadAttention(E, H, bias=bias, batch_first=batch_first, **kw).eval()
    with torch.no_grad():  # nonzero biases (PyTorch starts them at 0)
        for p in (m.in_proj_bias, m.out_proj.bias):
            if p is not None:
                p.uniform_(-0.5, 0.5)
    return m


def close(a, b, tol=1e-5):
    return a.shape == b.shape and (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


def call(m, q, k, v, **kw):
    with torch.no_grad():
        return m(q, k, v, **kw)


L, S, N = 7, 9, 3


def masks(batch_first):
    g = torch.Generator().manual_seed(1)
    bool_2d = torch.rand(L, S, generator=g) > 0.7
    bool_2d[:, 0] = False  # every query sees a key
    float_3d = torch.randn(N * H, L, S, generator=g)
    pad = torch.zeros(N, S, dtype=torch.bool)
    pad[0, -3:] = True
    pad_float = torch.randn(N, S, generator=g)
    return [dict(), dict(attn_mask=bool_2d), dict(attn_mask=float_3d), dict(key_padding_mask=pad),
            dict(key_padding_mask=pad_float), dict(attn_mask=bool_2d, key_padding_mask=pad)]


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("inputs", ["self", "kv", "distinct"])
def test_frozen_attention_matches_pytorch(batch_first, need_weights, inputs):
    """Self-attention (one tensor), key = value, and three distinct inputs; with and
    without weights (averaged and per head); masks of every kind."""
    m = mha(batch_first)
    f = qpack.freeze(m)
    assert isinstance(f, FrozenMultiheadAttention)
    g = torch.Generator().manual_seed(2)
    shape_q = (N, L, E) if batch_first else (L, N, E)
    shape_k = (N, S, E) if batch_first else (S, N, E)
    q = torch.randn(*shape_q, generator=g)
    k = q if inputs == "self" else torch.randn(*shape_k, generator=g)
    v = k if inputs in ("self", "kv") else torch.randn(*shape_k, generator=g)
    for kw in (masks(batch_first) if inputs != "self" else [dict()]):
        for avg in (True, False):
            ref_out, ref_w = call(m, q, k, v, need_weights=need_weights, average_attn_weights=avg, **kw)
            out, w = call(f, q, k, v, need_weights=need_weights, average_attn_weights=avg, **kw)
            assert close(out, ref_out), (kw.keys(), avg)
            if need_weights:
                assert close(w, ref_w), (kw.keys(), avg)
            else:
                assert w is None and ref_w is None


def test_frozen_attention_unbatched_causal_and_no_bias():
    m = mha(bias=False)
    f = qpack.freeze(m)
    x = torch.randn(L, E)  # unbatched
    for need in (True, False):
        ref, rw = call(m, x, x, x, need_weights=need)
        out, w = call(f, x, x, x, need_weights=need)
        assert close(out, ref) and (not need or close(w, rw))
    causal = nn.Transformer.generate_square_subsequent_mask(L)
    xb = torch.randn(N, L, E)
    ref, _ = call(m, xb, xb, xb, attn_mask=causal, is_causal=True, need_weights=False)
    out, _ = call(f, xb, xb, xb, attn_mask=causal, is_causal=True, need_weights=False)
    assert close(out, ref)
    out2, _ = call(f, xb, xb, xb, is_causal=True, need_weights=False)  # causal without the mask given
    assert close(out2, ref)


class Block(nn.Module):
    """A ViT encoder block (torchvision's EncoderBlock, small)."""

    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(E)
        self.attn = nn.MultiheadAttention(E, H, batch_first=True)
        self.ln2 = nn.LayerNorm(E)
        self.mlp = nn.Sequential(nn.Linear(E, 4 * E), nn.GELU(), nn.Linear(4 * E, E))

    def forward(self, x):
        y = self.ln1(x)
        y, _ = self.attn(y, y, y, need_weights=False)
        x = x + y
        return x + self.mlp(self.ln2(x))


def test_block_fp32_and_int8_graphs():
    """In a traced model a self-attention call is the core's graph: its projections and an
    attention node, one graph for the blocks; an int8 freeze calibrates them with the
    rest (static int8 projections in the u8 graph)."""
    from qpack.torch.graph import runner_of
    torch.manual_seed(3)
    m = nn.Sequential(Block(), Block()).eval()
    x = torch.randn(2, 10, E)
    f = qpack.freeze(m)
    assert all(isinstance(b.attn, FrozenMultiheadAttention) for b in f)
    runner = runner_of(f)
    assert runner._gm is None and [n["kind"] for n in runner._spec["nodes"]].count("attention") == 2
    with torch.no_grad():
        ref = m(x)
        assert close(f(x), ref, 1e-5)
    fi = qpack.freeze(m, dtype="int8", example_inputs=[torch.randn(2, 10, E) for _ in range(2)], progress=False)
    assert all(b.attn.in_proj.mode == "int8_static" and b.attn.out_proj.mode == "int8_static" for b in fi)
    with torch.no_grad():
        err = ((fi(x) - ref).norm() / ref.norm()).item()
    assert err < 0.05, err
    fd = qpack.freeze(m, dtype="int8")  # no calibration: layer by layer, dynamic
    with torch.no_grad():
        assert ((fd(x) - ref).norm() / ref.norm()).item() < 0.05


def test_kept_as_pytorch_where_it_does_more():
    """bias_k / bias_v, add_zero_attn, key / value sizes of their own: the module stays."""
    for kw in (dict(add_bias_kv=True), dict(add_zero_attn=True), dict(kdim=16, vdim=24)):
        m = mha(**kw)
        f = qpack.freeze(nn.Sequential(m).eval())
        assert type(f[0]) is nn.MultiheadAttention, kw


class OwnEncoderLayer(nn.TransformerEncoderLayer):
    """A subclass of nn.TransformerEncoderLayer with a forward of its own (here its
    base's, whose fast path hands self_attn's weights to one function)."""

    def forward(self, src, *args, **kwargs):
        return super().forward(src, *args, **kwargs) * 2.0


class SameEncoderLayer(nn.TransformerEncoderLayer):
    """A subclass that overrides nothing: it computes what its base computes."""


def test_inside_a_transformer_encoder_layer_subclass_stays():
    """A subclass of nn.TransformerEncoderLayer with its own forward is no layer freeze
    writes out (test_transformer_encoder.py has those): its code may read self_attn's
    weights, so its attention stays PyTorch's, and the model still runs; one that
    overrides nothing is written out as its base."""
    torch.manual_seed(4)
    x = torch.randn(2, 5, E)
    for cls, frozen_attn in ((OwnEncoderLayer, nn.MultiheadAttention), (SameEncoderLayer, FrozenMultiheadAttention)):
        m = cls(E, H, dim_feedforward=64, batch_first=True).eval()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FreezeWarning)  # OwnEncoderLayer's forward does not trace
            f = qpack.freeze(nn.Sequential(m).eval())
        assert type(f[0].self_attn) is frozen_attn
        with torch.no_grad():
            assert close(f(x), m(x))


class ReadsWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(E, H, batch_first=True)

    def forward(self, x):
        y, _ = self.attn(x, x, x, need_weights=False)
        return y + self.attn.in_proj_weight.sum()


def test_a_forward_that_reads_the_weights_keeps_the_module():
    torch.manual_seed(5)
    m = ReadsWeight().eval()
    f = qpack.freeze(m)
    assert type(f.attn) is nn.MultiheadAttention
    x = torch.randn(2, 5, E)
    with torch.no_grad():
        assert close(f(x), m(x))


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_lifetimes_saving_and_unfreeze(dtype, tmp_path):
    """Released originals, state_dict, pickle, torch.save, deepcopy, qpack.save / load,
    memory_report; unfreeze gives an nn.MultiheadAttention computing the same."""
    m = nn.Sequential(mha(seed=6)).eval()
    f = qpack.freeze(m, retain=False, dtype=dtype)
    x = torch.randn(2, 5, E)
    with torch.no_grad():
        want = f[0](x, x, x, need_weights=False)[0]
    rep = qpack.memory_report(f)
    assert rep.nbytes_original == 0 and rep.nbytes_packed >= (3 * E * E + E * E) * (4 if dtype is None else 1)
    copies = [copy.deepcopy(f), pickle.loads(pickle.dumps(f))]
    buf = io.BytesIO()
    torch.save(f, buf)
    buf.seek(0)
    copies.append(torch.load(buf, weights_only=False))
    qpack.save(f, tmp_path / "mha.qpk")
    copies.append(qpack.load(tmp_path / "mha.qpk"))
    fresh = qpack.freeze(nn.Sequential(mha(seed=7)).eval(), retain=False, dtype=dtype)
    fresh.load_state_dict(f.state_dict())
    copies.append(fresh)
    for c in copies:
        assert isinstance(c[0], FrozenMultiheadAttention)
        with torch.no_grad():
            assert torch.equal(c[0](x, x, x, need_weights=False)[0], want)
    u = qpack.unfreeze(f)
    assert type(u[0]) is nn.MultiheadAttention
    with torch.no_grad():
        got = u[0](x, x, x, need_weights=False)[0]
    if dtype is None:
        assert close(got, want)
    else:  # the float module on dequantized weights: within int8's activation quantization
        assert ((got - want).norm() / want.norm()).item() < 0.05


def test_bad_inputs_raise_and_leave_it_usable():
    f = qpack.freeze(mha())
    x = torch.randn(2, 5, E)
    with pytest.raises(qpack.InvalidTypeError, match="float32"):
        f(x.double(), x.double(), x.double())
    with pytest.raises(qpack.InvalidTypeError, match="embed_dim"):
        f(torch.randn(2, 5, E + 1), x, x)
    with pytest.raises(qpack.InvalidTypeError, match="3-d"):
        f(torch.randn(1, 2, 5, E), x, x)
    with pytest.raises(qpack.InvalidTypeError, match="bool or float"):
        f(x, x, x, key_padding_mask=torch.zeros(2, 5, dtype=torch.int64))
    with torch.no_grad():
        assert close(f(x, x, x)[0], mha()(x, x, x)[0])


# ---- the core's attention kernel (qpack_attention_f32) ------------------------------------------

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import torch.nn.functional as F  # noqa: E402

from qpack.torch.attention import scaled_dot_product_attention as qpack_sdpa  # noqa: E402

_SHAPES = [((1, 12, 197, 64), 197), ((2, 3, 7, 16), 9), ((1, 2, 5, 20), 33), ((1, 1, 1, 8), 1),
           ((2, 4, 50, 80), 50), ((1, 2, 70, 130), 65), ((3, 1, 9, 3), 100), ((4, 4, 196, 24), 196)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_core_attention_matches_pytorch(threads, causal):
    """Head dims on and off 16 and past 64, keys from 1 to 197, fewer and more keys than
    queries, causal or not, one or two threads: within float rounding of PyTorch."""
    qpack.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(8)
        for (b, h, l, d), s in _SHAPES:
            q, k, v = (torch.randn(b, h, n, d, generator=g) for n in (l, s, s))
            got = qpack_sdpa(q, k, v, is_causal=causal)
            assert close(got, F.scaled_dot_product_attention(q, k, v, is_causal=causal), 2e-6), (b, h, l, d, s)
            scaled = qpack_sdpa(q, k, v, scale=0.3)
            assert close(scaled, F.scaled_dot_product_attention(q, k, v, scale=0.3), 2e-6)
    finally:
        qpack.set_num_threads(1)


def test_core_attention_takes_strided_heads():
    """q, k, v as [B, L, H, D] viewed [B, H, L, D] (what a transpose of heads gives): strides,
    no copy; the output is a new contiguous tensor."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 11, 3, 4, 32, generator=g)  # [B, L, 3, H, D]: timm's qkv layout
    q, k, v = x.permute(2, 0, 3, 1, 4).unbind(0)
    assert not q.is_contiguous()
    got = qpack_sdpa(q, k, v)
    assert got.is_contiguous() and close(got, F.scaled_dot_product_attention(q, k, v), 2e-6)


def test_core_attention_copies_rows_that_are_not_contiguous(monkeypatch):
    """Heads made from channels, [B, H, D, N] permuted to [B, H, N, D] (EfficientFormerV2):
    the rows are copied and the core runs (before, PyTorch's math kernel ran them)."""
    from qpack import _core
    calls = []
    real = _core.attention_f32
    monkeypatch.setattr(_core, "attention_f32", lambda *a, **k: calls.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(14)
    q, k = torch.randn(1, 8, 16, 49, generator=g), torch.randn(1, 8, 16, 196, generator=g)
    v, mask = torch.randn(1, 8, 64, 196, generator=g), torch.randn(8, 49, 196, generator=g)
    q, k, v = (t.permute(0, 1, 3, 2) for t in (q, k, v))
    assert q.stride(-1) != 1
    got = qpack_sdpa(q, k, v, attn_mask=mask, scale=0.25)
    assert calls == [1] and close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25), 2e-6)


def test_core_attention_takes_a_float_mask_and_another_value_dim(monkeypatch):
    """A float attn_mask of every shape that broadcasts to [B, H, L, S] (a position bias
    shared by the batch, LeViT's) added to the scores, and v's head dim other than q's:
    on the core (counted), within float rounding of PyTorch; a row the mask hides
    entirely (all -inf) gives 0 as PyTorch's, not NaN."""
    from qpack import _core
    calls = []
    real = _core.attention_f32
    monkeypatch.setattr(_core, "attention_f32", lambda *a, **k: calls.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(13)
    for (b, h, l, s, d, dv) in [(2, 4, 49, 196, 16, 32), (1, 3, 5, 7, 20, 20), (2, 2, 17, 17, 64, 80)]:
        q, k, v = torch.randn(b, h, l, d, generator=g), torch.randn(b, h, s, d, generator=g), \
            torch.randn(b, h, s, dv, generator=g)
        for shape in [(l, s), (h, l, s), (b, h, l, s), (1, 1, l, s), (b, 1, 1, s)]:
            mask = torch.randn(*shape, generator=g)
            got = qpack_sdpa(q, k, v, attn_mask=mask, scale=0.25)
            assert close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25), 2e-6), shape
    assert len(calls) == 15
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g) for _ in range(3))
    mask = torch.zeros(5, 5)
    mask[3] = float("-inf")
    got, ref = qpack_sdpa(q, k, v, attn_mask=mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert len(calls) == 16 and not got.isnan().any() and torch.equal(got[:, :, 3], ref[:, :, 3])
    assert close(got, ref, 2e-6)


def test_core_attention_leaves_other_calls_to_pytorch():
    """A boolean mask, a mask with is_causal, dropout, float64, autograd, grouped heads:
    PyTorch's own call, same result."""
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))
    mask = torch.rand(6, 6, generator=g) > 0.3
    mask[:, 0] = True
    assert torch.equal(qpack_sdpa(q, k, v, attn_mask=mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    fm = mask.float()
    assert torch.equal(qpack_sdpa(q, k, v, attn_mask=fm, is_causal=True),
                       F.scaled_dot_product_attention(q, k, v, attn_mask=fm, is_causal=True))
    assert torch.equal(qpack_sdpa(q.double(), k.double(), v.double()),
                       F.scaled_dot_product_attention(q.double(), k.double(), v.double()))
    qg = q.clone().requires_grad_()
    out = qpack_sdpa(qg, k, v)
    out.sum().backward()  # PyTorch's call: it has a gradient
    assert qg.grad is not None
    kv = torch.randn(1, 1, 6, 8, generator=g)
    assert torch.equal(qpack_sdpa(q, kv, kv, enable_gqa=True), F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True))


def test_core_attention_errors():
    from qpack import _core
    import numpy as np
    q = np.zeros((1, 2, 3, 8), np.float32)
    with pytest.raises(qpack.InvalidTypeError, match="4-d float32"):
        _core.attention_f32(q.astype(np.float64), q, q, q.copy(), 1.0)
    with pytest.raises(qpack.InvalidArgumentError, match="do not match"):
        _core.attention_f32(q, np.zeros((1, 2, 3, 4), np.float32), q, q.copy(), 1.0)
    with pytest.raises(qpack.InvalidArgumentError, match="no keys"):
        _core.attention_f32(q, np.zeros((1, 2, 0, 8), np.float32), np.zeros((1, 2, 0, 8), np.float32),
                            q.copy(), 1.0)
    with pytest.raises(qpack.InvalidArgumentError, match="finite"):
        _core.attention_f32(q, q, q, q.copy(), float("nan"))
    with pytest.raises(qpack.InvalidArgumentError, match="mask"):
        _core.attention_f32(q, q, q, q.copy(), 1.0, mask=np.zeros((1, 2, 3, 4), np.float32))
    with pytest.raises(qpack.InvalidTypeError, match="mask must be a 4-d float32"):
        _core.attention_f32(q, q, q, q.copy(), 1.0, mask=np.zeros((1, 2, 3, 3), np.float64))
    with pytest.raises(qpack.InvalidTypeError, match="mask's rows must be contiguous"):
        _core.attention_f32(q, q, q, q.copy(), 1.0, mask=np.zeros((1, 2, 3, 6), np.float32)[..., ::2])
    with pytest.raises(qpack.InvalidArgumentError, match="do not match"):  # out's rows are not v's
        _core.attention_f32(q, q, np.zeros((1, 2, 3, 4), np.float32), q.copy(), 1.0)
    out = q.copy()
    _core.attention_f32(q, q, q, out, 1.0)  # still works: zeros in, zeros out
    assert not out.any()


_SCALAR = """
import torch, torch.nn.functional as F
from qpack.torch.attention import scaled_dot_product_attention as sdpa
g = torch.Generator().manual_seed(11)
for causal in (False, True):
    q, k, v = (torch.randn(2, 3, n, 20, generator=g) for n in (7, 13, 13))
    a, b = sdpa(q, k, v, is_causal=causal), F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert (a - b).abs().max().item() < 1e-5, (a - b).abs().max().item()
q, k, v, m = torch.randn(2, 3, 7, 20), torch.randn(2, 3, 13, 20), torch.randn(2, 3, 13, 9), torch.randn(3, 7, 13)
m[1, 4] = float("-inf")
a, b = sdpa(q, k, v, attn_mask=m), F.scaled_dot_product_attention(q, k, v, attn_mask=m)
assert (a - b).abs().max().item() < 1e-5, (a - b).abs().max().item()
print("ok")
"""


def test_core_attention_scalar_loops():
    """QPACK_VEC_MATH=0: the plain loops (what runs without AVX-512), within rounding,
    with a mask (one row hidden) and v's head dim other than q's too."""
    r = subprocess.run([sys.executable, "-c", _SCALAR], env=dict(os.environ, QPACK_VEC_MATH="0"),
                       capture_output=True, text=True, cwd="/tmp")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


class TimmAttention(nn.Module):
    """timm's ViT attention: one qkv Linear, F.scaled_dot_product_attention, a projection;
    with ``rows`` the heads are merged into [B N, C] rows (no graph node takes that
    merge: the attention stays a call between graphs)."""

    def __init__(self, rows=False):
        super().__init__()
        self.qkv, self.proj, self.rows = nn.Linear(E, 3 * E), nn.Linear(E, E), rows

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, H, c // H).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        if self.rows:
            return self.proj(y.transpose(1, 2).reshape(b * n, c)).reshape(b, n, c)
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


@pytest.mark.parametrize("rows", [False, True])
def test_traced_sdpa_calls_run_on_the_core(rows):
    """A traced forward's F.scaled_dot_product_attention runs on the core: as an attention
    node of the graph where it reads heads split from rows and merges them back
    (test_graph_attention.py), else as qpack's call between graphs."""
    from qpack.torch.graph import runner_of
    torch.manual_seed(12)
    m = nn.Sequential(nn.LayerNorm(E), TimmAttention(rows), nn.LayerNorm(E)).eval()
    f = qpack.freeze(m)
    runner = runner_of(f)
    assert runner is not None
    if not rows:
        assert runner._gm is None and "attention" in [n["kind"] for n in runner._spec["nodes"]]
    else:
        targets = [n.target for n in runner._gm.graph.nodes if n.op == "call_function"]
        assert qpack_sdpa in targets and F.scaled_dot_product_attention not in targets
    x = torch.randn(2, 9, E)
    with torch.no_grad():
        assert close(f(x), m(x), 1e-5)
