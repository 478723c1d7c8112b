"""u8 graph nodes on QNNPACK's own operators: add, max / average / global
average pooling, clamp, sigmoid, hardswish.

Each op in a small int8 model frozen on the qnnpack backend: the report says
where the node ran; its output is within one quantum of PyTorch on the
graph's own u8 input to that node, and the model's output within the
per-edge reference's bound (tests/python/test_graph.py). Parameters QNNPACK
does not take run in qpack's C++ code, as correctly; threads and changing
input sizes share a node's operators."""
import copy
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the graph tests freeze torch models")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import qpack  # noqa: E402
from qpack.torch import graph as G  # noqa: E402

from conftest import BACKENDS  # noqa: E402
from test_graph import One, _act, deq, per_edge_reference, quant  # noqa: E402

pytestmark = pytest.mark.skipif("qnnpack" not in BACKENDS, reason="QNNPACK is not available here")


def conv1(c=4):
    return nn.Conv2d(4, c, 1)


# name: (forward, modules, node kind, where it runs)
CASES = {
    "add": (lambda s, x: s.mods[0](x) + x, lambda: [conv1()], "add", "qnnpack"),
    "add_relu": (lambda s, x: F.relu(s.mods[0](x) + x), lambda: [conv1()], "add", "qnnpack"),
    "maxpool_3s2p1": (lambda s, x: s.mods[1](s.mods[0](x)), lambda: [conv1(), nn.MaxPool2d(3, 2, 1)],
                      "maxpool2d", "qnnpack"),
    "maxpool_2": (lambda s, x: s.mods[1](s.mods[0](x)), lambda: [conv1(), nn.MaxPool2d(2)], "maxpool2d", "qnnpack"),
    "avgpool_3s2p1": (lambda s, x: s.mods[1](s.mods[0](x)), lambda: [conv1(), nn.AvgPool2d(3, 2, 1)],
                      "avgpool2d", "qnnpack"),
    "avgpool_2_exclude_pad": (lambda s, x: s.mods[1](s.mods[0](x)),
                              lambda: [conv1(), nn.AvgPool2d(2, count_include_pad=False)], "avgpool2d", "qnnpack"),
    "global_avgpool": (lambda s, x: s.mods[0](x).mean((2, 3)), lambda: [conv1()], "global_avgpool", "qnnpack"),
    "global_avgpool_keepdim": (lambda s, x: F.adaptive_avg_pool2d(s.mods[0](x), 1), lambda: [conv1()],
                               "global_avgpool", "qnnpack"),
    "hardswish": (lambda s, x: s.mods[1](s.mods[0](x)), lambda: [conv1(), nn.Hardswish()], "activation", "qnnpack"),
    # what QNNPACK does not take
    "avgpool_pad_exclude_pad": (lambda s, x: s.mods[1](s.mods[0](x)),
                                lambda: [conv1(), nn.AvgPool2d(3, 2, 1, count_include_pad=False)],
                                "avgpool2d", "qpack"),
    "maxpool_1x1": (lambda s, x: s.mods[1](s.mods[0](x)), lambda: [conv1(), nn.MaxPool2d(1, 2)], "maxpool2d", "qpack"),
    "maxpool_ceil": (lambda s, x: s.mods[1](s.mods[0](x)), lambda: [conv1(), nn.MaxPool2d(2, 2, ceil_mode=True)],
                     "maxpool2d", "qpack"),  # 5x5: ceil mode adds a window
    # calibrated output qparams: sigmoid's are not QNNPACK's fixed (1/256, 0),
    # ReLU's are not its input's (QNNPACK's clamp does not requantize)
    "sigmoid_calibrated": (lambda s, x: torch.sigmoid(s.mods[0](x)), lambda: [conv1()], "activation", "qpack"),
    "relu_calibrated": (lambda s, x: F.relu(s.mods[1](s.mods[0](x))), lambda: [conv1(), nn.MaxPool2d(2)],
                        "activation", "qpack"),
    # hardswish fused into the add: QNNPACK's add fuses a clamp only
    "add_hardswish": (lambda s, x: F.hardswish(s.mods[0](x) + x), lambda: [conv1()], "add", "qpack"),
}


def frozen(name, seed=1, shape=(2, 4, 5, 5), backend="qnnpack"):
    fn, mods = CASES[name][:2]
    torch.manual_seed(seed)
    model = One(fn, *mods()).eval()
    calib = [torch.randn(shape) for _ in range(3)]
    f = qpack.freeze(model, dtype="int8", backend=backend, example_inputs=calib, progress=False)
    assert G.runner_of(f) is not None and G.runner_of(f).num_segments == 1
    return f, calib


def segment(f):
    return G.runner_of(f)._segments[0]


def nodes_of(f, kind):
    """(index, node) of each node of this kind."""
    return [(i, n) for i, n in enumerate(segment(f).spec["nodes"]) if n["kind"] == kind]


def runs_on(f, kind):
    backends = segment(f).graph().node_backends()
    return [backends[i] for i, _ in nodes_of(f, kind)]


def set_qparams(f, value, scale, zero_point):
    """Gives a value other u8 parameters (the graph is made again on its next run)."""
    seg = segment(f)
    seg.spec["values"][value] = ("u8", scale, zero_point)
    seg.handle = None


def node_io(f, x, node):
    """The graph's own u8 inputs and output of `node` (NCHW tensors), from a
    graph over the same spec and packed ops whose outputs are those values."""
    probe = copy.copy(segment(f))
    probe.spec = dict(probe.spec, outputs=list(node["inputs"]) + [node["output"]])
    probe.handle = None
    arrays = probe.graph().run([x.contiguous().numpy()], ["nchw"])  # rank 4: NHWC
    return [torch.from_numpy(a).float().permute(0, 3, 1, 2) if a.ndim == 4 else torch.from_numpy(a).float()
            for a in arrays]


def node_reference(f, node, ins):
    """PyTorch's float op on the dequantized inputs, quantized to the output's parameters."""
    vals = segment(f).spec["values"]
    a = [deq(t, vals[v][1], vals[v][2]) for t, v in zip(ins, node["inputs"])]
    k, p = node["kind"], node.get("padding", (0, 0))
    if k == "add":
        r = _act(node.get("activation"), node.get("act_min"), node.get("act_max"), a[0] + a[1])
    elif k == "activation":
        r = _act(node["activation"], node.get("act_min"), node.get("act_max"), a[0])
    elif k == "maxpool2d":
        r = F.max_pool2d(a[0], node["kernel"], node["stride"], (p[0], p[1]), ceil_mode=node.get("ceil_mode", False))
    elif k == "avgpool2d":
        r = F.avg_pool2d(a[0], node["kernel"], node["stride"], (p[0], p[1]), ceil_mode=node.get("ceil_mode", False),
                         count_include_pad=node.get("count_include_pad", True))
    else:
        r = a[0].mean((2, 3), keepdim=True)
    _, s, zp = vals[node["output"]]
    return quant(r, s, zp)


def check_node(f, x, kind):
    """Each `kind` node's output within one quantum of PyTorch on its own inputs."""
    for _, node in nodes_of(f, kind):
        *ins, out = node_io(f, x, node)
        ref = node_reference(f, node, ins)
        diff = float((out.reshape(ref.shape) - ref).abs().max())
        assert diff <= 1, (kind, node, diff)


def check_model(f, x):
    """The model's output within the per-edge reference's bound (test_graph.py)."""
    spec = segment(f).spec
    with torch.no_grad():
        ref = per_edge_reference(f, x)
        y = f(x)
    out_s = spec["values"][spec["nodes"][-1]["inputs"][0]][1]
    assert float((y - ref).abs().max()) <= 2 * out_s + 1e-6


@pytest.mark.parametrize("name", sorted(CASES))
def test_node_runs_where_expected_within_one_quantum(name):
    kind, where = CASES[name][2:]
    f, calib = frozen(name)
    x = calib[1]
    check_model(f, x)
    check_node(f, x, kind)
    assert runs_on(f, kind) and set(runs_on(f, kind)) == {where}, (name, runs_on(f, kind))
    report = qpack.graph_report(f).splitlines()
    lines = [line for line in report if line.startswith(kind)]
    assert lines and all(f"backend={where}" in line for line in lines), report


def test_sigmoid_on_pytorchs_fixed_qparams_runs_on_qnnpack():
    f, calib = frozen("sigmoid_calibrated")
    (_, node), = nodes_of(f, "activation")
    set_qparams(f, node["output"], 1.0 / 256, 0)
    check_model(f, calib[1])
    check_node(f, calib[1], "activation")
    assert runs_on(f, "activation") == ["qnnpack"]


def test_relu_and_clamp_keeping_their_input_qparams_run_on_qnnpack():
    f, calib = frozen("relu_calibrated")
    (_, node), = nodes_of(f, "activation")
    set_qparams(f, node["output"], *segment(f).spec["values"][node["inputs"][0]][1:])
    check_node(f, calib[1], "activation")
    assert runs_on(f, "activation") == ["qnnpack"]
    node["activation"], node["act_min"], node["act_max"] = "clamp", -0.25, 0.5
    segment(f).handle = None
    check_model(f, calib[1])
    check_node(f, calib[1], "activation")
    assert runs_on(f, "activation") == ["qnnpack"]


@pytest.mark.parametrize("name,ratio", [("add", 300.0), ("add", 1e-5), ("global_avgpool", 300.0),
                                        ("avgpool_3s2p1", 1.0 / 300)])
def test_scale_ratios_qnnpack_rejects_fall_back(name, ratio):
    """QNNPACK takes input-to-output scale ratios in [2^-14, 2^8) (add) and
    [2^-8, 2^8) (pools); beyond them the node runs in qpack's C++ code."""
    kind = CASES[name][2]
    f, calib = frozen(name)
    (_, node), = nodes_of(f, kind)
    _, s_in, _ = segment(f).spec["values"][node["inputs"][0]]
    set_qparams(f, node["output"], s_in / ratio, 128)
    check_model(f, calib[1])
    check_node(f, calib[1], kind)
    assert runs_on(f, kind) == ["qpack"]


def test_ceil_mode_runs_on_qnnpack_where_it_adds_no_window():
    f, _ = frozen("maxpool_ceil", shape=(1, 4, 6, 6))
    x6, x5 = torch.randn(1, 4, 6, 6), torch.randn(1, 4, 5, 5)
    check_node(f, x6, "maxpool2d")
    check_model(f, x6)
    assert runs_on(f, "maxpool2d") == ["qnnpack"]
    check_node(f, x5, "maxpool2d")
    check_model(f, x5)
    assert runs_on(f, "maxpool2d") == ["qnnpack, qpack for some shapes"]
    assert "backend=qnnpack, qpack for some shapes" in qpack.graph_report(f)


class Mixed(nn.Module):
    """Every node kind QNNPACK runs, in one graph."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 8, 1)
        self.mp, self.ap, self.hs = nn.MaxPool2d(3, 2, 1), nn.AvgPool2d(3, 1, 1), nn.Hardswish()

    def forward(self, x):
        y = self.mp(self.c1(x))
        y = F.relu(self.c2(y) + y)
        return self.hs(self.ap(y)).mean((2, 3))


def frozen_mixed():
    torch.manual_seed(4)
    f = qpack.freeze(Mixed().eval(), dtype="int8", backend="qnnpack",
                     example_inputs=[torch.randn(2, 4, 16, 16) for _ in range(3)], progress=False)
    return f


def test_changing_input_sizes_and_batches():
    f = frozen_mixed()
    shapes = [(1, 4, 16, 16), (3, 4, 9, 13), (1, 4, 16, 16), (2, 4, 1, 1), (4, 4, 16, 16), (3, 4, 9, 13)]
    for i, s in enumerate(shapes):
        x = torch.randn(s, generator=torch.Generator().manual_seed(i))
        check_model(f, x)
        for kind in ("add", "maxpool2d", "avgpool2d", "global_avgpool", "activation"):
            check_node(f, x, kind)
    backends = segment(f).graph().node_backends()
    assert backends.count("qnnpack") >= 5, backends


def test_many_threads_run_one_graph():
    """More threads than a node keeps operator instances for: results equal
    to one thread's."""
    f = frozen_mixed()
    xs = [torch.randn(s) for s in [(1, 4, 16, 16), (2, 4, 12, 10), (1, 4, 7, 7), (3, 4, 16, 16)]]
    with torch.no_grad():
        refs = [f(x) for x in xs]

    def mismatches(t):
        with torch.no_grad():
            ks = [(t + i) % len(xs) for i in range(25)]
            return [(t, k) for k in ks if not torch.equal(f(xs[k]), refs[k])]

    with ThreadPoolExecutor(12) as pool:
        bad = [m for ms in pool.map(mismatches, range(12)) for m in ms]
    assert not bad, bad[:3]
    assert segment(f).graph().node_backends().count("qnnpack") >= 5


def test_other_backends_and_float_graphs_run_these_nodes_in_qpack():
    kinds = ("add", "maxpool2d", "avgpool2d", "global_avgpool", "activation")
    graphs = [qpack.freeze(Mixed().eval(), backend="qnnpack", graph=True)]  # float: no u8 values
    if "onednn" in BACKENDS:
        torch.manual_seed(4)
        graphs.append(qpack.freeze(Mixed().eval(), dtype="int8", backend="onednn",
                                   example_inputs=[torch.randn(2, 4, 16, 16)], progress=False))
    for f in graphs:
        x = torch.randn(2, 4, 16, 16)
        with torch.no_grad():
            f(x)
        for kind in kinds:
            assert set(runs_on(f, kind)) == {"qpack"}, (kind, runs_on(f, kind))


def test_backends_list_qnnpacks_graph_ops():
    ops = qpack.backends()["qnnpack"]["graph_ops"]
    assert {"add", "maxpool2d", "avgpool2d", "global_avgpool", "activation:clamp", "activation:relu",
            "activation:sigmoid", "activation:hardswish"} <= set(ops)
    assert all(b["graph_ops"] == [] for name, b in qpack.backends().items() if name != "qnnpack")


def test_environment_switch_keeps_the_nodes_in_qpack():
    code = ("import torch, qpack\n"
            "from qpack.torch import graph as G\n"
            "import test_graph_qnnpack_ops as T\n"
            "f, calib = T.frozen('add_relu')\n"
            "T.check_model(f, calib[1])\n"
            "print(T.runs_on(f, 'add'))\n")
    env = dict(os.environ, QPACK_GRAPH_BACKEND_OPS="0")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd="/tmp")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['qpack']"


def test_bad_input_to_a_qnnpack_graph_gives_a_clear_error():
    f, calib = frozen("maxpool_2")
    handle = segment(f).graph()
    with pytest.raises(qpack.InvalidArgumentError, match="pooling window 2 is larger"):
        handle.run([np.zeros((1, 4, 1, 5), np.float32)], ["nchw"])
    with pytest.raises(qpack.InvalidArgumentError, match="in_channels"):
        handle.run([np.zeros((1, 3, 5, 5), np.float32)], ["nchw"])
    empty = handle.run([np.zeros((0, 4, 5, 5), np.float32)], ["nchw"])[0]
    assert empty.shape[0] == 0
    check_model(f, calib[0])
