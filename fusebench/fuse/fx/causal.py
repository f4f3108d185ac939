"""Whether a mask node in a traced graph is the causal mask, read off how the code builds it:
SDPA's `is_causal=True` then stands for it (its kernels skip the masked half: CUDA's flash
kernel takes no mask at all, and CPU's runs 1.3x faster at 1024 tokens).

Causal, top-left aligned (key j visible to query i iff j <= i, as SDPA's is_causal is):
- a corner of a lower-triangular buffer of ones, `buf[:, :, :t, :t] == 0` as a masked_fill
  condition (nanoGPT's `bias`, minGPT's, Karpathy's `tril`);
- a corner of a buffer that is 0 on and below the diagonal and -inf (or <= FINITE) above, added
  to the scores (Whisper's `mask[:n, :n]`);
- `torch.full((a, b), -inf).triu(1)` built in forward and added (Meta LLaMA's, HF's with
  finfo.min), through casts and `[None, None]`.
Any corner `[:a, :b]` of such a matrix is the causal mask of an (a, b) score matrix; the site
checks at run time that the mask's last two dims are the scores' (no broadcast)."""
from __future__ import annotations

import torch
import torch.fx as fx

from fusebench.fuse.fx import nodes as N

FINITE = -1e4               # a value at or below this masks as -inf does (softmax underflows)
_CASTS = ("to", "type_as", "type", "float")


def _corner(n) -> torch.Tensor | None:
    """The buffer's value when n is `buf[..., :a, :b]` (leading full slices, Nones, an
    Ellipsis; the last two slices from 0), or n is the buffer itself."""
    if N.attr_path(n):
        v = N.attr_value(n)
        return v if isinstance(v, torch.Tensor) else None
    if N.op(n) != "getitem" or not N.attr_path(n.args[0]):
        return None
    idx = n.args[1] if isinstance(n.args[1], tuple) else (n.args[1],)
    v = N.attr_value(n.args[0])
    if not isinstance(v, torch.Tensor) or v.dim() < 2:
        return None
    tail = [i for i in idx if i is not None and i is not Ellipsis]
    full = slice(None)
    if len(tail) > v.dim() or any(i != full for i in tail[:-2]) or not all(
            isinstance(i, slice) and i.start in (None, 0) and i.step is None for i in tail[-2:]):
        return None
    return v


def _square(v: torch.Tensor) -> torch.Tensor | None:
    """v's last two dims as a matrix, when every leading dim is 1."""
    if v.dim() < 2 or v.numel() != v.shape[-1] * v.shape[-2]:
        return None
    return v.reshape(v.shape[-2:])


def _lower(m: torch.Tensor) -> torch.Tensor:
    return torch.ones(m.shape, dtype=torch.bool, device=m.device).tril()


def fill_is_causal(cond) -> bool:
    """cond (a masked_fill's mask) is `corner == 0` of a lower-triangular buffer of ones."""
    if N.op(cond) != "eq" or N.number(cond.args[1] if len(cond.args) > 1 else None) != 0:
        return False
    v = _corner(cond.args[0])
    m = _square(v) if v is not None else None
    return m is not None and torch.equal(m != 0, _lower(m))


def masking(v: float | None) -> bool:
    """A fill or mask value that masks as -inf does: -inf itself, or <= FINITE."""
    return v is not None and v <= FINITE


def add_is_causal(mask) -> bool:
    """mask (added to the scores) is 0 on and below the diagonal, -inf (or <= FINITE) above."""
    while N.op(mask) in _CASTS or (N.op(mask) == "getitem" and not N.attr_path(mask.args[0])
                                   and _nones(mask.args[1])):
        mask = N.x_of(mask)
    v = _corner(mask)
    if v is not None:
        m = _square(v)
        if m is None or not m.is_floating_point():
            return False
        low = _lower(m)
        return bool((m[low] == 0).all()) and bool((m[~low] <= FINITE).all())
    return _full_triu(mask)


def _nones(idx) -> bool:
    """`[None, None]` / `[None, None, :, :]`: dims added in front, nothing sliced."""
    idx = idx if isinstance(idx, tuple) else (idx,)
    return any(i is None for i in idx) and all(i is None or i == slice(None) for i in idx)


def _full_triu(n) -> bool:
    """`torch.triu(torch.full((a, b), v), diagonal=1)` or `.triu(1)` / `.triu_(1)`, v masking."""
    is_triu = (n.op == "call_function" and n.target is torch.triu) or (
        n.op == "call_method" and n.target in ("triu", "triu_"))
    if not is_triu or N.arg(n, 1, "diagonal", 0) != 1:
        return False
    full = N.x_of(n)
    if not (isinstance(full, fx.Node) and full.op == "call_function" and full.target is torch.full):
        return False
    size = N.arg(full, 0, "size")
    return isinstance(size, (tuple, list)) and len(size) == 2 and \
        masking(N.number(N.arg(full, 1, "fill_value")))
