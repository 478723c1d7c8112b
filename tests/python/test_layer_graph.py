"""A frozen layer on its own (qpack.freeze of a bare Linear / Conv, or a layer of a
model frozen layer by layer) runs as a one-node core graph (graph.LayerGraph):
float tensor in and out in one core call, the same values as the layer's torch
path, which still runs (and raises its errors) wherever the graph cannot."""
import concurrent.futures
import copy
import io
import pickle

import pytest

import qpack

torch = pytest.importorskip("torch")
nn = torch.nn

from qpack.torch import FrozenConv2d, FrozenLinear  # noqa: E402

BACKENDS = [b for b in ("onednn", "qnnpack") if qpack.backends()[b]["available"]]


@pytest.fixture(autouse=True)
def _inference():
    with torch.no_grad():
        yield


def _runs(f):
    graph = f.__dict__.get("_layer_graph")
    return 0 if graph is None or graph.handle is None else graph.handle.info()["runs"]


def _layers():
    torch.manual_seed(0)
    return [
        ("linear", nn.Linear(40, 24), (3, 40)),
        ("linear rank 3", nn.Linear(40, 24), (2, 5, 40)),
        ("conv1d", nn.Conv1d(8, 16, 3, padding=1), (2, 8, 19)),
        ("conv2d", nn.Conv2d(8, 16, 3, stride=2, padding=1), (2, 8, 13, 11)),
        ("depthwise", nn.Conv2d(24, 24, 3, padding=1, groups=24), (1, 24, 10, 10)),
    ]


def _frozen(layer, mode, backend, x):
    if mode == "f32":
        return qpack.freeze(layer.eval(), progress=False)
    if mode == "int8 dynamic":
        return qpack.freeze(layer.eval(), dtype="int8", backend=backend, progress=False)
    return qpack.freeze(layer.eval(), dtype="int8", backend=backend, progress=False,
                        example_inputs=[x, 2 * torch.rand_like(x) - 1])


CASES = [("f32", "onednn")] + [(m, b) for b in BACKENDS for m in ("int8 dynamic", "int8 static")]


@pytest.mark.parametrize("mode,backend", CASES)
def test_bare_layer_is_one_core_call_with_its_own_values(mode, backend):
    """Each call is one run of the layer's graph; the values are the torch path's:
    fp32 within float rounding, static int8 within one output quantum (the graph
    quantizes x * (1 / scale), the torch path x / scale), and near PyTorch's."""
    for name, layer, shape in _layers():
        if mode == "int8 dynamic" and backend == "qnnpack" and name.startswith("conv"):
            continue  # no dynamic int8 convolutions on QNNPACK
        x = torch.randn(*shape)
        f = _frozen(layer, mode, backend, x)
        y = f(x)
        assert _runs(f) == 1, name
        f(x)
        assert _runs(f) == 2, name
        ref = f._forward_layer(x)
        assert y.shape == ref.shape == layer(x).shape, name
        if mode == "int8 static":
            q = f._spec["output_scale"]
            assert float((y - ref).abs().max()) <= q * 1.001, name
        else:
            torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5 * max(1.0, float(ref.abs().max())))
        err = float((y - layer(x)).norm() / layer(x).norm())
        assert err < (1e-5 if mode == "f32" else 0.05), (name, err)


def test_channels_last_input_gives_channels_last_output():
    conv = nn.Conv2d(8, 16, 3, padding=1).eval()
    f = qpack.freeze(conv)
    x = torch.randn(2, 8, 9, 7).contiguous(memory_format=torch.channels_last)
    y = f(x)
    assert _runs(f) == 1 and y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, conv(x), rtol=1e-5, atol=1e-5)


def test_what_the_graph_cannot_take_runs_the_torch_path():
    """Other ranks run the layer's torch path (no graph run); bad inputs raise the
    layer's own errors and leave it usable; an empty batch works."""
    lin = nn.Linear(40, 24).eval()
    f = qpack.freeze(lin)
    for shape in [(40,)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(f(x), lin(x), rtol=1e-5, atol=1e-5)
    assert _runs(f) == 0
    with pytest.raises(qpack.InvalidArgumentError, match="40"):
        f(torch.randn(2, 39))
    with pytest.raises(qpack.InvalidTypeError, match="float32"):
        f(torch.randn(2, 40, dtype=torch.float64))
    with pytest.raises(qpack.InvalidTypeError):
        f([1.0] * 40)
    x = torch.randn(2, 40)
    torch.testing.assert_close(f(x), lin(x), rtol=1e-5, atol=1e-5)
    assert f(torch.randn(0, 40)).shape == (0, 24)

    conv = nn.Conv2d(4, 8, 3).eval()
    c = qpack.freeze(conv, dtype="int8", example_inputs=[torch.randn(1, 4, 8, 8)], progress=False)
    x3 = torch.randn(4, 8, 8)  # unbatched: the torch path
    assert c(x3).shape == conv(x3).shape
    with pytest.raises(qpack.InvalidArgumentError, match="channels"):
        c(torch.randn(1, 5, 8, 8))
    with pytest.raises(qpack.InvalidArgumentError):
        c(torch.randn(1, 4, 2, 2))  # smaller than the kernel
    assert c(torch.randn(1, 4, 8, 8)).shape == (1, 8, 6, 6)


def test_a_layer_no_graph_takes_keeps_its_torch_path(monkeypatch):
    """Where the core will not make the layer's graph (here: made to refuse), the layer
    runs its torch path, then and on later calls, with the same values."""
    from qpack.torch import graph as G
    lin = nn.Linear(16, 8).eval()
    f = qpack.freeze(lin)
    x = torch.randn(2, 16)

    def refuse(*args, **kwargs):
        raise qpack.UnsupportedError("no graph for this layer")

    monkeypatch.setattr(G._core, "GraphHandle", refuse)
    torch.testing.assert_close(f(x), lin(x), rtol=1e-5, atol=1e-5)
    assert f.__dict__["_layer_graph"].usable is False
    monkeypatch.undo()
    torch.testing.assert_close(f(x), lin(x), rtol=1e-5, atol=1e-5)
    assert _runs(f) == 0


def test_close_frees_the_layer_and_later_calls_raise():
    for close in (lambda f: f.close(), lambda f: f.packed.close()):
        f = qpack.freeze(nn.Linear(16, 8).eval())
        x = torch.randn(2, 16)
        f(x)
        close(f)
        with pytest.raises(qpack.ClosedError):
            f(x)
        graph = f.__dict__.get("_layer_graph")
        assert graph is None or graph.handle is None  # the graph shared the op: dropped


def test_copies_rebuild_their_graph_and_repacking_is_followed():
    torch.manual_seed(1)
    conv = nn.Conv2d(6, 10, 3, padding=1).eval()
    x = torch.randn(1, 6, 8, 8)
    f = qpack.freeze(conv)
    y = f(x)
    for g in (pickle.loads(pickle.dumps(f)), copy.deepcopy(f)):
        assert isinstance(g, FrozenConv2d) and "_layer_graph" not in g.__getstate__()
        torch.testing.assert_close(g(x), y)
        assert _runs(g) == 1
    buf = io.BytesIO()
    torch.save(f, buf)
    buf.seek(0)
    torch.testing.assert_close(torch.load(buf, weights_only=False)(x), y)

    other = nn.Conv2d(6, 10, 3, padding=1).eval()
    f.load_state_dict(qpack.freeze(other).state_dict())
    torch.testing.assert_close(f(x), other(x), rtol=1e-5, atol=1e-5)


def test_qpack_save_and_load(tmp_path):
    lin = nn.Linear(32, 12).eval()
    x = torch.randn(4, 32)
    f = qpack.freeze(lin, dtype="int8", example_inputs=[x], progress=False)
    y = f(x)
    path = tmp_path / "lin.qpk"
    qpack.save(f, str(path))
    g = qpack.load(str(path))
    assert isinstance(g, FrozenLinear)
    assert torch.equal(g(x), y) and _runs(g) == 1


def test_threads_share_one_layer_graph():
    conv = nn.Conv2d(8, 8, 3, padding=1).eval()
    f = qpack.freeze(conv, dtype="int8", example_inputs=[torch.randn(1, 8, 12, 12)], progress=False)
    xs = [torch.randn(1, 8, 12, 12) for _ in range(4)]
    want = [f(x) for x in xs]

    def work(i):
        with torch.no_grad():
            return all(torch.equal(f(xs[i]), want[i]) for _ in range(25))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(4)))
    assert _runs(f) == 4 + 100


def test_handle_closed_flag_follows_the_core():
    """PackedOp.closed reads the handle's cheap `closed` property (asked on every call of a
    frozen layer): the same as info()["closed"] before and after close, for both kinds."""
    lin = qpack.PackedLinear(torch.randn(4, 8))
    conv = qpack.PackedConv2d(torch.randn(4, 2, 3, 3))
    for p in (lin, conv):
        assert p._h.closed is False and p._h.info()["closed"] is False and not p.closed
        p.close()
        assert p._h.closed is True and p._h.info()["closed"] is True and p.closed


@pytest.mark.parametrize("mode,backend", CASES)
def test_linear_over_the_last_dim_of_more_dims_runs_as_rows(mode, backend):
    """A frozen Linear called on [B, H, W, C] (Swin's layout) runs on the core as rows,
    one call, with the values of the 2-D call on the same rows."""
    torch.manual_seed(1)
    x = torch.randn(2, 3, 5, 40)
    f = _frozen(nn.Linear(40, 24), mode, backend, x.reshape(-1, 40))
    before = _runs(f)
    y = f(x)
    assert y.shape == (2, 3, 5, 24) and _runs(f) == before + 1
    assert torch.equal(y, f(x.reshape(-1, 40)).reshape(2, 3, 5, 24))
    assert torch.equal(f(x.transpose(1, 2)), f(x.transpose(1, 2).contiguous()))
    with pytest.raises((qpack.InvalidArgumentError, RuntimeError), match="40|39"):
        f(torch.randn(2, 3, 5, 39))  # the layer's own error; it stays usable
    assert torch.equal(f(x), y)
