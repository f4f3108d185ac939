"""A Conformer speech encoder laid out as torchaudio's `Conformer` is (our own code, not copied):
time-major layers (T, B, D) inside, features (B, T, D) and their lengths outside.

Each layer: half a feed-forward module (LayerNorm -> Linear -> SiLU -> Dropout -> Linear ->
Dropout, scaled 0.5 into the residual), self-attention (LayerNorm -> nn.MultiheadAttention with a
key-padding mask from the lengths), the convolution module (LayerNorm -> pointwise Conv1d to 2D
channels -> GLU over channels -> depthwise Conv1d -> BatchNorm1d -> SiLU -> pointwise Conv1d ->
Dropout, on (B, D, T)), the second half feed-forward, a final LayerNorm. forward returns
(output, lengths), as torchaudio's does.

`size="bench"` is the size the fused-mode figures use (docs/fused.md), "tiny" the tests'."""
from __future__ import annotations

import torch
import torch.nn as nn

SIZES = {"tiny": dict(feats=12, dim=16, heads=2, ffn=32, layers=2, kernel=7, frames=20),
         "bench": dict(feats=80, dim=144, heads=4, ffn=576, layers=4, kernel=31, frames=200)}


class FeedForward(nn.Module):
    def __init__(self, dim, hidden, dropout):
        super().__init__()
        self.sequential = nn.Sequential(
            nn.LayerNorm(dim), nn.Linear(dim, hidden, bias=True), nn.SiLU(), nn.Dropout(dropout),
            nn.Linear(hidden, dim, bias=True), nn.Dropout(dropout))

    def forward(self, x):
        return self.sequential(x)


class ConvolutionModule(nn.Module):
    def __init__(self, dim, kernel, dropout):
        super().__init__()
        self.layer_norm = nn.LayerNorm(dim)
        self.sequential = nn.Sequential(
            nn.Conv1d(dim, 2 * dim, 1),
            nn.GLU(dim=1),
            nn.Conv1d(dim, dim, kernel, padding=(kernel - 1) // 2, groups=dim),
            nn.BatchNorm1d(dim),
            nn.SiLU(),
            nn.Conv1d(dim, dim, 1),
            nn.Dropout(dropout))

    def forward(self, x):                       # (B, T, D)
        x = self.layer_norm(x).transpose(1, 2)  # (B, D, T)
        return self.sequential(x).transpose(1, 2)


class ConformerLayer(nn.Module):
    def __init__(self, dim, heads, ffn, kernel, dropout):
        super().__init__()
        self.ffn1 = FeedForward(dim, ffn, dropout)
        self.self_attn_layer_norm = nn.LayerNorm(dim)
        self.self_attn = nn.MultiheadAttention(dim, heads, dropout=dropout)
        self.self_attn_dropout = nn.Dropout(dropout)
        self.conv_module = ConvolutionModule(dim, kernel, dropout)
        self.ffn2 = FeedForward(dim, ffn, dropout)
        self.final_layer_norm = nn.LayerNorm(dim)

    def forward(self, x, key_padding_mask):     # x: (T, B, D)
        x = 0.5 * self.ffn1(x) + x
        residual = x
        y = self.self_attn_layer_norm(x)
        y, _ = self.self_attn(query=y, key=y, value=y, key_padding_mask=key_padding_mask,
                              need_weights=False)
        x = self.self_attn_dropout(y) + residual
        x = self.conv_module(x.transpose(0, 1)).transpose(0, 1) + x
        x = 0.5 * self.ffn2(x) + x
        return self.final_layer_norm(x)


class Conformer(nn.Module):
    def __init__(self, feats, dim, heads, ffn, layers, kernel, frames, dropout=0.0):
        super().__init__()
        self.feats, self.frames = feats, frames
        self.input_linear = nn.Linear(feats, dim)
        self.conformer_layers = nn.ModuleList(
            [ConformerLayer(dim, heads, ffn, kernel, dropout) for _ in range(layers)])

    def forward(self, features, lengths):       # (B, T, feats), (B,)
        t = features.shape[1]
        mask = torch.arange(t, device=lengths.device)[None, :] >= lengths[:, None]
        x = self.input_linear(features).transpose(0, 1)
        for layer in self.conformer_layers:
            x = layer(x, mask)
        return x.transpose(0, 1), lengths

    def example_inputs(self, batch_size: int, device, dtype):
        return features(batch_size, self.frames, self.feats, device=device, dtype=dtype)


def features(batch: int, frames: int, feats: int, device="cpu", dtype=torch.float32, seed=1):
    """A seeded batch of features and lengths: every other utterance a quarter shorter."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, frames, feats, generator=gen).to(device, dtype)
    lengths = torch.tensor([frames - (frames // 4) * (i % 2) for i in range(batch)],
                           device=device)
    return x, lengths


def make(size: str | None = None, **kw):
    return Conformer(**{**SIZES[size or "bench"], **kw})
