"""nn.TransformerEncoder / nn.TransformerEncoderLayer frozen as their forward written out
(FrozenTransformerEncoder / FrozenTransformerEncoderLayer): attention and feed-forward
Linears packed, adds, norms and the feed-forward on core graphs. PyTorch's own modules
are the oracle for every configuration and mask; unfreeze gives them back."""
import copy
import io
import pickle
import warnings

import pytest
import torch
from torch import nn

import qpack
from qpack.torch import FreezeWarning, FrozenMultiheadAttention, FrozenTransformerEncoder
from qpack.torch import FrozenTransformerEncoderLayer

pytestmark = pytest.mark.skipif("onednn" not in qpack.backends(), reason="the oneDNN backend is not built")

D, H, F = 32, 4, 64
BACKENDS = [b for b in ("onednn", "qnnpack") if qpack.backends()[b]["available"]]


def encoder(norm_first=False, activation="relu", batch_first=True, final_norm=True, layers=2, seed=0):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(D, H, F, dropout=0.1, activation=activation, batch_first=batch_first,
                                       norm_first=norm_first)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's note that norm_first turns its nested-tensor path off
        enc = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(D) if final_norm else None)
    with torch.no_grad():
        for m in enc.modules():
            if isinstance(m, nn.LayerNorm):  # not the identity norms PyTorch starts with
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return enc.eval()


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def freeze(m, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FreezeWarning)  # traced whole: no fallback warning
        return qpack.freeze(m, progress=False, **kw)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("final_norm", [True, False])
def test_encoder_matches_pytorch(norm_first, activation, batch_first, final_norm):
    enc = encoder(norm_first, activation, batch_first, final_norm)
    x = torch.randn(3, 11, D) if batch_first else torch.randn(11, 3, D)
    f = freeze(enc)
    assert type(f) is FrozenTransformerEncoder
    assert all(type(layer) is FrozenTransformerEncoderLayer for layer in f.layers)
    assert type(f.layers[0].self_attn) is FrozenMultiheadAttention
    report = qpack.graph_report(f)
    assert report is not None and "layer_norm" in report and "linear" in report
    with torch.no_grad():
        assert rel(f(x), enc(x)) < 1e-5
        assert rel(f(x[:, :5] if batch_first else x[:5]), enc(x[:, :5] if batch_first else x[:5])) < 1e-5


def masks():
    g = torch.Generator().manual_seed(1)
    causal = nn.Transformer.generate_square_subsequent_mask(11)
    left = torch.zeros(3, 11, dtype=torch.bool)
    left[1, 8:] = True  # left-aligned padding: PyTorch runs its nested-tensor path, padded rows 0
    scattered = torch.zeros(3, 11, dtype=torch.bool)
    scattered[2, 3] = True  # not left-aligned: PyTorch's plain path
    bool_mask = torch.rand(11, 11, generator=g) > 0.7
    bool_mask[:, 0] = False
    return {"none": {}, "causal": dict(mask=causal), "causal_flag": dict(mask=causal, is_causal=True),
            "left_padding": dict(src_key_padding_mask=left), "scattered_padding": dict(src_key_padding_mask=scattered),
            "bool_mask": dict(mask=bool_mask), "float_mask": dict(mask=torch.randn(11, 11, generator=g))}


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")  # eager's nested-tensor path
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("name", list(masks()))
def test_masks_match_pytorch(norm_first, name):
    """Every mask PyTorch's encoder takes, the frozen one takes alike (a call with a mask
    runs the layers' own forward: the graph was traced without one)."""
    enc = encoder(norm_first)
    f = freeze(enc)
    x = torch.randn(3, 11, D)
    kw = masks()[name]
    fast = torch.backends.mha.get_fastpath_enabled()
    # PyTorch's fused path gives NaN for a float mask of random values (torch 2.13); its
    # plain path adds the mask to the scores, as its documentation says and qpack does
    torch.backends.mha.set_fastpath_enabled(fast and name != "float_mask")
    try:
        with torch.no_grad():
            ref, got = enc(x, **kw), f(x, **kw)
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)
    assert rel(got, ref) < 1e-5
    if name == "left_padding" and not norm_first:
        assert torch.equal(got[1, 8:], ref[1, 8:])  # PyTorch's zeros (then the final norm's bias)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("static", [False, True])
def test_int8(backend, static):
    enc = encoder(layers=2, seed=3)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 16, D, generator=g)
    kw = dict(dtype="int8", backend=backend)
    if static:
        kw["example_inputs"] = [torch.randn(2, 16, D, generator=g) for _ in range(4)]
    f = freeze(enc, **kw)
    assert f.layers[0].linear1.mode.startswith("int8")
    with torch.no_grad():
        assert rel(f(x), enc(x)) < 0.1


class Tagger(nn.Module):
    """Token embedding, an encoder, a head: the encoder inside a model."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, D)
        self.encoder = encoder(norm_first=True, activation="gelu", seed=5)
        self.head = nn.Linear(D, 7)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)))


def test_inside_a_model_lifetimes_saving_and_unfreeze():
    torch.manual_seed(6)
    model = Tagger().eval()
    tokens = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        ref = model(tokens)
    f = freeze(model, retain=False)
    assert type(f.encoder) is FrozenTransformerEncoder and "linear" in qpack.graph_report(f)
    with torch.no_grad():
        assert rel(f(tokens), ref) < 1e-5
        assert torch.equal(copy.deepcopy(f)(tokens), f(tokens))
        assert torch.equal(pickle.loads(pickle.dumps(f))(tokens), f(tokens))
        buf = io.BytesIO()
        torch.save(f.state_dict(), buf)
        buf.seek(0)
        g = freeze(Tagger().eval())
        g.load_state_dict(torch.load(buf))
        assert torch.equal(g(tokens), f(tokens))
    back = qpack.unfreeze(f)  # after release: from the packed weights
    assert type(back.encoder) is nn.TransformerEncoder
    assert type(back.encoder.layers[0]) is nn.TransformerEncoderLayer
    assert type(back.encoder.layers[0].self_attn) is nn.MultiheadAttention
    with torch.no_grad():
        assert rel(back(tokens), ref) < 1e-6
    layer = qpack.unfreeze(freeze(model.encoder.layers[0]))
    assert type(layer) is nn.TransformerEncoderLayer and layer.norm_first


def test_one_layer_frozen_alone():
    enc = encoder(layers=1, seed=7)
    layer = enc.layers[0]
    f = freeze(layer)
    assert type(f) is FrozenTransformerEncoderLayer and qpack.graph_report(f) is not None
    x = torch.randn(2, 6, D)
    with torch.no_grad():
        assert rel(f(x), layer(x)) < 1e-5
        assert rel(f(x, src_key_padding_mask=torch.tensor([[False] * 6, [False] * 4 + [True] * 2])),
                   layer(x, src_key_padding_mask=torch.tensor([[False] * 6, [False] * 4 + [True] * 2]))) < 1e-5


def test_bad_inputs_raise_and_leave_it_usable():
    enc = encoder(seed=8)
    f = freeze(enc)
    x = torch.randn(2, 5, D)
    with torch.no_grad():
        ref = f(x)
        with pytest.raises((qpack.InvalidTypeError, qpack.InvalidArgumentError), match="32"):
            f(torch.randn(2, 5, D + 1))  # the attention's in_proj takes 32 features
        with pytest.raises(qpack.InvalidTypeError, match="float32"):
            f(x.double())
        assert torch.equal(f(x), ref)
