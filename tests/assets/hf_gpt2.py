"""A GPT-2 laid out like HF transformers' (transformers/models/gpt2/modeling_gpt2.py and
pytorch_utils.Conv1D), written here from scratch and shrunk for tests. What sets it apart
from nanoGPT's layout: every projection is a Conv1D, a linear whose weight is stored
(in, out) and applied as `addmm(bias, x.view(-1, x.size(-1)), weight)` then viewed back to
x's leading dims; the MLP's activation is a NewGELUActivation module writing out the tanh
GELU; nn.LayerNorm modules; an lm_head tied to the token embedding. Input: int64 token ids
(B, T); output: logits (B, T, vocab)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CONTEXT = 50, 16


class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf).normal_(std=0.02))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        out_shape = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(out_shape)


class NewGELUActivation(nn.Module):
    def forward(self, x):
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
        return 0.5 * x * (1.0 + torch.tanh(inner))


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.c_attn, self.c_proj = Conv1D(3 * dim, dim), Conv1D(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, dim, dropout):
        super().__init__()
        self.c_fc, self.c_proj = Conv1D(4 * dim, dim), Conv1D(dim, 4 * dim)
        self.act = NewGELUActivation()
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden):
        return self.dropout(self.c_proj(self.act(self.c_fc(hidden))))


class Block(nn.Module):
    def __init__(self, dim, heads, dropout):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn, self.mlp = Attention(dim, heads), MLP(dim, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, dim=32, heads=4, layers=2, dropout=0.0):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, dim), nn.Embedding(CONTEXT, dim)
        self.h = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def make(**kw):
    return GPT2(**kw)
