"""A Vision Transformer in torchvision's layout (our own code): a conv patch projection, a class
token, learned positions, encoder blocks of `ln_1 -> nn.MultiheadAttention (unpacked as
`x, _ = attn(x, x, x, need_weights=False)`) -> dropout -> + input`, then `ln_2 -> MLPBlock
(Linear, GELU, Dropout, Linear, Dropout: an nn.Sequential) -> + input`, a final LayerNorm and a
linear head on the class token. `size="tiny"` for tests, "bench" for
benchmarks/torch_transformer.py (160 px, 16 px patches: 101 tokens, 4 layers, width 256)."""
from __future__ import annotations

import torch
import torch.nn as nn

SIZES = {"tiny": dict(image=32, patch=8, layers=2, heads=4, dim=32, mlp=64),
         "bench": dict(image=160, patch=16, layers=4, heads=4, dim=256, mlp=1024)}


class MLPBlock(nn.Sequential):
    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout),
                         nn.Linear(hidden, dim), nn.Dropout(dropout))


class EncoderBlock(nn.Module):
    def __init__(self, heads: int, dim: int, hidden: int, dropout: float, attention_dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, dropout=attention_dropout,
                                                    batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = MLPBlock(dim, hidden, dropout)

    def forward(self, x):                                     # (N, S, D)
        torch._assert(x.dim() == 3, f"Expected (batch, seq, hidden), got {x.shape}")
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = self.dropout(y) + x
        return x + self.mlp(self.ln_2(x))


class VisionTransformer(nn.Module):
    def __init__(self, image, patch, layers, heads, dim, mlp, classes=10, dropout=0.0,
                 attention_dropout=0.0):
        super().__init__()
        self.patch, self.image = patch, image
        self.conv_proj = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        seq = (image // patch) ** 2 + 1
        self.pos_embedding = nn.Parameter(torch.empty(1, seq, dim).normal_(std=0.02))
        self.layers = nn.Sequential(*[EncoderBlock(heads, dim, mlp, dropout, attention_dropout)
                                      for _ in range(layers)])
        self.ln = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):                                     # (N, 3, H, W)
        n = x.shape[0]
        x = self.conv_proj(x).flatten(2).transpose(1, 2)       # (N, S - 1, D)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1) + self.pos_embedding
        x = self.ln(self.layers(x))
        return self.head(x[:, 0])

    def example_inputs(self, batch_size: int, device, dtype):
        return (torch.randn(batch_size, 3, self.image, self.image, device=device, dtype=dtype),)


def make(size="tiny", dropout=0.0, attention_dropout=0.0):
    return VisionTransformer(**SIZES[size], dropout=float(dropout),
                             attention_dropout=float(attention_dropout))
