"""Forwards whose Python reads their inputs' sizes (MobileViT's ``if new_h != H``,
Twins' size tuples) do not trace symbolically; with ``example_inputs`` freeze traces
them on inputs of those shapes (graph.py's _ShapeTracer): one graph, sizes the
example's, and calls with other shapes run the layers one by one (a FreezeWarning
says so). PyTorch is the oracle."""
import copy
import io
import pickle

import pytest
import torch

torch.backends.mkldnn.enabled = False  # noqa: E402
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import qpack  # noqa: E402
from qpack.torch import graph as G  # noqa: E402

from conftest import BACKENDS  # noqa: E402
from test_graph import per_edge_reference, randomize_bn, rel_err  # noqa: E402

pytestmark = pytest.mark.skipif("onednn" not in qpack.backends(), reason="the oneDNN backend is not built")


class Block(nn.Module):
    """Tokens of an image through attention and back to the image: sizes read in Python."""

    def __init__(self, c=16, heads=2):
        super().__init__()
        self.norm, self.qkv, self.proj, self.heads = nn.LayerNorm(c), nn.Linear(c, 3 * c), nn.Linear(c, c), heads

    def forward(self, x):
        b, c, h, w = x.shape
        t = x.flatten(2).transpose(1, 2)
        q, k, v = self.qkv(self.norm(t)).reshape(b, h * w, 3, self.heads, c // self.heads).permute(
            2, 0, 3, 1, 4).unbind(0)
        t = t + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, h * w, c))
        return t.transpose(1, 2).reshape(b, c, h, w)


class SizeReader(nn.Module):
    """MobileViT's shape: resized to whole patches when the input's size needs it."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU())
        self.block = Block()
        self.head = nn.Sequential(nn.Conv2d(16, 8, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                  nn.Flatten(), nn.Linear(8, 5))

    def forward(self, x):
        x = self.stem(x)
        _, _, h, w = x.shape
        if h % 2 or w % 2:
            x = F.interpolate(x, size=(h + h % 2, w + w % 2), mode="bilinear", align_corners=False)
        return self.head(self.block(x))


class SizeTuples(nn.Module):
    """Twins' shape: blocks take and return the image size as Python ints."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Conv2d(3, 16, 4, 4)
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)
        self.out = nn.Linear(16, 4)

    def block(self, t, size):
        b, n, c = t.shape
        h, w = size
        img = t.transpose(1, 2).reshape(b, c, h, w)
        if h > 1:  # a size the Python reads
            img = F.avg_pool2d(img, 3, 1, 1)
        return t + self.fc(self.norm(img.flatten(2).transpose(1, 2))), (h, w)

    def forward(self, x):
        x = self.embed(x)
        size = x.shape[2:]
        t = x.flatten(2).transpose(1, 2)
        for _ in range(2):
            t, size = self.block(t, size)
        return self.out(t)


def frozen_with_warning(model, **kw):
    with pytest.warns(qpack.torch.freeze.FreezeWarning, match="could not trace"):
        return qpack.freeze(model, progress=False, **kw)


@pytest.mark.parametrize("shape", [(2, 3, 18, 18), (1, 3, 14, 18)], ids=["even", "padded"])
def test_a_forward_reading_its_sizes_is_one_graph_for_the_examples_shape(shape):
    torch.manual_seed(0)
    model = randomize_bn(SizeReader()).eval()
    x = torch.randn(*shape)
    frozen_with_warning(model)  # no example: graphs for the parts that trace, as before
    f = qpack.freeze(model, example_inputs=x, progress=False)
    runner = G.runner_of(f)
    assert runner is not None and runner.num_segments == 1, qpack.graph_report(f)
    assert runner._specialized == ((shape, torch.float32),)
    kinds = [n["kind"] for n in runner._spec["nodes"]]
    assert "attention" in kinds and "transpose" in kinds, kinds
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5, rel_err(f(x), model(x))
        y = torch.randn(*shape)
        assert rel_err(f(y), model(y)) < 1e-5  # other values, same shapes: the graph
    assert runner.info()["runs"] >= 2


def test_other_shapes_run_the_layers_with_a_warning():
    torch.manual_seed(1)
    model = randomize_bn(SizeReader()).eval()
    f = qpack.freeze(model, example_inputs=torch.randn(1, 3, 16, 16), progress=False)
    runs = G.runner_of(f).info()["runs"]
    with torch.no_grad():
        x = torch.randn(1, 3, 14, 18)
        with pytest.warns(qpack.torch.freeze.FreezeWarning, match=r"traced for inputs of shape \(1, 3, 16, 16\)"):
            out = f(x)
        assert rel_err(out, model(x)) < 1e-5
        x = torch.randn(3, 3, 16, 16)  # another batch (the warning is said once)
        assert rel_err(f(x), model(x)) < 1e-5
        assert G.runner_of(f).info()["runs"] == runs  # not the graph
        x = torch.randn(1, 3, 16, 16)
        assert rel_err(f(x), model(x)) < 1e-5
    assert G.runner_of(f).info()["runs"] == runs + 1


def test_size_tuples_passed_between_blocks():
    torch.manual_seed(2)
    model = SizeTuples().eval()
    x = torch.randn(2, 3, 16, 12)
    frozen_with_warning(model)
    f = qpack.freeze(model, example_inputs=(x,), progress=False)
    assert G.runner_of(f) is not None and G.runner_of(f).num_segments == 1, qpack.graph_report(f)
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5


class DataBranch(nn.Module):
    """Control flow on the values, not the sizes: never specialized."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x) if x.sum() > 0 else self.b(x)


def test_control_flow_on_values_is_not_specialized():
    torch.manual_seed(3)
    model = DataBranch().eval()
    x = torch.randn(4, 8)
    f = frozen_with_warning(model, example_inputs=x)
    assert G.runner_of(f) is None
    with torch.no_grad():
        for y in (x.abs(), -x.abs()):
            assert rel_err(f(y), model(y)) < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_calibrates_the_specialized_graph_per_edge(backend):
    torch.manual_seed(4)
    model = randomize_bn(SizeReader()).eval()
    calib = [torch.randn(2, 3, 14, 18) for _ in range(4)]
    f = qpack.freeze(model, dtype="int8", example_inputs=calib, backend=backend, progress=False)
    runner = G.runner_of(f)
    assert runner is not None and runner.num_segments == 1, qpack.graph_report(f)
    assert f.block.qkv.mode == "int8_static" and f.stem[0].mode == "int8_static"
    x = calib[0]
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 0.1, rel_err(f(x), model(x))
        spec = runner._spec
        out_s = spec["values"][spec["nodes"][-1]["inputs"][0]][1]
        assert float((f(x) - per_edge_reference(f, x)).abs().max()) <= 2 * out_s + 1e-6
        y = torch.randn(1, 3, 16, 16)  # another shape: the int8 layers one by one
        with pytest.warns(qpack.torch.freeze.FreezeWarning, match="traced for inputs of shape"):
            assert rel_err(f(y), model(y)) < 0.2


def test_calibration_batches_of_several_shapes_keep_the_parts():
    torch.manual_seed(5)
    model = randomize_bn(SizeReader()).eval()
    calib = [torch.randn(2, 3, 14, 18), torch.randn(1, 3, 16, 16)]
    f = frozen_with_warning(model, dtype="int8", example_inputs=calib)
    assert G.runner_of(f) is None and G.graph_parts(f)


def test_the_specialization_survives_copies_and_files(tmp_path):
    torch.manual_seed(6)
    model = randomize_bn(SizeReader()).eval()
    x = torch.randn(1, 3, 14, 18)
    f = qpack.freeze(model, example_inputs=x, progress=False)
    with torch.no_grad():
        ref = f(x)
        buf = io.BytesIO()
        torch.save(f, buf)
        buf.seek(0)
        path = tmp_path / "m.qpk"
        qpack.save(f, path)
        for g in (copy.deepcopy(f), pickle.loads(pickle.dumps(f)), torch.load(buf, weights_only=False),
                  qpack.load(path)):
            r = G.runner_of(g)
            assert r is not None
            assert torch.equal(g(x), ref)
            assert r._specialized == ((tuple(x.shape), torch.float32),)
            with pytest.warns(qpack.torch.freeze.FreezeWarning, match="traced for inputs of shape"):
                y = torch.randn(1, 3, 16, 16)
                assert rel_err(g(y), model(y)) < 1e-5


class CachesATensor(SizeReader):
    """timm's attention biases: a tensor its forward caches in the module on a first call
    (in inference mode here), a constant of later traces."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(16))
        self.cache = {}

    def forward(self, x):
        if "cpu" not in self.cache:
            self.cache["cpu"] = self.table.view(1, -1, 1, 1) * 2
        x = self.stem(x) + self.cache["cpu"]  # (a value whose sizes are read next)
        _, _, h, w = x.shape
        if h % 2 or w % 2:
            x = F.interpolate(x, size=(h + h % 2, w + w % 2), mode="bilinear", align_corners=False)
        return self.head(self.block(x))


def test_a_tensor_cached_by_an_earlier_call_is_a_constant_of_the_trace():
    torch.manual_seed(7)
    model = randomize_bn(CachesATensor()).eval()
    x = torch.randn(1, 3, 14, 18)
    with torch.inference_mode():
        model(x)  # fills the cache with an inference tensor
    f = qpack.freeze(model, example_inputs=x, progress=False)
    assert G.runner_of(f) is not None and G.runner_of(f)._specialized is not None
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 1e-5
