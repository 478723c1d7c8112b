"""The conda package's own test (conda/recipe.yaml, tests:), numpy only (and qpack's run
requirements).

Also run against the wheel build by tests/python/test_conda_recipe.py and against
the conda-prefix build by conda/check_prefix_build.sh.
"""
import numpy as np

import qpack

backends = qpack.backends()
for name in ("onednn", "qnnpack"):
    assert backends[name]["available"], (name, backends[name])
    print(f"{name}: {backends[name]['version']}")

rng = np.random.default_rng(0)
w = rng.standard_normal((16, 32)).astype(np.float32)
x = rng.standard_normal((4, 32)).astype(np.float32)

# fp32 on oneDNN, original released: unpack() rebuilds it bit-exactly.
with qpack.PackedLinear(w, backend="onednn", retain=False) as lin:
    assert not lin.has_original
    y = lin(x)
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-5, atol=1e-5)
    w_back, _ = lin.unpack()
    assert w_back.dtype == w.dtype and (w_back == w).all()

# int8 static on QNNPACK: runs, and unpack() gives the int8 weights back.
w8 = np.clip(np.round(w / 0.02), -127, 127).astype(np.int8)
with qpack.PackedLinear(w8, weight_scale=0.02, backend="qnnpack", retain=False,
                        output_scale=0.1, output_zero_point=128) as q:
    x8 = rng.integers(0, 256, (4, 32), dtype=np.uint8)
    yq = q(x8, scale=0.05, zero_point=128)
    assert yq.shape == (4, 16) and yq.dtype == np.uint8
    w8_back, _ = q.unpack()
    assert (np.asarray(w8_back) == w8).all()

    # A packed model file: saved, loaded mapped, the same outputs.
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "q.qpk")
        q.save(path)
        loaded = qpack.load(path)
        assert (loaded(x8, scale=0.05, zero_point=128) == yq).all()
        del loaded

print("qpack conda test: ok")
