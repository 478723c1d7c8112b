"""Shared packed objects under threads, lifecycle races and fork (issue: invariant 3)."""
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

import qpack

SCALES = [0.01, 0.013, 0.02, 0.031, 0.05]


def shared_static_linear(backend, rng):
    w = rng.integers(-127, 128, size=(96, 80), dtype=np.int8)
    b = rng.standard_normal(96).astype(np.float32)
    return qpack.PackedLinear(w, b, backend=backend, weight_scale=0.01, output_scale=0.3,
                              output_zero_point=128), w


def shared_static_conv(backend, rng):
    w = rng.integers(-127, 128, size=(24, 8, 3, 3), dtype=np.int8)
    b = rng.standard_normal(24).astype(np.float32)
    return qpack.PackedConv2d(w, b, padding=1, backend=backend, weight_scale=0.01, output_scale=0.3,
                              output_zero_point=128), w


def hammer(obj, w, inputs, n_threads=8, iters=300):
    """n_threads x iters runs over inputs with mixed scales, while another
    thread releases, unpacks and finally closes. Returns the tally."""
    expected = [obj(x, scale=s, zero_point=128) for x, s in inputs]
    closed = threading.Event()
    results = {"ok": 0, "closed": 0, "bad": []}
    lock = threading.Lock()

    def worker(tid):
        for i in range(iters):
            t = (tid + i) % len(inputs)
            closed_before = closed.is_set()
            try:
                y = obj(inputs[t][0], scale=inputs[t][1], zero_point=128)
            except qpack.ClosedError:
                with lock:
                    results["closed"] += 1
                continue
            with lock:
                if closed_before:
                    results["bad"].append(("ran after close", tid, i))
                elif not np.array_equal(np.asarray(y), np.asarray(expected[t])):
                    results["bad"].append(("wrong output", tid, i))
                else:
                    results["ok"] += 1

    def lifecycle():
        obj.release_original()
        for _ in range(20):
            if not np.array_equal(obj.unpack()[0], w):
                results["bad"].append(("unpack differs",))
        while True:
            with lock:
                if results["ok"] >= n_threads * iters // 2:
                    break
            time.sleep(0.001)
        obj.close()
        closed.set()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    threads.append(threading.Thread(target=lifecycle))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results["total"] = n_threads * iters
    return results


@pytest.mark.stress
@pytest.mark.parametrize("kind", ["linear", "conv2d"])
def test_stress_shared_object_with_rebuilds_release_and_close(backend, kind):
    rng = np.random.default_rng(21)
    qpack.set_num_threads(1)
    if kind == "linear":
        obj, w = shared_static_linear(backend, rng)
        inputs = [(rng.integers(0, 256, size=(4, 80), dtype=np.uint8), s) for s in SCALES]
    else:
        obj, w = shared_static_conv(backend, rng)
        inputs = [(rng.integers(0, 256, size=(1, 8, 10, 9), dtype=np.uint8), s) for s in SCALES]
    r = hammer(obj, w, inputs)
    assert r["bad"] == []
    assert r["ok"] >= r["total"] // 2
    assert r["ok"] + r["closed"] == r["total"]
    with pytest.raises(qpack.ClosedError):
        obj(inputs[0][0], scale=SCALES[0], zero_point=128)


@pytest.mark.stress
def test_stress_shared_fp32_and_dynamic(backend):
    rng = np.random.default_rng(22)
    w8 = rng.integers(-127, 128, size=(64, 48), dtype=np.int8)
    layers = [qpack.PackedLinear(w8, backend=backend, weight_scale=0.02, dynamic=True)]
    if backend == "onednn":
        layers.append(qpack.PackedLinear(rng.standard_normal((64, 48)).astype(np.float32)))
    xs = [(rng.standard_normal((m, 48)) * (m + 1)).astype(np.float32) for m in (1, 3, 17, 64)]
    expected = [[lay(x) for x in xs] for lay in layers]
    bad = []

    def worker(tid):
        for i in range(200):
            li, xi = (tid + i) % len(layers), (tid * 7 + i) % len(xs)
            if not np.array_equal(layers[li](xs[xi]), expected[li][xi]):
                bad.append((tid, i))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


def test_states_rebuilt_from_packed_form_under_threads():
    rng = np.random.default_rng(23)
    lin, _ = shared_static_linear("qnnpack", rng)
    lin.release_original()
    x = rng.integers(0, 256, size=(2, 80), dtype=np.uint8)
    refs = {s: lin(x, scale=s, zero_point=0) for s in SCALES}

    def worker():
        for s in SCALES * 20:
            assert np.array_equal(lin(x, scale=s, zero_point=0), refs[s])

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    st = lin.stats
    assert st["states_built"] > len(SCALES)  # cache of 2 keeps rebuilding
    assert st["evictions"] > 0 and st["runs"] == len(SCALES) * 81


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("backend_name", ["onednn", "qnnpack"])
def test_fork_after_use_runs_in_child(backend_name):
    qpack.set_num_threads(2)
    rng = np.random.default_rng(24)
    lin = qpack.PackedLinear(rng.integers(-127, 128, size=(256, 256), dtype=np.int8),
                             backend=backend_name, weight_scale=0.01, dynamic=True)
    fp = qpack.PackedLinear(rng.standard_normal((256, 256)).astype(np.float32))
    x = rng.standard_normal((64, 256)).astype(np.float32)
    y, yf = lin(x), fp(x)  # thread pools of both libraries are now running
    pid = os.fork()
    if pid == 0:  # child: must not hang; the alarm turns a hang into a failure
        signal.alarm(20)
        code = 0
        try:
            if not (np.array_equal(lin(x), y) and np.array_equal(fp(x), yf)):
                code = 3
            if not qpack.build_info()["forked_child"] or qpack.get_num_threads() != 1:
                code = 4
        except BaseException:
            code = 5
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not qpack.build_info()["forked_child"]
    np.testing.assert_array_equal(lin(x), y)  # parent unaffected
