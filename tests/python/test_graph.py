"""Frozen graphs: a frozen model's forward run by the core in one call.

Graph vs eager (fp32) and vs a per-edge int8 reference on small models of
every node kind, both backends; threads, changing sizes, bad inputs, close,
saving."""
import copy
import io
import pickle
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the graph tests freeze torch models")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import qpack  # noqa: E402
from qpack import _core  # noqa: E402
from qpack.torch import graph as G  # noqa: E402

from conftest import BACKENDS  # noqa: E402


def rel_err(a, b):
    return float((a - b).norm() / max(float(b.norm()), 1e-12))


def close(a, b, tol=1e-5):
    assert rel_err(a, b) < tol, rel_err(a, b)


def conv_bn(cin, cout, k=3, stride=1, groups=1, act=nn.ReLU6):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


def freeze_args(dtype, shape):
    """qpack.freeze keywords: {} for fp32; static int8 on the first backend, calibrated
    on three random batches of ``shape``."""
    if dtype is None:
        return {}
    return dict(dtype="int8", example_inputs=[torch.randn(*shape) for _ in range(3)], backend=BACKENDS[0])


def randomize_bn(model, types=(nn.BatchNorm2d,)):
    g = torch.Generator().manual_seed(7)
    for m in model.modules():
        if isinstance(m, types):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model


class Residual(nn.Module):
    """conv-bn-relu, conv-bn, + shortcut, relu (ResNet's basic block, shared ReLU)."""

    def __init__(self, c=8):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU()

    def forward(self, x):
        y = self.relu(self.b1(self.c1(x)))
        return self.relu(self.b2(self.c2(y)) + x)


class Inverted(nn.Module):
    """MobileNetV2's inverted residual with a max-pool stem and a mean head."""

    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 8, 3, 2)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.block = nn.Sequential(conv_bn(8, 24, 1), conv_bn(24, 24, 3, groups=24), conv_bn(24, 8, 1, act=None))
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(8, 5))

    def forward(self, x):
        y = self.pool(self.stem(x))
        y = y + self.block(y)
        return self.head(y.mean((2, 3)))


class Branches(nn.Module):
    """Concat of branches, avg pooling (count_include_pad both ways), unfoldable
    BatchNorm (conv -> relu -> bn), elementwise activations, adaptive pool, flatten."""

    def __init__(self, act):
        super().__init__()
        self.a = nn.Conv2d(4, 6, 1)
        self.b = nn.Conv2d(4, 5, 3, padding=1)
        self.act = act
        self.bn = nn.BatchNorm2d(11)
        self.avg = nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False)
        self.avg2 = nn.AvgPool2d(2, 2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(11, 3)

    def forward(self, x):
        y = torch.cat([F.relu(self.a(x)), self.b(x)], dim=1)
        y = self.bn(self.act(y))
        y = self.avg2(self.avg(y))
        return self.fc(torch.flatten(self.gap(y), 1))


ACTS = [nn.Hardswish(), nn.Sigmoid(), nn.GELU(), nn.SiLU(), nn.ReLU6(), nn.Hardtanh(-0.5, 0.5)]


def models():
    torch.manual_seed(0)
    out = [("residual", randomize_bn(Residual()).eval(), (2, 8, 9, 11)),
           ("inverted", randomize_bn(Inverted()).eval(), (1, 3, 32, 30))]
    out += [(f"branches-{type(a).__name__}", randomize_bn(Branches(a)).eval(), (2, 4, 13, 12)) for a in ACTS]
    return out


MODELS = models()


@pytest.mark.parametrize("name,model,shape", MODELS, ids=[m[0] for m in MODELS])
def test_fp32_graph_matches_eager(name, model, shape):
    x = torch.randn(shape)
    f = qpack.freeze(model)
    runner = G.runner_of(f)
    assert runner is not None, "the model should lower to one graph"
    with torch.no_grad():
        close(f(x), model(x))
        layers = qpack.freeze(model, graph=False)
        assert G.runner_of(layers) is None
        close(f(x), layers(x))
    assert runner.info()["runs"] >= 2
    assert "conv2d" in runner.report()
    # a channels_last input gives the same result
    with torch.no_grad():
        close(f(x.contiguous(memory_format=torch.channels_last)), model(x))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,model,shape", MODELS[:2] + MODELS[2:4], ids=[m[0] for m in MODELS[:4]])
def test_int8_graph_end_to_end(backend, name, model, shape):
    calib = [torch.randn(shape) for _ in range(4)]
    f = qpack.freeze(model, dtype="int8", example_inputs=calib, backend=backend)
    runner = G.runner_of(f)
    assert runner is not None
    values = runner._spec["values"]
    assert sum(v[0] == "u8" for v in values) >= len(values) - 2  # u8 between ops
    x = calib[0]
    with torch.no_grad():
        err = rel_err(f(x), model(x))
    assert err < 0.08, err
    for m in f.modules():
        if isinstance(m, (qpack.torch.FrozenConv2d, qpack.torch.FrozenLinear)):
            assert m.mode == "int8_static" and m.backend == backend


# ---- int8: every node kind within one quantum of the per-edge reference ---------------------

def quant(x, s, zp):
    return torch.clamp(torch.round(x / s) + zp, 0, 255)


def deq(q, s, zp):
    return (q - zp) * s


class One(nn.Module):
    def __init__(self, fn, *mods):
        super().__init__()
        self.mods = nn.ModuleList(mods)
        self.fn = fn

    def forward(self, x):
        return self.fn(self, x)


ONE_NODE = {
    "conv": (lambda s, x: s.mods[0](x), lambda: [nn.Conv2d(4, 6, 3, padding=1)]),
    "depthwise": (lambda s, x: s.mods[0](x), lambda: [nn.Conv2d(4, 4, 3, padding=1, groups=4)]),
    "add_relu": (lambda s, x: F.relu(s.mods[0](x) + x), lambda: [nn.Conv2d(4, 4, 1)]),
    "maxpool": (lambda s, x: s.mods[1](s.mods[0](x)), lambda: [nn.Conv2d(4, 4, 1), nn.MaxPool2d(3, 2, 1)]),
    "avgpool": (lambda s, x: s.mods[1](s.mods[0](x)), lambda: [nn.Conv2d(4, 4, 1), nn.AvgPool2d(3, 2, 1)]),
    "gap": (lambda s, x: s.mods[0](x).mean((2, 3)), lambda: [nn.Conv2d(4, 4, 1)]),
    "concat": (lambda s, x: torch.cat([s.mods[0](x), s.mods[1](x)], 1),
               lambda: [nn.Conv2d(4, 3, 1), nn.Conv2d(4, 2, 1)]),
    "hardswish": (lambda s, x: s.mods[1](s.mods[0](x)), lambda: [nn.Conv2d(4, 4, 1), nn.Hardswish()]),
    "sigmoid": (lambda s, x: torch.sigmoid(s.mods[0](x)), lambda: [nn.Conv2d(4, 4, 1)]),
    "tanh": (lambda s, x: s.mods[1](s.mods[0](x)) + torch.tanh(x).tanh(), lambda: [nn.Conv2d(4, 4, 1), nn.Tanh()]),
    "affine": (lambda s, x: s.mods[1](F.relu(s.mods[0](x))), lambda: [nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)]),
    "linear": (lambda s, x: s.mods[1](torch.flatten(s.mods[0](x), 1)), lambda: [nn.Conv2d(4, 2, 1), nn.Linear(50, 7)]),
    "channel_range": (lambda s, x: s.mods[1](s.mods[0](x)[:, 1:4]), lambda: [nn.Conv2d(4, 6, 1), nn.Conv2d(3, 4, 1)]),
}


def _act(name, lo, hi, v):
    return {None: lambda: v, "relu": lambda: F.relu(v), "clamp": lambda: torch.clamp(v, lo, hi),
            "hardswish": lambda: F.hardswish(v), "sigmoid": lambda: torch.sigmoid(v),
            "gelu": lambda: F.gelu(v), "silu": lambda: F.silu(v),
            "hardsigmoid": lambda: F.hardsigmoid(v), "leaky_relu": lambda: F.leaky_relu(v, lo),
            "tanh": lambda: torch.tanh(v)}[name]()


def _layer_act(a, v):
    if a is None:
        return v
    if a == "relu":
        return F.relu(v)
    if a == "relu6":
        return torch.clamp(v, 0, 6)
    return torch.clamp(v, a[1], a[2])


def per_edge_reference(f, x):
    """The graph's nodes run in PyTorch (float, NCHW) on dequantized inputs, each
    output requantized to its value's parameters: the reference every u8 value
    of the graph must be within one quantum of."""
    spec = G.runner_of(f)._spec
    layers = dict(f.named_modules())
    vals = spec["values"]
    env = {spec["inputs"][0]: x}

    def d(v):
        dt, s, zp = vals[v]
        return env[v] if dt == "f32" else deq(env[v], s, zp)

    for n in spec["nodes"]:
        k, ins, o = n["kind"], n["inputs"], n["output"]
        a = d(ins[0])
        if k == "quantize":
            env[o] = quant(a, vals[o][1], vals[o][2])
            continue
        if k == "dequantize":
            env[o] = a
            continue
        if k in ("conv2d", "linear"):
            layer = layers[n["layer"]]
            w, b = layer.dequantized_weight(), layer.unpack()[1]
            if k == "conv2d":
                sp = layer._spec
                conv = F.conv1d if a.dim() == 3 else F.conv2d
                r = conv(a, w, b, sp["stride"], sp["padding"], sp["dilation"], sp["groups"])
            elif n.get("per_pixel"):  # over the channels of a rank-4 value
                r = F.linear(a.movedim(1, -1), w, b).movedim(-1, 1)
            else:
                r = F.linear(a, w, b)
            r = _layer_act(layer.activation, r)
        elif k == "add":
            r = _act(n.get("activation"), n.get("act_min"), n.get("act_max"), a + d(ins[1]))
        elif k == "mul":
            r = a * d(ins[1])
        elif k == "activation":
            r = _act(n["activation"], n.get("act_min"), n.get("act_max"), a)
        elif k == "maxpool2d":
            p = n["padding"]
            r = F.max_pool2d(a, n["kernel"], n["stride"], (p[0], p[1]), ceil_mode=n.get("ceil_mode", False))
        elif k == "avgpool2d":
            p = n["padding"]
            r = F.avg_pool2d(a, n["kernel"], n["stride"], (p[0], p[1]), ceil_mode=n.get("ceil_mode", False),
                             count_include_pad=n.get("count_include_pad", True))
        elif k == "adaptive_avgpool2d":
            r = F.adaptive_avg_pool2d(a, n["kernel"])
        elif k == "prelu":
            r = F.prelu(a, torch.as_tensor(n["slopes"]))
        elif k in ("resize_nearest", "resize_bilinear"):
            how = dict(size=tuple(d(ins[1]).shape[-2:])) if len(ins) == 2 else \
                dict(size=tuple(n["size"])) if "size" in n else dict(scale_factor=tuple(n["scale"]))
            if k == "resize_bilinear":
                how["align_corners"] = n["align_corners"]
            r = F.interpolate(a, mode=k[len("resize_"):], **how)
        elif k == "global_avgpool":
            r = a.mean(tuple(range(2, a.dim())), keepdim=n.get("keepdim", True))
        elif k == "flatten":
            r = torch.flatten(a, 1)
        elif k == "transpose" and len(ins) == 2:  # tokens -> the image of the second input's H, W
            like = d(ins[1])
            r = a.transpose(1, 2).reshape(a.shape[0], a.shape[2], like.shape[2], like.shape[3])
        elif k == "transpose" and a.dim() == 4:  # an image's tokens
            r = a.flatten(2).transpose(1, 2)
        elif k == "transpose":
            r = a.transpose(1, 2)
        elif k == "depth_to_space" and n.get("ceil_mode"):
            r = F.pixel_shuffle(a, n["kernel"][0])
        elif k == "depth_to_space":
            r = qpack.torch.modules.blocks_to_space(a, *n["kernel"])
        elif k == "channels":
            r = G.channel_part(a, n["kernel"][0], n["kernel"][1], n["stride"][0])
        elif k == "pad":
            t, lf, b, rt = n["padding"]
            r = F.pad(a, (lf, rt, t, b), value=n.get("act_min", 0.0))
        elif k == "channel_range":
            r = a[:, n["kernel"][0]:n["kernel"][0] + n["kernel"][1]]
        elif k == "concat":
            r = torch.cat([d(v) for v in ins], 1)
        elif k == "layer_norm" and "groups" in n:
            r = F.group_norm(a, n["groups"], torch.as_tensor(n["weight"]), torch.as_tensor(n["bias"]), n["eps"])
        elif k == "layer_norm":
            w, b = torch.as_tensor(n["weight"]), torch.as_tensor(n["bias"])
            dim = 1 if n.get("dim", -1) == 1 else -1
            r = F.layer_norm(a.movedim(dim, -1), (w.numel(),), w, b, n["eps"]).movedim(-1, dim)
        elif k == "attention":
            h, dq, dv, at = n["heads"], n["head_dim"], n.get("value_dim", n["head_dim"]), n["offsets"]
            step = n.get("head_strides", (dq, dv))
            q, kk, v = (d(i) for i in ins)

            def heads(t, start, w, s):  # head i: t[..., start + i s:][:w]
                return torch.stack([t[..., start + i * s:start + i * s + w] for i in range(h)], 1)
            mask = None if n.get("mask") is None else torch.as_tensor(n["mask"])
            kv_step = (0, 0) if n.get("multi_query") else step  # one k and v head for all
            r = F.scaled_dot_product_attention(heads(q, at[0], dq, step[0]), heads(kk, at[1], dq, kv_step[0]),
                                               heads(v, at[2], dv, kv_step[1]), attn_mask=mask,
                                               is_causal=n.get("causal", False), scale=n["scale"])
            r = r.transpose(1, 2).flatten(2)
        elif k == "permute_rows":  # rows of C values in the permutation's order, block by block
            c = a.shape[1] if a.dim() == 4 else a.shape[-1]
            rows, (kh, kw) = a.numel() // c, n["kernel"]
            shape = (rows // kh, kh, c) if kw == 0 else (rows // (kh * kw), c, kh, kw)
            r = G.permute_rows(a, torch.as_tensor(n["rows"]).long(), shape)
        elif k == "constant":  # the table over the input's batch
            t = torch.as_tensor(n["table"])
            r = t.expand((a.shape[0],) + tuple(t.shape))
        elif k == "affine":
            sh = (-1,) if n.get("dim", 1) == -1 else (1, -1) + (1,) * (a.dim() - 2)
            r = a * torch.as_tensor(n["scale"]).reshape(sh) + torch.as_tensor(n["shift"]).reshape(sh)
        else:
            raise AssertionError(k)
        # (an f32 value inside: reduce_range's clamp of a graph input before its quantize)
        env[o] = r if vals[o][0] == "f32" else quant(r, vals[o][1], vals[o][2])
    return env[spec["outputs"][0]]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", sorted(ONE_NODE))
def test_int8_node_within_one_quantum(backend, kind):
    fn, mods = ONE_NODE[kind]
    torch.manual_seed(1)
    model = randomize_bn(One(fn, *mods())).eval()
    calib = [torch.randn(2, 4, 5, 5) for _ in range(3)]
    f = qpack.freeze(model, dtype="int8", example_inputs=calib, backend=backend)
    runner = G.runner_of(f)
    assert runner is not None
    x = calib[1]
    with torch.no_grad():
        ref = per_edge_reference(f, x)
        y = f(x)
    out_s = runner._spec["values"][runner._spec["nodes"][-1]["inputs"][0]][1]
    # the last op's output within one quantum; ops before it keep their own
    # one-quantum error, which one more op can carry into at most one more
    assert float((y - ref).abs().max()) <= 2 * out_s + 1e-6, (kind, float((y - ref).abs().max()), out_s)


# ---- threads, sizes, bad input, close, saving --------------------------------------------------

def concurrent_errors(f, xs, refs, threads, rounds):
    """f run from `threads` Python threads at once, `rounds` calls each over xs in
    turn: "mismatch" for each result unequal to its ref, and each exception raised."""
    errors = []

    def work(t):
        try:
            for i in range(rounds):
                k = (t + i) % len(xs)
                with torch.no_grad():
                    if not torch.equal(f(xs[k]), refs[k]):
                        errors.append("mismatch")
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return errors


def test_many_threads_share_one_graph():
    model = randomize_bn(Inverted()).eval()
    f = qpack.freeze(model)
    xs = [torch.randn(1, 3, 32, 30) for _ in range(4)]
    with torch.no_grad():
        refs = [f(x) for x in xs]
    assert not concurrent_errors(f, xs, refs, threads=6, rounds=30)


def test_changing_input_sizes_plan_once_each():
    model = randomize_bn(Inverted()).eval()
    f = qpack.freeze(model)
    runner = G.runner_of(f)
    shapes = [(1, 3, 32, 30), (2, 3, 17, 21), (1, 3, 32, 30), (3, 3, 8, 8)]
    with torch.no_grad():
        for s in shapes:
            x = torch.randn(s)
            close(f(x), model(x))
    assert runner.info()["plans_built"] == 3


def test_bad_inputs_give_clear_errors_and_leave_the_graph_usable():
    model = randomize_bn(Residual()).eval()
    f = qpack.freeze(model)
    x = torch.randn(1, 8, 6, 6)
    with torch.no_grad():
        good = f(x)
        with pytest.raises(qpack.InvalidArgumentError, match="channels"):
            f(torch.randn(1, 5, 6, 6))
        with pytest.raises(qpack.InvalidTypeError, match="float32"):
            f(x.double())
        assert torch.equal(f(x), good)
    handle = G.runner_of(f)._graph()
    arr = x.numpy()
    with pytest.raises(qpack.InvalidArgumentError, match="takes 1 input"):
        handle.run([arr, arr], ["nchw", "nchw"])
    with pytest.raises(qpack.InvalidTypeError, match="float32 or uint8"):
        handle.run([arr.astype(np.float64)], ["nchw"])
    with pytest.raises(qpack.InvalidArgumentError, match="in_channels"):
        handle.run([np.zeros((1, 3, 6, 6), np.float32)], ["nchw"])
    with pytest.raises(qpack.InvalidTypeError, match="input 0 must be f32"):
        handle.run([np.zeros((1, 8, 6, 6), np.uint8)], ["nchw"])
    np.testing.assert_array_equal(handle.run([arr], ["nchw"])[0].transpose(0, 3, 1, 2), good.numpy())


GRAPH_ERRORS = [
    # (values, nodes, inputs, outputs, exception, fragment)
    ([("f32", 0, 0)], [], [0], [1], qpack.InvalidArgumentError, "output value 1 is outside"),
    ([("f32", 0, 0), ("f32", 0, 0)], [dict(kind="activation", inputs=[1], output=1, activation="relu")],
     [0], [1], qpack.InvalidArgumentError, "before any node produces it"),
    ([("f32", 0, 0), ("f32", 0, 0)], [dict(kind="activation", inputs=[0], output=0, activation="relu")],
     [0], [0], qpack.InvalidArgumentError, "already produced"),
    ([("f32", 0, 0), ("u8", 0.1, 3)], [dict(kind="activation", inputs=[0], output=1, activation="relu")],
     [0], [1], qpack.InvalidTypeError, "writes f32"),
    ([("f32", 0, 0), ("u8", 0.0, 3)], [dict(kind="quantize", inputs=[0], output=1)],
     [0], [1], qpack.InvalidArgumentError, "valid scale"),
    ([("f32", 0, 0), ("f32", 0, 0)], [dict(kind="activation", inputs=[0], output=1, activation="clamp",
                                           act_min=1.0, act_max=0.0)],
     [0], [1], qpack.InvalidArgumentError, "act_min < act_max"),
    ([("f32", 0, 0), ("f32", 0, 0)], [dict(kind="conv2d", inputs=[0], output=1)],
     [0], [1], qpack.InvalidArgumentError, "has no conv"),
    ([("f32", 0, 0), ("f32", 0, 0)], [dict(kind="maxpool2d", inputs=[0], output=1, kernel=(2, 2),
                                           stride=(1, 1), padding=(2, 0, 0, 0))],
     [0], [1], qpack.InvalidArgumentError, "padding"),
    ([("u8", 0.1, 0), ("u8", 0.2, 0)], [dict(kind="maxpool2d", inputs=[0], output=1, kernel=(2, 2),
                                             stride=(2, 2))],
     [0], [1], qpack.InvalidArgumentError, "keeps its input's u8 parameters"),
    ([("f32", 0, 0), ("f32", 0, 0)], [dict(kind="add", inputs=[0], output=1)],
     [0], [1], qpack.InvalidArgumentError, "takes 2 input"),
    ([("f32", 0, 0), ("f32", 0, 0)], [dict(kind="channel_range", inputs=[0], output=1, kernel=(2, 0))],
     [0], [1], qpack.InvalidArgumentError, "count in"),
    ([("u8", 0.1, 0), ("u8", 0.2, 0)], [dict(kind="channel_range", inputs=[0], output=1, kernel=(0, 1))],
     [0], [1], qpack.InvalidArgumentError, "keeps its input's u8 parameters"),
]


@pytest.mark.parametrize("values,nodes,inputs,outputs,exc,fragment", GRAPH_ERRORS)
def test_graph_create_rejects(values, nodes, inputs, outputs, exc, fragment):
    with pytest.raises(exc, match=fragment):
        _core.GraphHandle(values, nodes, inputs, outputs)


def test_plan_errors_name_the_node():
    g = _core.GraphHandle([("f32", 0, 0), ("f32", 0, 0), ("f32", 0, 0)],
                          [dict(kind="activation", inputs=[0], output=1, activation="relu"),
                           dict(kind="add", inputs=[0, 1], output=2)], [0], [2])
    y = g.run([np.ones((2, 3), np.float32)], ["nchw"])[0]
    np.testing.assert_array_equal(y, np.full((2, 3), 2.0, np.float32))
    with pytest.raises(qpack.InvalidArgumentError, match="maxpool2d takes a rank-4"):
        _core.GraphHandle([("f32", 0, 0), ("f32", 0, 0)],
                          [dict(kind="maxpool2d", inputs=[0], output=1, kernel=(2, 2), stride=(2, 2))],
                          [0], [1]).run([np.ones((2, 3), np.float32)], ["nchw"])


def test_close_while_running():
    model = randomize_bn(Inverted()).eval()
    f = qpack.freeze(model)
    handle = G.runner_of(f)._graph()
    x = torch.randn(1, 3, 32, 30).numpy()
    ref = handle.run([x], ["nchw"])[0]
    stop, seen = threading.Event(), []

    def work():
        while not stop.is_set():
            try:
                out = handle.run([x], ["nchw"])[0]
                seen.append(np.array_equal(out, ref))
            except qpack.ClosedError:
                seen.append("closed")
                return

    t = threading.Thread(target=work)
    t.start()
    handle.close()
    t.join(5)
    stop.set()
    assert seen and seen[-1] == "closed" and all(s is True for s in seen[:-1])
    assert handle.info()["closed"]
    with pytest.raises(qpack.ClosedError):
        handle.run([x], ["nchw"])
    # the layers' packed objects are untouched: a new graph over them runs
    G.runner_of(f)._handle = None
    with torch.no_grad():
        close(f(torch.from_numpy(x)), model(torch.from_numpy(x)))


def test_saving_unfreeze_and_reload_keep_working():
    model = randomize_bn(Inverted()).eval()
    f = qpack.freeze(model, retain=False)
    x = torch.randn(1, 3, 32, 30)
    with torch.no_grad():
        ref = f(x)
        for g in (pickle.loads(pickle.dumps(f)), copy.deepcopy(f)):
            assert G.runner_of(g) is not None and G.runner_of(g) is not G.runner_of(f)
            close(g(x), ref, 1e-6)
        buf = io.BytesIO()
        torch.save(f, buf)
        buf.seek(0)
        close(torch.load(buf, weights_only=False)(x), ref, 1e-6)
        u = qpack.unfreeze(f)
        assert G.runner_of(u) is None
        close(u(x), ref)
        # load_state_dict re-packs the layers: the graph follows
        other = randomize_bn(Inverted()).eval()
        f.load_state_dict(qpack.freeze(other).state_dict())
        close(f(x), other(x))


def test_graph_report_and_layer_fallback():
    model = randomize_bn(Inverted()).eval()
    f = qpack.freeze(model, dtype="int8", example_inputs=[torch.randn(1, 3, 32, 30)], backend=BACKENDS[0],
                     progress=False)
    rep = qpack.graph_report(f)
    lines = rep.splitlines()
    assert lines[0].startswith("quantize") and "u8 scale=" in lines[0]
    assert any("+bn +relu6" in line and "packed=" in line for line in lines)
    assert "workspace" in lines[-1] and "packed" in lines[-1]
    assert qpack.graph_report(qpack.freeze(model, graph=False)) is None
    # inputs the graph cannot plan (rank 3) run the layers one by one, which
    # fail as the model's own code does (x.mean((2, 3)) on a rank-3 tensor)
    with pytest.raises(IndexError):
        f(torch.randn(3, 32, 30))


class RopeLike(nn.Module):
    """A Linear over the last dim of a rank-4 value, times halves of a buffer split in
    PyTorch (EVA-02's rotary embedding): the segment's graph cannot plan a rank-4 linear,
    so it runs in PyTorch."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("emb", torch.randn(5, 16))

    def forward(self, x):
        sin, cos = self.emb.tensor_split(2, -1)
        y = self.lin(x)
        return torch.relu(y * cos + y * sin)


def test_a_segment_refused_once_runs_in_pytorch_at_once_for_those_inputs(monkeypatch):
    """A segment whose graph refuses its inputs runs its ops in PyTorch (eager's values) and,
    for inputs of that shape, dtype and strides, goes there at once from then on (not
    converted and planned to be refused again at every call); other inputs try the graph."""
    torch.manual_seed(3)
    model = RopeLike().eval()
    f = qpack.freeze(model, progress=False)
    (seg,) = G.runner_of(f)._segments
    tries = []
    real = G.Segment.run_arrays
    monkeypatch.setattr(G.Segment, "run_arrays", lambda self, arrays: tries.append(1) or real(self, arrays))
    x = torch.randn(2, 3, 5, 8)
    with torch.no_grad():
        for _ in range(3):
            close(f(x), model(x))
        assert len(tries) == 1 and seg.fallback is not None and len(seg.refused) == 1
        close(f(x[:1]), model(x[:1]))  # another shape: the graph is asked once
    assert len(tries) == 2 and len(seg.refused) == 2


class WithCustomOp(nn.Module):
    """Supported ops around ops the core does not run (torch.roll, LayerNorm, a
    Python function): the graph splits into segments with PyTorch between."""

    def __init__(self):
        super().__init__()
        self.a = conv_bn(3, 8, 3)
        self.b = conv_bn(8, 8, 3)
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = self.a(x)
        y = torch.roll(y, 1, dims=3) + y
        y = self.b(y)
        y = self.norm(y.mean((2, 3)))
        return self.fc(y)


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_unsupported_ops_split_the_graph_into_segments(dtype):
    model = randomize_bn(WithCustomOp()).eval()
    x = torch.randn(2, 3, 10, 9)
    kw = freeze_args(dtype, x.shape)
    f = qpack.freeze(model, **kw)
    runner = G.runner_of(f)
    assert runner is not None and runner.num_segments >= 2
    rep = qpack.graph_report(f)
    assert rep.count("segment ") == runner.num_segments
    with torch.no_grad():
        err = rel_err(f(x), model(x))
    assert err < (0.08 if dtype else 1e-5), err
    # saving and copying rebuild the segments
    g = pickle.loads(pickle.dumps(f))
    with torch.no_grad():
        close(g(x), f(x), 1e-6)
    assert G.runner_of(g).num_segments == runner.num_segments


class SqueezeExcite(nn.Module):
    """MobileNetV3/EfficientNet blocks: Hardswish/SiLU, squeeze-excitation
    (global pool, 1x1 convs, Hardsigmoid or Sigmoid, channel-wise mul in either
    operand order), elementwise mul of equal shapes."""

    def __init__(self, act, gate):
        super().__init__()
        self.conv = conv_bn(3, 16, 3, act=act)
        self.fc1, self.fc2 = nn.Conv2d(16, 4, 1), nn.Conv2d(4, 16, 1)
        self.gate = gate
        self.out = nn.Conv2d(16, 8, 1)

    def forward(self, x):
        y = self.conv(x)
        s = self.gate(self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(y, 1)))))
        y = s * y + y * s
        y = self.out(y) * torch.sigmoid(self.out(y))
        return torch.flatten(F.adaptive_avg_pool2d(y, 1), 1)


@pytest.mark.parametrize("act,gate", [(nn.Hardswish, nn.Hardsigmoid()), (nn.SiLU, nn.Sigmoid())])
def test_squeeze_excitation_runs_as_one_graph(act, gate):
    model = randomize_bn(SqueezeExcite(act, gate)).eval()
    x = torch.randn(2, 3, 12, 10)
    f = qpack.freeze(model)
    runner = G.runner_of(f)
    assert runner is not None and runner.num_segments == 1 and "mul" in qpack.graph_report(f)
    with torch.no_grad():
        close(f(x), model(x))
    calib = [torch.randn(2, 3, 12, 10) for _ in range(3)]
    q = qpack.freeze(model, dtype="int8", example_inputs=calib, backend=BACKENDS[0])
    assert G.runner_of(q).num_segments == 1
    with torch.no_grad():
        assert rel_err(q(x), model(x)) < 0.08
        ref = per_edge_reference(q, x)
        out_s = G.runner_of(q)._spec["values"][G.runner_of(q)._spec["nodes"][-1]["inputs"][0]][1]
        assert float((q(x) - ref).abs().max()) <= 2 * out_s + 1e-6


class _AoNet(nn.Module):
    """An eager-mode torch.ao model: QuantStub, conv+ReLU, max pool, conv,
    quantized add (FloatFunctional), ReLU, global pool, flatten, DeQuantStub."""

    def __init__(self):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.c1, self.r1 = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.ff = torch.ao.nn.quantized.FloatFunctional()
        self.r2 = nn.ReLU()
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        y = self.pool(self.r1(self.c1(self.quant(x))))
        y = self.r2(self.ff.add(self.c2(y), y))
        return self.dequant(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


def test_torch_ao_eager_model_runs_as_one_graph_on_its_own_qparams():
    torch.backends.quantized.engine = "x86"
    torch.manual_seed(3)
    model = _AoNet().eval()
    model.qconfig = torch.ao.quantization.get_default_qconfig("x86")
    torch.ao.quantization.fuse_modules(model, [["c1", "r1"]], inplace=True)
    torch.ao.quantization.prepare(model, inplace=True)
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn(2, 3, 12, 12))
    torch.ao.quantization.convert(model, inplace=True)
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        ref = model(x)
    out_scale = float(model.ff.scale)
    for backend in BACKENDS:
        f = qpack.freeze(model, backend=backend)
        runner = G.runner_of(f)
        assert runner is not None and runner.num_segments == 1, backend
        spec = runner._spec
        dtypes = [v[0] for v in spec["values"]]
        assert dtypes[spec["inputs"][0]] == "f32" and dtypes[spec["outputs"][0]] == "f32"
        assert dtypes.count("u8") >= 5
        rep = qpack.graph_report(f)
        assert f"scale={out_scale:.6g}" in rep  # the model's own add qparams
        with torch.no_grad():
            y = f(x)
            layers = qpack.freeze(model, backend=backend, graph=False)(x)
        # the graph's ops against PyTorch's quantized kernels: within two quanta of the output
        assert float((y - ref).abs().max()) <= 2.01 * out_scale, backend
        assert float((y - layers).abs().max()) <= 2.01 * out_scale, backend


class FunctionalNet(nn.Module):
    """Functional spellings: F.max_pool2d, F.avg_pool2d, F.dropout in eval,
    torch.clamp / Tensor.clamp, and a dict output."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 6, 3, padding=1)
        self.b = nn.Conv2d(6, 6, 1)

    def forward(self, x):
        y = F.max_pool2d(torch.clamp(self.a(x), 0, 6), 2)
        y = F.dropout(y, 0.3, self.training)
        y = F.avg_pool2d(self.b(y).clamp(min=0), 2, ceil_mode=True)
        return {"features": y, "pooled": y.mean((2, 3))}


def test_functional_spellings_and_dict_outputs():
    model = FunctionalNet().eval()
    x = torch.randn(2, 3, 13, 11)
    f = qpack.freeze(model)
    runner = G.runner_of(f)
    assert runner is not None and runner.num_segments == 1
    assert "maxpool2d" in qpack.graph_report(f) and "avgpool2d" in qpack.graph_report(f)
    with torch.no_grad():
        y, ref = f(x), model(x)
    assert set(y) == {"features", "pooled"}
    for k in y:
        close(y[k], ref[k])


class Speech1d(nn.Module):
    """A 1-D convolution stack (speech-style): Conv1d-BN-ReLU, an unfoldable
    BatchNorm1d, a residual add, adaptive average pooling to one step, a head."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv1d(20, 32, 5, padding=2), nn.BatchNorm1d(32)
        self.c2 = nn.Conv1d(32, 32, 3, padding=1, groups=4)
        self.bn = nn.BatchNorm1d(32)
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.fc = nn.Linear(32, 6)

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.bn(F.relu(self.c2(y))) + y
        return self.fc(torch.flatten(self.pool(y), 1))


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_conv1d_models_run_as_one_graph(dtype):
    torch.manual_seed(5)
    model = Speech1d().eval()
    for bn in (model.b1, model.bn):
        bn.running_mean.uniform_(-0.2, 0.2)
        bn.running_var.uniform_(0.5, 1.5)
    x = torch.randn(3, 20, 50)
    kw = freeze_args(dtype, x.shape)
    f = qpack.freeze(model, **kw)
    runner = G.runner_of(f)
    assert runner is not None and runner.num_segments == 1
    with torch.no_grad():
        err = rel_err(f(x), model(x))
        assert err < (0.08 if dtype else 1e-5), err
        if dtype:
            ref = per_edge_reference(f, x)
            out_s = runner._spec["values"][runner._spec["nodes"][-1]["inputs"][0]][1]
            assert float((f(x) - ref).abs().max()) <= 2 * out_s + 1e-6
        # other lengths plan again
        x2 = torch.randn(2, 20, 31)
        close(f(x2), model(x2), 0.08 if dtype else 1e-5)


class ConvChain1d(nn.Module):
    """1-D convolutions back to back (dense, depthwise, pointwise), activations and a
    residual add between them: the core holds those values channels-last; the chain's
    end is a graph output, and a value also read by a mean stays row-major."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(12, 48, 5, padding=2)
        self.dw = nn.Conv1d(48, 48, 5, padding=2, groups=48)
        self.pw = nn.Conv1d(48, 48, 1)
        self.c2 = nn.Conv1d(48, 24, 3, padding=1)

    def forward(self, x):
        y = F.relu(self.c1(x))
        z = F.relu(self.pw(F.relu(self.dw(y)))) + y
        return self.c2(z), y.mean(2)


def one_graph_matches(model, x, dtype, backend, graph_input=None):
    """model frozen (fp32, or int8 on backend) as one graph: its outputs against eager,
    and in int8 the first one within a quantum of the per-edge reference (fed
    ``graph_input``, what the graph's input is, x by default). Returns the frozen model."""
    if dtype is None and backend != BACKENDS[0]:
        pytest.skip("fp32 graphs run on oneDNN")
    kw = dict(freeze_args(dtype, x.shape), backend=backend) if dtype else {}
    f = qpack.freeze(model, progress=False, **kw)
    runner = G.runner_of(f)
    assert runner is not None and runner.num_segments == 1
    with torch.no_grad():
        got, ref = f(x), model(x)
        for g, r in zip(got, ref):
            assert g.is_contiguous() and g.shape == r.shape
            assert rel_err(g, r) < (0.08 if dtype else 1e-5), rel_err(g, r)
        if dtype:
            want = per_edge_reference(f, x if graph_input is None else graph_input)  # the first output's
            spec = runner._spec
            last = next(n for n in spec["nodes"] if n["output"] == spec["outputs"][0])  # its dequantize
            assert float((got[0] - want).abs().max()) <= 2 * spec["values"][last["inputs"][0]][1] + 1e-6
    return f


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [None, "int8"])
def test_conv1d_chains_match_eager_and_the_per_edge_reference(dtype, backend):
    torch.manual_seed(6)
    model = ConvChain1d().eval()
    f = one_graph_matches(model, torch.randn(2, 12, 37), dtype, backend)
    # the plan holds values between convolutions channels-last, and the report says so;
    # y (which the mean also reads) stays row-major, and with it what the add ties to it
    # (pw's output); the depthwise's output and c2's (a graph output) are NLC
    report = qpack.graph_report(f)
    assert " NLC " in report and " row-major " in report, report
    layouts = G.runner_of(f)._graph().value_layouts()
    conv_outs = [n["output"] for n in G.runner_of(f)._spec["nodes"] if n["kind"] == "conv2d"]
    assert [layouts[v] for v in conv_outs] == ["row-major", "NLC", "row-major", "NLC"], layouts
    with torch.no_grad():
        x2 = torch.randn(1, 12, 64)  # another length: planned again
        for g, r in zip(f(x2), model(x2)):
            assert rel_err(g, r) < (0.08 if dtype else 1e-5)


class ConformerConv(nn.Module):
    """Tokens [N, T, D] transposed into a Conv1d chain and back (a Conformer's
    convolution module), then a Linear per step; and a Conv1d's output transposed
    for a Linear (an acoustic model's head)."""

    def __init__(self):
        super().__init__()
        self.pw1, self.dw = nn.Conv1d(16, 32, 1), nn.Conv1d(32, 32, 7, padding=3, groups=32)
        self.pw2, self.fc, self.head = nn.Conv1d(32, 16, 1), nn.Linear(16, 5), nn.Linear(16, 3)

    def forward(self, x):
        y = self.pw2(F.silu(self.dw(F.relu(self.pw1(x.transpose(1, 2))))))
        z = self.fc(F.relu(y.permute(0, 2, 1)))
        return z, self.head(y.transpose(-1, -2)), z.transpose(1, 2)  # (a row-major value transposed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [None, "int8"])
def test_rank3_transposes_run_in_the_graph(dtype, backend, tmp_path):
    """x.transpose(1, 2) / permute(0, 2, 1) of rank-3 values are transpose nodes: a
    copy or a tiled transpose by the layouts the core holds its values in; one graph,
    eager's values (int8: within a quantum of the per-edge reference), saved and loaded."""
    torch.manual_seed(7)
    model = ConformerConv().eval()
    x = torch.randn(2, 23, 16)
    # (the input's transpose stays PyTorch's: the trace does not know the input's rank)
    f = one_graph_matches(model, x, dtype, backend, graph_input=x.transpose(1, 2))
    assert [n["kind"] for n in G.runner_of(f)._spec["nodes"]].count("transpose") == 3
    with torch.no_grad():
        got = f(x)
        path = tmp_path / "m.qpk"
        qpack.save(f, str(path))
        for g, r in zip(qpack.load(str(path))(x), got):
            assert torch.equal(g, r)


class SharedHead(nn.Module):
    """One convolution applied to two feature maps of different ranges (a detection
    head over pyramid levels)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, 2, 1)
        self.head = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        p1 = F.relu(self.a(x))
        p2 = F.relu(self.b(p1)) * 3
        return self.head(p1), self.head(p2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_layer_called_twice_is_one_int8_layer_over_both_ranges(backend):
    """Its static int8 twin quantizes both calls: the ranges of what it reads, and of
    what it makes, united (before, the graph could not hold its two output qparams and
    the whole model ran layer by layer)."""
    torch.manual_seed(8)
    model = SharedHead().eval()
    x = torch.randn(1, 3, 32, 32)
    f = qpack.freeze(model, progress=False, dtype="int8", backend=backend,
                     example_inputs=[torch.randn(1, 3, 32, 32) for _ in range(4)])
    runner = G.runner_of(f)
    assert runner is not None and runner.num_segments == 1
    spec = runner._spec
    heads = [n for n in spec["nodes"] if n.get("layer") == "head"]
    assert len(heads) == 2 and spec["values"][heads[0]["output"]] == spec["values"][heads[1]["output"]]
    with torch.no_grad():
        for g, r in zip(f(x), model(x)):
            assert rel_err(g, r) < 0.05, rel_err(g, r)


class BigConcat(nn.Module):
    """A concat whose output passes 8 MB (written with streaming stores), of runs of
    64 and 31 floats a pixel (aligned to 16 bytes and not), and a small one."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Conv2d(3, 64, 1), nn.Conv2d(3, 31, 1), nn.Conv2d(3, 5, 1)

    def forward(self, x):
        a, b = F.relu(self.a(x)), self.b(x)
        return torch.cat([a, b, x], 1), torch.cat([self.c(x), x], 1)


def test_large_concats_match_eager():
    torch.manual_seed(9)
    model = BigConcat().eval()
    x = torch.randn(1, 3, 200, 180)
    f = qpack.freeze(model, progress=False)
    assert G.runner_of(f).num_segments == 1
    with torch.no_grad():
        for g, r in zip(f(x), model(x)):
            assert rel_err(g, r) < 1e-6
            assert torch.equal(g[:, -3:], x)  # the input's channels copied exactly


class UpNet(nn.Module):
    """A U-Net's decoder: ConvTranspose2d upsampling whose stride is its kernel (2x2 / 2,
    and a rectangular 2x3 / (2, 3) without bias), concatenated with the skip; and one
    that overlaps (3x3 / 2, padding 1), which stays PyTorch's."""

    def __init__(self):
        super().__init__()
        self.d = nn.Conv2d(4, 16, 3, 2, 1)
        self.up = nn.ConvTranspose2d(16, 8, 2, 2)
        self.fuse = nn.Conv2d(12, 6, 3, padding=1)
        self.wide = nn.ConvTranspose2d(6, 5, (2, 3), (2, 3), bias=False)
        self.overlap = nn.ConvTranspose2d(6, 3, 3, 2, 1)

    def forward(self, x):
        y = F.relu(self.fuse(torch.cat([self.up(F.relu(self.d(x))), x], 1)))
        return self.wide(y), self.overlap(y)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [None, "int8"])
def test_conv_transpose_with_stride_equal_to_kernel_is_a_conv_and_depth_to_space(dtype, backend, tmp_path):
    torch.manual_seed(10)
    model = UpNet().eval()
    x = torch.randn(2, 4, 10, 12)
    kw = dict(freeze_args(dtype, x.shape), backend=backend) if dtype else {}
    if dtype is None and backend != BACKENDS[0]:
        pytest.skip("fp32 graphs run on oneDNN")
    f = qpack.freeze(model, progress=False, **kw)
    assert type(f.up) is qpack.torch.FrozenConvTranspose2d and type(f.wide) is qpack.torch.FrozenConvTranspose2d
    assert type(f.overlap) is nn.ConvTranspose2d  # overlapping windows: PyTorch's
    runner = G.runner_of(f)
    kinds = [n["kind"] for seg in runner._segments for n in seg.spec["nodes"]]
    assert kinds.count("depth_to_space") == 2, kinds
    with torch.no_grad():
        got, ref = f(x), model(x)
        for g, r in zip(got, ref):
            assert rel_err(g, r) < (0.08 if dtype else 1e-5), rel_err(g, r)
        if dtype is None:
            back = qpack.unfreeze(f)
            assert type(back.up) is nn.ConvTranspose2d and torch.equal(back.up.weight, model.up.weight)
            assert torch.equal(back.up.bias, model.up.bias) and back.wide.bias is None
            for g, r in zip(back(x), ref):
                assert rel_err(g, r) < 1e-6
        path = tmp_path / "m.qpk"
        qpack.save(f, str(path))
        for g, r in zip(qpack.load(str(path))(x), got):
            assert torch.equal(g, r)


class SubPixel(nn.Module):
    """ESPCN's sub-pixel upsampling: convolutions to 3 r^2 channels, nn.PixelShuffle(r) (and
    F.pixel_shuffle), then a convolution on the upscaled image."""

    def __init__(self, r=3):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 16, 5, padding=2), nn.Conv2d(16, 3 * r * r, 3, padding=1)
        self.shuffle, self.c = nn.PixelShuffle(r), nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = self.b(torch.tanh(self.a(x)))  # ESPCN's activation
        return self.c(self.shuffle(y)), F.pixel_shuffle(y, 3)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [None, "int8"])
def test_pixel_shuffle_is_a_depth_to_space_node(dtype, backend, tmp_path):
    """PyTorch's channel order (c r r + a r + b): one graph, eager's values (int8: within a
    quantum of the per-edge reference), saved and loaded."""
    torch.manual_seed(11)
    model = SubPixel().eval()
    x = torch.randn(2, 3, 9, 7)
    f = one_graph_matches(model, x, dtype, backend)
    assert [n["kind"] for n in G.runner_of(f)._spec["nodes"]].count("depth_to_space") == 2
    path = tmp_path / "m.qpk"
    qpack.save(f, str(path))
    with torch.no_grad():
        for g, r in zip(qpack.load(str(path))(x), f(x)):
            assert torch.equal(g, r)


def test_depth_to_space_node_within_one_quantum_of_its_reference():
    """The node alone on u8 (qparams kept: the same bytes moved) and f32 against blocks_to_space."""
    x = torch.rand(2, 2 * 3 * 5, 4, 3)
    g = _core.GraphHandle([("f32", 0.0, 0), ("f32", 0.0, 0)], [dict(kind="depth_to_space", inputs=[0], output=1,
                                                                     kernel=(2, 3))], [0], [1])
    y = torch.from_numpy(g.run([x.numpy()], ["nchw"], "nchw")[0])
    assert torch.equal(y, qpack.torch.modules.blocks_to_space(x, 2, 3))
    with pytest.raises(qpack.InvalidArgumentError, match="divide into kernel_h x kernel_w blocks"):
        g.run([torch.rand(1, 7, 2, 2).numpy()], ["nchw"], "nchw")
    with pytest.raises(qpack.InvalidArgumentError, match="block sizes"):
        _core.GraphHandle([("f32", 0.0, 0), ("f32", 0.0, 0)], [dict(kind="depth_to_space", inputs=[0], output=1,
                                                                     kernel=(0, 2))], [0], [1])
    assert torch.equal(torch.from_numpy(g.run([x.numpy()], ["nchw"], "nchw")[0]), y)  # still usable
    for dtype, t in (("f32", x), ("u8", (x * 255).to(torch.uint8))):  # pixel_shuffle's order (ceil_mode)
        v = [(dtype, 0.02, 3), (dtype, 0.02, 3)]
        ps = _core.GraphHandle(v, [dict(kind="depth_to_space", inputs=[0], output=1, kernel=(2, 2), ceil_mode=True)],
                               [0], [1])
        t4 = t[:, :12].contiguous()
        assert torch.equal(torch.from_numpy(ps.run([t4.numpy()], ["nchw"], "nchw")[0]), F.pixel_shuffle(t4, 2))


def test_negative_mean_dims_stay_in_pytorch():
    # (-2, -1) of a rank-3 value are dims (1, 2): not the graph's spatial mean
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv1d(4, 4, 3)

        def forward(self, x):
            return self.c(x).mean((-2, -1))

    model = M().eval()
    x = torch.randn(2, 4, 9)
    f = qpack.freeze(model)
    assert "global_avgpool" not in qpack.graph_report(f)
    with torch.no_grad():
        close(f(x), model(x))


def test_a_submodule_named_graph_warns_and_runs_layer_by_layer():
    """fx cannot hold a submodule called `graph` in a GraphModule: the freeze
    says so instead of silently running layer by layer."""

    class Named(nn.Module):
        def __init__(self):
            super().__init__()
            self.graph = nn.Conv2d(3, 4, 3)
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(self.graph(x))

    model = Named().eval()
    with pytest.warns(qpack.torch.freeze.FreezeWarning, match="cannot become a GraphModule"):
        frozen = qpack.freeze(model)
    assert G.runner_of(frozen) is None
    x = torch.randn(1, 3, 8, 8)
    assert torch.allclose(frozen(x), model(x), atol=1e-5)


class PassThrough(nn.Module):
    """A graph input that is also a graph output (through an identity) and is
    read by a convolution, which takes NCHW data where it lies: timm's
    InvertedResidual puts its shortcut through such a segment edge."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(4, 8, 3)
        self.drop = nn.Dropout()

    def forward(self, x):
        a = self.drop(x)
        return self.c(a), a


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [None, "int8"])
def test_an_input_returned_as_an_output_keeps_its_layout(dtype, channels_last):
    torch.manual_seed(2)
    model = PassThrough().eval()
    x = torch.randn(2, 4, 9, 7)
    f = qpack.freeze(model, dtype=dtype, example_inputs=[x] if dtype else None)
    assert G.runner_of(f).num_segments == 1
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        (y, a), (ref, _) = f(x), model(x)
    if dtype is None:
        assert torch.equal(a, x)  # the input itself, not a transpose of it
    else:  # quantized on its edge: within one quantum, in the caller's layout
        assert float((a - x).abs().max()) < 0.05 * float(x.abs().max())
    close(y, ref, 1e-5 if dtype is None else 0.05)


class BatchNormAct(nn.BatchNorm2d):
    """timm's BatchNormAct2d: a rank check, F.batch_norm on its own tensors, then
    an activation, all in its own forward."""

    def __init__(self, c, act=nn.Hardswish, scale_input=1.0):
        super().__init__(c)
        self.act = act()
        self.scale_input = scale_input

    def forward(self, x):
        torch._assert(x.ndim == 4, "expected 4D input")
        x = F.batch_norm(x * self.scale_input if self.scale_input != 1.0 else x, self.running_mean,
                         self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        return self.act(x)


class TimmStyle(nn.Module):
    """conv -> BatchNormAct (folded into the conv), ReLU -> BatchNormAct (nothing to
    fold into: an affine node), a BatchNormAct that scales its input first (not a
    BatchNorm then the rest: stays as it is), residual add."""

    def __init__(self):
        super().__init__()
        self.c1, self.n1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), BatchNormAct(8)
        self.n2 = BatchNormAct(8, nn.ReLU)
        self.c3, self.n3 = nn.Conv2d(8, 8, 1), BatchNormAct(8, nn.Identity, scale_input=2.0)

    def forward(self, x):
        y = self.n1(self.c1(x))
        y = self.n2(F.relu(y))
        return self.n3(self.c3(y)) + y


class TimmStylePlain(nn.Module):
    """TimmStyle spelled with nn.BatchNorm2d modules (the same tensors)."""

    def __init__(self, m):
        super().__init__()
        self.c1, self.c3 = m.c1, m.c3
        self.b1, self.b2, self.b3 = (nn.BatchNorm2d(8).eval() for _ in range(3))
        for b, n in ((self.b1, m.n1), (self.b2, m.n2), (self.b3, m.n3)):
            b.load_state_dict(n.state_dict())

    def forward(self, x):
        y = F.hardswish(self.b1(self.c1(x)))
        y = F.relu(self.b2(F.relu(y)))
        return self.b3(self.c3(y) * 2.0) + y


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_batchnorm_subclasses_fold_or_lower_as_one_graph(dtype):
    model = randomize_bn(TimmStyle()).eval()
    x = torch.randn(2, 3, 10, 9)
    kw = freeze_args(dtype, x.shape)
    f = qpack.freeze(model, **kw)
    assert G.runner_of(f).num_segments == 1 and G.runner_of(f)._gm is None
    rep = qpack.graph_report(f)
    # n1 folded into c1 (its copy keeps only the Hardswish); n2 an affine, n3 two (x * 2, its BatchNorm)
    assert f.n1.running_var.eq(1).all() and f.n1.eps == 0.0 and model.n1.eps != 0.0
    assert f.n3.eps == model.n3.eps
    assert "c1 backend=onednn +bn " in rep and rep.count("affine") == 3, rep
    plain = TimmStylePlain(model).eval()
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < (0.1 if dtype else 1e-5)
        # the same graph as the model spelled with nn.BatchNorm2d: the same values
        close(f(x), qpack.freeze(plain, **kw)(x), 1e-6)
        layers = qpack.unfreeze(f)
        close(layers(x), model(x), 0.05 if dtype else 1e-5)  # int8: its dequantized weights


class DenseConcat(nn.Module):
    """DenseNet's block: every layer reads the concat of all the features before it
    (up to 12 inputs here, more than a core node takes)."""

    def __init__(self, layers=11, growth=4):
        super().__init__()
        self.stem = nn.Conv2d(3, growth, 3, padding=1)
        self.convs = nn.ModuleList(nn.Conv2d(growth * (i + 1), growth, 3, padding=1) for i in range(layers))

    def forward(self, x):
        feats = [F.relu(self.stem(x))]
        for conv in self.convs:
            feats.append(F.relu(conv(torch.cat(feats, 1))))
        return torch.cat(feats, 1)


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_concat_of_more_inputs_than_a_node_takes(dtype):
    torch.manual_seed(3)
    model = DenseConcat().eval()
    x = torch.randn(2, 3, 8, 7)
    kw = freeze_args(dtype, x.shape)
    f = qpack.freeze(model, **kw)
    assert G.runner_of(f).num_segments == 1 and G.runner_of(f)._gm is None
    assert qpack.graph_report(f).count("concat") > 11  # 10 concats, of 9-12 inputs in two levels
    with torch.no_grad():
        y, ref = f(x), model(x)
    assert y.shape == ref.shape
    assert rel_err(y, ref) < (0.05 if dtype else 1e-5), rel_err(y, ref)


def stochastic_depth(x, p, mode, training=True):
    """Spelled as torchvision.ops.stochastic_depth (identity when not training)."""
    if not training or p == 0.0:
        return x
    keep = torch.empty(x.shape[0], 1, 1, 1).bernoulli_(1 - p)
    return x * keep / (1 - p)


stochastic_depth.__module__ = "torchvision.ops.stochastic_depth"
torch.fx.wrap("stochastic_depth")


class WithStochasticDepth(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 1)

    def forward(self, x):
        return stochastic_depth(self.c2(F.relu(self.c1(x))), 0.2, "row", self.training) + x


def test_stochastic_depth_in_eval_is_an_identity_in_the_graph():
    model = WithStochasticDepth().eval()
    f = qpack.freeze(model)
    assert G.runner_of(f).num_segments == 1 and G.runner_of(f)._gm is None
    x = torch.randn(2, 4, 6, 5)
    with torch.no_grad():
        close(f(x), model(x))


class SlicesAndSplits(nn.Module):
    """GhostNet's x[:, :c] of a concat, MixNet's uneven torch.split (sections and an
    int size with a remainder) into convolutions, ReXNet's partial residual spelled
    with a concat, and a slice written in place (stays in PyTorch)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 5, 3, padding=1), nn.Conv2d(5, 5, 3, padding=1, groups=5)
        self.mix = nn.ModuleList(nn.Conv2d(c, c, k, padding=k // 2, groups=c) for c, k in ((3, 3), (4, 5), (2, 7)))
        self.c = nn.Conv2d(9, 7, 1)

    def forward(self, x):
        y = self.a(x)
        y = torch.cat([y, self.b(y)], 1)[:, :9]                                  # ghost: 10 -> 9
        sp = torch.split(y, [3, 4, 2], 1)
        y = torch.cat([self.mix[i](sp[i]) for i in range(3)], 1)
        parts = y.split(4, dim=1)                                                 # 4, 4, 1
        y = torch.cat([parts[-1], parts[0], F.relu(parts[1])], 1)               # (Res2Net's spx[-1])
        y = self.c(y)
        y = torch.cat([y[:, 0:3] + x, y[:, 3:]], dim=1)                           # rexnet
        return y


class SliceWrittenInPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 6, 1), nn.Conv2d(6, 4, 1)

    def forward(self, x):
        y = self.a(x)
        y[:, 0:3].add_(x)  # writes into y through the view
        return self.b(y)


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_channel_slices_and_uneven_splits_run_in_the_graph(dtype):
    torch.manual_seed(4)
    model = SlicesAndSplits().eval()
    x = torch.randn(2, 3, 9, 8)
    f = qpack.freeze(model, **freeze_args(dtype, x.shape))
    assert G.runner_of(f).num_segments == 1 and G.runner_of(f)._gm is None
    assert qpack.graph_report(f).count("channel_range") == 9
    with torch.no_grad():
        err = rel_err(f(x), model(x))
    assert err < (0.05 if dtype else 1e-5), err


def test_a_slice_written_in_place_stays_in_pytorch():
    model = SliceWrittenInPlace().eval()
    f = qpack.freeze(model)
    assert "channel_range" not in (qpack.graph_report(f) or "")
    x = torch.randn(2, 3, 5, 4)
    with torch.no_grad():
        close(f(x), model(x))


class InPlaceFunctional(nn.Module):
    """F.relu(x, inplace=True) writes into x, which the add reads after it: PyTorch adds the
    rectified values; bilinear with align_corners=True positionally is not in place."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        y = self.a(x)
        z = self.b(F.relu(y, inplace=True))
        up = F.interpolate(z, None, 2.0, "bilinear", True)
        return z + y, up


def test_in_place_functional_ops_keep_pytorch_semantics():
    model = InPlaceFunctional().eval()
    f = qpack.freeze(model)
    x = torch.randn(2, 3, 6, 5)
    with torch.no_grad():
        for got, want in zip(f(x), model(x)):
            close(got, want)
    assert "resize_bilinear" in qpack.graph_report(f)


class ConvThenAct(nn.Module):
    """A convolution, then an activation: fused into the f32 convolution as a post-op
    where nothing else reads the convolution's output."""

    def __init__(self, act):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1)
        self.act = act

    def forward(self, x):
        y = self.act(self.c1(x))
        z = self.c2(y)
        return torch.sigmoid(z) + z  # z is read twice: its sigmoid stays a node


@pytest.mark.parametrize("act", [nn.Hardswish(), nn.Hardsigmoid(), nn.Sigmoid(), nn.SiLU(), nn.GELU(),
                                 nn.LeakyReLU(0.2), nn.ELU()], ids=lambda a: type(a).__name__)
def test_f32_activation_after_a_conv_is_its_post_op(act):
    torch.manual_seed(6)
    model = ConvThenAct(act).eval()
    x = torch.randn(2, 3, 9, 7)
    f = qpack.freeze(model)
    rep = qpack.graph_report(f)
    fused = not isinstance(act, nn.ELU)  # oneDNN has an eltwise for each of the others; qpack's graph no ELU
    if fused:
        name = {"Hardswish": "hardswish", "Hardsigmoid": "hardsigmoid", "Sigmoid": "sigmoid", "SiLU": "silu",
                "GELU": "gelu", "LeakyReLU": "leaky_relu"}[type(act).__name__]
        assert f"c1 backend=onednn +{name} " in rep, rep
        assert rep.count("activation") == 1, rep  # the sigmoid of z, read by the add beside z
    with torch.no_grad():
        close(f(x), model(x), 2e-6)
    # int8 keeps the activation as a node (a 256-entry table)
    q = qpack.freeze(model, **freeze_args("int8", (2, 3, 9, 7)))
    if fused:
        assert "+" + name not in qpack.graph_report(q).split("\n")[1]


def test_a_conv_post_op_is_for_f32_convolutions():
    model = ConvThenAct(nn.Hardswish()).eval()
    f = qpack.freeze(model, **freeze_args("int8", (2, 3, 9, 7)))
    seg = G.runner_of(f)._segments[0]
    nodes = []
    for src in seg.spec["nodes"]:
        n = {k: v for k, v in src.items() if k not in ("layer", "layer_index")}
        if "layer_index" in src:
            n.update(op=seg.layers[src["layer_index"]]._packed._h, activation="hardswish")
        nodes.append(n)
    with pytest.raises(qpack.InvalidArgumentError, match="for f32 convolutions"):
        _core.GraphHandle(seg.spec["values"], nodes, seg.spec["inputs"], seg.spec["outputs"])
    x = torch.randn(2, 3, 9, 7)
    with torch.no_grad():
        assert rel_err(f(x), model(x)) < 0.05  # its own graph still builds and runs
