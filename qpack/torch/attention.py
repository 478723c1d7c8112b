"""Scaled dot-product attention on qpack's core (qpack_attention_f32) where it
applies, PyTorch's ``F.scaled_dot_product_attention`` elsewhere.

``scaled_dot_product_attention`` takes PyTorch's arguments. The core runs
float32 CPU tensors of shape [B, H, L, D] / [B, H, S, D] (any strides above
contiguous rows; rows of other strides are copied first) with a float32
``attn_mask`` (added to the scores: a position bias) or none, without
dropout, grouped heads or autograd; other calls go to PyTorch unchanged.
Frozen models call it for nn.MultiheadAttention (FrozenMultiheadAttention)
and for the
``scaled_dot_product_attention`` calls a traced forward makes between its
graphs (timm's ViT/DeiT attention, MobileViT's). One Zen 5 thread, ViT-B/16's
shapes (12 heads of 197 x 64): 652 us a call against PyTorch's 1429 (its flash
kernel for CPU); 0.45-0.55x PyTorch's time from 49 to 197 tokens and head
dims 24 to 64 (``bench/bench_attention.py``).
"""
import torch
import torch.nn.functional as F

from qpack import _core


def _core_mask(attn_mask, B, H, L, S):
    """attn_mask as the core takes it (a float32 array [B, H, L, S], broadcast dims of
    stride 0, contiguous rows), None for no mask, False where the core cannot take it
    (a boolean mask, another dtype, a shape that does not broadcast)."""
    if attn_mask is None:
        return None
    if (not torch.is_tensor(attn_mask) or attn_mask.dtype != torch.float32 or attn_mask.device.type != "cpu"
            or attn_mask.dim() > 4 or attn_mask.requires_grad and torch.is_grad_enabled()):
        return False
    try:
        m = attn_mask.expand(B, H, L, S)
    except RuntimeError:
        return False
    if S > 1 and m.stride(-1) != 1:
        return False
    return m.detach().numpy()


def _core_can_run(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa):
    if dropout_p != 0.0 or enable_gqa or (attn_mask is not None and is_causal):
        return False
    for t in (q, k, v):
        if (not torch.is_tensor(t) or t.dtype != torch.float32 or t.device.type != "cpu" or t.dim() != 4
                or t.requires_grad and torch.is_grad_enabled()):
            return False
    B, H, L, D = q.shape
    return (k.shape[0] == B and k.shape[1] == H and k.shape[3] == D and v.shape[:3] == k.shape[:3]
            and k.shape[2] > 0 and D > 0 and v.shape[3] > 0)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """PyTorch's F.scaled_dot_product_attention, on qpack's core where it applies."""
    mask = False  # the mask as the core takes it (None: no mask), False: PyTorch's call
    if _core_can_run(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
        B, H, L, _ = query.shape
        mask = _core_mask(attn_mask, B, H, L, key.shape[2])
    if mask is False:
        kw = dict(attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
        if enable_gqa:
            kw["enable_gqa"] = True
        return F.scaled_dot_product_attention(query, key, value, **kw)
    B, H, L, D = query.shape
    out = torch.empty((B, H, L, value.shape[3]), dtype=torch.float32)
    s = (1.0 / D ** 0.5) if scale is None else float(scale)
    q, k, v = (_rows(t) for t in (query, key, value))
    _core.attention_f32(q, k, v, out.numpy(), s, bool(is_causal), mask=mask)
    return out


def _rows(t):
    """t as an array whose rows (the last dim) are contiguous: a copy where they are
    not (heads transposed from channels: EfficientFormerV2's [B, H, D, N] permuted),
    cheaper than PyTorch's math kernel that would run instead."""
    t = t.detach()
    return (t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()).numpy()
