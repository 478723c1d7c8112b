"""Residual adds run as their convolution's sum post-op (oneDNN's, or qpack's
own int8 1x1 kernel's), fp32 and int8, after convolutions of any size.

The add's other operand becomes the convolution's destination (it is dead
after the add); where that would overwrite a value something still reads, the
caller's memory or a graph output, the add stays a node of its own. fp32 cases
against eager PyTorch, int8 against the per-edge reference (test_graph.py),
and the report says which adds were fused."""
import threading

import pytest

torch = pytest.importorskip("torch", reason="the graph tests freeze torch models")
from torch import nn  # noqa: E402

import qpack  # noqa: E402

from test_graph import per_edge_reference, randomize_bn  # noqa: E402

pytestmark = pytest.mark.skipif(not qpack.backends()["onednn"]["available"],
                                reason="fp32 graphs run on oneDNN, which this build lacks")


def rel_err(a, b):
    return float((a - b).norm() / max(float(b.norm()), 1e-12))


class Projection(nn.Module):
    """MobileNetV2's inverted residual: x + project(depthwise(expand(x)))."""

    def __init__(self, c=24, relu_after=False):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, 4 * c, 1), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(4 * c, 4 * c, 3, 1, 1, groups=4 * c), nn.ReLU6())
        self.project = nn.Conv2d(4 * c, c, 1)
        self.relu_after = relu_after

    def forward(self, x):
        x = torch.relu(x)  # the residual is a value the graph makes, not its input
        y = x + self.project(self.dw(self.expand(x)))
        return (torch.relu(y) if self.relu_after else y) * 0.5


class ReadLater(nn.Module):
    """The residual is read again after the add: it must not be overwritten."""

    def __init__(self, c=16):
        super().__init__()
        self.a, self.b = nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 1)

    def forward(self, x):
        r = torch.relu(self.a(x))
        y = r + self.b(x)
        return (y + r) * 0.5


class InputResidual(nn.Module):
    """The residual is the graph's input, which the convolution itself reads."""

    def __init__(self, c=16):
        super().__init__()
        self.a = nn.Conv2d(c, c, 1)

    def forward(self, x):
        return (x + self.a(x)) * 0.5


class OutputAdd(nn.Module):
    """The add's output is a graph output (the caller's buffer)."""

    def __init__(self, c=16):
        super().__init__()
        self.a, self.b = nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 1)

    def forward(self, x):
        r = torch.relu(self.a(x))
        return r + self.b(r)


class TwoConvs(nn.Module):
    """Both operands are convolutions (ResNet's downsampling block): the later one takes the add."""

    def __init__(self, c=16):
        super().__init__()
        self.a, self.b, self.c = nn.Conv2d(c, 2 * c, 1), nn.Conv2d(2 * c, 2 * c, 1), nn.Conv2d(c, 2 * c, 1, 2)
        self.d = nn.Conv2d(c, 2 * c, 1, 2)

    def forward(self, x):
        h = self.b(torch.relu(self.a(x)))[:, :, ::2, ::2].contiguous()
        y = torch.relu(h + self.c(x))
        return y.mean((2, 3))


class ThreeByThree(nn.Module):
    """The add's other operand is the 3x3 convolution's own input: it stays a node (the
    convolution cannot write its sum over what it reads)."""

    def __init__(self, c=16):
        super().__init__()
        self.a, self.b = nn.Conv2d(c, c, 3, 1, 1), nn.Conv2d(c, c, 3, 1, 1)

    def forward(self, x):
        r = torch.relu(self.a(x))
        return torch.relu(r + self.b(r)) * 0.5


def freeze_and_check(model, shape, fused):
    torch.manual_seed(0)
    model = model.eval()
    f = qpack.freeze(model, progress=False)
    x = torch.randn(*shape)
    x0 = x.clone()
    with torch.no_grad():
        ref, out = model(x), f(x)
    assert rel_err(out, ref) < 1e-5, rel_err(out, ref)
    assert torch.equal(x, x0), "the caller's input changed"
    report = qpack.graph_report(f)
    adds = [line for line in report.splitlines() if line.startswith("add")]
    assert adds, report
    got = sum("sum post-op of the conv2d ->" in line for line in adds)
    assert got == fused, report
    if fused:
        assert "+add(" in report
    return f, model


@pytest.mark.parametrize("relu_after", [False, True])
def test_projection_add_is_fused(relu_after):
    freeze_and_check(Projection(relu_after=relu_after), (2, 24, 14, 13), fused=1)


def test_residual_read_after_the_add_is_not_overwritten():
    freeze_and_check(ReadLater(), (1, 16, 9, 9), fused=0)


def test_graph_input_residual_is_not_overwritten():
    freeze_and_check(InputResidual(), (1, 16, 9, 9), fused=0)


def test_add_that_is_a_graph_output_stays_a_node():
    freeze_and_check(OutputAdd(), (1, 16, 9, 9), fused=0)


def test_the_later_convolution_takes_the_add():
    f, _ = freeze_and_check(TwoConvs(), (1, 16, 12, 12), fused=1)
    report = qpack.graph_report(f)
    # the stride-2 1x1 (self.c) comes after the slice of b's output
    assert " c backend=onednn +add(" in report, report


def test_three_by_three_add_stays_apart():
    freeze_and_check(ThreeByThree(), (1, 16, 9, 9), fused=0)


class BasicBlock(nn.Module):
    """ResNet's basic block with an identity shortcut: the second 3x3 takes the add (fp32
    too: on Zen 5 oneDNN's brgconv with sum costs less than the add's own pass)."""

    def __init__(self, c=16):
        super().__init__()
        self.a, self.b = nn.Conv2d(c, c, 3, 1, 1), nn.Conv2d(c, c, 3, 1, 1)
        self.stem = nn.Conv2d(3, c, 3, 1, 1)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        return torch.relu(x + self.b(torch.relu(self.a(x)))).mean((2, 3))


def test_basic_block_add_is_fused_into_the_three_by_three():
    f, _ = freeze_and_check(BasicBlock(), (2, 3, 11, 10), fused=1)
    assert " b backend=onednn +add(" in qpack.graph_report(f)


def test_fused_adds_under_many_threads_and_changing_sizes():
    f, model = freeze_and_check(Projection(relu_after=True), (1, 24, 14, 14), fused=1)
    xs = [torch.randn(1 + i % 2, 24, 10 + i, 12) for i in range(4)]
    with torch.no_grad():
        refs = [model(v) for v in xs]
    errors = []

    def work():
        with torch.no_grad():
            for _ in range(20):
                for v, r in zip(xs, refs):
                    e = rel_err(f(v), r)
                    if e >= 1e-5:
                        errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


class Block(nn.Module):
    """A ResNet block on a value the graph makes: relu(h + bn(conv(relu(conv(h))))), then a max pool."""

    def __init__(self, c=32, k=3):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(8, c, 3, 1, 1), nn.ReLU())
        self.a = nn.Sequential(nn.Conv2d(c, c, k, 1, k // 2), nn.BatchNorm2d(c), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(c, c, k, 1, k // 2), nn.BatchNorm2d(c))
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        h = self.stem(x)
        return self.pool(torch.relu(h + self.b(self.a(h))))


# channel counts off 16 (qpack's 1x1 kernel's tails of 8 and 4 outputs) and over 64
@pytest.mark.parametrize("k,c", [(1, 32), (1, 24), (1, 20), (1, 72), (3, 32)])
def test_int8_add_fused_within_the_per_edge_reference(k, c):
    torch.manual_seed(2)
    model = randomize_bn(Block(c=c, k=k)).eval()
    calib = [torch.randn(2, 8, 12, 12) for _ in range(3)]
    f = qpack.freeze(model, dtype="int8", example_inputs=calib, backend="onednn", progress=False)
    x = torch.randn(2, 8, 12, 12)
    with torch.no_grad():
        y, ref, fp = f(x), per_edge_reference(f, x), model(x)
    report = qpack.graph_report(f)
    assert "sum post-op of the conv2d ->" in report, report
    spec = qpack.torch.graph.runner_of(f)._spec
    out_s = spec["values"][spec["nodes"][-1]["inputs"][0]][1]  # the last node dequantizes
    # the add skips the convolution's own rounding (at most one quantum at the
    # add, which the max pool carries as it is) on top of the ops before it
    assert float((y - ref).abs().max()) <= 2 * out_s + 1e-6, (float((y - ref).abs().max()), out_s)
    assert rel_err(y, fp) < 0.05, rel_err(y, fp)
