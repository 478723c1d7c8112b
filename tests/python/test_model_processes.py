"""Packed model files (.qpk) across processes: several processes map one file and
share its pages, a file replaced on disk leaves a process that mapped the old one
running the old model, and a ProcessPoolExecutor passes models as paths both ways.

Children are spawned (never forked from this process, which has loaded models)
and run on one thread, as this process does, so outputs compare bit for bit.
"""
import concurrent.futures
import multiprocessing as mp
import os
import sys
import warnings

import numpy as np
import pytest

import qpack

torch = pytest.importorskip("torch", reason="qpack.freeze needs torch (pip install qpack[test])")
nn = torch.nn

BACKENDS = [b for b in ("onednn", "qnnpack") if qpack.backends()[b]["available"]]
LINUX = sys.platform.startswith("linux")
TIMEOUT = 120  # seconds a child may take for one command (it imports torch on its first)


class SmallNet(nn.Module):
    """Conv-BN-ReLU, a strided conv, global average pooling, a classifier: one graph when frozen."""

    def __init__(self, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.conv1, self.bn = nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, stride=2, padding=1)
        self.fc = nn.Linear(64, 10)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
            self.bn.running_mean.copy_(torch.randn(32, generator=g) * 0.1)
            self.bn.running_var.copy_(torch.rand(32, generator=g) + 0.5)
        self.eval()

    def forward(self, x):
        y = torch.relu(self.bn(self.conv1(x)))
        y = torch.relu(self.conv2(y))
        return self.fc(y.mean((2, 3)))


class MLP(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.fc1, self.fc2 = nn.Linear(256, 512), nn.Linear(512, 128)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        self.eval()

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def conv_inputs(seed, n):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, 16, 16, generator=g) for _ in range(n)]


def mlp_inputs(seed, n):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 256, generator=g) * (1 + k) for k in range(n)]  # another input scale each


def run(model, x):
    with torch.no_grad():
        return model(torch.as_tensor(x)).numpy()


def set_threads(n):
    torch.set_num_threads(n)
    qpack.set_num_threads(n)


def mapping(path):
    """This process's mappings of `path`: their names as /proc/self/smaps gives them, and
    their RSS and PSS in kB."""
    real = os.path.realpath(path)
    names, rss, pss, mine = set(), 0, 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split(None, 5)
            if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header line
                name = fields[5].strip() if len(fields) > 5 else ""
                mine = name in (real, real + " (deleted)")
                if mine:
                    names.add(name)
            elif mine and fields[0] == "Rss:":
                rss += int(fields[1])
            elif mine and fields[0] == "Pss:":
                pss += int(fields[1])
    return {"names": sorted(names), "rss_kb": rss, "pss_kb": pss}


# ---- a child that runs commands from this process -------------------------------------------

def _serve(conn):
    """Loads, runs and reports what it is told: ("load", key, path), ("run", key, array),
    ("mapping", path), ("exit",). Replies ("ok", result) or ("error", message)."""
    warnings.simplefilter("error", qpack.RepackWarning)  # the file was packed on this machine
    set_threads(1)
    models = {}
    while True:
        cmd, *args = conn.recv()
        if cmd == "exit":
            conn.send(("ok", None))
            return
        try:
            if cmd == "load":
                key, path = args
                models[key] = qpack.load(path)
                result = None
            elif cmd == "run":
                key, x = args
                result = run(models[key], x)
            elif cmd == "mapping":
                result = mapping(*args)
            else:
                raise ValueError(f"unknown command {cmd!r}")
        except Exception as e:  # noqa: BLE001 - sent back and raised by the test
            conn.send(("error", f"{type(e).__name__}: {e}"))
        else:
            conn.send(("ok", result))


class Child:
    def __init__(self, ctx):
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(theirs,), daemon=True)
        self.proc.start()
        theirs.close()

    def __call__(self, *cmd):
        cmd = tuple(c.numpy() if isinstance(c, torch.Tensor) else c for c in cmd)  # sent by value
        self.conn.send(cmd)
        if not self.conn.poll(TIMEOUT):
            raise TimeoutError(f"child {self.proc.pid} did not answer {cmd[0]!r} in {TIMEOUT} s")
        status, result = self.conn.recv()
        if status != "ok":
            raise AssertionError(f"child {self.proc.pid}, {cmd[0]!r}: {result}")
        return result

    def close(self):
        try:
            if self.proc.is_alive():
                self("exit")
        except (OSError, EOFError, TimeoutError, AssertionError):
            pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


@pytest.fixture
def children():
    """Starts spawned children; every one is ended (and reaped) after the test."""
    made = []

    def start(n):
        ctx = mp.get_context("spawn")
        new = [Child(ctx) for _ in range(n)]
        made.extend(new)
        return new

    yield start
    for c in made:
        c.close()
    assert all(not c.proc.is_alive() for c in made)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    set_threads(1)
    yield
    torch.set_num_threads(threads)


def configurations():
    """(name, frozen model, inputs): fp32, static int8 and dynamic int8 on every backend."""
    net, mlp = SmallNet(0), MLP(0)
    calib = conv_inputs(100, 3)
    out = [("fp32", qpack.freeze(net, retain=False), conv_inputs(1, 2))]
    for b in BACKENDS:
        out.append((f"int8-static-{b}", qpack.freeze(net, dtype="int8", backend=b, example_inputs=calib,
                                                     retain=False), conv_inputs(2, 2)))
        out.append((f"int8-dynamic-{b}", qpack.freeze(mlp, dtype="int8", backend=b, retain=False),
                    mlp_inputs(3, 2)))
    return out


# ---- tests ----------------------------------------------------------------------------------

def test_two_processes_map_one_file_and_match_the_in_process_model(tmp_path, children):
    configs = configurations()
    for name, frozen, _ in configs:
        qpack.save(frozen, tmp_path / f"{name}.qpk")
    refs = {name: [run(frozen, x) for x in xs] for name, frozen, xs in configs}
    a, b = children(2)
    for child in (a, b):  # both hold every model at once
        for name, _, _ in configs:
            child("load", name, str(tmp_path / f"{name}.qpk"))
    for child in (a, b):
        for name, _, xs in configs:
            for x, ref in zip(xs, refs[name]):
                out = child("run", name, x)
                assert out.dtype == ref.dtype and out.shape == ref.shape
                assert np.array_equal(out, ref), f"{name}: child {child.proc.pid} differs from this process"
    if LINUX:
        for name, _, _ in configs:
            path = str(tmp_path / f"{name}.qpk")
            size_kb = os.path.getsize(path) // 1024
            for child in (a, b):
                m = child("mapping", path)
                assert m["names"] == [os.path.realpath(path)], f"{name}: not mapped by the child"
                # verify read every page; the two children map the same page-cache pages
                assert m["rss_kb"] >= size_kb
                assert m["pss_kb"] <= 0.6 * m["rss_kb"], f"{name}: pages not shared ({m})"


def test_a_replaced_file_leaves_the_old_model_running(tmp_path, children):
    path = tmp_path / "model.qpk"
    xs = conv_inputs(5, 2)
    calib = conv_inputs(6, 3)
    old = qpack.freeze(SmallNet(0), dtype="int8", example_inputs=calib, retain=False)
    new = qpack.freeze(SmallNet(1), dtype="int8", example_inputs=calib, retain=False)
    old_refs, new_refs = [run(old, x) for x in xs], [run(new, x) for x in xs]
    assert not any(np.array_equal(o, n) for o, n in zip(old_refs, new_refs))

    qpack.save(old, path)
    here = qpack.load(path)  # this process maps the old file too
    (child,) = children(1)
    child("load", "old", str(path))
    for x, ref in zip(xs[:1], old_refs):
        assert np.array_equal(child("run", "old", x), ref)
    if LINUX:
        assert child("mapping", str(path))["names"] == [os.path.realpath(path)]

    qpack.save(new, path)  # written beside the file and renamed over it

    if LINUX:  # the child still maps the old file, now unlinked
        assert child("mapping", str(path))["names"] == [os.path.realpath(path) + " (deleted)"]
    for x, ref in zip(xs, old_refs):  # the second input is the first run of that shape after the swap
        assert np.array_equal(child("run", "old", x), ref)
        assert np.array_equal(run(here, x), ref)
    child("load", "new", str(path))
    for x, ref in zip(xs, new_refs):
        assert np.array_equal(child("run", "new", x), ref)
        assert np.array_equal(run(qpack.load(path), x), ref)
    for x, ref in zip(xs, old_refs):  # and the old one is untouched by the new load beside it
        assert np.array_equal(child("run", "old", x), ref)


_POOL_MODEL = None


def _pool_init(path):
    global _POOL_MODEL
    set_threads(1)
    _POOL_MODEL = qpack.load(path)


def _pool_run(x):
    return os.getpid(), run(_POOL_MODEL, x)


def _pool_freeze_and_save(path, seed, x):
    """In a worker: freeze a static int8 model, save it, and return its output on x."""
    model = qpack.freeze(SmallNet(seed), dtype="int8", example_inputs=conv_inputs(seed, 2), retain=False)
    qpack.save(model, path)
    return run(model, x)


def test_process_pool_round_trip(tmp_path):
    ctx = mp.get_context("spawn")
    frozen = qpack.freeze(SmallNet(3), retain=False)
    there = tmp_path / "to_workers.qpk"
    qpack.save(frozen, there)
    xs = conv_inputs(7, 4)
    refs = [run(frozen, x) for x in xs]
    back = tmp_path / "from_a_worker.qpk"
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx, initializer=_pool_init,
                                                initargs=(str(there),)) as pool:
        results = list(pool.map(_pool_run, [x.numpy() for x in xs], timeout=TIMEOUT))
        theirs = pool.submit(_pool_freeze_and_save, str(back), 4, xs[0].numpy()).result(timeout=TIMEOUT)
        worker_pids = {pid for pid, _ in results}
    assert os.getpid() not in worker_pids
    for (_, out), ref in zip(results, refs):
        assert np.array_equal(out, ref)
    # the other way: a model frozen and saved in a worker, loaded here
    assert np.array_equal(run(qpack.load(back), xs[0]), theirs)
