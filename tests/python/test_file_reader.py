"""qpack/_file.py, the pure-Python reader of .qpk files, against files the core
writes (qpack.save): header fields and build identifiers, checksums (the
core's libxxhash against PyPI's xxhash), op records against the packed
objects that were saved, graph records against the plan the model runs, and
damage of every kind named in ``problems`` without an exception.
"""
import os
import random
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
import xxhash
from torch import nn

import qpack
from conftest import BACKENDS
from qpack import _file

HEADER = 256
ENTRY = 32


def _bytes(path):
    with open(path, "rb") as f:
        return f.read()


def source_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=(1, 0), groups=2, bias=False), nn.ReLU(),
        nn.Flatten(), nn.Linear(8 * 4 * 3, 10)).eval()


def calibration():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(4, 3, 8, 8, generator=g) for _ in range(3)]


VARIANTS = {
    "fp32": dict(),
    "fp32_released": dict(retain=False),
    "fp32_layers": dict(graph=False),
    "int8_dynamic": dict(dtype="int8"),
}
for _b in BACKENDS:
    VARIANTS[f"int8_static_{_b}"] = dict(dtype="int8", backend=_b, calibrate=True)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{variant: (path, source model, frozen model)} written by qpack.save."""
    d = tmp_path_factory.mktemp("qpk")
    src = source_model()
    out = {}
    for name, kw in VARIANTS.items():
        kw = dict(kw)
        if kw.pop("calibrate", False):
            kw["example_inputs"] = calibration()
        frozen = qpack.freeze(src, progress=False, **kw)
        path = str(d / f"{name}.qpk")
        qpack.save(frozen, path)
        out[name] = (path, src, frozen)
    return out


@pytest.fixture(params=sorted(VARIANTS))
def variant(request, saved):
    return saved[request.param]


# ---- sound files ------------------------------------------------------------------------

def test_sound_file_has_no_problems_and_its_header_fields(variant):
    path, _, _ = variant
    d = _file.describe(path)
    assert d["problems"] == []
    h = d["header"]
    assert h["magic_ok"] and h["format_version"] == 1 and h["byte_order"] == 0x01020304
    assert h["header_size"] == 256 and h["table_offset"] == 256 and h["reserved"] == 0
    assert h["file_size"] == d["file_bytes"] == os.path.getsize(path)
    assert h["num_sections"] == len(d["sections"])
    assert h["qpack_version"] == qpack.__version__
    assert h["header_checksum_ok"] and h["table_checksum_ok"]
    assert all(s["ok"] is True for s in d["sections"])
    assert d["host_bytes"] > 0 and sum(s["type"] == "host" for s in d["sections"]) == 1


def test_build_identifiers_name_this_build(saved):
    path = saved["fp32"][0]
    h = _file.describe(path)["header"]
    info = qpack.backends()
    if info["onednn"]["compiled"]:
        version = re.match(r"oneDNN (\S+) \((\w+)\).*isa=(\w+)", info["onednn"]["version"])
        assert re.fullmatch(rf"onednn {re.escape(version[1])} {version[2]} pack \d+", h["onednn_build"])
        assert h["onednn_isa"] == version[3]
    if info["qnnpack"]["compiled"]:
        assert re.fullmatch(r"qnnpack pytorch-1\.13\.1 pack \d+", h["qnnpack_build"])
        assert h["qnnpack_isa"] in ("x86_64-sse2", "aarch64-neon")


def test_checksums_of_the_core_equal_pypi_xxhash(variant):
    path, _, _ = variant
    data = _bytes(path)
    d = _file.describe(path, verify=False)
    n = d["header"]["num_sections"]
    assert struct.unpack_from("<Q", data, 248)[0] == xxhash.xxh3_64_intdigest(data[:248])
    assert struct.unpack_from("<Q", data, 232)[0] == xxhash.xxh3_64_intdigest(data[HEADER:HEADER + ENTRY * n])
    for s in d["sections"]:
        assert s["checksum"] == xxhash.xxh3_64_intdigest(data[s["offset"]:s["offset"] + s["size"]]), s


def test_layout_of_sections(variant):
    path, _, _ = variant
    d = _file.describe(path)
    table_end = HEADER + ENTRY * len(d["sections"])
    weights = [s for s in d["sections"] if s["type"] in ("packed", "original", "data")]
    small = [s for s in d["sections"] if s["type"] in ("op", "graph", "host")]
    assert all(s["offset"] % 64 == 0 for s in weights)
    assert min(s["offset"] for s in weights) % 4096 == 0  # the weight segment starts on a page
    assert all(s["offset"] >= table_end for s in d["sections"])
    assert max(s["offset"] + s["size"] for s in small) <= min(s["offset"] for s in weights)


def _expected_ops(src, frozen):
    """(op, backend, mode, geometry, scales, has_bias, packed, original) of every layer
    the frozen model holds, geometry from the source layer."""
    out = []
    for name, m in src.named_modules():
        if not isinstance(m, (nn.Conv2d, nn.Linear)):
            continue
        p = frozen.get_submodule(name).packed
        scales = 0 if p.weight_scale is None else len(p.weight_scale)
        if isinstance(m, nn.Linear):
            geo = {"K": m.in_features, "N": m.out_features}
        else:
            (kh, kw), (sh, sw), (ph, pw), (dh, dw) = m.kernel_size, m.stride, m.padding, m.dilation
            geo = {"IC": m.in_channels, "OC": m.out_channels, "groups": m.groups, "KH": kh, "KW": kw,
                   "stride_h": sh, "stride_w": sw, "pad_top": ph, "pad_left": pw, "pad_bottom": ph,
                   "pad_right": pw, "dilation_h": dh, "dilation_w": dw}
        out.append(("linear" if isinstance(m, nn.Linear) else "conv2d", p.backend, p.mode, geo, scales,
                    m.bias is not None, p.nbytes_packed, p.nbytes_original))
    return sorted(out, key=repr)


def test_op_records_equal_the_packed_objects(variant):
    path, src, frozen = variant
    d = _file.describe(path)
    got = sorted(((op["op"], op["backend"], op["mode"], op["geometry"], op["num_weight_scales"], op["has_bias"],
                   op["packed_bytes"], op["original_bytes"]) for op in d["ops"]), key=repr)
    want = _expected_ops(src, frozen)
    assert [g[:6] + g[7:] for g in got] == [w[:6] + w[7:] for w in want]
    for g, w in zip(got, want):
        # The PACKED section is the weight as the kernels read it; a live op also
        # holds more (oneDNN: its float32 bias and weight scales; QNNPACK: its
        # per-input-scale state beside the packed form).
        packed, live = g[6], w[6]
        if g[1] == "onednn":
            assert live - packed == 4 * (g[3].get("N", g[3].get("OC")) * g[5] + g[4]), g
        else:
            assert 0 < packed < live, g
    for op in d["ops"]:
        lay = op["layout"]
        assert lay["tag"] == op["backend"]
        assert lay["size" if lay["tag"] == "onednn" else "packed_size"] == op["packed_bytes"]


def test_released_originals_are_not_in_the_file(saved):
    kept = _file.describe(saved["fp32"][0])
    released = _file.describe(saved["fp32_released"][0])
    assert all(op["original_bytes"] > 0 and op["original_section"] >= 0 for op in kept["ops"])
    assert all(op["original_bytes"] == 0 and op["original_section"] == -1 for op in released["ops"])
    assert not any(s["type"] == "original" for s in released["sections"])
    # f32 originals are the float weights: 4 bytes per element
    w_bytes = sorted(4 * m.weight.numel() for m in source_model().modules() if isinstance(m, (nn.Conv2d, nn.Linear)))
    assert sorted(op["original_bytes"] for op in kept["ops"]) == w_bytes


def test_onednn_layouts(saved):
    if "onednn" not in BACKENDS:
        pytest.skip("oneDNN is not available in this build")
    d = _file.describe(saved["fp32"][0])
    lin = next(op for op in d["ops"] if op["op"] == "linear")
    lay = lin["layout"]
    assert lay["data_type"] == "f32" and lay["ndims"] == 2 and lay["dims"] == [96, 10] and lay["split"] == 0
    grouped = next(op for op in d["ops"] if op["op"] == "conv2d" and op["geometry"]["groups"] == 2)
    assert grouped["layout"]["ndims"] == 5 and grouped["layout"]["dims"] == [2, 4, 4, 3, 3]  # goihw
    for op in d["ops"]:
        assert re.fullmatch(r"[a-eA-E]+(\d+[a-e])*", op["layout"]["summary"]), op["layout"]


def test_qnnpack_layouts_use_this_builds_blocking(saved):
    if "qnnpack" not in BACKENDS:
        pytest.skip("QNNPACK is not available in this build")
    d = _file.describe(saved["int8_static_qnnpack"][0])
    mr_nr_kr = re.search(r"gemm mr=(\d+) nr=(\d+) kr=(\d+)", qpack.backends()["qnnpack"]["version"])
    lin = next(op for op in d["ops"] if op["op"] == "linear")
    assert lin["layout"]["kind"] == "q8gemm"
    assert (lin["layout"]["nr"], lin["layout"]["kr"]) == (int(mr_nr_kr[2]), int(mr_nr_kr[3]))
    assert all(op["layout"]["kind"] in ("dwconv", "gemm_1x1", "conv") for op in d["ops"] if op["op"] == "conv2d")
    # static ops are saved with their int32 bias made for the calibrated input scale
    for op in d["ops"]:
        assert op["layout"]["bias_input_scale"] == pytest.approx(op["input_scale"], rel=1e-6)


def test_int8_dynamic_freezes_linear_layers_only(saved):
    d = _file.describe(saved["int8_dynamic"][0])
    assert {(op["op"], op["mode"]) for op in d["ops"]} == {("linear", "int8_dynamic"), ("conv2d", "f32")}
    lin = next(op for op in d["ops"] if op["op"] == "linear")
    assert lin["num_weight_scales"] == 10 and lin["weight_scale_range"][0] > 0


_REPORT_LINE = re.compile(r"^(\w+)\s+\(([\d,]*)\) -> (\d+) (f32|u8)(?: scale=(\S+) zp=(\d+))?")


def _report_nodes(frozen):
    out = []
    for line in qpack.graph_report(frozen).splitlines():
        m = _REPORT_LINE.match(line)
        if m:
            out.append(m.groups())
    return out


@pytest.mark.parametrize("name", sorted(v for v in VARIANTS if v != "fp32_layers"))
def test_graph_records_equal_the_plan_the_model_runs(saved, name):
    path, _, frozen = saved[name]
    d = _file.describe(path)
    assert len(d["graphs"]) == 1
    g = d["graphs"][0]
    rows = []
    for n in g["nodes"]:
        v = g["values"][n["output"]]
        q = (f"{v['scale']:.6g}", str(v["zero_point"])) if v["dtype"] == "u8" else (None, None)
        rows.append((n["kind"], ",".join(map(str, n["inputs"])), str(n["output"]), v["dtype"]) + q)
    assert rows == _report_nodes(frozen)
    kinds = [n["kind"] for n in g["nodes"]]
    assert kinds.count("conv2d") == 2 and kinds.count("linear") == 1
    ops = d["ops"]
    for n in g["nodes"]:
        if n["kind"] in ("conv2d", "linear"):
            assert ops[n["op"]]["op"] == n["kind"]
        else:
            assert n["op"] == -1
    if name.startswith("int8_static"):
        assert kinds[0] == "quantize" and kinds[-1] == "dequantize"
        assert {v["dtype"] for v in g["values"]} == {"f32", "u8"}
    # the ReLUs are fused into the convolutions
    assert "activation" not in kinds


def test_layer_by_layer_model_has_no_graph(saved):
    d = _file.describe(saved["fp32_layers"][0])
    assert d["graphs"] == [] and len(d["ops"]) == 3 and d["problems"] == []


def test_verify_false_does_not_read_the_weights(saved, tmp_path):
    path = saved["fp32"][0]
    d = _file.describe(path, verify=False)
    assert d["problems"] == [] and not d["verified"]
    assert all(s["ok"] is None for s in d["sections"])


def test_other_isa_layout_is_read_and_checked(tmp_path):
    """A file packed under ONEDNN_MAX_CPU_ISA=AVX2: a blocking other than this machine's."""
    if "onednn" not in BACKENDS:
        pytest.skip("oneDNN is not available in this build")
    here = qpack.backends()["onednn"]["version"]
    if not re.search(r"isa=avx512_core_(vnni|bf16|amx|fp16)|isa=avx2_vnni", here):
        pytest.skip(f"this machine has no int8 VNNI ({here}): the AVX2 layout would not differ")
    child = (
        "import sys, numpy as np, qpack\n"
        "g = np.random.default_rng(0)\n"
        "w = g.integers(-127, 128, size=(19, 37), dtype=np.int8)\n"
        "lin = qpack.PackedLinear(w, None, backend='onednn', weight_scale=0.01, output_scale=0.1,\n"
        "                         output_zero_point=3, input_scale=0.05, input_zero_point=120)\n"
        "qpack.save(lin, sys.argv[1])\n")
    paths = {}
    for cap in ("AVX2", None):
        paths[cap] = str(tmp_path / f"{cap}.qpk")
        env = dict(os.environ)
        env.pop("ONEDNN_MAX_CPU_ISA", None)
        if cap:
            env["ONEDNN_MAX_CPU_ISA"] = cap
        p = subprocess.run([sys.executable, "-c", child, paths[cap]], env=env, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stderr
    capped, native = _file.describe(paths["AVX2"]), _file.describe(paths[None])
    assert capped["problems"] == [] and native["problems"] == []
    assert capped["header"]["onednn_isa"] == "avx2" != native["header"]["onednn_isa"]
    # without VNNI oneDNN packs int8 split (an s32 primitive over split input)
    assert capped["ops"][0]["layout"]["split"] == 1 and native["ops"][0]["layout"]["split"] == 0


# ---- damage --------------------------------------------------------------------------

def _sections(data):
    n = struct.unpack_from("<I", data, 20)[0]
    return [struct.unpack_from("<IIQQQ", data, HEADER + ENTRY * i) for i in range(n)]


def _reseal(data):
    """Every checksum recomputed, so that damage inside a record reaches the record checks."""
    data = bytearray(data)
    for i, (_, _, off, size, _) in enumerate(_sections(data)):
        struct.pack_into("<Q", data, HEADER + ENTRY * i + 24, xxhash.xxh3_64_intdigest(bytes(data[off:off + size])))
    n = struct.unpack_from("<I", data, 20)[0]
    struct.pack_into("<Q", data, 232, xxhash.xxh3_64_intdigest(bytes(data[HEADER:HEADER + ENTRY * n])))
    struct.pack_into("<Q", data, 248, xxhash.xxh3_64_intdigest(bytes(data[:248])))
    return bytes(data)


def _section_start(data, type_id, k=0):
    """Offset of the k-th section of a type (1 OP, 2 PACKED, 3 ORIGINAL, 4 GRAPH, 5 HOST)."""
    return [off for t, _, off, _, _ in _sections(data) if t == type_id][k]


def _op_layout_start(data, k=0):
    """Offset of op k's layout blob, walking its record as docs/FORMAT.md lays it out."""
    pos = _section_start(data, 1, k) + 20
    (ng,) = struct.unpack_from("<I", data, pos)
    pos += 4 + 8 * ng
    (nws,) = struct.unpack_from("<I", data, pos)
    pos += 4 + 8 * nws
    (nb,) = struct.unpack_from("<I", data, pos)
    pos += 4 + 4 * nb + 24
    return pos + 4  # after u32 layout_size


def _graph_node_start(data, node=0):
    pos = _section_start(data, 4)
    (nv,) = struct.unpack_from("<I", data, pos)
    pos += 4 + 12 * nv
    for _ in range(2):  # inputs, outputs
        (n,) = struct.unpack_from("<I", data, pos)
        pos += 4 + 4 * n
    pos += 4  # num_nodes
    for _ in range(node):
        (n_in,) = struct.unpack_from("<I", data, pos + 4)
        pos += 8 + 4 * n_in + 8 + 64 + 4 + 12
        (na,) = struct.unpack_from("<I", data, pos)
        pos += 4 + 8 * na
    return pos


def _reseal_header(data):
    data = bytearray(data)
    struct.pack_into("<Q", data, 248, xxhash.xxh3_64_intdigest(bytes(data[:248])))
    return bytes(data)


def _put(fmt, where, value, reseal=_reseal):
    """Damage: a field rewritten (value: a number, or a function of the file's bytes), checksums resealed."""
    def damage(data):
        v = value(data) if callable(value) else value
        data = bytearray(data)
        struct.pack_into(fmt, data, where(bytes(data)), v)
        return reseal(data)
    return damage


def _flip(where):
    def damage(data):
        data = bytearray(data)
        data[where(bytes(data))] ^= 0x5A
        return bytes(data)
    return damage


def _first_packed_mid(data):
    t = [s for s in _sections(data) if s[0] == 2][0]
    return t[2] + t[3] // 2


# (damage, a piece of the problem it must produce, whether qpack.load must refuse it too)
DAMAGE = {
    "empty": (lambda d: b"", "fewer than the 256-byte header"),
    "truncated header": (lambda d: d[:200], "fewer than the 256-byte header"),
    "truncated table": (lambda d: d[:HEADER + 40], "truncated"),
    "truncated weights": (lambda d: d[:-1], "truncated"),
    "trailing bytes": (lambda d: d + b"\0" * 3, "3 trailing bytes"),
    "magic": (_flip(lambda d: 1), "not a .qpk file"),
    "header byte": (_flip(lambda d: 45), "header_checksum"),
    "table byte": (_flip(lambda d: HEADER + 10), "table_checksum"),
    "packed byte": (_flip(_first_packed_mid), "checksum mismatch"),
    "big-endian": (_put("<I", lambda d: 12, 0x04030201), "big-endian"),
    "newer version": (_put("<I", lambda d: 8, 2), "format_version: 2"),
    "num_sections": (_put("<I", lambda d: 20, 1 << 21, _reseal_header), "more than the format's limit"),
    "section type": (_put("<I", lambda d: HEADER, 9), "unknown type 9"),
    "section bounds": (_put("<Q", lambda d: HEADER + 16, 1 << 40), "not inside the file"),
    "weights unaligned": (_put("<Q", lambda d: HEADER + ENTRY * [s[0] for s in _sections(d)].index(2) + 8,
                               lambda d: _section_start(d, 2) + 8), "not a multiple of 64"),
    "op mode": (_put("<I", lambda d: _section_start(d, 1) + 8, 7), "mode 7 unknown"),
    "op backend": (_put("<I", lambda d: _section_start(d, 1) + 4, 3), "backend 3 unknown"),
    "op packed ref": (_put("<I", lambda d: _section_start(d, 1) + 12, 0), "is a section of type op, not packed"),
    "op geometry count": (_put("<I", lambda d: _section_start(d, 1) + 20, 0x7FFFFFFF), "record truncated"),
    "op geometry value": (_put("<q", lambda d: _section_start(d, 1) + 24, -4), "must be >= 1"),
    "layout tag": (_put("<I", _op_layout_start, 0xDEADBEEF), "neither DNNL"),
    "layout version": (_put("<I", lambda d: _op_layout_start(d) + 4, 9), "layout version 9"),
    "graph node kind": (_put("<I", lambda d: _graph_node_start(d, 1), 99), "unknown kind 99"),
    "graph node op": (_put("<i", lambda d: _graph_node_start(d, 1) + 16, 40), "not an op of this file"),
    "graph value dtype": (_put("<I", lambda d: _section_start(d, 4) + 4, 5), "unknown dtype 5"),
}
LOAD_REFUSES = {"empty", "truncated header", "truncated table", "truncated weights", "trailing bytes", "magic",
                "header byte", "table byte", "packed byte", "big-endian", "newer version", "num_sections",
                "section type", "section bounds", "weights unaligned", "op mode", "op backend", "op packed ref",
                "op geometry count", "op geometry value", "graph node kind", "graph node op", "graph value dtype"}


@pytest.mark.parametrize("what", sorted(DAMAGE))
def test_damage_is_named_not_raised(saved, tmp_path, what):
    damage, expected = DAMAGE[what]
    name = "fp32" if "onednn" in BACKENDS else f"int8_static_{BACKENDS[0]}"
    bad = tmp_path / "bad.qpk"
    bad.write_bytes(damage(_bytes(saved[name][0])))
    d = _file.describe(bad)
    assert any(expected in p for p in d["problems"]), d["problems"]
    if what in LOAD_REFUSES:  # the core refuses what the reader names (the layout is the core's own check)
        with pytest.raises(qpack.FileFormatError):
            qpack.load(bad)


def test_onednn_layout_size_and_dims_are_checked(saved, tmp_path):
    if "onednn" not in BACKENDS:
        pytest.skip("oneDNN is not available in this build")
    data = _bytes(saved["fp32"][0])
    op0 = _file.describe(saved["fp32"][0])["ops"][0]
    nd = op0["layout"]["ndims"]
    bad = tmp_path / "bad.qpk"
    # dims[0] (after tag, version, data_type, split, ndims)
    bad.write_bytes(_put("<q", lambda d: _op_layout_start(d) + 20, op0["layout"]["dims"][0] + 1)(data))
    assert any("do not match the op's geometry" in p for p in _file.describe(bad)["problems"])
    # size (after dims, strides, inner_nblks, inner blocks and indices)
    nblks = len(op0["layout"]["inner_blks"])
    at = 20 + 16 * nd + 4 + 16 * nblks
    bad.write_bytes(_put("<Q", lambda d: _op_layout_start(d) + at, op0["packed_bytes"] + 64)(data))
    assert any("differs from its PACKED section" in p for p in _file.describe(bad)["problems"])
    # a stride that walks past the packed bytes
    bad.write_bytes(_put("<q", lambda d: _op_layout_start(d) + 20 + 8 * nd, 1 << 30)(data))
    assert any("addresses" in p for p in _file.describe(bad)["problems"])


def test_weight_damage_is_found_only_when_verifying(saved, tmp_path):
    data = _bytes(saved["fp32"][0])
    bad = tmp_path / "bad.qpk"
    bad.write_bytes(_flip(_first_packed_mid)(data))
    assert _file.describe(bad, verify=False)["problems"] == []
    d = _file.describe(bad)
    packed = [s for s in d["sections"] if s["type"] == "packed"]
    assert packed[0]["ok"] is False and all(s["ok"] for s in packed[1:])
    assert d["problems"] == [f"section {packed[0]['index']} (packed): checksum mismatch: stored "
                             f"0x{packed[0]['checksum']:016x}, its bytes give "
                             f"0x{xxhash.xxh3_64_intdigest(bad.read_bytes()[packed[0]['offset']:packed[0]['offset'] + packed[0]['size']]):016x}"
                             " (the section is corrupt)"]


def test_random_damage_never_raises(saved, tmp_path):
    """Byte changes anywhere a checksum covers are always found; with the checksums
    recomputed (damage that reaches the record parsers) nothing raises."""
    rng = random.Random(0)
    bad = tmp_path / "bad.qpk"
    for name in sorted(saved):
        data = _bytes(saved[name][0])
        covered = [(0, HEADER + ENTRY * len(_sections(data)))] + [(off, off + size) for _, _, off, size, _ in
                                                                 _sections(data) if size]
        for _ in range(60):
            b = bytearray(data)
            lo, hi = rng.choice(covered)
            at = rng.randrange(lo, hi)
            b[at] ^= rng.randrange(1, 256)
            bad.write_bytes(bytes(b))
            assert _file.describe(bad)["problems"], (name, at)
            # the same change with every checksum made good again
            small = [(off, off + size) for t, _, off, size, _ in _sections(data) if t in (1, 4)]
            lo, hi = rng.choice(small)
            b = bytearray(data)
            for _ in range(rng.randint(1, 3)):
                at = rng.randrange(lo, hi)
                if rng.random() < 0.5:
                    b[at] = rng.randrange(256)
                else:
                    at -= (at - lo) % 4
                    if at + 4 <= hi:
                        struct.pack_into("<I", b, at, rng.choice([0, 1, 7, 255, 1 << 16, 0x7FFFFFFF, 0xFFFFFFFF]))
            bad.write_bytes(_reseal(b))
            _file.describe(bad)  # must not raise
        for cut in sorted(rng.sample(range(len(data)), 20)):
            bad.write_bytes(data[:cut])
            assert _file.describe(bad)["problems"], (name, cut)


def test_only_io_errors_raise(tmp_path):
    with pytest.raises(FileNotFoundError):
        _file.describe(tmp_path / "missing.qpk")
    with pytest.raises(IsADirectoryError):
        _file.describe(tmp_path)
    (tmp_path / "text.qpk").write_text("hello, this is not a model file " * 20)
    d = _file.describe(tmp_path / "text.qpk")
    assert d["problems"] == ["magic: not a .qpk file (starts with 68 65 6c 6c 6f 2c 20 74, a .qpk file with "
                             "89 51 50 4b 0d 0a 1a 0a)"]


def test_reader_imports_neither_torch_nor_the_extension():
    code = ("import importlib.util, sys\n"
            "spec = importlib.util.spec_from_file_location('r', sys.argv[1])\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "print(sorted(k for k in sys.modules if k.split('.')[0] in ('torch', 'qpack', 'numpy')))\n")
    p = subprocess.run([sys.executable, "-c", code, _file.__file__], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_numbers_read_are_the_files_own(saved):
    """Scales read from the op records equal the frozen layers' float32 scales."""
    name = next(n for n in saved if n.startswith("int8_static"))
    path, src, frozen = saved[name]
    d = _file.describe(path)
    lin = next(op for op in d["ops"] if op["op"] == "linear")
    packed = frozen.get_submodule("5").packed
    scales = np.asarray(packed.weight_scale, dtype=np.float32)
    assert lin["weight_scale_range"] == (float(scales.min()), float(scales.max()))
    assert lin["output_scale"] == np.float32(packed.output_scale)
    assert lin["output_zero_point"] == packed.output_zero_point


def test_data_sections(tmp_path):
    """Large tensors that are not packed weights (an embedding table) are DATA sections."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(300, 32), nn.Linear(32, 8)).eval()
    path = tmp_path / "emb.qpk"
    qpack.save(qpack.freeze(model), path)
    d = _file.describe(path)
    assert d["problems"] == []
    data = [s for s in d["sections"] if s["type"] == "data"]
    assert len(data) == 1 and data[0]["ok"] and data[0]["offset"] % 64 == 0
    assert d["data_bytes"] == data[0]["size"] == 300 * 32 * 4
    assert [op["op"] for op in d["ops"]] == ["linear"]
    raw = path.read_bytes()[data[0]["offset"]:data[0]["offset"] + data[0]["size"]]
    assert np.array_equal(np.frombuffer(raw, dtype=np.float32).reshape(300, 32), model[0].weight.detach().numpy())
