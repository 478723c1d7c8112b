"""Swin's shifted window attention on one core graph (qpack.torch.attention.
shifted_window_attention, what a traced torchvision Swin calls in place of torchvision's):
against the attention written out in PyTorch (roll, windows, relative position bias,
the shifted windows' masks, back), its fallbacks, the graph's lifetime with its layers."""
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qpack
from qpack.torch import attention as A


def rel_err(a, b):
    return float((a - b).norm() / b.norm())


def reference(x, qkv, proj, bias, window, heads, shift):
    """The attention of torchvision's Swin blocks, written out: the image rolled by -shift,
    cut into windows, each window's multi-head attention with the relative position bias
    and (shifted) -100 between pixels of different regions of the unrolled image, projected,
    put back and rolled by +shift."""
    B, H, W, C = x.shape
    wh, ww = window
    sh, sw = (shift[0] if wh < H else 0), (shift[1] if ww < W else 0)  # no shift along a dim one window spans
    t = torch.roll(x, (-sh, -sw), (1, 2)) if sh or sw else x
    t = t.reshape(B, H // wh, wh, W // ww, ww, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, wh * ww, C)
    n, N, d = t.shape[0], wh * ww, C // heads
    q, k, v = qkv(t).reshape(n, N, 3, heads, d).permute(2, 0, 3, 1, 4)
    scores = (q * d ** -0.5) @ k.transpose(-2, -1) + bias
    if sh or sw:
        def parts(n, w, s):  # the rows (columns) that wrapped around apart from the rest
            return ((0, n - w), (n - w, n - s), (n - s, n)) if s else ((0, n),)
        region = torch.zeros(H, W)
        for i, (h0, h1) in enumerate(parts(H, wh, sh)):
            for j, (w0, w1) in enumerate(parts(W, ww, sw)):
                region[h0:h1, w0:w1] = 3 * i + j
        region = region.reshape(H // wh, wh, W // ww, ww).permute(0, 2, 1, 3).reshape(-1, N)
        mask = torch.where(region[:, None, :] == region[:, :, None], 0.0, -100.0)  # [windows, N, N]
        scores = (scores.reshape(B, -1, heads, N, N) + mask[None, :, None]).reshape(n, heads, N, N)
    out = proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(n, N, C))
    out = out.reshape(B, H // wh, W // ww, wh, ww, C).permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, C)
    return torch.roll(out, (sh, sw), (1, 2)) if sh or sw else out


class Attn(nn.Module):
    def __init__(self, c, heads, window, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        n = window[0] * window[1]
        self.bias = torch.randn(1, heads, n, n, generator=g)

    def forward(self, x):  # (freeze traces it; the tests call the layers through the attention)
        return self.proj(self.qkv(x)[..., :self.proj.in_features])


def frozen_pair(c, heads, window, seed=0, **kw):
    torch.manual_seed(seed)
    m = Attn(c, heads, window, seed).eval()
    f = qpack.freeze(m, progress=False, **kw)
    return m, f


def call(f, m, x, window, heads, shift, fallback=None, **kw):
    return A.shifted_window_attention(x, f.qkv.weight, f.proj.weight, m.bias, window, heads, shift,
                                      qkv_bias=f.qkv.bias, proj_bias=f.proj.bias, training=False,
                                      fallback=fallback, **kw)


@pytest.mark.parametrize("B,H,W,C,heads,window,shift", [
    (1, 8, 8, 16, 2, [4, 4], [0, 0]), (1, 8, 8, 16, 2, [4, 4], [2, 2]), (2, 12, 8, 24, 3, [4, 4], [2, 2]),
    (2, 6, 9, 8, 1, [3, 3], [1, 1]), (1, 4, 4, 16, 4, [4, 4], [2, 2])])  # the last: one window, no shift
def test_matches_the_attention_written_out(B, H, W, C, heads, window, shift):
    """On the core graph (no fallback), within float rounding of PyTorch's; the graph is
    kept on the qkv layer and used again for any batch, remade for another image size."""
    m, f = frozen_pair(C, heads, window)
    x = torch.randn(B, H, W, C)
    with torch.no_grad():
        got = call(f, m, x, window, heads, shift, fallback=lambda *a: pytest.fail("fell back"))
        assert rel_err(got, reference(x, m.qkv, m.proj, m.bias, window, heads, shift)) < 1e-5
        graph = f.qkv.__dict__["_window_graph"]
        handle = graph.handle
        x2 = torch.randn(B, H, W, C)
        assert rel_err(call(f, m, x2, window, heads, shift), reference(x2, m.qkv, m.proj, m.bias, window, heads,
                                                                       shift)) < 1e-5
        assert graph.handle is handle and handle.info()["runs"] == 2
        x3 = torch.randn(B + 1, H, W, C)  # another batch: the same graph (its tables are a sample's)
        assert rel_err(call(f, m, x3, window, heads, shift), reference(x3, m.qkv, m.proj, m.bias, window, heads,
                                                                       shift)) < 1e-5
        assert graph.handle is handle
        x4 = torch.randn(B, H + window[0], W, C)  # another image size: another graph
        assert rel_err(call(f, m, x4, window, heads, shift), reference(x4, m.qkv, m.proj, m.bias, window, heads,
                                                                       shift)) < 1e-5
        assert graph.handle is not handle


def test_int8_dynamic_linears():
    """Frozen int8 (the linears dynamic: no calibrated graph holds them) within 0.05."""
    m, f = frozen_pair(16, 2, [4, 4], dtype="int8")
    assert f.qkv.mode == "int8_dynamic"
    x = torch.randn(2, 8, 8, 16)
    with torch.no_grad():
        got = call(f, m, x, [4, 4], 2, [2, 2], fallback=lambda *a: pytest.fail("fell back"))
        assert rel_err(got, reference(x, m.qkv, m.proj, m.bias, [4, 4], 2, [2, 2])) < 0.05


def test_what_the_graph_does_not_take_falls_back():
    """Training, cosine attention (Swin V2's logit_scale), windows that do not divide the
    image, other weights, another dtype: the fallback runs, with every argument."""
    m, f = frozen_pair(16, 2, [4, 4])
    seen = []

    def fallback(*args):
        seen.append(args)
        return "fallback"
    x = torch.randn(1, 8, 8, 16)
    assert call(f, m, x, [4, 4], 2, [2, 2], fallback=fallback, logit_scale=torch.ones(2, 1, 1)) == "fallback"
    assert call(f, m, torch.randn(1, 6, 8, 16), [4, 4], 2, [2, 2], fallback=fallback) == "fallback"
    assert call(f, m, x.double(), [4, 4], 2, [2, 2], fallback=fallback) == "fallback"
    assert A.shifted_window_attention(x, m.qkv.weight, m.proj.weight, m.bias, [4, 4], 2, [2, 2], qkv_bias=m.qkv.bias,
                                      proj_bias=m.proj.bias, training=False, fallback=fallback) == "fallback"
    assert A.shifted_window_attention(x, f.qkv.weight, f.proj.weight, m.bias, [4, 4], 2, [2, 2],
                                      qkv_bias=torch.zeros(48), proj_bias=f.proj.bias, training=False,
                                      fallback=fallback) == "fallback"  # a bias not the layer's
    assert call(f, m, x, [4, 4], 2, [2, 2], fallback=fallback, ) != "fallback"
    A.shifted_window_attention(x, f.qkv.weight, f.proj.weight, m.bias, [4, 4], 2, [2, 2], qkv_bias=f.qkv.bias,
                               proj_bias=f.proj.bias, training=True, fallback=fallback)
    assert len(seen) == 6 and seen[-1][-1] is True  # training passed on
    assert seen[0][0] is x and seen[0][4] == [4, 4] and seen[0][6] == [2, 2]


def test_the_graph_is_not_saved_and_close_frees_it(tmp_path):
    """The window graph is the qkv layer's transient state: pickle, deepcopy and qpack.save
    leave it out (the copies run and make their own), close() drops it with the packed op."""
    import copy
    m, f = frozen_pair(16, 2, [4, 4])
    x = torch.randn(1, 8, 8, 16)
    with torch.no_grad():
        want = call(f, m, x, [4, 4], 2, [2, 2])
        for g in (pickle.loads(pickle.dumps(f)), copy.deepcopy(f)):
            assert "_window_graph" not in g.qkv.__dict__
            assert torch.equal(call(g, m, x, [4, 4], 2, [2, 2]), want)
        path = tmp_path / "m.qpk"
        qpack.save(f, str(path))
        assert torch.equal(call(qpack.load(str(path)), m, x, [4, 4], 2, [2, 2]), want)
    graph = f.qkv.__dict__["_window_graph"]
    f.qkv.close()
    assert graph.handle is None and "_window_graph" not in f.qkv.__dict__
    with pytest.raises(qpack.ClosedError):
        f.qkv(torch.randn(1, 16))


def test_torchvision_swin_calls_it():
    """A traced torchvision Swin (small) runs its blocks' window attention on qpack's graph,
    its relative position bias a constant of the trace: eager's values fp32, int8 within 0.1."""
    try:
        from torchvision.models.swin_transformer import SwinTransformer
    except Exception as e:  # noqa: BLE001 - not installed, or built for another torch
        pytest.skip(f"torchvision's Swin is not importable here ({type(e).__name__}: {str(e)[:80]})")
    torch.manual_seed(21)
    model = SwinTransformer([4, 4], 16, [2, 2], [2, 4], [4, 4], num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    f = qpack.freeze(model, progress=False)
    from qpack.torch import graph as G
    calls = [n for n in G.runner_of(f)._gm.graph.nodes if n.target is A.shifted_window_attention]
    assert len(calls) == 4
    with torch.no_grad():
        ref = model(x)
        assert rel_err(f(x), ref) < 1e-5
        assert "_window_graph" in f.features[1][0].attn.qkv.__dict__
        f8 = qpack.freeze(model, dtype="int8", example_inputs=[torch.randn(2, 3, 32, 32) for _ in range(2)],
                          progress=False)
        assert rel_err(f8(x), ref) < 0.1


def test_threads_share_the_graph():
    """Threads calling it at once, at two image sizes (the graph replaced under them), each
    get their own input's attention."""
    import threading
    m, f = frozen_pair(16, 2, [4, 4])
    xs = [torch.randn(1, 8 + 4 * (i % 2), 8, 16) for i in range(6)]
    with torch.no_grad():
        want = [reference(x, m.qkv, m.proj, m.bias, [4, 4], 2, [2, 2]) for x in xs]
    errors = []

    def work(i):
        try:
            with torch.no_grad():
                for _ in range(20):
                    assert rel_err(call(f, m, xs[i], [4, 4], 2, [2, 2]), want[i]) < 1e-5
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
