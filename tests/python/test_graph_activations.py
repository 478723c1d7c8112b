"""fp32 sigmoid and SiLU graph nodes run a vectorized exp (src/core/vec_math.cc) where the
CPU has AVX2 or AVX-512: every value, tails of any length and extreme inputs stay within
DESIGN.md's 1e-5 relative tolerance of PyTorch."""
import pytest
import torch
from torch import nn

import qpack
from qpack.torch.graph import runner_of


class Act(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)  # the identity: the activation sees x exactly
        self.act = act

    def forward(self, x):
        return self.act(self.conv(x))


@pytest.mark.parametrize("act", [nn.Sigmoid(), nn.SiLU()], ids=["sigmoid", "silu"])
@pytest.mark.parametrize("hw", [(1, 1), (3, 7), (17, 13), (64, 96)])
def test_vector_activation_matches_torch(act, hw):
    torch.manual_seed(0)
    m = Act(act).eval()
    with torch.no_grad():
        m.conv.weight.copy_(torch.eye(3)[:, :, None, None])
        m.conv.bias.zero_()
    frozen = qpack.freeze(m, retain=False, progress=False)
    assert runner_of(frozen) is not None
    x = torch.randn(2, 3, *hw) * 40  # well past +-88, where exp saturates
    x.view(-1)[:4] = torch.tensor([0.0, -0.0, 88.5, -88.5])
    with torch.no_grad():
        ref, out = m(x), frozen(x)
    assert out.shape == ref.shape
    tol = 1e-5 * ref.abs() + 1e-30
    assert bool(((out - ref).abs() <= tol).all()), (out - ref).abs().max().item()
