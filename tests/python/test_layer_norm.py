"""The layer_norm node: LayerNorm over a rank-4 value's channels (timm's LayerNorm2d,
ConvNeXt's permute / LayerNorm / permute) or over the last dim (nn.LayerNorm, F.layer_norm
of one dim, as transformers use it), f32 and u8, and the freeze rewrites that bring those
spellings and ConvNeXt's layer scale (x * gamma.reshape(1, -1, 1, 1)) into one graph."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qpack
from qpack import _core
from qpack.torch import graph as G

from test_graph import concurrent_errors, rel_err
from test_graph_models import plan
from test_graph_ops_more import check_both, check_fp32, kinds


def _ln_graph(C, dim, dtype="f32", qp=(0.0, 0), qp_out=None, eps=1e-6, seed=0):
    g = torch.Generator().manual_seed(seed)
    w, b = torch.randn(C, generator=g), torch.randn(C, generator=g)
    vals = [(dtype, *qp), (dtype, *(qp_out or qp))]
    node = dict(kind="layer_norm", inputs=[0], output=1, weight=w.numpy(), bias=b.numpy(), eps=eps, dim=dim)
    return _core.GraphHandle(vals, [node], [0], [1]), w, b


def _ref(x, w, b, dim, eps=1e-6):
    return F.layer_norm(x.movedim(dim, -1), (w.numel(),), w, b, eps).movedim(-1, dim)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape,dim", [((2, 40, 7, 9), 1), ((1, 768, 3, 5), 1), ((3, 197, 192), -1),
                                       ((5, 33), -1), ((2, 6, 5, 9), -1), ((4, 7, 17), -1), ((1, 1, 1, 1), 1)])
def test_f32_matches_torch(shape, dim, threads):
    """Within 1e-5 of F.layer_norm: channels of NCHW / NHWC values (vector rows of the
    NHWC pixels, tails off the 8 / 16 lanes), the last dim of rank 2 and 3, and a rank-4
    value's W (strided rows), over threads."""
    qpack.set_num_threads(threads)
    try:
        C = shape[dim]
        g, w, b = _ln_graph(C, dim)
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(C)) * 3 + 1
        ref = _ref(x, w, b, dim)
        y = torch.from_numpy(g.run([x.numpy()], ["nchw"], "nchw")[0])
        assert y.shape == ref.shape
        assert torch.allclose(y, ref, rtol=1e-5, atol=1e-5), (y - ref).abs().max()
        if x.dim() == 4:  # an NHWC input and output: the same values
            yh = g.run([x.permute(0, 2, 3, 1).contiguous().numpy()], ["nhwc"], "nhwc")[0]
            assert torch.allclose(torch.from_numpy(yh), ref.permute(0, 2, 3, 1), rtol=1e-5, atol=1e-5)
    finally:
        qpack.set_num_threads(1)


@pytest.mark.parametrize("shape,dim", [((2, 24, 5, 3), 1), ((3, 10, 48), -1), ((2, 6, 4, 11), -1)])
def test_u8_within_one_quantum(shape, dim):
    """u8: each row dequantized, normalized in float, requantized: within one quantum
    of the same steps in PyTorch."""
    s_in, z_in, s_out, z_out = 0.05, 120, 0.03, 128
    C = shape[dim]
    g, w, b = _ln_graph(C, dim, "u8", (s_in, z_in), (s_out, z_out))
    q = torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(1)).to(torch.uint8)
    y = torch.from_numpy(g.run([q.numpy()], ["nchw"], "nchw")[0]).float()
    ref = torch.clamp(torch.round(_ref((q.float() - z_in) * s_in, w, b, dim) / s_out) + z_out, 0, 255)
    assert float((y - ref).abs().max()) <= 1


F32 = [("f32", 0, 0), ("f32", 0, 0)]


@pytest.mark.parametrize("params,fragment", [
    (dict(eps=0.0), "eps > 0"), (dict(eps=float("nan")), "eps > 0"), (dict(dim=2), "dim 1 or -1"),
    (dict(weight=np.ones(4, np.float32), bias=np.ones(3, np.float32)), "weight and bias"),
    (dict(weight=np.array([np.inf] * 4, np.float32)), "finite"),
])
def test_bad_parameters_give_clear_errors(params, fragment):
    node = dict(kind="layer_norm", inputs=[0], output=1, weight=np.ones(4, np.float32),
                bias=np.zeros(4, np.float32), eps=1e-5, dim=-1)
    node.update(params)
    with pytest.raises(qpack.InvalidArgumentError, match=fragment):
        _core.GraphHandle(F32, [node], [0], [1])


def test_bad_shapes_give_clear_errors_and_leave_the_graph_usable():
    g, w, b = _ln_graph(4, -1)
    for bad in (np.ones((2, 5), np.float32), np.ones((1, 4, 3, 3), np.float32), np.ones(4, np.float32)):
        with pytest.raises(qpack.InvalidArgumentError, match="normalized dim|rank"):
            g.run([bad], ["nchw"])
    x = torch.randn(3, 4)
    assert torch.allclose(torch.from_numpy(g.run([x.numpy()], ["nchw"])[0]), _ref(x, w, b, -1), atol=1e-5)
    g1, _, _ = _ln_graph(6, 1)
    with pytest.raises(qpack.InvalidArgumentError, match="normalized dim"):
        g1.run([np.ones((1, 5, 2, 2), np.float32)], ["nchw"])


# ---- freeze: the spellings ---------------------------------------------------------------------

class LayerNorm2d(nn.LayerNorm):
    """timm's: permute to NHWC, F.layer_norm over C, permute back."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """timm's ConvNeXt block with conv_mlp: 7x7 depthwise, LayerNorm2d, 1x1 convs with
    GELU, layer scale, residual; `module_norm`: the norm as permute, nn.LayerNorm, permute."""

    def __init__(self, c=16, module_norm=False):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 4, 4)
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.module_norm = module_norm
        self.norm = nn.LayerNorm(c, eps=1e-6) if module_norm else LayerNorm2d(c, eps=1e-6)
        self.fc1, self.fc2 = nn.Conv2d(c, 4 * c, 1), nn.Conv2d(4 * c, c, 1)
        self.gamma = nn.Parameter(torch.rand(c) + 0.5)
        self.head_norm = LayerNorm2d(c)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        x = self.stem(x)
        y = self.dw(x)
        y = self.norm(y.permute(0, 2, 3, 1)).permute(0, 3, 1, 2) if self.module_norm else self.norm(y)
        y = self.fc2(F.gelu(self.fc1(y)))
        x = x + y.mul(self.gamma.reshape(1, -1, 1, 1))
        return self.head_norm(x)


class TokenBlock(nn.Module):
    """A transformer's MLP half on [N, T, C] tokens: nn.LayerNorm, Linear, GELU, Linear,
    residual, then F.layer_norm without weight and a head."""

    def __init__(self, c=32):
        super().__init__()
        self.norm = nn.LayerNorm(c)
        self.fc1, self.fc2, self.head = nn.Linear(c, 2 * c), nn.Linear(2 * c, c), nn.Linear(c, 10)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        x = x + self.fc2(F.gelu(self.fc1(self.norm(x))))
        return self.head(F.layer_norm(x, (32,)))


@pytest.mark.parametrize("module_norm", [False, True], ids=["layernorm2d", "permute-module-permute"])
def test_convnext_block_is_one_graph(module_norm):
    torch.manual_seed(2)
    model = ConvNeXtBlock(module_norm=module_norm).eval()
    check_both(model, torch.randn(2, 3, 32, 28), ["layer_norm", "affine"])
    f = qpack.freeze(model, progress=False)
    assert kinds(f).count("layer_norm") == 2 and "layer_norm" in qpack.graph_report(f)


def test_token_layer_norms_are_one_graph():
    torch.manual_seed(3)
    model = TokenBlock().eval()
    check_both(model, torch.randn(2, 7, 32), ["layer_norm"])
    assert kinds(qpack.freeze(model, progress=False)).count("layer_norm") == 2


def test_layer_norms_the_core_does_not_run_stay_in_pytorch():
    """Over two dims, or over a rank-4 value's W after a permute the rewrite does not
    cover: still frozen and right, in PyTorch around the graph."""
    class Other(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1)
            self.ln2 = nn.LayerNorm((6, 5))

        def forward(self, x):
            y = self.c1(x)
            y = self.ln2(y)                                  # over H, W
            y = F.layer_norm(y.permute(0, 2, 1, 3), (5,))    # over W, of a permuted value
            return self.c2(y.permute(0, 2, 1, 3))

    model = Other().eval()
    x = torch.randn(2, 3, 6, 5)
    f = qpack.freeze(model, progress=False)
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5


class Permute(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return torch.permute(x, self.dims)


class NhwcMlpBlock(nn.Module):
    """ConvNeXt's block without conv_mlp, as torchvision (Permute modules, nn.LayerNorm,
    layer_scale [C, 1, 1] times the block) or timm (x.permute, F.layer_norm on the
    module's tensors, Dropout / Identity in the MLP, gamma.reshape(1, -1, 1, 1)) write it:
    Linear layers over the channels of an NHWC view, between two permutes."""

    def __init__(self, c=16, style="torchvision"):
        super().__init__()
        self.style = style
        self.stem = nn.Conv2d(3, c, 4, 4)
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.drop, self.ident = nn.Dropout(0.1), nn.Identity()
        self.to_nhwc, self.to_nchw = Permute([0, 2, 3, 1]), Permute([0, 3, 1, 2])
        self.layer_scale = nn.Parameter(torch.rand(c, 1, 1) + 0.5)
        self.gamma = nn.Parameter(torch.rand(c) + 0.5)
        self.head = nn.Conv2d(c, 5, 1)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        x = self.stem(x)
        if self.style == "torchvision":
            y = self.to_nchw(self.fc2(F.gelu(self.fc1(self.norm(self.to_nhwc(self.dw(x)))))))
            y = self.layer_scale * y
        else:
            y = self.dw(x).permute(0, 2, 3, 1)
            y = F.layer_norm(y, self.norm.normalized_shape, self.norm.weight, self.norm.bias, self.norm.eps)
            y = self.drop(self.fc2(self.ident(self.drop(F.gelu(self.fc1(y))))))
            y = y.permute(0, 3, 1, 2).mul(self.gamma.reshape(1, -1, 1, 1))
        return self.head(x + y)


@pytest.mark.parametrize("style", ["torchvision", "timm"])
def test_linear_layers_between_permutes_are_one_graph(style):
    """The permutes to and from NHWC vanish: the core holds rank-4 values NHWC, so
    the Linear layers run per pixel on the value itself (linear nodes with
    per_pixel), fp32 and int8 on both backends, within the per-edge reference."""
    torch.manual_seed(5)
    model = NhwcMlpBlock(style=style).eval()
    check_both(model, torch.randn(2, 3, 28, 24), ["layer_norm", "linear", "affine"])
    f = qpack.freeze(model, progress=False)
    assert [n.get("per_pixel", False) for n in G.runner_of(f)._spec["nodes"] if n["kind"] == "linear"] == [True] * 2


class CutShort(nn.Module):
    """Permutes around ops the region does not take (a softmax over the channels, a
    view read outside the region): no channels-last region, still right."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.c, self.fc = nn.Conv2d(3, 8, 1), nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(self.c(x).permute(0, 2, 3, 1))
        if self.how == "softmax":
            return torch.softmax(y, -1).permute(0, 3, 1, 2)
        return y.permute(0, 3, 1, 2) + y.mean()  # the view read twice


@pytest.mark.parametrize("how", ["softmax", "read-twice"])
def test_permutes_around_other_ops_stay_right(how):
    torch.manual_seed(6)
    model = CutShort(how).eval()
    x = torch.randn(2, 3, 5, 7)
    f = qpack.freeze(model, progress=False)
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5
    for n in (G.runner_of(f)._spec["nodes"] if plan(f) == "graph" else []):
        assert not n.get("per_pixel")


def test_per_pixel_linear_node_checks_its_input():
    torch.manual_seed(7)
    ref_layer = nn.Linear(4, 6).eval()
    lin = qpack.freeze(ref_layer, progress=False)
    g = _core.GraphHandle(F32, [dict(kind="linear", inputs=[0], output=1, op=lin._packed._h, per_pixel=True)],
                          [0], [1])
    with pytest.raises(qpack.InvalidArgumentError, match="per pixel"):
        g.run([np.ones((2, 5), np.float32)], ["nchw"])
    with pytest.raises(qpack.InvalidArgumentError, match="per pixel"):
        g.run([np.ones((1, 5, 2, 2), np.float32)], ["nchw"])
    x = torch.randn(1, 4, 3, 2)
    y = torch.from_numpy(g.run([x.numpy()], ["nchw"], "nchw")[0])
    with torch.no_grad():
        assert torch.allclose(y, ref_layer(x.movedim(1, -1)).movedim(-1, 1), atol=1e-5)


def test_saved_models_with_layer_norm_reload(tmp_path):
    torch.manual_seed(4)
    f = check_fp32(ConvNeXtBlock().eval(), torch.randn(1, 3, 16, 16))
    path = tmp_path / "m.qpk"
    qpack.save(f, str(path))
    g = qpack.load(str(path))
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(g(x), f(x))
    from qpack import _file
    desc = _file.describe(str(path))
    assert not desc["problems"], desc["problems"]
    assert "layer_norm" in [n["kind"] for gr in desc["graphs"] for n in gr["nodes"]]


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_graphs_with_the_new_nodes_keep_frozen_model_semantics(dtype):
    """deepcopy, pickle and torch.save give the same outputs; releasing the originals
    changes nothing; unfreeze (after release) gives the fp32 model back exactly."""
    import copy
    import io
    import pickle
    torch.manual_seed(8)
    model = NhwcMlpBlock(style="timm").eval()
    x = torch.randn(2, 3, 28, 24)
    kw = dict(dtype="int8", example_inputs=[torch.randn_like(x) for _ in range(3)]) if dtype else {}
    f = qpack.freeze(model, progress=False, **kw)
    with torch.no_grad():
        y = f(x)
        buf = io.BytesIO()
        torch.save(f, buf)
        buf.seek(0)
        for g in (copy.deepcopy(f), pickle.loads(pickle.dumps(f)), torch.load(buf, weights_only=False)):
            assert torch.equal(g(x), y)
        for m in f.modules():
            if hasattr(m, "release_original"):
                m.release_original()
        assert torch.equal(f(x), y)
        back = qpack.unfreeze(f)
        if dtype is None:
            assert torch.equal(back(x), model(x))
        else:
            assert rel_err(back(x), model(x)) < 0.05


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_many_threads_share_a_graph_with_the_new_nodes(dtype):
    """Concurrent runs on one graph of layer_norm, per-pixel linear with a fused GELU and
    affine nodes, 2 core threads each: every result equals the one-thread-at-a-time one."""
    torch.manual_seed(9)
    model = NhwcMlpBlock(style="torchvision").eval()
    xs = [torch.randn(1, 3, 32, 28) for _ in range(4)]
    kw = dict(dtype="int8", example_inputs=xs[:2]) if dtype else {}
    qpack.set_num_threads(2)
    try:
        f = qpack.freeze(model, progress=False, **kw)
        with torch.no_grad():
            refs = [f(x) for x in xs]
        errors = concurrent_errors(f, xs, refs, threads=4, rounds=20)
        assert not errors, errors[:3]
    finally:
        qpack.set_num_threads(1)
