import os
import random

import numpy as np
import pytest

import qpack

try:
    import torch
except ImportError:  # pragma: no cover - the test extra installs torch
    torch = None

BACKENDS = [b for b in ("onednn", "qnnpack") if qpack.backends()[b]["available"]]


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    np.random.seed(0)
    if torch is not None:
        torch.manual_seed(0)


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Runs a test once per available backend."""
    return request.param


@pytest.fixture
def needs_torch():
    if torch is None:
        pytest.skip("torch is not installed (pip install qpack[test])")
    return torch


@pytest.fixture(autouse=True)
def _restore_policy():
    keep = qpack.get_default_retain()
    threads = qpack.get_num_threads()
    yield
    qpack.set_default_retain(keep)
    qpack.set_num_threads(threads)
