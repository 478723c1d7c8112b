"""transformers models built from small configs (random weights, nothing downloaded), frozen
fp32 and int8 (dynamic, and static calibrated on two batches) on both backends: each freezes and runs, fp32 within
1e-5 of eager at 1.00-1.05x its parameter bytes (weights released), int8 within 0.1."""
import warnings

import pytest

import qpack

torch = pytest.importorskip("torch")
T = pytest.importorskip("transformers", reason="transformers is not installed")

IDS = torch.randint(0, 1000, (2, 24), generator=torch.Generator().manual_seed(0))
IMG = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
SMALL = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256)

MODELS = {
    # an MLM head whose decoder shares the word embeddings' weight (tied)
    "bert_mlm": (lambda: T.BertForMaskedLM(T.BertConfig(vocab_size=1000, **SMALL)), dict(input_ids=IDS)),
    "distilbert": (lambda: T.DistilBertModel(T.DistilBertConfig(vocab_size=1000, dim=128, n_layers=2, n_heads=4,
                                                                hidden_dim=256)), dict(input_ids=IDS)),
    # reads its patch embedding's weight.dtype in forward
    "vit": (lambda: T.ViTForImageClassification(T.ViTConfig(image_size=64, patch_size=8, num_labels=10, **SMALL)),
            dict(pixel_values=IMG)),
    "clip_vision": (lambda: T.CLIPVisionModel(T.CLIPVisionConfig(image_size=64, patch_size=8, **SMALL)),
                    dict(pixel_values=IMG)),
    # Conv1D layers (a Linear's weight transposed) and a tied lm_head
    "gpt2": (lambda: T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000,
                                                     n_positions=64, bos_token_id=0, eos_token_id=0)),
             dict(input_ids=IDS)),
    "t5": (lambda: T.T5ForConditionalGeneration(T.T5Config(vocab_size=1000, d_model=128, d_kv=32, d_ff=256,
                                                             num_layers=2, num_heads=4)),
           dict(input_ids=IDS, decoder_input_ids=IDS[:, :8])),
    # convolutions whose weight is a weight-norm parametrization
    "wav2vec2": (lambda: T.Wav2Vec2Model(T.Wav2Vec2Config(conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
                                                          num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                                                          **SMALL)),
                 dict(input_values=torch.randn(1, 4000, generator=torch.Generator().manual_seed(2)))),
}


def first(out):
    for key in ("logits", "last_hidden_state"):
        if hasattr(out, key):
            return getattr(out, key)
    return out[0]


BACKENDS = [b for b in ("onednn", "qnnpack") if qpack.backends()[b]["available"]]


@pytest.mark.parametrize("config", ["fp32"] + [f"{k}-{b}" for b in BACKENDS for k in ("int8", "int8_static")])
@pytest.mark.parametrize("name", list(MODELS))
def test_transformers_model(name, config):
    torch.manual_seed(0)
    make, inputs = MODELS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make().eval()
        with torch.no_grad():
            ref = first(model(**inputs))
        kind, _, backend = config.partition("-")
        kw = {"fp32": {}, "int8": dict(dtype="int8", backend=backend),
              "int8_static": dict(dtype="int8", backend=backend, example_inputs=[inputs, inputs])}[kind]
        frozen = qpack.freeze(model, progress=False, retain=False, **kw)
        with torch.no_grad():
            y = first(frozen(**inputs))
    err = ((y - ref).abs().max() / ref.abs().max()).item()
    report = qpack.memory_report(frozen)
    assert report.layers, "nothing was frozen"
    if config == "fp32":
        assert err <= 1e-5, err
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        assert report.nbytes_original == 0
        assert 0.99 <= (report.nbytes_packed + report.nbytes_other) / params <= 1.05
    else:
        assert err <= 0.1, err
