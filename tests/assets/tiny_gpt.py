"""A tiny GPT for tests (our own code, nanoGPT-shaped): token + position embeddings, pre-norm
blocks of causal self-attention and a GELU MLP, final LayerNorm, lm_head tied to the token
embedding. Takes int64 token ids (B, T), returns logits (B, T, vocab).

`example_inputs(batch_size, device, dtype)` tells fusebench what to feed it: token ids are
integers whatever the run dtype, so `dtype` is not used for them."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, BLOCK = 64, 16      # vocabulary size, context length


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        # lower-triangular mask: position t attends to positions <= t
        self.register_buffer("mask", torch.tril(torch.ones(BLOCK, BLOCK)).view(1, 1, BLOCK, BLOCK))

    def forward(self, x):                                    # (B, T, D)
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)                # 3 x (B, T, D)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)   # (B, H, T, D/H)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)    # (B, H, T, T)
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v                       # (B, H, T, D/H)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))


class MLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, layers: int = 2, dim: int = 32, heads: int = 4):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, dim)
        self.wpe = nn.Embedding(BLOCK, dim)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight                # tied, as in GPT-2

    def forward(self, idx):                                  # (B, T) int64
        t = idx.shape[1]
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)                    # (B, T, D)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))                    # (B, T, VOCAB)

    @staticmethod
    def example_inputs(batch_size: int, device, dtype):
        return (torch.randint(0, VOCAB, (batch_size, BLOCK), device=device),)


def make(layers: int = 2):
    return TinyGPT(layers)


class MaskedSum(nn.Module):
    """Two inputs, one of them integer: (x float (B, T, D), mask int64 (B, T)) -> (B, D)."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x, mask):
        return (self.fc(x) * mask.unsqueeze(-1).to(x.dtype)).sum(1)


def masked_sum():
    return MaskedSum()


def example_inputs(batch_size, device, dtype):
    """Module-level example_inputs: used for factories whose model does not define one."""
    x = torch.randn(batch_size, 5, 8, device=device, dtype=dtype)
    return x, torch.randint(0, 2, (batch_size, 5), device=device)


def wrong_inputs():
    """A GPT whose example_inputs hands it floats: the cell must say what it was given."""
    model = TinyGPT(1)
    model.example_inputs = lambda b, device, dtype: (torch.randn(b, 3, device=device),)
    return model
