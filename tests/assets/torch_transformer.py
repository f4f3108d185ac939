"""Models built from torch.nn's own transformer modules, the way most PyTorch code writes a
transformer (our own code, not copied from any project).

- `make(...)`: a text classifier, token ids (B, T) -> embeddings + learned positions ->
  nn.TransformerEncoder(nn.TransformerEncoderLayer, final LayerNorm) -> mean over tokens ->
  nn.Linear: logits (B, classes). A key-padding mask marks the last tokens of every other
  sample as padding, as batches of uneven sentences have.
- `make_seq2seq(...)`: nn.Transformer (encoder and decoder stacks) between two embeddings,
  a causal mask on the target, logits (B, T, vocab).

`size="bench"` is the size benchmarks/torch_transformer.py times; "tiny" the tests'.
`dropout` is nn.Transformer*'s (default there: 0.1), `activation` "relu" (torch's default),
"gelu" or a module, `norm_first` pre-norm (True) or post-norm (False)."""
from __future__ import annotations

import torch
import torch.nn as nn

SIZES = {"tiny": dict(dim=32, heads=4, ff=64, layers=2, vocab=50, context=12),
         "bench": dict(dim=256, heads=4, ff=1024, layers=4, vocab=1000, context=128)}


def padding(ids: torch.Tensor) -> torch.Tensor:
    """(B, T) bool, True where a token is padding: the last quarter of every odd sample."""
    b, t = ids.shape
    late = torch.arange(t, device=ids.device) >= t - t // 4          # (T,)
    odd = torch.arange(b, device=ids.device) % 2 == 1                  # (B,)
    return odd[:, None] & late[None, :]


class TextClassifier(nn.Module):
    def __init__(self, dim, heads, ff, layers, vocab, context, classes=10, dropout=0.0,
                 activation="gelu", norm_first=True, masked=True):
        super().__init__()
        self.vocab, self.context, self.masked = vocab, context, masked
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Parameter(torch.randn(1, context, dim) * 0.02)
        block = nn.TransformerEncoderLayer(dim, heads, ff, dropout=dropout, activation=activation,
                                           batch_first=True, norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(block, layers, norm=nn.LayerNorm(dim),
                                             enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids):                                   # (B, T) int64
        x = self.tokens(ids) + self.positions[:, : ids.shape[1]]   # (B, T, D)
        pad = padding(ids) if self.masked else None
        x = self.encoder(x, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(x.dtype) if pad is not None else torch.ones_like(x[..., :1])
        return self.head((x * keep).sum(1) / keep.sum(1))     # (B, classes)

    def example_inputs(self, batch_size: int, device, dtype):
        return (torch.randint(0, self.vocab, (batch_size, self.context), device=device),)


class Seq2Seq(nn.Module):
    def __init__(self, dim, heads, ff, layers, vocab, context, dropout=0.0, activation="relu",
                 norm_first=False):
        super().__init__()
        self.vocab, self.context = vocab, context
        self.src_tokens = nn.Embedding(vocab, dim)
        self.tgt_tokens = nn.Embedding(vocab, dim)
        self.transformer = nn.Transformer(dim, heads, layers, layers, ff, dropout=dropout,
                                          activation=activation, batch_first=True,
                                          norm_first=norm_first)
        self.out = nn.Linear(dim, vocab)

    def forward(self, src, tgt):                              # (B, S), (B, T) int64
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device,
                                                                dtype=self.out.weight.dtype)
        h = self.transformer(self.src_tokens(src), self.tgt_tokens(tgt), tgt_mask=causal,
                             tgt_is_causal=True)
        return self.out(h)                                    # (B, T, vocab)

    def example_inputs(self, batch_size: int, device, dtype):
        def ids():
            return torch.randint(0, self.vocab, (batch_size, self.context), device=device)
        return ids(), ids()


def make(size="tiny", dropout=0.0, activation="gelu", norm_first=True, masked=True):
    return TextClassifier(**SIZES[size], dropout=float(dropout), activation=activation,
                          norm_first=_flag(norm_first), masked=_flag(masked))


def make_seq2seq(size="tiny", dropout=0.0, activation="relu", norm_first=False):
    return Seq2Seq(**SIZES[size], dropout=float(dropout), activation=activation,
                   norm_first=_flag(norm_first))


def _flag(v) -> bool:
    """--model-kwarg hands strings: "false" / "0" read as False."""
    return v if isinstance(v, bool) else str(v).lower() not in ("false", "0", "no")
