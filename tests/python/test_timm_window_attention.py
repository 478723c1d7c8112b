"""timm's Swin window attention (SwinTransformerBlock._attn) on qpack's core graph:
a traced timm Swin block calls qpack.torch.attention.timm_window_attention in its place.
Checked against the attention written out (test_window_attention.reference), on a
block written here the way timm 1.0 writes it (its class named and placed as timm's,
which is what freeze recognizes), and on timm's own Swin when timm is importable."""
import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qpack
from qpack.torch import attention as A
from qpack.torch import graph as G
from test_window_attention import reference, rel_err


def timm_mask(H, W, window, shift):
    """timm's SwinTransformerBlock.get_attn_mask: [windows, N, N], -100 between pixels
    of different regions of the unrolled image."""
    img = torch.zeros(1, H, W, 1)
    cnt = 0
    for h in ((0, -window[0]), (-window[0], -shift[0]), (-shift[0], None)):
        for w in ((0, -window[1]), (-window[1], -shift[1]), (-shift[1], None)):
            img[:, h[0]:h[1], w[0]:w[1], :] = cnt
            cnt += 1
    win = img.view(1, H // window[0], window[0], W // window[1], window[1], 1).permute(0, 1, 3, 2, 4, 5)
    win = win.reshape(-1, window[0] * window[1])
    m = win.unsqueeze(1) - win.unsqueeze(2)
    return m.masked_fill(m != 0, -100.0).masked_fill(m == 0, 0.0)


class WindowAttention(nn.Module):
    def __init__(self, dim, heads, window):
        super().__init__()
        self.num_heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.relative_position_bias_table = nn.Parameter(
            torch.randn((2 * window[0] - 1) * (2 * window[1] - 1), heads))
        coords = torch.stack(torch.meshgrid(torch.arange(window[0]), torch.arange(window[1]), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)
        rel[:, :, 0] += window[0] - 1
        rel[:, :, 1] += window[1] - 1
        rel[:, :, 0] *= 2 * window[1] - 1
        self.register_buffer("relative_position_index", rel.sum(-1), persistent=False)
        self.window_area = window[0] * window[1]

    def _get_rel_pos_bias(self):
        n = self.window_area
        b = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(n, n, -1)
        return b.permute(2, 0, 1).contiguous().unsqueeze(0)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B_, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        attn_mask = self._get_rel_pos_bias()
        if mask is not None:
            nw = mask.shape[0]
            mask = mask.view(1, nw, 1, N, N).expand(B_ // nw, -1, self.num_heads, -1, -1)
            attn_mask = attn_mask + mask.reshape(-1, self.num_heads, N, N)
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.proj(x.transpose(1, 2).reshape(B_, N, -1))


class SwinTransformerBlock(nn.Module):
    """timm 1.0's block, its structure and names (freeze recognizes the class by them)."""

    def __init__(self, dim, heads, size, window, shift):
        super().__init__()
        self.window_size, self.shift_size = tuple(window), tuple(shift)
        self.window_area = window[0] * window[1]
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, heads, window)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        mask = timm_mask(size[0], size[1], window, shift) if any(shift) else None
        self.register_buffer("attn_mask", mask, persistent=False)

    def _attn(self, x):
        B, H, W, C = x.shape
        if any(self.shift_size):
            x = torch.roll(x, shifts=(-self.shift_size[0], -self.shift_size[1]), dims=(1, 2))
        ws = self.window_size
        w = x.view(B, H // ws[0], ws[0], W // ws[1], ws[1], C).permute(0, 1, 3, 2, 4, 5).reshape(-1, self.window_area, C)
        w = self.attn(w, mask=self.attn_mask)
        x = w.view(B, H // ws[0], W // ws[1], ws[0], ws[1], C).permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, C)
        if any(self.shift_size):
            x = torch.roll(x, shifts=self.shift_size, dims=(1, 2))
        return x

    def forward(self, x):
        B, H, W, C = x.shape
        x = x + self._attn(self.norm1(x))
        x = x.reshape(B, -1, C)
        x = x + self.mlp(self.norm2(x))
        return x.reshape(B, H, W, C)


SwinTransformerBlock.__module__ = WindowAttention.__module__ = "timm.models.swin_transformer"


class TinySwin(nn.Module):
    def __init__(self, size=8, dim=16, heads=2, window=(4, 4)):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, 2, 2)
        s = (size // 2, size // 2)
        self.blocks = nn.Sequential(SwinTransformerBlock(dim, heads, s, window, (0, 0)),
                                    SwinTransformerBlock(dim, heads, s, window, (2, 2)))
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x).permute(0, 2, 3, 1)).mean((1, 2)))


def _attention_calls(frozen):
    runners = [G.runner_of(frozen)] + [G.runner_of(frozen.get_submodule(p)) for p in G.graph_parts(frozen)]
    return sum(1 for r in runners if r is not None and r._gm is not None
               for n in r._gm.graph.nodes if n.target is A.timm_window_attention)


def test_a_timm_block_calls_it(monkeypatch):
    """Both blocks (unshifted and shifted) are one call each of timm_window_attention on
    the core graph (never its PyTorch fallback), eager's values in fp32; int8 within 0.1."""
    torch.manual_seed(3)
    model = TinySwin(size=16).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ref = model(x)
    f = qpack.freeze(model, progress=False)
    assert _attention_calls(f) == 2
    monkeypatch.setattr(A, "_timm_window_attention_torch", lambda *a: pytest.fail("fell back to PyTorch"))
    with torch.no_grad():
        assert rel_err(f(x), ref) < 1e-5
    assert "_window_graph" in f.blocks[1].attn.qkv.__dict__
    # graph_report lists the window graphs: the shifted block's constants are its 2 heads'
    # bias and its 4 windows' masks, each [16][16] floats held once (not 4 x 2 sums), and
    # its two permutations of 64 rows (floats and int32)
    lines = [ln for ln in qpack.graph_report(f).splitlines() if ln.startswith("window attention of blocks.1.attn.qkv")]
    assert len(lines) == 1 and "(8x8 image" in lines[0]
    assert int(lines[0].split("constants ")[1].split(" B")[0]) == (2 + 4) * 16 * 16 * 4 + 2 * 64 * 8
    monkeypatch.undo()
    f8 = qpack.freeze(model, dtype="int8", example_inputs=[torch.randn(2, 3, 16, 16) for _ in range(2)],
                      progress=False)
    with torch.no_grad():
        assert rel_err(f8(x), ref) < 0.1


@pytest.mark.parametrize("B,H,W,C,heads,window,shift", [
    (1, 8, 8, 16, 2, [4, 4], [0, 0]), (2, 8, 8, 16, 2, [4, 4], [2, 2]), (2, 12, 8, 24, 3, [4, 4], [2, 2]),
    (1, 6, 9, 8, 1, [3, 3], [1, 1])])
def test_matches_the_attention_written_out(B, H, W, C, heads, window, shift):
    """On the core graph with frozen linears, the same written out in PyTorch with plain
    ones, both within float rounding of the reference."""
    torch.manual_seed(B + H + W)
    qkv, proj = nn.Linear(C, 3 * C).eval(), nn.Linear(C, C).eval()
    fq, fp = qpack.freeze(qkv, progress=False), qpack.freeze(proj, progress=False)
    N = window[0] * window[1]
    bias = torch.randn(1, heads, N, N)
    mask = timm_mask(H, W, window, shift) if any(shift) else None
    x = torch.randn(B, H, W, C)
    with torch.no_grad():
        want = reference(x, qkv, proj, bias, window, heads, shift)
        got = A.timm_window_attention(x, fq.weight, fp.weight, bias, window, heads, shift, fq.bias, fp.bias, mask)
        assert rel_err(got, want) < 1e-5
        assert "_window_graph" in fq.__dict__
        plain = A.timm_window_attention(x, qkv.weight, proj.weight, bias, window, heads, shift, qkv.bias,
                                        proj.bias, mask)
        assert rel_err(plain, want) < 1e-5


def test_padding_and_bad_input():
    """An image the windows do not divide runs in PyTorch, padded as timm pads it; an
    input that is not an image raises ValueError and the layers still run."""
    torch.manual_seed(0)
    C, heads, window = 8, 2, [4, 4]
    qkv, proj = nn.Linear(C, 3 * C).eval(), nn.Linear(C, C).eval()
    fq, fp = qpack.freeze(qkv, progress=False), qpack.freeze(proj, progress=False)
    bias = torch.randn(1, heads, 16, 16)
    x = torch.randn(1, 6, 7, C)  # padded to 8 x 8
    with torch.no_grad():
        got = A.timm_window_attention(x, fq.weight, fp.weight, bias, window, heads, [0, 0], fq.bias, fp.bias, None)
        want = reference(F.pad(x, (0, 0, 0, 1, 0, 2)), qkv, proj, bias, window, heads, [0, 0])[:, :6, :7]
        assert rel_err(got, want) < 1e-5
        with pytest.raises(ValueError, match=r"image \[B, H, W, C\]"):
            A.timm_window_attention(x[0], fq.weight, fp.weight, bias, window, heads, [0, 0], fq.bias, fp.bias, None)
        assert rel_err(fq(x), qkv(x)) < 1e-5


def test_timm_swin_calls_it(tmp_path):
    """timm's own Swin (small, random weights): its blocks' attention on the graph."""
    try:
        from timm.models.swin_transformer import SwinTransformer
    except Exception as e:  # noqa: BLE001 - not installed, or built for another torch
        pytest.skip(f"timm's Swin is not importable here ({type(e).__name__}: {str(e)[:80]})")
    torch.manual_seed(5)
    model = SwinTransformer(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(2, 2),
                            num_heads=(2, 4), num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
    f = qpack.freeze(model, progress=False)
    assert _attention_calls(f) == 4
    with torch.no_grad():
        out = f(x)
        assert rel_err(out, ref) < 1e-5
        # pickled, deep-copied and saved, its traces (their constants, the packed qkv weights) go along
        assert rel_err(pickle.loads(pickle.dumps(f))(x), out) < 1e-6
        assert rel_err(copy.deepcopy(f)(x), out) < 1e-6
        path = tmp_path / "swin.qpk"
        qpack.save(f, str(path))
        assert rel_err(qpack.load(str(path))(x), out) < 1e-6
        assert rel_err(qpack.unfreeze(f)(x), ref) < 1e-5
