"""Frozen models in Ray actors: every actor qpack.loads the same .qpk file (the path
crosses the process boundary, not the model) and answers bit-identically to the
in-process model; the actors share the file's pages; ray.shutdown leaves no process.

One local Ray instance for the module: 2 CPUs, no dashboard, no network, logs kept
out of the test's output.
"""
import os
import sys
import time

import numpy as np
import pytest

import qpack

torch = pytest.importorskip("torch", reason="qpack.freeze needs torch (pip install qpack[test])")
ray = pytest.importorskip("ray", reason="Ray is not importable (pip install 'ray>=2.40'; make setup does)",
                         exc_type=ImportError)
nn = torch.nn

BACKENDS = [b for b in ("onednn", "qnnpack") if qpack.backends()[b]["available"]]
ACTORS = 2
TIMEOUT = 120


def make_cnn(seed):
    """Plain torch modules (nn.Sequential): a Ray worker unpickles the model without this file."""
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.Conv2d(32, 64, 3, 1, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(64, 10))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        model[1].running_mean.copy_(torch.randn(32, generator=g) * 0.1)
        model[1].running_var.copy_(torch.rand(32, generator=g) + 0.5)
    return model.eval()


def make_mlp(seed):
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 64))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def inputs(shape, seed, n):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g) * (1 + k)).numpy() for k in range(n)]


def run(model, x):
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def _actor_class():
    """The actor, defined here so that Ray pickles it by value: its workers cannot import this
    test module (they see the installed packages and the driver's current directory only)."""

    @ray.remote(num_cpus=2 / ACTORS)
    class ModelServer:
        def __init__(self, paths):
            import qpack as qp
            import torch as t
            t.set_num_threads(1)
            qp.set_num_threads(1)
            self.paths = paths
            # mapped read-only: the packed weights are the files' pages
            self.models = {name: qp.load(path) for name, path in paths.items()}

        def infer(self, name, x):
            import numpy
            import torch as t
            with t.no_grad():  # Ray's arrays are read-only views of its object store: copy first
                return self.models[name](t.from_numpy(numpy.array(x))).numpy()

        def mapping(self, name):
            """pid, and RSS/PSS (kB) of this process's mappings of a model's file."""
            import os as o
            real, rss, pss, mine = o.path.realpath(self.paths[name]), 0, 0, False
            with open("/proc/self/smaps") as f:
                for line in f:
                    fields = line.split(None, 5)
                    if "-" in fields[0] and not fields[0].endswith(":"):
                        mine = len(fields) > 5 and fields[5].strip() == real
                    elif mine and fields[0] == "Rss:":
                        rss += int(fields[1])
                    elif mine and fields[0] == "Pss:":
                        pss += int(fields[1])
            return o.getpid(), rss, pss

    return ModelServer


def _processes_of(session):
    """pids of live (not zombie) processes whose command line names this Ray session."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if session in cmd and state != "Z":
            found.append(int(pid))
    return found


class Cluster:
    def __init__(self, workdir):
        # Ray puts the driver's current directory first on its workers' sys.path: started from a
        # checkout of qpack (not built in place) the source tree would shadow the installed package.
        self._cwd = os.getcwd()
        os.chdir(workdir)
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                     object_store_memory=128 * 2**20, configure_logging=False)
        finally:
            os.chdir(self._cwd)
        self.session = os.path.basename(ray._private.worker._global_node.get_session_dir_path())
        self.down = False

    def shutdown(self):
        """ray.shutdown(), then waits for every process of the session to end; returns the ones
        that did not within 30 s (and kills them: this test started them)."""
        if not self.down:
            ray.shutdown()
            self.down = True
        deadline = time.monotonic() + 30
        left = _processes_of(self.session)
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = _processes_of(self.session)
        for pid in left:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        return left


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not sys.platform.startswith("linux"):
        pytest.skip("the test reads /proc (Linux)")
    c = Cluster(tmp_path_factory.mktemp("ray-cwd"))
    try:
        yield c
    finally:
        c.shutdown()


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    qpack.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def configurations():
    cnn, mlp = make_cnn(0), make_mlp(1)
    calib = [torch.from_numpy(x) for x in inputs((2, 3, 32, 32), 10, 3)]
    out = [("fp32", qpack.freeze(cnn, retain=False), inputs((2, 3, 32, 32), 1, 4))]
    for b in BACKENDS:
        out.append((f"int8-static-{b}", qpack.freeze(cnn, dtype="int8", backend=b, example_inputs=calib,
                                                     retain=False), inputs((2, 3, 32, 32), 2, 4)))
        out.append((f"int8-dynamic-{b}", qpack.freeze(mlp, dtype="int8", backend=b, retain=False),
                    inputs((3, 128), 3, 4)))
    return out


def test_actors_load_one_file_and_match_the_in_process_model(cluster, one_thread, tmp_path):
    configs = configurations()
    paths = {name: str(tmp_path / f"{name}.qpk") for name, _, _ in configs}
    for name, frozen, _ in configs:
        qpack.save(frozen, paths[name])
    refs = {name: [run(frozen, x) for x in xs] for name, frozen, xs in configs}
    actors = [_actor_class().remote(paths) for _ in range(ACTORS)]
    try:
        for name, _, xs in configs:
            answers = ray.get([actors[i % ACTORS].infer.remote(name, x) for i, x in enumerate(xs)],
                              timeout=TIMEOUT)
            for i, (out, ref) in enumerate(zip(answers, refs[name])):
                assert out.dtype == ref.dtype and out.shape == ref.shape
                assert np.array_equal(out, ref), f"{name}: request {i} differs from the in-process model"
        for name, _, _ in configs:
            maps = ray.get([a.mapping.remote(name) for a in actors], timeout=TIMEOUT)
            pids = {pid for pid, _, _ in maps}
            assert len(pids) == ACTORS and os.getpid() not in pids
            size_kb = os.path.getsize(paths[name]) // 1024
            for pid, rss, pss in maps:  # both actors verified (read) every page of the same mapping
                assert rss >= size_kb, f"{name}: actor {pid} does not map the file ({rss} kB)"
                assert pss <= 0.6 * rss, f"{name}: actor {pid} does not share the file's pages ({pss}/{rss} kB)"
    finally:
        for a in actors:
            ray.kill(a)


def test_shutdown_ends_every_ray_process(cluster):
    assert _processes_of(cluster.session), "no process of the Ray session was found to begin with"
    left = cluster.shutdown()
    assert not left, f"processes of {cluster.session} still running after ray.shutdown(): {left}"
