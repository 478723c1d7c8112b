"""The qpack command line (qpack/cli.py): freeze from a factory, a torch.export
program and TorchScript, fp32 and int8 (calibrated from .pt and .npy data, or
dynamic); inspect, verify and bench on the files it writes; bad arguments
(exit 2) and bad files or models (exit 1, one line, no traceback).
"""
import json
import os
import re
import struct
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
import xxhash
from click.testing import CliRunner

import qpack
from conftest import BACKENDS
from qpack import _file
from qpack.cli import main

MODELS = textwrap.dedent("""
    import torch
    from torch import nn

    def tiny():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))

    def not_a_module():
        return 42

    def raises():
        raise ValueError("no weights here")

    def no_layers():
        return nn.Sequential(nn.ReLU())

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 4)

        def forward(self, x):
            return torch.relu(self.fc(x))

    def custom():
        torch.manual_seed(0)
        return Net()
""")
MODULE = "qpack_cli_test_models"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A folder with the models module, calibration data, exported and TorchScript models."""
    d = tmp_path_factory.mktemp("cli")
    (d / f"{MODULE}.py").write_text(MODELS)
    sys.path.insert(0, str(d))
    try:
        import importlib
        tiny = importlib.import_module(MODULE).tiny().eval()
        g = torch.Generator().manual_seed(1)
        data = torch.randn(20, 3, 8, 8, generator=g)
        torch.save(data, d / "calib.pt")
        torch.save([data[:4], data[4:8], data[8:12]], d / "calib_list.pt")
        np.save(d / "calib.npy", data.numpy())
        torch.save({"x": data}, d / "calib_dict.pt")
        torch.save(torch.zeros(4, 3, 8, 8, dtype=torch.int64), d / "calib_int.pt")
        (d / "calib_text.pt").write_text("not a tensor file")
        x = torch.randn(1, 3, 8, 8, generator=g)
        torch.export.save(torch.export.export(tiny, (x,)), d / "tiny.pt2")
        with warnings.catch_warnings():  # PyTorch 2.13 deprecates TorchScript; the CLI still reads it
            warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", DeprecationWarning)
            torch.jit.script(tiny).save(str(d / "tiny.ts"))
        yield d, tiny
    finally:
        sys.path.remove(str(d))
        sys.modules.pop(MODULE, None)


def run(*args):
    """The command in-process; any exception other than click's exits fails the test."""
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def freeze(env, *args, model=f"{MODULE}:tiny"):
    d, _ = env
    out = d / f"out-{abs(hash(args + (model,)))}.qpk"
    r = run("freeze", model, "-o", out, *args)
    assert r.exit_code == 0, r.output
    return out, r


def one_line_error(r, code=1):
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output
    if code == 1:
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("qpack: error: "), r.stderr
        return lines[0]
    return r.output


def max_diff(a, b):
    return float((a - b).abs().max())


def test_freeze_fp32_from_a_factory_then_inspect_and_verify(env):
    d, tiny = env
    out, r = freeze(env, "--input-shape", "1,3,8,8")
    assert re.search(r"2 ops \(f32\), 1 graphs", r.stdout)
    check = re.search(r"max \|frozen - source\| = (\S+)", r.stdout)
    assert float(check[1]) < 1e-5
    info = _file.describe(out)
    assert info["problems"] == []
    assert sorted((op["op"], op["mode"]) for op in info["ops"]) == [("conv2d", "f32"), ("linear", "f32")]
    x = torch.randn(2, 3, 8, 8)
    with torch.inference_mode():
        assert max_diff(qpack.load(out)(x), tiny(x)) < 1e-5

    r = run("inspect", out)
    assert r.exit_code == 0, r.output
    assert re.search(r"^  0  linear\s+onednn\s+f32\s+512 -> 10\s", r.stdout, re.M), r.stdout
    assert re.search(r"conv2d\s+onednn\s+f32\s+3 -> 8 k3x3 s1x1 p1\s", r.stdout)
    assert "no problems (checksums verified)" in r.stdout
    assert f"isa {info['header']['onednn_isa']}" in r.stdout

    r = run("verify", out)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == f"{out}: OK (2 ops, 1 graphs, {len(info['sections'])} sections, checksums verified, loads)"


@pytest.mark.parametrize("data", ["calib.pt", "calib_list.pt", "calib.npy"])
def test_freeze_int8_calibrated(env, data):
    d, tiny = env
    out, r = freeze(env, "--int8", "--calibrate", d / data, "--batch-size", "5")
    info = _file.describe(out)
    assert info["problems"] == []
    assert {op["mode"] for op in info["ops"]} == {"int8_static"}
    kinds = [n["kind"] for n in info["graphs"][0]["nodes"]]
    assert kinds[0] == "quantize" and kinds[-1] == "dequantize"
    x = torch.load(d / "calib.pt")[:4]
    with torch.inference_mode():
        ref = tiny(x)
        assert max_diff(qpack.load(out)(x), ref) < 0.05 * float(ref.abs().max())


def test_calibration_batches_follow_batch_size(env):
    """One tensor is split along dim 0: the same data in other batches calibrates the same ranges."""
    d, _ = env
    a, _ = freeze(env, "--int8", "--calibrate", d / "calib.pt", "--batch-size", "4")
    b, _ = freeze(env, "--int8", "--calibrate", d / "calib.pt", "--batch-size", "7")
    qa = [(v["scale"], v["zero_point"]) for v in _file.describe(a)["graphs"][0]["values"]]
    qb = [(v["scale"], v["zero_point"]) for v in _file.describe(b)["graphs"][0]["values"]]
    assert qa == qb  # min/max calibration does not depend on the batching


def test_freeze_int8_dynamic_quantizes_linear_layers_only(env):
    out, r = freeze(env, "--int8")
    assert "int8_dynamic" in r.stdout
    assert sorted((op["op"], op["mode"]) for op in _file.describe(out)["ops"]) == [
        ("conv2d", "f32"), ("linear", "int8_dynamic")]


def test_retain_flags(env):
    kept, _ = freeze(env, "--retain")
    released, r = freeze(env, "--no-retain")
    assert all(op["original_bytes"] > 0 for op in _file.describe(kept)["ops"])
    assert all(op["original_bytes"] == 0 for op in _file.describe(released)["ops"])
    assert "original released" in r.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_flag(env, backend):
    d, _ = env
    out, _ = freeze(env, "--int8", "--calibrate", d / "calib.pt", "--backend", backend)
    assert {op["backend"] for op in _file.describe(out)["ops"]} == {backend}


def test_no_graph_and_quiet(env):
    out, r = freeze(env, "--no-graph", "--quiet")
    assert r.output == ""
    info = _file.describe(out)
    assert info["graphs"] == [] and len(info["ops"]) == 2


def test_freeze_a_torch_export_program(env):
    d, tiny = env
    out, _ = freeze(env, "--input-shape", "1,3,8,8", model=d / "tiny.pt2")
    info = _file.describe(out)
    assert info["problems"] == [] and len(info["graphs"]) == 1  # one graph, as from the eager model
    assert [n["kind"] for n in info["graphs"][0]["nodes"]] == ["conv2d", "flatten", "linear"]
    x = torch.randn(3, 3, 8, 8)
    with torch.inference_mode():
        assert max_diff(qpack.load(out)(x), tiny(x)) < 1e-5
    q, _ = freeze(env, "--int8", "--calibrate", d / "calib.pt", model=d / "tiny.pt2")
    assert {op["mode"] for op in _file.describe(q)["ops"]} == {"int8_static"}


def test_freeze_torchscript(env):
    d, tiny = env
    r = run("freeze", d / "tiny.ts", "-o", d / "ts.qpk")
    assert "--input-shape" in one_line_error(r)
    out, _ = freeze(env, "--input-shape", "1,3,8,8", model=d / "tiny.ts")
    x = torch.randn(2, 3, 8, 8)
    with torch.inference_mode():
        assert max_diff(qpack.load(out)(x), tiny(x)) < 1e-5


@pytest.mark.parametrize("args, message", [
    (["freeze", f"{MODULE}:tiny"], "Missing option '-o'"),
    (["freeze", f"{MODULE}:tiny", "-o", "x.qpk", "--calibrate", "{d}/calib.pt"], "add --int8"),
    (["freeze", f"{MODULE}:tiny", "-o", "x.qpk", "--backend", "fast"], "'fast' is not one of"),
    (["freeze", f"{MODULE}:tiny", "-o", "x.qpk", "--input-shape", "1,three"], "expected integers"),
    (["freeze", f"{MODULE}:tiny", "-o", "x.qpk", "--input-shape", "1,0,8"], ">= 1"),
    (["freeze", f"{MODULE}:tiny", "-o", "x.qpk", "--batch-size", "0"], "--batch-size"),
    (["freeze", f"{MODULE}:tiny", "-o", "x.qpk", "--int8", "--calibrate", "{d}/none.pt"], "does not exist"),
    (["inspect", "{d}/none.qpk"], "does not exist"),
    (["verify"], "Missing argument 'FILE'"),
    (["bench", "{d}/tiny.pt2"], "Missing option '--input-shape'"),
    (["bench", "{d}/tiny.pt2", "--input-shape", "1,3,8,8", "--runs", "0"], "--runs"),
    (["frobnicate"], "No such command"),
])
def test_bad_arguments_exit_2(env, args, message):
    d, _ = env
    r = run(*[a.format(d=d) for a in args])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("model, args, message", [
    ("{d}/missing.pt2", [], "no such file"),
    ("{d}", [], "is a directory"),
    ("{d}/calib.pt", [], "neither a torch.export program"),
    ("{d}/calib_text.pt", [], "neither a torch.export program"),
    ("no_such_module_xyz:f", [], "cannot import no_such_module_xyz (ModuleNotFoundError"),
    (f"{MODULE}:missing", [], "has no attribute 'missing'"),
    (f"{MODULE}:not_a_module", [], "returned int, not a torch.nn.Module"),
    (f"{MODULE}:raises", [], "the factory raised ValueError: no weights here"),
    (f"{MODULE}:no_layers", [], "no layer of"),
    (f"{MODULE}:tiny", ["--int8", "--calibrate", "{d}/calib_dict.pt"], "holds dict"),
    (f"{MODULE}:tiny", ["--int8", "--calibrate", "{d}/calib_int.pt"], "must be floating point"),
    (f"{MODULE}:tiny", ["--int8", "--calibrate", "{d}/calib_text.pt"], "torch.load failed"),
    (f"{MODULE}:tiny", ["--int8", "--calibrate", "{d}/tiny.pt2"], "torch.load failed"),
    (f"{MODULE}:tiny", ["--input-shape", "1,4,8,8"], "does not run on an input of shape (1, 4, 8, 8)"),
])
def test_bad_models_and_data_exit_1_with_one_line(env, model, args, message):
    d, _ = env
    r = run("freeze", model.format(d=d), "-o", d / "bad-out.qpk", *[a.format(d=d) for a in args])
    assert message in one_line_error(r)
    assert not (d / "bad-out.qpk").exists()


def test_inspect_json(env):
    out, _ = freeze(env)
    r = run("inspect", out, "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["problems"] == [] and len(got["ops"]) == 2 and len(got["sections"]) == got["header"]["num_sections"]
    linear = next(op for op in got["ops"] if op["op"] == "linear")
    assert linear["geometry"] == {"K": 512, "N": 10}
    assert linear["clamp"] == ["-inf", "inf"]  # JSON has no infinities


def _damaged(path, tmp_path, what):
    data = bytearray(path.read_bytes())
    n = struct.unpack_from("<I", data, 20)[0]
    sections = [struct.unpack_from("<IIQQQ", data, 256 + 32 * i) for i in range(n)]
    i, (_, _, off, size, _) = next((i, s) for i, s in enumerate(sections) if s[0] == what)
    data[off + size // 2] ^= 0x40
    bad = tmp_path / f"damaged-{what}.qpk"
    bad.write_bytes(bytes(data))
    return bad, i


def test_inspect_and_verify_name_the_damage(env, tmp_path):
    out, _ = freeze(env)
    bad, i = _damaged(out, tmp_path, 2)  # a PACKED section
    r = run("inspect", bad)
    assert r.exit_code == 1
    assert re.search(rf"^  {i}  packed .* BAD$", r.stdout, re.M), r.stdout
    assert f"section {i} (packed): checksum mismatch" in r.stdout
    assert run("inspect", bad, "--no-verify").exit_code == 0
    r = run("verify", bad)
    assert r.exit_code == 1
    assert f"section {i} (packed): checksum mismatch" in r.stdout and "FAILED (1 problems)" in r.stdout

    cut = tmp_path / "cut.qpk"
    cut.write_bytes(out.read_bytes()[:1000])
    r = run("verify", cut)
    assert r.exit_code == 1 and "truncated" in r.stdout
    text = tmp_path / "text.qpk"
    text.write_text("x" * 300)
    r = run("inspect", text)
    assert r.exit_code == 1 and "not a .qpk file" in r.stdout and "Traceback" not in r.output


def test_verify_reports_what_only_the_core_refuses(env, tmp_path):
    """A host section that does not unpickle: structure and checksums are sound, qpack.load refuses."""
    out, _ = freeze(env)
    data = bytearray(out.read_bytes())
    n = struct.unpack_from("<I", data, 20)[0]
    for i in range(n):
        t, _, off, size, _ = struct.unpack_from("<IIQQQ", data, 256 + 32 * i)
        if t == 5:
            data[off:off + size] = b"\x00" * size
            struct.pack_into("<Q", data, 256 + 32 * i + 24, xxhash.xxh3_64_intdigest(bytes(data[off:off + size])))
    struct.pack_into("<Q", data, 232, xxhash.xxh3_64_intdigest(bytes(data[256:256 + 32 * n])))
    struct.pack_into("<Q", data, 248, xxhash.xxh3_64_intdigest(bytes(data[:248])))
    bad = tmp_path / "host.qpk"
    bad.write_bytes(bytes(data))
    assert _file.describe(bad)["problems"] == []
    r = run("verify", bad)
    assert r.exit_code == 1, r.output
    assert "qpack.load: FileFormatError" in r.stdout and "host section" in r.stdout
    assert r.stdout.strip().endswith("FAILED (qpack.load refuses it)")


def test_verify_needs_the_models_own_classes(env, tmp_path):
    """A model of the user's own class pickles by reference: verify loads it where the class imports."""
    d, _ = env
    out, _ = freeze(env, model=f"{MODULE}:custom")
    cmd = [sys.executable, "-m", "qpack", "verify", str(out)]
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=clean)
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"No module named '{MODULE}'" in p.stdout and "Traceback" not in p.stdout + p.stderr
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=d, env=clean)
    assert p.returncode == 0 and p.stdout.strip().endswith("loads)"), p.stdout + p.stderr


def test_inspect_never_fails_on_damage(env, tmp_path):
    import random
    out, _ = freeze(env, "--int8", "--calibrate", env[0] / "calib.pt")
    data = out.read_bytes()
    rng = random.Random(0)
    bad = tmp_path / "bad.qpk"
    codes = set()
    for i in range(150):
        b = bytearray(data[:rng.randrange(len(data))] if i % 5 == 0 else data)
        for _ in range(rng.randint(1, 3)):
            if len(b) > 4:
                at = rng.randrange(len(b) - 4)
                struct.pack_into("<I", b, at, rng.choice([0, 1, 9, 0xFFFFFFFF, rng.randrange(1 << 32)]))
        bad.write_bytes(bytes(b))
        for args in ([], ["--json"], ["--no-verify"]):
            r = run("inspect", bad, *args)
            assert r.exit_code in (0, 1) and "Traceback" not in r.output, r.output
            codes.add(r.exit_code)
            if args == ["--json"]:
                assert (r.exit_code == 1) == bool(json.loads(r.stdout)["problems"])
    assert codes == {0, 1}  # damage in bytes no check covers (padding) passes; the rest is named


def test_bench(env):
    d, _ = env
    out, _ = freeze(env)
    r = run("bench", out, "--input-shape", "2,3,8,8", "--runs", "5", "--threads", "1", "--source", f"{MODULE}:tiny")
    assert r.exit_code == 0, r.output
    assert "threads: qpack 1, torch 1" in r.stdout
    rows = {m[1]: (float(m[2]), float(m[3])) for m in re.finditer(r"^(qpack|source)\s+\S+\s+([\d.e+-]+)\s+([\d.e+-]+)$",
                                                                  r.stdout, re.M)}
    assert set(rows) == {"qpack", "source"} and all(0 < med <= p90 for med, p90 in rows.values())
    ratio = re.search(r"source / qpack median: ([\d.e+-]+)x; max \|qpack - source\| = (\S+)", r.stdout)
    assert ratio and float(ratio[2]) < 1e-5
    assert float(ratio[1]) == pytest.approx(rows["source"][0] / rows["qpack"][0], rel=0.02)
    r = run("bench", out, "--input-shape", "2,5,8,8", "--runs", "2")
    assert "does not run on an input of shape (2, 5, 8, 8)" in one_line_error(r)
    r = run("bench", d / "calib.npy", "--input-shape", "2,3,8,8", "--runs", "2")
    assert "magic" in one_line_error(r) or "not a qpack model file" in one_line_error(r)


def test_python_m_qpack_and_import_cost(env, tmp_path):
    out, _ = freeze(env)
    p = subprocess.run([sys.executable, "-m", "qpack", "inspect", str(out)], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "no problems" in p.stdout
    p = subprocess.run([sys.executable, "-m", "qpack", "verify", str(tmp_path / "missing.qpk")], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 2 and "does not exist" in p.stderr
    code = "import sys, qpack; print(sorted(m for m in ('torch', 'click', 'tqdm', 'xxhash') if m in sys.modules))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_console_script():
    script = os.path.join(os.path.dirname(sys.executable), "qpack")
    if not os.path.exists(script):
        pytest.skip("qpack is not installed with its scripts in this environment")
    p = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and all(c in p.stdout for c in ("freeze", "inspect", "verify", "bench"))
