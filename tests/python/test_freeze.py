"""qpack.freeze / unfreeze / memory_report against the unfrozen PyTorch model."""
import contextlib
import copy
import io
import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import pytest

import qpack

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from qpack.torch import FreezeWarning, FrozenConv1d, FrozenConv2d, FrozenLinear, fold_bn  # noqa: E402

BACKENDS = [b for b in ("onednn", "qnnpack") if qpack.backends()[b]["available"]]


@pytest.fixture(autouse=True)
def _inference():
    with torch.no_grad():
        yield


def close(a, b, rtol=1e-5):
    a, b = a.detach(), b.detach()
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * scale)


def rel_err(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def randomize_bn(bn):
    with torch.no_grad():
        bn.running_mean.normal_(0, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        if bn.weight is not None:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_(0, 0.3)
    return bn


def frozen_layers(model):
    return [m for m in model.modules() if isinstance(m, (FrozenLinear, FrozenConv1d, FrozenConv2d))]


@contextlib.contextmanager
def qengine(name):
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous


# ---- models -----------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self, act="relu_module", bn=True):
        super().__init__()
        self.fc1 = nn.Linear(20, 32)
        self.bn = randomize_bn(nn.BatchNorm1d(32)) if bn else nn.Identity()
        self.act_kind = act
        self.act = {"relu_module": nn.ReLU(), "relu6_module": nn.ReLU6(),
                    "hardtanh_module": nn.Hardtanh(-0.5, 0.75)}.get(act, nn.Identity())
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        y = self.bn(self.fc1(x))
        if self.act_kind == "functional_relu":
            y = F.relu(y)
        elif self.act_kind == "method_relu":
            y = y.relu()
        elif self.act_kind == "functional_hardtanh":
            y = F.hardtanh(y, -0.25, 0.5)
        else:
            y = self.act(y)
        return self.fc2(y)


class Untraceable(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 16)
        self.bn = randomize_bn(nn.BatchNorm1d(16))
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        y = self.bn(self.fc1(x))
        if y.sum() > 0:
            y = torch.relu(y)
        return self.fc2(y)


class Tied(nn.Module):
    """An embedding and an output projection sharing one weight, plus a twice-used Linear."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.proj = nn.Linear(16, 16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        h = self.emb(ids)
        h = self.proj(self.proj(h))
        return self.head(h)


def speech_mlp(width=64, depth=3):
    layers = [nn.Linear(20, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 30))
    return nn.Sequential(*layers).eval()


# ---- import without torch ------------------------------------------------------------

def test_import_qpack_without_torch():
    code = textwrap.dedent("""
        import sys
        sys.modules['torch'] = None  # import torch now raises ImportError
        import numpy as np
        import qpack
        lin = qpack.PackedLinear(np.ones((2, 3), np.float32))
        assert lin(np.ones((1, 3), np.float32)).tolist() == [[3.0, 3.0]]
        try:
            qpack.freeze
        except ImportError:
            print('ok')
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ---- fp32: single layers, folding, fusion ---------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_single_linear(bias):
    lin = nn.Linear(37, 19, bias=bias).eval()
    f = qpack.freeze(lin)
    assert isinstance(f, FrozenLinear) and f.mode == "f32" and f.backend == "onednn"
    with torch.enable_grad():  # inputs that require grad are fine too (inference only)
        x = torch.randn(3, 37, requires_grad=True)
        close(f(x), lin(x))
    for shape in [(1, 37), (5, 37), (2, 3, 37), (0, 37)]:
        x = torch.randn(shape)
        y = f(x)
        assert y.shape == lin(x).shape
        close(y, lin(x))


@pytest.mark.parametrize("act", ["relu_module", "relu6_module", "hardtanh_module", "functional_relu",
                                 "method_relu", "functional_hardtanh", "none"])
def test_mlp_bn_folded_activation_fused(act):
    model = MLP(act).eval()
    x = torch.randn(9, 20) * 3
    ref = model(x)
    f = qpack.freeze(model)
    assert type(f) is MLP and isinstance(f.bn, nn.Identity)  # BatchNorm folded away
    assert isinstance(f.fc1, FrozenLinear) and f.fc1._spec["folded_bn"]
    expected_act = {"relu_module": "relu", "relu6_module": "relu6", "hardtanh_module": ("hardtanh", -0.5, 0.75),
                    "functional_relu": "relu", "method_relu": "relu",
                    "functional_hardtanh": ("hardtanh", -0.25, 0.5), "none": None}[act]
    assert f.fc1.activation == expected_act
    if act.endswith("_module"):
        assert isinstance(f.act, nn.Identity)
    assert f.fc2.activation is None
    close(f(x), ref)
    # the source model is untouched
    assert isinstance(model.bn, nn.BatchNorm1d) and isinstance(model.fc1, nn.Linear)
    close(model(x), ref, rtol=0)


def test_shared_activation_module_is_fused_and_kept():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(self.b(self.relu(self.a(x))) + x)

    model = Block().eval()
    x = torch.randn(4, 8)
    f = qpack.freeze(model)
    assert isinstance(f.relu, nn.ReLU)  # used three times: stays
    assert f.a.activation == "relu" and f.b.activation is None  # b's output feeds an add, not the ReLU
    close(f(x), model(x))


def test_twice_called_layer_not_fused():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)

        def forward(self, x):
            return self.fc(torch.relu(self.fc(x)))

    model = Twice().eval()
    f = qpack.freeze(model)
    assert f.fc.activation is None
    x = torch.randn(3, 6)
    close(f(x), model(x))


def test_trace_failure_warns_once_and_swaps_without_folding():
    model = Untraceable().eval()
    x = torch.randn(6, 12)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = qpack.freeze(model)
    msgs = [w for w in caught if issubclass(w.category, FreezeWarning)]
    assert len(msgs) == 1 and "could not trace" in str(msgs[0].message)
    assert len(caught) == 1
    assert isinstance(f.bn, nn.BatchNorm1d) and isinstance(f.fc1, FrozenLinear) and not f.fc1._spec["folded_bn"]
    close(f(x), model(x))


def test_fuse_false_no_warning_no_folding():
    model = MLP().eval()
    f = qpack.freeze(model, fuse=False)
    assert isinstance(f.bn, nn.BatchNorm1d) and f.fc1.activation is None
    x = torch.randn(5, 20)
    close(f(x), model(x))


def test_unsupported_layers_kept():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(30, 12)
            self.lstm = nn.LSTM(12, 12, batch_first=True)
            self.norm = nn.LayerNorm(12)
            self.fc = nn.Linear(12, 7)
            self.fc64 = nn.Linear(7, 3).double()

        def forward(self, ids):
            h, _ = self.lstm(self.emb(ids))
            return self.fc64(self.fc(self.norm(h)).double())

    model = Mixed().eval()
    ids = torch.randint(0, 30, (2, 5))
    f = qpack.freeze(model)
    assert isinstance(f.fc, FrozenLinear)
    for name in ("emb", "lstm", "norm", "fc64"):
        assert type(getattr(f, name)) is type(getattr(model, name))
        assert getattr(f, name) is not getattr(model, name)
    close(f(ids), model(ids))


def test_training_mode_refused():
    model = MLP()
    with pytest.raises(qpack.InvalidArgumentError, match=r"eval mode.*model\.eval\(\)"):
        qpack.freeze(model)
    model.eval()
    model.bn.train()
    with pytest.raises(ValueError, match="bn"):
        qpack.freeze(model)


def test_bad_arguments():
    model = MLP().eval()
    with pytest.raises(qpack.InvalidArgumentError, match="backend"):
        qpack.freeze(model, backend="cuda")
    with pytest.raises(qpack.InvalidTypeError, match="retain"):
        qpack.freeze(model, retain="yes")
    with pytest.raises(qpack.InvalidArgumentError, match="dtype"):
        qpack.freeze(model, dtype="int4")
    # a float freeze takes example tensors (to trace a forward that reads their sizes), not keywords
    with pytest.raises(qpack.InvalidArgumentError, match="example_inputs"):
        qpack.freeze(model, example_inputs={"x": torch.randn(2, 20)})
    with pytest.raises(qpack.InvalidArgumentError, match="example_inputs"):
        qpack.freeze(model, example_inputs=(torch.randn(2, 20), 3))
    with pytest.raises(qpack.InvalidTypeError):
        qpack.freeze(torch.randn(3))
    f = qpack.freeze(model)
    with pytest.raises(qpack.InvalidTypeError, match="float32"):
        f.fc1(torch.randn(2, 20, dtype=torch.float64))


def test_register_extends_mapping():
    class MyLinear(nn.Linear):
        def forward(self, x):  # not what nn.Linear computes: kept as it is
            return super().forward(x) + 1

    model = nn.Sequential(MyLinear(5, 4), nn.ReLU()).eval()
    assert not frozen_layers(qpack.freeze(model))
    try:
        qpack.torch.register(MyLinear, qpack.torch.MAPPING[nn.Linear].convert, fuse_activation=True)
        f = qpack.freeze(model)
        assert isinstance(f[0], FrozenLinear) and f[0].activation == "relu"
        x = torch.randn(3, 5)
        close(f(x), F.relu(F.linear(x, model[0].weight, model[0].bias)))  # the rule's conversion
    finally:
        qpack.torch.MAPPING.pop(MyLinear)


class CallsLinear(nn.Linear):
    """timm's Linear: calls F.linear itself, computing what nn.Linear does."""

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class PadsFirst(nn.Conv2d):
    """Pads the input itself, so it is not nn.Conv2d's computation; the odd pad before, so not
    TensorFlow's "SAME" either (timm's Conv2dSame: SamePadConv2d, test_graph_ops_more.py)."""

    def forward(self, x):
        return F.conv2d(F.pad(x, (1, 0, 1, 0)), self.weight, self.bias, self.stride, 0)


def test_subclasses_that_compute_as_their_base_are_frozen():
    torch.manual_seed(0)
    model = nn.Sequential(PadsFirst(3, 4, 2), nn.Flatten(), CallsLinear(4 * 6 * 6, 5)).eval()
    f = qpack.freeze(model)
    assert isinstance(f[0], PadsFirst) and isinstance(f[2], FrozenLinear)
    x = torch.randn(2, 3, 6, 6)
    close(f(x), model(x))


# ---- BatchNorm folding math (no packing) ------------------------------------------------

@pytest.mark.parametrize("affine", [True, False])
def test_fold_bn_conv2d_math(affine):
    conv = nn.Conv2d(3, 8, 3, padding=1, groups=1).eval()
    bn = randomize_bn(nn.BatchNorm2d(8, affine=affine)).eval()
    w, b = fold_bn(conv.weight, conv.bias, bn)
    x = torch.randn(2, 3, 7, 7)
    close(F.conv2d(x, w, b, padding=1), bn(conv(x)), rtol=1e-5)


def test_fold_bn_conv1d_depthwise_no_bias_math():
    conv = nn.Conv1d(6, 6, 5, groups=6, bias=False).eval()
    bn = randomize_bn(nn.BatchNorm1d(6)).eval()
    w, b = fold_bn(conv.weight, None, bn)
    x = torch.randn(2, 6, 11)
    close(F.conv1d(x, w, b, groups=6), bn(conv(x)), rtol=1e-5)


# ---- int8 sources ------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_dtype_int8_dynamic(backend):
    model = speech_mlp()
    x = torch.randn(16, 20)
    f = qpack.freeze(model, dtype="int8", backend=backend)
    layers = frozen_layers(f)
    assert len(layers) == 5 and all(m.mode == "int8_dynamic" and m.backend == backend for m in layers)
    assert all(m.activation == "relu" for m in layers[:-1])
    assert rel_err(f(x), model(x)) < 0.03
    # the int8 weights are per-channel symmetric quantizations of the float ones, onto
    # [-64, 64] where reduce_range="auto" chooses "weights": oneDNN without VNNI
    w, _ = layers[0].unpack()
    wmax = 64 if qpack.backends()[backend]["int8_input_max"] == 127 else 127
    assert w.dtype == torch.int8 and int(w.abs().amax(dim=1).min()) == int(w.abs().max()) == wmax
    for reduce_range, want in ((False, 127), ("weights", 64), (True, 127)):
        w, _ = frozen_layers(qpack.freeze(model, dtype="int8", backend=backend, reduce_range=reduce_range))[0].unpack()
        assert int(w.abs().amax(dim=1).min()) == int(w.abs().max()) == want, reduce_range
    close(layers[0].dequantized_weight(), model[0].weight.detach(), rtol=float(layers[0].weight_scale.max()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_dtype_int8_static_calibrated(backend):
    model = MLP("relu6_module").eval()
    calib = [torch.randn(32, 20) for _ in range(4)]
    f = qpack.freeze(model, dtype="int8", backend=backend, example_inputs=calib)
    assert [m.mode for m in frozen_layers(f)] == ["int8_static", "int8_static"]
    assert f.fc1._spec["output_zero_point"] == 0  # ReLU6 fused: outputs in [0, 6]
    x = torch.randn(8, 20)
    assert rel_err(f(x), model(x)) < 0.05


def _eager_ptq_model(engine):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.quant = torch.ao.quantization.QuantStub()
            self.fc1, self.relu, self.fc2 = nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 12)
            self.dequant = torch.ao.quantization.DeQuantStub()

        def forward(self, x):
            return self.dequant(self.fc2(self.relu(self.fc1(self.quant(x)))))

    with qengine(engine):
        model = Net().eval()
        model.qconfig = torch.ao.quantization.get_default_qconfig(engine)
        torch.ao.quantization.fuse_modules(model, [["fc1", "relu"]], inplace=True)
        torch.ao.quantization.prepare(model, inplace=True)
        with torch.no_grad():
            for _ in range(4):
                model(torch.randn(32, 24))
        torch.ao.quantization.convert(model, inplace=True)
    return model


@pytest.mark.parametrize("engine", ["qnnpack", "x86"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_eager_ptq_model(engine, backend):
    model = _eager_ptq_model(engine)
    x = torch.randn(7, 24)
    with qengine(engine):
        ref = model(x)
        f = qpack.freeze(model, backend=backend)
        assert [m.mode for m in frozen_layers(f)] == ["int8_static", "int8_static"]
        assert f.fc1.activation == "relu" and f.fc1.backend == backend
        y = f(x)
        # within a quantum or two of the output (errors of fc1 pass through fc2)
        assert float((y - ref).abs().max()) <= 2.01 * model.fc2.scale
        # unfreeze gives the torch.ao modules back, bit-compatible with the frozen ones
        u = qpack.unfreeze(f)
        assert type(u.fc2) is type(model.fc2) and type(u.fc1) is type(model.fc1)
        torch.testing.assert_close(u.fc1.weight().int_repr(), model.fc1.weight().int_repr())
        assert float((u(x) - ref).abs().max()) <= 2.01 * model.fc2.scale


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_dynamic_quantized_model(backend):
    model = speech_mlp()
    with qengine("qnnpack"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ignores reduce_range.*")
        dq = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
        x = torch.randn(10, 20)
        ref = dq(x)
    f = qpack.freeze(dq, backend=backend)
    assert all(m.mode == "int8_dynamic" for m in frozen_layers(f)) and len(frozen_layers(f)) == 5
    assert all(m.activation == "relu" for m in frozen_layers(f)[:-1])  # fused onto the dynamic layers
    assert rel_err(f(x), ref) < 0.01


def test_torchao_int8_model():
    torchao_q = pytest.importorskip("torchao.quantization")
    model = speech_mlp()
    x = torch.randn(12, 20)
    ref_float = model(x)
    torchao_q.quantize_(model, torchao_q.Int8DynamicActivationInt8WeightConfig())
    ref = model(x)
    f = qpack.freeze(model)
    layers = frozen_layers(f)
    assert len(layers) == 5 and all(m.mode == "int8_dynamic" and m._spec["source"] == "torchao" for m in layers)
    # same int8 weights and scales as torchao's
    torch.testing.assert_close(layers[0].unpack()[0], model[0].weight.qdata)
    # torchao quantizes activations per row, qpack per tensor: equal up to activation rounding
    assert rel_err(f(x), ref) < 0.03
    assert rel_err(f(x), ref_float) < 0.03


# ---- snapshot semantics ------------------------------------------------------------------

@pytest.mark.parametrize("retain", [True, False])
def test_snapshot_source_mutation_does_not_leak(retain):
    model = MLP().eval()
    x = torch.randn(4, 20)
    f = qpack.freeze(model, retain=retain)
    before = f(x).clone()
    with torch.no_grad():
        model.fc1.weight.mul_(3)
        model.fc2.bias.add_(1)
        model.bn.running_mean.add_(2)
    close(f(x), before, rtol=0)
    assert rel_err(model(x), before) > 0.1  # the source did change


def test_snapshot_aliasing_tied_weights():
    """A Linear whose weight an Embedding holds too (a language model's tied output layer) stays
    PyTorch's in an fp32 freeze, over the frozen model's one copy of the tensor (packed it would hold
    a second copy), with a FreezeWarning naming it; the copy is cut from the source's tensor."""
    model = Tied().eval()
    ids = torch.randint(0, 50, (2, 6))
    ref = model(ids)
    with pytest.warns(FreezeWarning, match="head share their weight"):
        f = qpack.freeze(model)
    assert isinstance(f.proj, FrozenLinear)
    assert type(f.head) is nn.Linear and isinstance(f.emb, nn.Embedding)
    assert f.head.weight is f.emb.weight  # one tensor in the frozen model
    # the copy of the embedding is not the source's tensor: the tie is cut from the source, not inside
    assert f.emb.weight.data_ptr() != model.emb.weight.data_ptr()
    close(f(ids), ref)
    with torch.no_grad():  # mutate through the alias: both of the source's users change
        model.emb.weight.add_(1.0)
        model.proj.weight.zero_()
    assert rel_err(model(ids), ref) > 0.1
    close(f(ids), ref)


def test_tied_weights_int8_and_linear_pairs():
    """int8 packs a tied Linear (its int8 weight is another tensor than the embedding's fp32 one);
    two Linears sharing one weight both stay PyTorch's in fp32 (no packed copy of either)."""
    model = Tied().eval()
    ids = torch.randint(0, 50, (2, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FreezeWarning)
        f8 = qpack.freeze(model, dtype="int8")
    assert isinstance(f8.head, FrozenLinear) and f8.head.mode == "int8_dynamic"
    assert rel_err(f8(ids), model(ids)) < 0.1

    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 8)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.c(self.b(self.a(x).relu()))

    pair = Pair().eval()
    x = torch.randn(3, 16)
    with pytest.warns(FreezeWarning, match="a, b share their weight"):
        f = qpack.freeze(pair, retain=False)
    assert type(f.a) is nn.Linear and type(f.b) is nn.Linear and f.a.weight is f.b.weight
    assert isinstance(f.c, FrozenLinear)
    close(f(x), pair(x))
    report = qpack.memory_report(f)
    assert [r.name for r in report.layers] == ["c"]
    assert report.nbytes_other == (16 * 16 + 2 * 16) * 4  # the shared weight once, two biases


def test_inplace_replaces_and_drops_source():
    model = MLP().eval()
    x = torch.randn(4, 20)
    ref = model(x)
    fc1 = model.fc1
    f = qpack.freeze(model, inplace=True, retain=False)
    assert f is model and isinstance(model.fc1, FrozenLinear) and isinstance(model.bn, nn.Identity)
    assert fc1.weight is None  # the source layer's tensors were dropped
    assert not model.fc1.has_original
    close(f(x), ref)


PEAK_SCRIPT = r"""
import gc, sys, torch, qpack
from torch import nn
torch.set_num_threads(1); qpack.set_num_threads(1)
def rss(field):
    for line in open('/proc/self/status'):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
n, width = 8, 1024
model = nn.Sequential(*[nn.Linear(width, width) for _ in range(n)]).eval()
x = torch.randn(2, width)
with torch.no_grad():  # no autograd graph holding the weights
    ref = model(x)
qpack.PackedLinear(torch.randn(4, 4))(torch.randn(1, 4))  # the backend's one-time set-up, before measuring
gc.collect()
base = rss('VmRSS:')
open('/proc/self/clear_refs', 'w').write('5')  # reset the peak (VmHWM)
f = qpack.freeze(model, inplace=sys.argv[1] == 'inplace', retain=False)
peak = rss('VmHWM:')
assert torch.allclose(f(x), ref, rtol=1e-4, atol=1e-4)
packed = qpack.memory_report(f).nbytes_packed
print(peak - base, packed, width * width * 4)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc peak RSS reset")
def test_inplace_peak_memory():
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    res = {}
    for mode in ("inplace", "copy"):
        out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, mode], capture_output=True, text=True, env=env,
                             cwd="/")
        assert out.returncode == 0, out.stderr
        res[mode] = [int(v) for v in out.stdout.split()]
    growth, packed, layer = res["inplace"]
    # the originals were already resident; freezing in place adds at most one layer beyond the packed total
    # minus what it released, i.e. about one layer
    assert growth < 2 * layer, res
    # copying keeps every original: growth is the whole packed total
    assert res["copy"][0] > 0.8 * packed, res


# ---- unfreeze, saving -----------------------------------------------------------------------

@pytest.mark.parametrize("retain", [True, False])
def test_unfreeze_round_trip(retain):
    model = MLP("relu6_module").eval()
    x = torch.randn(6, 20)
    f = qpack.freeze(model, retain=retain)
    assert all(m.has_original == retain for m in frozen_layers(f))
    u = qpack.unfreeze(f)
    assert not frozen_layers(u) and type(u) is MLP and not u.training
    close(u(x), f(x))
    assert isinstance(u.fc1, nn.Sequential) and isinstance(u.fc1[1], nn.ReLU6)  # fused activation, back
    assert isinstance(u.bn, nn.Identity)  # BatchNorm stays folded
    # editable: a change shows, and the frozen model is unaffected
    before = f(x).clone()
    with torch.no_grad():
        u.fc2.weight.zero_()
    close(u(x), u.fc2.bias.expand(6, 10))
    close(f(x), before, rtol=0)
    # and it freezes again
    close(qpack.freeze(u)(x), u(x))


def _roundtrips(f):
    yield "pickle", pickle.loads(pickle.dumps(f))
    yield "deepcopy", copy.deepcopy(f)
    buf = io.BytesIO()
    torch.save(f, buf)
    buf.seek(0)
    yield "torch.save", torch.load(buf, weights_only=False)


@pytest.mark.parametrize("retain", [True, False])
@pytest.mark.parametrize("dtype", [None, "int8"])
def test_save_load_pickle_deepcopy(retain, dtype):
    model = MLP().eval()
    x = torch.randn(5, 20)
    f = qpack.freeze(model, retain=retain, dtype=dtype)
    ref = f(x)
    for how, g in _roundtrips(f):
        assert all(m.has_original == retain for m in frozen_layers(g)), how
        assert frozen_layers(g)[0].packed is not frozen_layers(f)[0].packed, how
        close(g(x), ref, rtol=0)


def test_state_dict_portable_and_reloads():
    model = MLP().eval()
    x = torch.randn(5, 20)
    f = qpack.freeze(model, retain=False, dtype="int8", example_inputs=torch.randn(64, 20))
    sd = f.state_dict()
    assert sd["fc1.weight"].dtype == torch.int8 and sd["fc1.weight_scale"].shape == (32,)
    assert "fc1.input_scale" in sd and "bn.running_mean" not in sd
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    sd2 = torch.load(buf, weights_only=True)  # plain tensors only
    other = qpack.freeze(MLP().eval(), retain=False, dtype="int8", example_inputs=torch.randn(64, 20) * 5)
    assert rel_err(other(x), f(x)) > 1e-3
    result = other.load_state_dict(sd2)
    assert not result.missing_keys and not result.unexpected_keys
    close(other(x), f(x), rtol=0)
    with pytest.raises(RuntimeError, match="fc1.weight"):
        other.load_state_dict({**sd2, "fc1.weight": torch.zeros(3, 3, dtype=torch.int8)})
    with pytest.raises(RuntimeError, match="Missing key"):
        other.load_state_dict({k: v for k, v in sd2.items() if k != "fc2.bias"})


def test_fp32_unpack_bit_exact_after_release():
    model = speech_mlp()
    f = qpack.freeze(model, retain=False)
    for src, m in zip([l for l in model if isinstance(l, nn.Linear)], frozen_layers(f)):
        w, b = m.unpack()
        assert not m.has_original
        assert torch.equal(w, src.weight.detach()) and torch.equal(b, src.bias.detach())


# ---- memory_report ----------------------------------------------------------------------------

def test_memory_report():
    model = Tied().eval()
    with pytest.warns(FreezeWarning):  # the tied head stays PyTorch's (test_snapshot_aliasing_tied_weights)
        kept = qpack.memory_report(qpack.freeze(model, retain=True))
        released = qpack.memory_report(qpack.freeze(model, retain=False))
    names = [r.name for r in kept.layers]
    assert names == ["proj"]
    assert [r.op for r in kept.layers] == ["linear"] and kept.layers[0].dtype == "f32"
    assert kept.layers[0].nbytes_original >= 16 * 16 * 4
    assert released.nbytes_original == 0 and released.nbytes_packed == kept.nbytes_packed > 0
    assert released.nbytes_other == 50 * 16 * 4  # the embedding, which the head reads too: once
    text = str(kept)
    assert "proj" in text and "total" in text and "packed MB" in text
    assert kept.to_dict()["nbytes_total"] == kept.nbytes_total


# ---- convolutions (need qpack.PackedConv2d) ------------------------------------------------------

class ConvBnReLU(nn.Module):
    def __init__(self, cin, cout, stride=1, groups=1, act=nn.ReLU):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, groups=groups, bias=False)
        self.bn = randomize_bn(nn.BatchNorm2d(cout))
        self.act = act()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Residual(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.a = ConvBnReLU(c, c)
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.bn = randomize_bn(nn.BatchNorm2d(c))

    def forward(self, x):
        return F.relu(self.bn(self.conv(self.a(x))) + x)


def test_conv_bn_relu_stack():
    model = nn.Sequential(ConvBnReLU(3, 16, stride=2), ConvBnReLU(16, 16, groups=16, act=nn.ReLU6),
                          nn.Conv2d(16, 8, 1)).eval()
    x = torch.randn(2, 3, 17, 17)
    f = qpack.freeze(model)
    assert isinstance(f[0].conv, FrozenConv2d) and isinstance(f[0].bn, nn.Identity)
    assert f[1].conv.activation == "relu6"
    close(f(x), model(x), rtol=1e-4)
    u = qpack.unfreeze(f)
    close(u(x), f(x), rtol=1e-4)
    close(pickle.loads(pickle.dumps(f))(x), f(x), rtol=0)


def test_residual_block_and_conv1d():
    model = nn.Sequential(Residual(8), Residual(8)).eval()
    x = torch.randn(1, 8, 9, 9)
    f = qpack.freeze(model, retain=False)
    assert len(frozen_layers(f)) == 4 and f[0].a.conv.activation == "relu" and f[0].conv.activation is None
    close(f(x), model(x), rtol=1e-4)
    conv1 = nn.Sequential(nn.Conv1d(4, 6, 5, padding=2), nn.BatchNorm1d(6), nn.ReLU()).eval()
    randomize_bn(conv1[1])
    y = torch.randn(3, 4, 20)
    g = qpack.freeze(conv1)
    assert isinstance(g[0], FrozenConv1d) and g[0].activation == "relu"
    close(g(y), conv1(y), rtol=1e-4)


@pytest.mark.parametrize("engine", ["qnnpack", "x86"])
def test_torch_eager_ptq_conv_model(engine):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.quant = torch.ao.quantization.QuantStub()
            self.conv, self.bn, self.relu = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()
            self.dequant = torch.ao.quantization.DeQuantStub()

        def forward(self, x):
            return self.dequant(self.relu(self.bn(self.conv(self.quant(x)))))

    with qengine(engine):
        model = Net().eval()
        randomize_bn(model.bn)
        model.qconfig = torch.ao.quantization.get_default_qconfig(engine)
        torch.ao.quantization.fuse_modules(model, [["conv", "bn", "relu"]], inplace=True)
        torch.ao.quantization.prepare(model, inplace=True)
        with torch.no_grad():
            model(torch.randn(4, 3, 10, 10))
        torch.ao.quantization.convert(model, inplace=True)
        x = torch.randn(2, 3, 10, 10)
        ref = model(x)
        f = qpack.freeze(model)
        assert isinstance(f.conv, FrozenConv2d) and f.conv.mode == "int8_static"
        assert float((f(x) - ref).abs().max()) <= 1.01 * model.conv.scale


class ReadsItsWeight(nn.Module):
    """torchvision's Swin: the forward passes a Linear's weight to a function."""

    def __init__(self):
        super().__init__()
        self.qkv, self.proj = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.proj(F.linear(x, self.qkv.weight, self.qkv.bias).relu())


@pytest.mark.parametrize("retain", [True, False])
def test_a_linear_whose_weight_the_forward_reads_is_frozen(retain):
    """F.linear on a frozen Linear's .weight (a PackedWeight) runs the packed layer, with
    its own bias or another; other ops get the unpacked weight; in-place ones raise."""
    from qpack.torch.modules import PackedWeight
    model = ReadsItsWeight().eval()
    f = qpack.freeze(model, retain=retain)
    assert isinstance(f.qkv, FrozenLinear) and isinstance(f.proj, FrozenLinear)
    assert isinstance(f.qkv.weight, PackedWeight) and f.qkv.weight.shape == (8, 8)
    x = torch.randn(3, 8)
    with torch.no_grad():
        close(f(x), model(x))
        other = torch.randn(8)
        close(F.linear(x, f.qkv.weight, other), F.linear(x, model.qkv.weight, other))
        close(F.linear(x, f.qkv.weight), F.linear(x, model.qkv.weight))
        close(x @ f.qkv.weight.t(), x @ model.qkv.weight.t())  # unpacked for the call
    with pytest.raises(qpack.UnsupportedError, match="in place"):
        f.qkv.weight.mul_(2)
    with torch.no_grad():
        close(f(x), model(x))
    fi = qpack.freeze(model, dtype="int8", example_inputs=[torch.randn(3, 8) for _ in range(2)], progress=False)
    assert fi.qkv.mode == "int8_dynamic"  # no graph holds it: int8 dynamic
    with torch.no_grad():
        assert ((fi(x) - model(x)).norm() / model(x).norm()).item() < 0.1


# ---- modules that hold a Linear's weight transposed (transformers' Conv1D, GPT-2's layers) ----

class AddmmLinear(nn.Module):
    """What transformers' Conv1D computes: addmm(bias, x, weight) with the weight [in, out]."""

    def __init__(self, nf, nx, bias=True):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.1)
        self.bias = nn.Parameter(torch.randn(nf)) if bias else None

    def forward(self, x):
        out = x.reshape(-1, x.size(-1)) @ self.weight
        if self.bias is not None:
            out = out + self.bias
        return out.view(x.size()[:-1] + (self.nf,))


class AddmmPlusOne(AddmmLinear):
    def forward(self, x):
        return super().forward(x) + 1


class GptMlp(nn.Module):
    def __init__(self, cls=AddmmLinear):
        super().__init__()
        self.fc, self.proj, self.out = cls(64, 16), cls(16, 64, bias=False), nn.Linear(16, 4)

    def forward(self, x):
        return self.out(self.proj(F.gelu(self.fc(x))))


def test_transposed_linear_modules_freeze_as_linears():
    """A module type whose every instance computes F.linear(x, weight.t(), bias) is frozen as that
    Linear (fp32 and int8, static int8 calibrated layer by layer too), unfreezes to nn.Linear; a
    lookalike computing something else keeps its forward."""
    model = GptMlp().eval()
    x = torch.randn(2, 5, 16)
    ref = model(x)
    f = qpack.freeze(model, retain=False)
    assert isinstance(f.fc, FrozenLinear) and isinstance(f.proj, FrozenLinear)
    assert f.fc.unpack()[0].shape == (64, 16)
    close(f(x), ref)
    u = qpack.unfreeze(f)
    assert type(u.fc) is nn.Linear or isinstance(u.fc, nn.Sequential)
    close(u(x), ref)
    for kw in (dict(), dict(example_inputs=[(x,), (x * 0.9,)]), dict(example_inputs=[(x,)], graph=False)):
        f8 = qpack.freeze(model, dtype="int8", **kw)
        assert isinstance(f8.fc, FrozenLinear) and f8.fc.mode.startswith("int8"), kw
        assert rel_err(f8(x), ref) < 0.05, kw
    assert qpack.freeze(model, dtype="int8", example_inputs=[(x,)], graph=False).fc.mode == "int8_static"
    other = GptMlp(AddmmPlusOne).eval()
    g = qpack.freeze(other)
    assert type(g.fc) is AddmmPlusOne and isinstance(g.out, FrozenLinear)
    close(g(x), other(x))


def test_transformers_conv1d_freezes():
    transformers = pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D
    m = nn.Sequential(Conv1D(48, 16), nn.ReLU(), Conv1D(8, 48)).eval()
    x = torch.randn(3, 7, 16)
    f = qpack.freeze(m, retain=False)
    assert all(isinstance(f[i], FrozenLinear) for i in (0, 2))
    close(f(x), m(x))
