"""The graph's vector code paths: fp32 sigmoid and SiLU nodes run a vectorized exp
(src/core/vec_math.cc) where the CPU has AVX2 or AVX-512, within DESIGN.md's 1e-5 relative
tolerance of PyTorch for every value, tail length and extreme input; NCHW <-> NHWC
conversions at the graph's edges go by SSE2 blocks (4x4 floats, 16x16 bytes) with element
loops at the edges of the blocks."""
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


@pytest.mark.parametrize("dtype", [None, "int8"])
@pytest.mark.parametrize("c_in,c_out,hw", [(3, 16, (16, 16)), (17, 37, (19, 23)), (32, 64, (4, 4)),
                                            (20, 3, (33, 17)), (64, 16, (1, 1))])
def test_nchw_edges(dtype, c_in, c_out, hw):
    """A 1x1 conv between an NCHW input and an NCHW output: both conversions, every block
    shape and edge (channel and pixel counts on and off the 4 / 16 blocks)."""
    torch.manual_seed(c_in * 100 + c_out)
    m = nn.Sequential(nn.Conv2d(c_in, c_out, 1), nn.ReLU()).eval()
    x = torch.randn(2, c_in, *hw)
    kw = dict(dtype="int8", backend="onednn", example_inputs=[x]) if dtype else {}
    frozen = qpack.freeze(m, retain=False, progress=False, **kw)
    assert runner_of(frozen) is not None
    with torch.no_grad():
        ref, out = m(x), frozen(x)
    assert out.shape == ref.shape and out.is_contiguous()
    if dtype is None:
        assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
    else:  # a few output quanta of the int8 conv
        assert (out - ref).abs().max().item() <= 0.05 * ref.abs().max().item() + 1e-6


@pytest.mark.parametrize("c,hw", [(3, (40, 40)), (24, (17, 21)), (48, (32, 32))])
def test_nchw_input_to_pooling_int8(c, hw):
    """An int8 graph whose input feeds a max pool first: the quantized input is transposed
    as bytes (16x16 blocks)."""
    torch.manual_seed(c)
    m = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(c, 8, 3, padding=1)).eval()
    x = torch.randn(1, c, *hw)
    frozen = qpack.freeze(m, dtype="int8", backend="onednn", example_inputs=[x], retain=False, progress=False)
    assert runner_of(frozen) is not None
    with torch.no_grad():
        ref, out = m(x), frozen(x)
    assert out.shape == ref.shape
    assert (out - ref).abs().max().item() <= 0.05 * ref.abs().max().item()
