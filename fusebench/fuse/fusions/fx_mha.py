"""mha (graph, train): nn.MultiheadAttention as self-attention, `attn(x, x, x, ...)[0]`
(nn.TransformerEncoderLayer's and Decoder's `self_attn`, torchvision's ViT, CLIP-style
blocks) -> the same computation without MultiheadAttention's layout copies.

On its training path (F.multi_head_attention_forward) the packed in-projection's output is
copied to separate q, k, v, the heads are viewed out of those, and SDPA's output is copied
back to tokens before the out-projection; backward copies the gradients the same ways. Here
q, k and v are strided views of the one projection's output, SDPA (the same call, the same
shapes, scale and dropout) reads them as they are, and its output goes to the out-projection
through a view where SDPA already wrote it token-major (the CPU flash kernel does). The masks
are canonicalised and merged as MultiheadAttention does (F._canonical_mask, the key-padding
mask added to attn_mask), broadcast over heads instead of expanded. Parameters are read at
call time, so FSDP / DDP see them as before. Eval mode is left to MultiheadAttention (its
fast path there is one native op)."""
from __future__ import annotations

import operator

import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.pattern import Attr, Hit, Miss, Site, register_pattern
from fusebench.fuse.rule import computes_as


def _merged_mask(attn_mask, key_padding_mask, is_causal: bool, b: int, h: int, t: int,
                 s: int, dtype):
    """(SDPA's attn_mask, is_causal) for MultiheadAttention's masks, as its training path
    merges them: float masks (-inf where a bool mask is True), the key-padding mask added,
    the causal hint kept only where no key-padding mask comes with it."""
    kpm = F._canonical_mask(mask=key_padding_mask, mask_name="key_padding_mask",
                            other_type=F._none_or_dtype(attn_mask), other_name="attn_mask",
                            target_type=dtype)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the "
                           "Transformer module method `generate_square_subsequent_mask` to "
                           "create this mask.")
    if is_causal and kpm is None:
        return None, True                       # SDPA's own causal mask
    am = F._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None,
                           other_name="", target_type=dtype, check_other=False)
    if am is not None:                          # (T, S) or (B * H, T, S) -> broadcastable 4-D
        am = am.view(1, 1, t, s) if am.dim() == 2 else am.view(b, h, t, s)
    if kpm is not None:
        kpm = kpm.view(b, 1, 1, s)
        am = kpm if am is None else am + kpm
    return am, False


def self_attention(x, w_in, b_in, w_out, b_out, attn_mask, key_padding_mask, is_causal,
                   heads: int, p: float, batch_first: bool, eager_layout: bool = False):
    """MultiheadAttention(x, x, x, need_weights=False)[0] in training, x (B, T, E) when
    batch_first else (T, B, E). eager_layout: a batch-first output laid out (T, B, E) in
    memory, as MultiheadAttention's is (a transposed view): a live dropout on it then draws
    its mask in eager's order."""
    e = x.shape[-1]
    d = e // heads
    qkv = F.linear(x, w_in, b_in)                               # (.., .., 3E), x's layout
    if batch_first:
        b, t = x.shape[:2]
        q, k, v = qkv.view(b, t, 3, heads, d).permute(2, 0, 3, 1, 4)   # (B, H, T, D) views
    else:
        t, b = x.shape[:2]
        q, k, v = qkv.view(t, b, 3, heads, d).permute(2, 1, 3, 0, 4)
    mask, causal = _merged_mask(attn_mask, key_padding_mask, bool(is_causal), b, heads, t, t,
                                x.dtype)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                       is_causal=causal)              # (B, H, T, D)
    if batch_first and not eager_layout:
        return F.linear(o.transpose(1, 2).reshape(b, t, e), w_out, b_out)
    y = F.linear(o.permute(2, 0, 1, 3).reshape(t, b, e), w_out, b_out)     # (T, B, E)
    return y.transpose(0, 1) if batch_first else y


def _why_not(m: nn.MultiheadAttention) -> str | None:
    if not m._qkv_same_embed_dim:
        return "kdim / vdim other than embed_dim"
    if m.bias_k is not None or m.add_zero_attn:
        return "add_bias_kv or add_zero_attn"
    return None


@register_pattern("mha", benches=("train",))
def mha(n, scope):
    """attn(x, x, x, ...)[0] on an nn.MultiheadAttention -> self_attention (see module doc)."""
    if n.op != "call_module" or not computes_as(N.module(n), nn.MultiheadAttention):
        return None
    m = N.module(n)
    q, k, v = (N.arg(n, i, name) for i, name in ((0, "query"), (1, "key"), (2, "value")))
    if not (q is k is v):
        return Miss("mha", "cross-attention (query, key and value not one tensor)")
    why = _why_not(m)
    if why:
        return Miss("mha", why)
    items = {u: u.args[1] for u in n.users
             if u.op == "call_function" and u.target is operator.getitem}
    firsts = [u for u, i in items.items() if i == 0]
    if len(firsts) != 1 or any(u not in items or (u is not firsts[0] and u.users)
                               for u in n.users):
        return Miss("mha", "the attention weights are used")
    need_weights = N.arg(n, 4, "need_weights", True)
    p = float(m.dropout) if m.training else 0.0
    if p > 0 and need_weights is not False:      # a constant False, or no dropout to draw
        return Miss("mha", "need_weights with attention dropout: eager's explicit softmax "
                           "path draws its dropout otherwise")
    attn_mask, kpm = N.arg(n, 5, "attn_mask"), N.arg(n, 3, "key_padding_mask")
    is_causal = N.arg(n, 7, "is_causal", False)
    heads, batch_first = m.num_heads, m.batch_first
    # a live dropout on the output draws its mask in memory order: lay it out as eager does
    eager_layout = any(N.op(u) == "dropout" and not N.identity_dropout(u, scope.ctx.bench)
                       for u in firsts[0].users)
    site = Site("fused_mha", lambda x, wi, bi, wo, bo, am, kp, c: self_attention(
        x, wi, bi, wo, bo, am, kp, c, heads, p, batch_first, eager_layout))
    path = n.target
    bias = (m.in_proj_bias is not None and Attr(f"{path}.in_proj_bias") or None,
            m.out_proj.bias is not None and Attr(f"{path}.out_proj.bias") or None)
    args = (q, Attr(f"{path}.in_proj_weight"), bias[0], Attr(f"{path}.out_proj.weight"),
            bias[1], attn_mask, kpm, is_causal)
    # the unused getitems too (`out, _ = attn(...)`): else they keep the module's call alive
    return Hit("mha", firsts[0], site, args, (n, *(u for u in items if u is not firsts[0])))
