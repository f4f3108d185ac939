"""torch.nn's own composite modules, seen into by the graph pass.

fx keeps every torch.nn module a leaf, so a model built the most common way PyTorch users
write a transformer (`nn.TransformerEncoder(nn.TransformerEncoderLayer(...))`) fused nothing
and said nothing: its LayerNorms and MLPs sat inside leaves. Here:
- STACKS (nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder) are walked into as
  containers are: their forwards branch on proxies (nested tensors, mask checks) and call
  their layers in turn, and each layer is matched on its own.
- LAYERS are traced as roots of their own (a parent's trace still keeps them leaves): through
  the class's own forward where fx can trace it (TransformerDecoderLayer), else a stand-in that
  computes what the forward computes where the stand-in is used (TransformerEncoderLayer in
  training). A layer left to torch in some mode says why in a note.
A stand-in only traces: the graph's code then reads the layer's own attributes (install()),
and it runs only while the layer's training flag is the one it was traced with."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.nn as nn

STACKS: tuple[type, ...] = (nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder)


def _encoder_layer_in_training(self, src, src_mask=None, src_key_padding_mask=None,
                               is_causal=False):
    """nn.TransformerEncoderLayer.forward in training. Its fast-path checks (which branch on
    src.dim(), so fx cannot trace them) all end in this path while self.training is set. The
    masks reach self_attn as given: MultiheadAttention canonicalises them itself, to the
    values the layer's own canonicalisation would have handed it."""
    def attend(h):
        return self._sa_block(h, src_mask, src_key_padding_mask, is_causal=is_causal)

    if self.norm_first:                           # pre-norm: x + f(norm(x))
        x = src + attend(self.norm1(src))
        return x + self._ff_block(self.norm2(x))
    x = self.norm1(src + attend(src))             # post-norm: norm(x + f(x))
    return self.norm2(x + self._ff_block(x))


@dataclass(frozen=True)
class Layer:
    cls: type
    stand_in: Callable | None = None   # a traceable forward, where the class's is not
    eval_reason: str | None = None     # why the layer is left to torch in eval mode, if it is


LAYERS: tuple[Layer, ...] = (
    Layer(nn.TransformerEncoderLayer, _encoder_layer_in_training,
          eval_reason="left to torch in eval mode: its forward takes torch's one-op fast path "
                      "(torch._transformer_encoder_layer_fwd) where that path's conditions "
                      "hold"),
    Layer(nn.TransformerDecoderLayer),
)


def _layer(m: nn.Module) -> Layer | None:
    """m's LAYERS entry: m is the class, or a subclass that keeps its forward (blocks it
    overrides, `_ff_block` ..., are traced as it wrote them)."""
    return next((e for e in LAYERS if isinstance(m, e.cls) and type(m).forward is e.cls.forward),
                None)


def seen_into(m: nn.Module) -> bool:
    """A torch.nn module the graph pass walks into or traces, though fx keeps it a leaf."""
    return isinstance(m, STACKS) or _layer(m) is not None


def walked_only(m: nn.Module) -> bool:
    """A stack: never traced itself, its layers are matched on their own."""
    return isinstance(m, STACKS)


def left_to_torch(m: nn.Module) -> str | None:
    """Why the graph pass leaves m as torch runs it, in m's present mode; None if it does not."""
    e = _layer(m)
    return e.eval_reason if e is not None and not m.training else None


def traced_as(m: nn.Module) -> nn.Module:
    """The module whose forward fx traces for m: m itself, or a stand-in sharing m's state (its
    children, Parameters and flags) whose class's forward is the registered stand-in."""
    e = _layer(m)
    if e is None or e.stand_in is None or not m.training:
        return m
    cls = type(f"{type(m).__name__}InTraining", (type(m),), {"forward": e.stand_in})
    s = cls.__new__(cls)
    object.__setattr__(s, "__dict__", m.__dict__)   # the same state, not a copy
    return s
