"""A GPT laid out like nanoGPT's model.py (karpathy/nanoGPT), written here from scratch and
shrunk for tests: a LayerNorm class with an optional bias (F.layer_norm), CausalSelfAttention
with one c_attn projection split into q, k, v (the split of a traced value is what stops
torch.fx at the attention), an MLP c_fc -> GELU -> c_proj -> dropout, pre-norm blocks with
residual adds, token + position embeddings, a final norm and an lm_head tied to the token
embedding. Input: int64 token ids (B, T); output: logits (B, T, vocab). `make_new_gelu()`:
the MLP's activation is nanoGPT's NewGELU module, the tanh GELU written out by hand.
`make(size="bench")`: 4 layers, width 256, 4 heads, 256 tokens (benchmarks/gpt_attention.py)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CONTEXT = 50, 16
SIZES = {"tiny": dict(layers=2, dim=32, heads=4, context=CONTEXT),
         "bench": dict(layers=4, dim=256, heads=4, context=256)}


class LayerNorm(nn.Module):
    def __init__(self, dim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, bias: bool, context: int = CONTEXT):
        super().__init__()
        self.c_attn = nn.Linear(dim, 3 * dim, bias=bias)
        self.c_proj = nn.Linear(dim, dim, bias=bias)
        self.heads, self.dim = heads, dim
        self.register_buffer("causal", torch.tril(torch.ones(context, context))
                             .view(1, 1, context, context))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(self.dim, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = F.softmax(att.masked_fill(self.causal[:, :, :t, :t] == 0, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class NewGELU(nn.Module):
    """GELU's tanh approximation spelled out, as in the original GPT code."""

    def forward(self, x):
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
        return 0.5 * x * (1.0 + torch.tanh(inner))


class MLP(nn.Module):
    def __init__(self, dim: int, bias: bool, dropout: float = 0.0, new_gelu: bool = False):
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim, bias=bias)
        self.gelu = NewGELU() if new_gelu else nn.GELU()
        self.c_proj = nn.Linear(4 * dim, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, bias: bool, new_gelu: bool = False,
                 context: int = CONTEXT):
        super().__init__()
        self.ln_1 = LayerNorm(dim, bias)
        self.attn = CausalSelfAttention(dim, heads, bias, context)
        self.ln_2 = LayerNorm(dim, bias)
        self.mlp = MLP(dim, bias, new_gelu=new_gelu)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, layers: int = 2, dim: int = 32, heads: int = 4, bias: bool = True,
                 new_gelu: bool = False, context: int = CONTEXT):
        super().__init__()
        self.context = context
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, dim), wpe=nn.Embedding(context, dim),
            h=nn.ModuleList([Block(dim, heads, bias, new_gelu, context) for _ in range(layers)]),
            ln_f=LayerNorm(dim, bias)))
        self.lm_head = nn.Linear(dim, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight      # weight tying

    def forward(self, idx):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))

    def example_inputs(self, batch_size: int, device, dtype):
        return (torch.randint(0, VOCAB, (batch_size, self.context), device=device),)


def make(size: str | None = None, **kw):
    return GPT(**{**SIZES[size], **kw}) if size else GPT(**kw)


def make_new_gelu(**kw):
    return make(new_gelu=True, **kw)


def tokens(batch: int = 2, seed: int = 1):
    """A seeded batch of token ids at the full context."""
    return torch.randint(0, VOCAB, (batch, CONTEXT), generator=torch.Generator().manual_seed(seed))
