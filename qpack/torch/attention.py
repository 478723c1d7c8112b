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


# ---- torchvision's Swin: shifted window attention on one core graph ----------------------

def _window_order(H, W, window, shift):
    """The rows of an image [H, W] (row-major pixels) in the order torchvision's
    shifted_window_attention takes them: rolled by -shift, then window by window,
    each window's pixels row-major (window_partition)."""
    idx = torch.arange(H * W).reshape(1, H, W, 1)
    if shift[0] or shift[1]:
        idx = torch.roll(idx, shifts=(-shift[0], -shift[1]), dims=(1, 2))
    idx = idx.view(1, H // window[0], window[0], W // window[1], window[1], 1)
    return idx.permute(0, 1, 3, 2, 4, 5).reshape(-1)


def _shift_mask(H, W, window, shift):
    """[windows, N, N] of torchvision's shifted windows: -100 between pixels that came
    from different regions of the image before the roll, 0 within one."""
    region = torch.zeros((H, W))
    count = 0
    for h in ((0, -window[0]), (-window[0], -shift[0]), (-shift[0], None)):
        for w in ((0, -window[1]), (-window[1], -shift[1]), (-shift[1], None)):
            region[h[0]:h[1], w[0]:w[1]] = count
            count += 1
    region = region.view(H // window[0], window[0], W // window[1], window[1]).permute(0, 2, 1, 3)
    region = region.reshape(-1, window[0] * window[1])
    diff = region.unsqueeze(1) - region.unsqueeze(2)
    return diff.masked_fill(diff != 0, -100.0)


class WindowGraph:
    """One core graph for a Swin block's window attention at one input shape: its rows
    in window order (permute_rows), the qkv linear, the attention of each window
    (the heads' relative position bias and, shifted, one mask per window position,
    each held once: the node adds a window's after its head's), the proj linear, the
    rows back in image order. Held by the qkv layer (not pickled, dropped when its
    packed op is closed: it shares the op), replaced for another image size or when
    either layer is re-packed (not closed then: a thread may still be running it; any
    batch runs on one graph)."""

    def __init__(self):
        self.key = None
        self.handle = None

    def drop(self):
        if self.handle is not None:
            self.handle.close()
        self.key = self.handle = None

    def run(self, x, qkv, proj, bias, window, heads, shift, qkv_bias, proj_bias, shift_mask=None):
        """``shift_mask``: the shifted windows' masks [windows, N, N] (timm's block keeps
        them), else torchvision's, made here (_shift_mask)."""
        B, H, W, C = x.shape
        key = (H, W, C, tuple(window), tuple(shift), heads, qkv._packed, proj._packed, bias.data_ptr(),
               None if qkv_bias is None else qkv_bias.data_ptr(), None if proj_bias is None else proj_bias.data_ptr(),
               None if shift_mask is None else shift_mask.data_ptr())
        handle = self.handle
        if key != self.key:  # (replaced, not closed: another thread may be running the old one)
            order = _window_order(H, W, window, shift)
            N = window[0] * window[1]
            # the heads' bias [heads, N, N] then, shifted, the windows' masks [windows, N, N]:
            # the core adds window b % windows's after the head's, each held once
            mask = bias.reshape(heads, N, N).float()
            if shift_mask is None and (shift[0] or shift[1]):
                shift_mask = _shift_mask(H, W, window, shift)
            windows = 0
            if shift_mask is not None:
                shift_mask = shift_mask.reshape(-1, N, N).float()
                windows = shift_mask.shape[0]
                mask = torch.cat([mask, shift_mask])
            f32 = ("f32", 0.0, 0)
            nodes = [dict(kind="permute_rows", inputs=[0], output=1, rows=order.numpy().astype("float32"),
                          kernel=(N, 0)),
                     dict(kind="linear", op=qkv._packed._h, inputs=[1], output=2),
                     dict(kind="attention", inputs=[2, 2, 2], output=3, heads=heads, head_dim=C // heads,
                          offsets=(0, C, 2 * C), scale=(C // heads) ** -0.5,
                          mask=mask.contiguous().numpy(), mask_windows=windows),
                     dict(kind="linear", op=proj._packed._h, inputs=[3], output=4),
                     dict(kind="permute_rows", inputs=[4], output=5,
                          rows=torch.argsort(order).numpy().astype("float32"), kernel=(H * W, 0))]
            handle = _core.GraphHandle([f32] * 6, nodes, [0], [5])
            self.handle, self.key = handle, key
        out = handle.run([x.detach().reshape(B, H * W, C).numpy()], ["nchw"])[0]
        return torch.from_numpy(out).reshape(B, H, W, C)


def _window_graph(qkv):
    graph = qkv.__dict__.get("_window_graph")
    if graph is None:
        graph = qkv.__dict__["_window_graph"] = WindowGraph()
    return graph


# ---- timm's Swin: its blocks' _attn, on the same graph --------------------------------------

def timm_window_attention(x, qkv_weight, proj_weight, relative_position_bias, window_size, num_heads, shift_size,
                          qkv_bias, proj_bias, attn_mask):
    """timm's ``SwinTransformerBlock._attn`` (eval: roll by -shift, pad to whole windows,
    window_partition, the block's WindowAttention with its relative position bias
    [1, heads, N, N] and ``attn_mask`` [windows, N, N] (None unshifted), window_reverse,
    crop, roll back) on one core graph (WindowGraph) where it applies: float32
    [B, H, W, C] whose H and W the windows divide, the mask's windows those of the
    image, qkv and proj frozen float-in-and-out linears; otherwise the same written
    out in PyTorch (_timm_window_attention_torch). Traced timm Swin blocks call it
    (graph.py's _LayerLeaves)."""
    if not torch.is_tensor(x) or x.dim() != 4:
        raise ValueError(f"timm_window_attention takes an image [B, H, W, C], got "
                         f"{tuple(x.shape) if torch.is_tensor(x) else type(x).__name__}")
    window, shift = [int(w) for w in window_size], [int(s) for s in shift_size]
    B, H, W, C = x.shape
    N = window[0] * window[1]
    windows = (H // window[0]) * (W // window[1]) if window[0] and window[1] else 0
    layers = None
    if (attn_mask is None) == (not any(shift)) and (attn_mask is None or tuple(attn_mask.shape) == (windows, N, N)):
        layers = _window_layers(x, qkv_weight, qkv_bias, proj_weight, proj_bias, relative_position_bias, window,
                                num_heads)
    if layers is None:
        return _timm_window_attention_torch(x, qkv_weight, proj_weight, relative_position_bias, window, num_heads,
                                            shift, qkv_bias, proj_bias, attn_mask)
    return _window_graph(layers[0]).run(x.contiguous(), *layers, relative_position_bias, window, num_heads, shift,
                                        qkv_bias, proj_bias, shift_mask=attn_mask)


def _timm_window_attention_torch(x, qkv_weight, proj_weight, bias, window, heads, shift, qkv_bias, proj_bias,
                                 attn_mask):
    """timm's SwinTransformerBlock._attn and WindowAttention.forward (eval), written out."""
    B, H, W, C = x.shape
    if any(shift):
        x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))
    ph, pw = (window[0] - H % window[0]) % window[0], (window[1] - W % window[1]) % window[1]
    x = F.pad(x, (0, 0, 0, pw, 0, ph))
    Hp, Wp, N = H + ph, W + pw, window[0] * window[1]
    xw = x.view(B, Hp // window[0], window[0], Wp // window[1], window[1], C).permute(0, 1, 3, 2, 4, 5)
    xw = xw.reshape(-1, N, C)
    Bw = xw.shape[0]
    q, k, v = F.linear(xw, qkv_weight, qkv_bias).reshape(Bw, N, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    mask = bias
    if attn_mask is not None:
        nw = attn_mask.shape[0]
        mask = mask + attn_mask.view(1, nw, 1, N, N).expand(Bw // nw, -1, heads, -1, -1).reshape(-1, heads, N, N)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = F.linear(out.transpose(1, 2).reshape(Bw, N, -1), proj_weight, proj_bias)
    out = out.view(B, Hp // window[0], Wp // window[1], window[0], window[1], C).permute(0, 1, 3, 2, 4, 5)
    out = out.reshape(B, Hp, Wp, C)[:, :H, :W, :].contiguous()
    if any(shift):
        out = torch.roll(out, shifts=tuple(shift), dims=(1, 2))
    return out


def _window_layers(x, qkv_weight, qkv_bias, proj_weight, proj_bias, bias, window, heads):
    """(qkv, proj), the frozen layers, when a WindowGraph runs this window attention:
    float32 CPU [B, H, W, C] (none of them 0) whose windows divide H and W, C a multiple
    of the heads, no autograd, a relative position bias of heads N N, qkv and proj
    frozen float-in-and-out linears (_packed_linear); else None."""
    if x.dim() != 4:
        return None
    B, H, W, C = x.shape
    if not (x.dtype == torch.float32 and x.device.type == "cpu" and B > 0 and H > 0 and W > 0
            and C % heads == 0 and H % window[0] == 0 and W % window[1] == 0
            and not (x.requires_grad and torch.is_grad_enabled())
            and torch.is_tensor(bias) and bias.numel() == heads * (window[0] * window[1]) ** 2):
        return None
    qkv, proj = _packed_linear(qkv_weight, qkv_bias, 3 * C), _packed_linear(proj_weight, proj_bias, C)
    return None if qkv is None or proj is None else (qkv, proj)


def _packed_linear(w, b, out_features):
    """The frozen Linear whose PackedWeight w is, when its packed op runs float in and
    out with no activation and b is its own bias (or both None), else None."""
    from qpack.torch.modules import FrozenLinear, PackedWeight
    layer = getattr(w, "_layer", None) if isinstance(w, PackedWeight) else None
    if not isinstance(layer, FrozenLinear) or layer._spec["mode"] == "int8_static" or \
            layer._spec.get("activation") is not None or layer.out_features != out_features:
        return None
    own = layer.bias
    if (b is None) != (own is None) or (b is not None and b is not own and not torch.equal(b, own)):
        return None
    return layer


def shifted_window_attention(input, qkv_weight, proj_weight, relative_position_bias, window_size, num_heads,
                             shift_size, attention_dropout=0.0, dropout=0.0, qkv_bias=None, proj_bias=None,
                             logit_scale=None, training=True, *, fallback=None):
    """torchvision's Swin window attention (``torchvision.models.swin_transformer.
    shifted_window_attention``, its arguments) on one core graph (WindowGraph) where
    it applies: eval, no cosine attention (Swin V2's logit_scale), float32 [B, H, W, C]
    whose H and W the windows divide, qkv and proj frozen float-in-and-out linears;
    ``fallback`` (torchvision's function, by default) otherwise."""
    window, shift = list(window_size), list(shift_size)
    layers = None
    if not training and logit_scale is None:
        layers = _window_layers(input, qkv_weight, qkv_bias, proj_weight, proj_bias, relative_position_bias,
                                window, num_heads)
    if layers is None:
        if fallback is None:
            from torchvision.models.swin_transformer import shifted_window_attention as fallback
        return fallback(input, qkv_weight, proj_weight, relative_position_bias, window_size, num_heads, shift_size,
                        attention_dropout, dropout, qkv_bias, proj_bias, logit_scale, training)
    H, W = input.shape[1:3]
    if window[0] >= H:
        shift[0] = 0
    if window[1] >= W:
        shift[1] = 0
    return _window_graph(layers[0]).run(input.contiguous(), *layers, relative_position_bias, window, num_heads,
                                        shift, qkv_bias, proj_bias)
