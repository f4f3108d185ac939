"""Attention written out by hand, the ways other projects write it (our own code, shrunk for
tests). Each class is one block: `forward(x)` on (B, T, D) tokens returns (B, T, D); where the
original takes a mask it is built here from the input. `SPELLINGS` maps a name to a factory.

- timm_style: timm's Attention with fused_attn off: one qkv Linear reshaped and permuted,
  `unbind(0)`, q pre-scaled by `self.scale`, `attn.softmax(dim=-1)`, an attn_drop Dropout.
- bert_style: HF BERT's self-attention before SDPA: q / k / v Linears, `transpose_for_scores`
  by view + permute, `torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(head_size)`, an
  additive (B, 1, 1, T) padding mask of -10000.0, nn.functional.softmax, dropout.
- llama_meta: Meta's LLaMA attention: `torch.matmul(xq, keys.transpose(2, 3)) /
  math.sqrt(head_dim)`, `+ mask` (a (T, T) float mask of -inf above the diagonal made with
  torch.full + triu), `F.softmax(scores.float(), dim=-1).type_as(xq)`.
- hf_eager: HF's eager_attention_forward: `* scaling`, `+ causal_mask`,
  `softmax(dtype=torch.float32).to(query.dtype)`, `F.dropout(p, training=self.training)`.
  HF shapes its views `(*input_shape, -1, head_dim)`: star-unpacking a traced shape stops
  torch.fx, so the shape is spelled out here (as in whisper_style's views).
- annotated: the Annotated Transformer's `attention()`: `masked_fill(mask == 0, -1e9)`,
  `scores.softmax(dim=-1)`; `returns_weights` keeps its `(out, p_attn)` return (the weights
  are used: a reason, not a site), `keeps_weights` the original's `self.attn = p_attn` (a
  forward that assigns an attribute: not traced).
- fairseq_bmm: 3-D (B * H, T, D) heads, `torch.bmm(q, k.transpose(1, 2))` with q scaled
  first, nn.Softmax(dim=-1) as a module.
- karpathy_heads: the "Let's build GPT" lecture's: one `Head` module per head (3-D (B, T, hs)
  tensors, `q @ k.transpose(-2, -1) * k.shape[-1]**-0.5`, a `tril[:T, :T] == 0` buffer fill),
  an nn.ModuleList of them, `torch.cat([h(x) for h in self.heads], dim=-1)`: one site per head.
- whisper_style: OpenAI Whisper's qkv_attention: q and k each scaled by head_dim ** -0.25,
  k laid out (B, H, D, T) by a permute (no transpose before the matmul),
  `(qk + mask).float()`, `softmax(...).to(q.dtype)`.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

DIM, HEADS, T = 32, 4, 12


def _pad_mask(x):
    """(B, T) 1.0 for keys to attend to, 0.0 for padding: here the tokens whose first feature
    is below -1 (a pattern read off the input, as a tokenizer's mask would come with it)."""
    return (x[..., 0] > -1).to(x.dtype)


class TimmStyle(nn.Module):
    def __init__(self, dim=DIM, heads=HEADS, attn_drop=0.0):
        super().__init__()
        self.num_heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        x = attn @ v
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class BertStyle(nn.Module):
    def __init__(self, dim=DIM, heads=HEADS):
        super().__init__()
        self.num_attention_heads, self.attention_head_size = heads, dim // heads
        self.all_head_size = dim
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))
        self.dropout = nn.Dropout(0.0)
        self.dense = nn.Linear(dim, dim)

    def transpose_for_scores(self, x):
        new_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(new_shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states):
        extended = (1.0 - _pad_mask(hidden_states)[:, None, None, :]) * -10000.0
        q = self.transpose_for_scores(self.query(hidden_states))
        k = self.transpose_for_scores(self.key(hidden_states))
        v = self.transpose_for_scores(self.value(hidden_states))
        scores = torch.matmul(q, k.transpose(-1, -2))
        scores = scores / math.sqrt(self.attention_head_size)
        scores = scores + extended
        probs = self.dropout(nn.functional.softmax(scores, dim=-1))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        context = context.view(context.size()[:-2] + (self.all_head_size,))
        return self.dense(context)


class LlamaMeta(nn.Module):
    def __init__(self, dim=DIM, heads=HEADS):
        super().__init__()
        self.n_heads, self.head_dim = heads, dim // heads
        self.wq, self.wk, self.wv = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device)
        mask = torch.triu(mask, diagonal=1).type_as(x)
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        keys = self.wk(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        values = self.wv(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        scores = scores + mask
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values)
        return self.wo(output.transpose(1, 2).contiguous().view(bsz, seqlen, -1))


class HfEager(nn.Module):
    def __init__(self, dim=DIM, heads=HEADS, attention_dropout=0.0):
        super().__init__()
        self.head_dim = dim // heads
        self.scaling = self.head_dim ** -0.5
        self.attention_dropout = attention_dropout
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(dim, dim)
                                                              for _ in range(4))

    def forward(self, hidden_states):
        b, n, _ = hidden_states.shape
        hidden_shape = (b, n, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        causal_mask = torch.full((n, n), torch.finfo(torch.float32).min,
                                 dtype=hidden_states.dtype, device=hidden_states.device)
        causal_mask = causal_mask.triu(1)[None, None]
        attn_weights = torch.matmul(query, key.transpose(2, 3)) * self.scaling
        attn_weights = attn_weights + causal_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32)
        attn_weights = attn_weights.to(query.dtype)
        attn_weights = nn.functional.dropout(attn_weights, p=self.attention_dropout,
                                             training=self.training)
        attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()
        return self.o_proj(attn_output.reshape(b, n, -1))


def annotated_attention(query, key, value, mask=None, dropout=None):
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


class Annotated(nn.Module):
    def __init__(self, dim=DIM, heads=HEADS, returns_weights=False, keeps_weights=False):
        super().__init__()
        self.d_k, self.h = dim // heads, heads
        self.linears = nn.ModuleList([nn.Linear(dim, dim) for _ in range(4)])
        self.dropout = nn.Dropout(p=0.0)
        self.returns_weights, self.keeps_weights = returns_weights, keeps_weights
        self.attn = None

    def forward(self, x):
        mask = _pad_mask(x)[:, None, None, :]               # (B, 1, 1, T): keys to keep
        nbatches = x.size(0)
        query, key, value = [lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)
                             for lin in self.linears[:3]]
        out, p_attn = annotated_attention(query, key, value, mask=mask, dropout=self.dropout)
        if self.keeps_weights:          # the original's `x, self.attn = attention(...)`
            self.attn = p_attn
        out = out.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        out = self.linears[-1](out)
        return (out, p_attn) if self.returns_weights else out


class FairseqBmm(nn.Module):
    def __init__(self, dim=DIM, heads=HEADS):
        super().__init__()
        self.num_heads, self.head_dim = heads, dim // heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim)
                                                                for _ in range(4))
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):                                   # fairseq is (T, B, D) inside
        x = x.transpose(0, 1)
        tgt_len, bsz, embed_dim = x.size()
        q = self.q_proj(x) * self.scaling
        k, v = self.k_proj(x), self.v_proj(x)
        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))
        attn_probs = self.softmax(attn_weights)
        attn = torch.bmm(attn_probs, v)
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        return self.out_proj(attn).transpose(0, 1)


class Head(nn.Module):
    def __init__(self, head_size, n_embd=DIM, block_size=T):
        super().__init__()
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))
        self.dropout = nn.Dropout(0.0)

    def forward(self, x):
        B, T, C = x.shape
        k, q = self.key(x), self.query(x)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        wei = self.dropout(F.softmax(wei, dim=-1))
        return wei @ self.value(x)


class KarpathyHeads(nn.Module):
    def __init__(self, dim=DIM, heads=HEADS):
        super().__init__()
        self.heads = nn.ModuleList([Head(dim // heads) for _ in range(heads)])
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        return self.proj(torch.cat([h(x) for h in self.heads], dim=-1))


class WhisperStyle(nn.Module):
    def __init__(self, dim=DIM, heads=HEADS, n_ctx=T):
        super().__init__()
        self.n_head = heads
        self.query, self.key, self.value, self.out = (nn.Linear(dim, dim) for _ in range(4))
        self.register_buffer("mask", torch.empty(n_ctx, n_ctx).fill_(-math.inf).triu_(1),
                             persistent=False)

    def forward(self, x):
        q, k, v = self.query(x), self.key(x), self.value(x)
        n_batch, n_ctx, n_state = q.shape
        scale = (n_state // self.n_head) ** -0.25
        q = q.view(n_batch, n_ctx, self.n_head, -1).permute(0, 2, 1, 3) * scale
        k = k.view(n_batch, n_ctx, self.n_head, -1).permute(0, 2, 3, 1) * scale
        v = v.view(n_batch, n_ctx, self.n_head, -1).permute(0, 2, 1, 3)
        qk = q @ k
        qk = (qk + self.mask[:n_ctx, :n_ctx]).float()
        w = F.softmax(qk, dim=-1).to(q.dtype)
        return self.out((w @ v).permute(0, 2, 1, 3).flatten(start_dim=2))


SPELLINGS = {
    "timm_style": TimmStyle,
    "bert_style": BertStyle,
    "llama_meta": LlamaMeta,
    "hf_eager": HfEager,
    "annotated": Annotated,
    "fairseq_bmm": FairseqBmm,
    "karpathy_heads": KarpathyHeads,
    "whisper_style": WhisperStyle,
}
SITES = {"karpathy_heads": HEADS}     # attention sites per spelling where not 1
