"""mha (graph, train): nn.MultiheadAttention, `attn(q, k, v, ...)[0]`: self-attention
(nn.TransformerEncoderLayer's and Decoder's `self_attn`, torchvision's ViT, CLIP-style
blocks), encoder-decoder attention (the decoder's `multihead_attn(x, memory, memory)`), or
three inputs (DETR adds positions to q and k only) -> the same computation without
MultiheadAttention's layout copies.

On its training path (F.multi_head_attention_forward) the in-projection's output is copied
to separate q, k, v, the heads are viewed out of those, and SDPA's output is copied back to
tokens before the out-projection; backward copies the gradients the same ways. Here each
input tensor is one projection GEMM over its rows of in_proj_weight (x once for
self-attention; memory once for k and v), q, k and v are strided views of those outputs,
SDPA (the same call, the same shapes, scale and dropout) reads them as they are, and its
output goes to the out-projection through a view where SDPA already wrote it token-major
(the CPU flash kernel does). The masks
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


def _groups(same_qk: bool, same_kv: bool) -> tuple[tuple[int, ...], ...]:
    """Which of q, k, v (0, 1, 2) share one input tensor, hence one projection GEMM: their
    rows of in_proj_weight are adjacent (q and v apart are two)."""
    if same_qk and same_kv:
        return ((0, 1, 2),)
    if same_kv:
        return ((0,), (1, 2))
    if same_qk:
        return ((0, 1), (2,))
    return ((0,), (1,), (2,))


def attention(inputs, w_in, b_in, w_out, b_out, attn_mask, key_padding_mask, is_causal,
              heads: int, p: float, batch_first: bool, groups=((0, 1, 2),),
              eager_layout: bool = False):
    """MultiheadAttention(query, key, value, need_weights=False)[0] in training, each input
    (B, L, E) when batch_first else (L, B, E); `inputs` holds one tensor per group of
    _groups (self-attention: x once). Each group is one projection GEMM over its adjacent
    rows of in_proj_weight, its heads strided views of that output. eager_layout: a
    batch-first output laid out (T, B, E) in memory, as MultiheadAttention's is (a
    transposed view): a live dropout on it then draws its mask in eager's order."""
    e = inputs[0].shape[-1]
    d = e // heads
    qkv = [None, None, None]
    for x, g in zip(inputs, groups):
        rows = slice(g[0] * e, (g[-1] + 1) * e)
        y = F.linear(x, w_in[rows], None if b_in is None else b_in[rows])     # x's layout
        if batch_first:
            views = y.view(*x.shape[:2], len(g), heads, d).permute(2, 0, 3, 1, 4)
        else:
            views = y.view(*x.shape[:2], len(g), heads, d).permute(2, 1, 3, 0, 4)
        for i, v in zip(g, views):                                      # (B, H, L, D)
            qkv[i] = v
    q, k, v = qkv
    b, t, s = q.shape[0], q.shape[2], k.shape[2]
    mask, causal = _merged_mask(attn_mask, key_padding_mask, bool(is_causal), b, heads, t, s,
                                q.dtype)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                       is_causal=causal)              # (B, H, T, D)
    if batch_first and not eager_layout:
        return F.linear(o.transpose(1, 2).reshape(b, t, e), w_out, b_out)
    y = F.linear(o.permute(2, 0, 1, 3).reshape(t, b, e), w_out, b_out)     # (T, B, E)
    return y.transpose(0, 1) if batch_first else y


def self_attention(x, w_in, b_in, w_out, b_out, attn_mask, key_padding_mask, is_causal,
                   heads: int, p: float, batch_first: bool, eager_layout: bool = False):
    """attention() with query, key and value one tensor x."""
    return attention((x,), w_in, b_in, w_out, b_out, attn_mask, key_padding_mask, is_causal,
                     heads, p, batch_first, eager_layout=eager_layout)


def _why_not(m: nn.MultiheadAttention) -> str | None:
    if not m._qkv_same_embed_dim:
        return "kdim / vdim other than embed_dim"
    if m.bias_k is not None or m.add_zero_attn:
        return "add_bias_kv or add_zero_attn"
    return None


@register_pattern("mha", benches=("train",))
def mha(n, scope):
    """attn(query, key, value, ...)[0] on an nn.MultiheadAttention -> attention() (module
    doc): self-attention, encoder-decoder attention (key is value: the decoder's
    `multihead_attn(x, memory, memory)`), or three inputs (DETR's positions added to q and k)."""
    if n.op != "call_module" or not computes_as(N.module(n), nn.MultiheadAttention):
        return None
    m = N.module(n)
    q, k, v = (N.arg(n, i, name) for i, name in ((0, "query"), (1, "key"), (2, "value")))
    groups = _groups(q is k, k is v)
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
    site = Site("fused_mha", lambda xs, wi, bi, wo, bo, am, kp, c: attention(
        xs, wi, bi, wo, bo, am, kp, c, heads, p, batch_first, groups, eager_layout))
    path = n.target
    bias = (m.in_proj_bias is not None and Attr(f"{path}.in_proj_bias") or None,
            m.out_proj.bias is not None and Attr(f"{path}.out_proj.bias") or None)
    inputs = tuple((q, k, v)[g[0]] for g in groups)
    args = (inputs, Attr(f"{path}.in_proj_weight"), bias[0], Attr(f"{path}.out_proj.weight"),
            bias[1], attn_mask, kpm, is_causal)
    # the unused getitems too (`out, _ = attn(...)`): else they keep the module's call alive
    return Hit("mha", firsts[0], site, args, (n, *(u for u in items if u is not firsts[0])))
