"""Models quantized by PyTorch FX (prepare_fx / convert_fx) freeze to core graphs on their
own qparams: quantize_per_tensor on attribute qparams, quantized conv/linear modules,
quantized add (+ReLU), ReLU6, pooling, mean, flatten, dequantize."""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qpack
from qpack.torch import FreezeWarning
from qpack.torch.graph import runner_of

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.act = nn.ReLU6()

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        y = F.relu(x + y)
        return self.act(self.dw(y)) + y


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.block = Block(16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.block(self.pool(self.stem(x)))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def fx_quantized(model, calib):
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
    torch.backends.quantized.engine = "x86"
    prepared = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping("x86"), example_inputs=(calib[0],))
    with torch.no_grad():
        for b in calib:
            prepared(b)
    return convert_fx(prepared).eval()


@pytest.fixture(scope="module")
def fx_model():
    torch.manual_seed(0)
    model = Net().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    calib = [torch.randn(2, 3, 32, 32) for _ in range(4)]
    return fx_quantized(model, calib), calib


def output_scale(q):
    """The scale of the FX model's last quantized value (its linear's output)."""
    return float(q.head.scale)


@pytest.mark.parametrize("backend", ["onednn", "qnnpack"])
def test_convert_fx_model_runs_as_one_graph(fx_model, backend):
    q, calib = fx_model
    with warnings.catch_warnings():
        warnings.simplefilter("error", FreezeWarning)
        frozen = qpack.freeze(q, backend=backend, retain=False, progress=False)
    runner = runner_of(frozen)
    assert runner is not None and runner.num_segments == 1, qpack.graph_report(frozen)
    report = qpack.graph_report(frozen)
    assert "quantize" in report and "dequantize" in report
    # the ReLU6 after the depthwise conv (it keeps qparams in PyTorch) is fused into the conv
    assert "activation" not in report, report
    with torch.no_grad():
        for x in calib + [torch.randn(1, 3, 40, 24)]:
            ref, out = q(x), frozen(x)
            assert out.shape == ref.shape and out.dtype == torch.float32
            # each edge within a quantum of PyTorch's kernels; a few quanta of the output after
            # the residual block, the pooling and the linear
            diff = (out - ref).abs().max().item() / output_scale(q)
            assert diff <= 4, (backend, diff)


def test_convert_fx_graph_matches_per_layer(fx_model):
    """The graph runs the same packed layers on the same qparams as per-layer freezing."""
    q, calib = fx_model
    graph = qpack.freeze(q, backend="onednn", retain=False, progress=False)
    layers = qpack.freeze(q, backend="onednn", retain=False, progress=False, graph=False)
    assert runner_of(graph) is not None and runner_of(layers) is None
    with torch.no_grad():
        for x in calib:
            diff = (graph(x) - layers(x)).abs().max().item() / output_scale(q)
            assert diff <= 4, diff


def test_convert_fx_unfreeze_and_threads(fx_model):
    q, calib = fx_model
    frozen = qpack.freeze(q, backend="onednn", retain=False, progress=False)
    x = calib[0]
    with torch.no_grad():
        want = frozen(x)
        import threading
        got, errors = [], []

        def work():
            try:
                for _ in range(5):
                    got.append(frozen(x))
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        ts = [threading.Thread(target=work) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert not errors and len(got) == 20 and all(torch.equal(g, want) for g in got)
    back = qpack.unfreeze(frozen)
    assert runner_of(back) is None


def test_convert_fx_quantize_without_constant_qparams_stays_in_pytorch():
    """A quantize whose scale is computed at run time is not a graph node; the model still runs."""
    class Dyn(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 1)

        def forward(self, x):
            s = x.abs().max() / 127
            return torch.quantize_per_tensor(self.conv(x), s.item(), 0, torch.quint8).dequantize()

    m = Dyn().eval()
    frozen = qpack.freeze(m, retain=False, progress=False)
    x = torch.randn(1, 3, 5, 5)
    with torch.no_grad():
        assert torch.allclose(frozen(x), m(x), atol=1e-4)
