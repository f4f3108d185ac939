"""attention (graph, train and infer): attention written out by hand -> one
F.scaled_dot_product_attention call.

    s = q @ k.transpose(-2, -1) * scale     # or `/ math.sqrt(d)`, `q = q * scale` first, none
    s = s.masked_fill(mask == 0, float("-inf"))   # and / or `s + additive_mask`
    p = F.softmax(s, dim=-1)                # maybe in float32 and cast back to q's dtype
    out = p @ v                             # an identity dropout between is fine

That is nanoGPT's and minGPT's CausalSelfAttention, timm's Attention with fused_attn off,
BERT-style additive masks, Meta LLaMA's `softmax(s.float()).type_as(q)`, HF's
`softmax(s, dtype=torch.float32).to(q.dtype)`, torch.matmul / bmm / the `@` operator, or an
einsum (`einsum("b i d, b j d -> b i j", q, k)`: Stable Diffusion's, lucidrains'; fx/products.py).
Eager writes the (.., L, S) scores and keeps the probabilities for backward; SDPA's fused
kernels (flash on CPU; flash or memory-efficient on CUDA) write neither: they keep the output
and a log-sum-exp per row. A mask the code builds as the causal pattern (fx/causal.py) is
SDPA's is_causal, so no mask is built or read.

What SDPA computes is the same function: softmax(q k^T * scale + mask) v, with the mask added
after the scale as the code above adds it. A masked_fill with -inf (or a finite value <= -1e4,
which underflows to the same zero in every row that keeps a key) becomes a bool mask; additive
masks are summed into a float mask. Where every key of a row is masked the two differ (eager:
NaN for -inf, the mean of v for a finite fill; SDPA: zeros): that row attends to nothing.

Reasons, not sites: the scores or probabilities used elsewhere (returned weights, an in-place
masked_fill_), a live dropout on the probabilities (SDPA would draw its own mask: the
correctness check could not compare; on CPU it runs its math path anyway), a scale that is a
tensor, a scale applied after the mask, ops between the matmul and the softmax SDPA does not
compute (clamps). At run time, input SDPA does not take as the code wrote it (q, k, v batch
dims that broadcast against each other, a mask that widens the scores, an additive mask in
another dtype; on CPU, a mask that takes a gradient: a learned relative-position bias, which
SDPA's CPU kernels leave to its slower math path) runs the attention as written, with a
warning.

Swin's shifted-window mask is added through a 5-D view of the scores and viewed back,
`(s.view(B_ // nW, nW, heads, N, N) + m).view(-1, heads, N, N)`: the same for every head, it
is the additive mask m broadcast to (B_ // nW, nW, 1, N, N) and viewed (B_, 1, N, N)."""
from __future__ import annotations

import math
import operator
import warnings

import torch
import torch.fx as fx
import torch.nn.functional as F

from fusebench.fuse.fx import causal, shims
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.pattern import Hit, Miss, Site, register_pattern
from fusebench.fuse.fx.products import product

CASTS_BACK = ("to", "type", "type_as")
_ARITH = {operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
          operator.pow, operator.neg}
_SEARCH = 6                 # ops walked up from a softmax looking for q @ k^T
VIEWS = ("view", "reshape")
# SDPA's CPU kernels take no mask gradient: it runs its math path, which took 1.29-1.31x the
# written ops' time (Swin-T's windows, 512 x 3 heads x 49 tokens, fwd+bwd, 2 threads);
# CUDA's memory-efficient kernel does take one
LEARNED_MASK = ("a mask that takes a gradient (a learned bias) on CPU: its math path would "
                "run, slower than these ops")


def _view_args(n: fx.Node) -> tuple:
    """The shape a view / reshape node asks for, as its arguments give it."""
    rest = n.args[1:] or (n.kwargs.get("size", n.kwargs.get("shape")),)
    return tuple(rest[0]) if len(rest) == 1 and isinstance(rest[0], (tuple, list)) else rest


def _shape_of(n) -> bool:
    """`x.size()` or `x.shape`: a torch.Size at run time."""
    return isinstance(n, fx.Node) and (
        (n.op == "call_method" and n.target == "size" and len(n.args) == 1 and not n.kwargs)
        or (n.op == "call_function" and n.target is getattr and n.args[1:] == ("shape",)))


def scalar(x, depth: int = 0) -> bool:
    """x is a Python number at run time: a constant, `x.size(-1)`, `x.shape[-1]`, or math and
    arithmetic over those (`1.0 / math.sqrt(k.size(-1))`, `d ** -0.5`)."""
    if N.number(x) is not None:
        return True
    if not isinstance(x, fx.Node) or depth > 8:
        return False
    if x.op == "call_method" and x.target == "size":
        return len(x.args) == 2 or "dim" in x.kwargs
    if x.op != "call_function":
        return False
    if x.target is operator.getitem:
        return _shape_of(x.args[0]) and isinstance(x.args[1], int)
    if x.target in _ARITH or getattr(x.target, "__module__", None) == "math":
        return all(scalar(a, depth + 1) for a in x.args) and not x.kwargs
    return False


def _scale_factor(n):
    """(the other operand, factor, divides) when n multiplies or divides by a number."""
    if N.op(n) == "mul":
        for a, b in N.commuted(n, "mul"):
            if scalar(b) and isinstance(a, fx.Node):
                return a, b, False
    if N.op(n) == "div":
        ab = N.operands(n)
        if ab and scalar(ab[1]) and isinstance(ab[0], fx.Node) \
                and not n.kwargs.get("rounding_mode"):
            return ab[0], ab[1], True
    return None


class _Lowest:
    """A fill with the scores' dtype's lowest value, read from the dtype at run time."""

    def __repr__(self):
        return "finfo(dtype).min"


LOWEST = _Lowest()


def _fill(n):
    """(scores, cond, v) of `s.masked_fill(cond, v)` with v masking as -inf does
    (causal.masking); a reason for another value; None when n is no masked_fill."""
    if N.op(n) != "masked_fill":
        return None
    if shims.reads_lowest(N.arg(n, 2, "value")):      # SD's `-torch.finfo(sim.dtype).max`
        return N.x_of(n), N.arg(n, 1, "mask"), LOWEST
    v = N.number(N.arg(n, 2, "value"))
    if not causal.masking(v):
        return "masked_fill with a value other than -inf or <= -1e4 (not a mask to SDPA)"
    return N.x_of(n), N.arg(n, 1, "mask"), v


def _reaches_matmul(n, depth: int = 0) -> bool:
    if not isinstance(n, fx.Node) or depth > _SEARCH:
        return False
    return product(n) is not None or any(_reaches_matmul(a, depth + 1)
                                         for a in n.all_input_nodes)


def _sole_use(n: fx.Node, user: fx.Node) -> bool:
    """user is n's one user, besides a dtype query that only a fill value reads (SD's
    `masked_fill(~mask, -torch.finfo(sim.dtype).max)`: absorbed with the fill)."""
    return [u for u in n.users if not _dtype_for_fill(u)] == [user]


def _dtype_for_fill(u: fx.Node) -> bool:
    return (u.op == "call_function" and u.target is getattr and u.args[1:] == ("dtype",)
            and bool(u.users) and all(shims.reads_lowest(f) or shims.reads_lowest(next(
                iter(f.users), None)) for f in u.users))


def _fill_value_nodes(value: fx.Node) -> list[fx.Node]:
    """The nodes that compute a LOWEST fill value, down to the scores' dtype query."""
    out, n = [], value
    while isinstance(n, fx.Node) and n.op == "call_function":
        out.append(n)
        if n.target is getattr:
            break
        n = n.args[0]
    return out


class _Scores:
    """What lies between q @ k^T and the softmax, walked up from the softmax's input."""

    def __init__(self):
        self.masks: list = []        # (kind "fill" / "add" / "window", mask, fill value), in order
        self.factors: list = []      # (number node or constant, divides)
        self.nodes: list = []        # absorbed
        self.extra: list = []        # absorbed too: a LOWEST fill's value, its dtype query
        self.k_rows = False          # k given as (.., S, D) (an einsum), not k^T

    def parse(self, s) -> str | tuple | None:
        """(q, k or k^T) of the product at the root, or a reason."""
        masked = False
        while True:
            if product(s) is not None:
                return self._operands(s)
            user = self.nodes[-1] if self.nodes else None
            if user is not None and not _sole_use(s, user):
                return "the attention scores are used elsewhere"
            fill = _fill(s)
            if isinstance(fill, str):
                return fill
            if fill is not None:
                if self.factors:
                    return "the scores are scaled after the mask"
                self.masks.insert(0, ("fill", fill[1], fill[2]))
                if fill[2] is LOWEST:
                    self.extra += _fill_value_nodes(N.arg(s, 2, "value"))
                self.nodes.append(s)
                s = fill[0]
                masked = True
                continue
            scaled = _scale_factor(s)
            if scaled is not None:
                self.factors.append(scaled[1:])
                self.nodes.append(s)
                s = scaled[0]
                continue
            window = self._window(s)
            if window is not None:
                if self.factors:
                    return "the scores are scaled after the mask"
                self.masks.insert(0, ("window", window[1], None))
                self.nodes.extend(window[2])
                s = window[0]
                masked = True
                continue
            if N.op(s) == "add":
                added = self._added(s)
                if isinstance(added, str):
                    return added
                if self.factors:
                    return "the scores are scaled after the mask"
                self.masks.insert(0, ("add", added[1], None))
                self.nodes.append(s)
                s = added[0]
                masked = True
                continue
            if N.op(s) in ("mul", "div"):
                return "the scores are scaled by a tensor (SDPA's scale is a number)"
            name = N.op(s) or (s.target if isinstance(s.target, str) else
                               getattr(s.target, "__name__", str(s.target)))
            where = "after the mask" if masked else "between q @ k^T and the softmax"
            return f"`{name}` {where} (not what SDPA computes)"

    def _added(self, s):
        """(scores, additive mask) of `s + m`: the operand q @ k^T reaches is the scores."""
        for a, b in N.commuted(s, "add"):
            if scalar(b):
                return "a number added to the scores"
            if isinstance(a, fx.Node) and isinstance(b, fx.Node) and _reaches_matmul(a) \
                    and a not in b.all_input_nodes and b is not a:
                return a, b
        return "an add between q @ k^T and the softmax that is not a mask"

    def _window(self, s):
        """Swin's shifted-window mask, added through a 5-D view of the scores and viewed back:
        `(s.view(B // nW, nW, heads, N, N) + m).view(-1, heads, N, N)` -> (the scores,
        (m, 5-D shape, shape back), the three nodes); None when s is no such view."""
        if N.op(s) not in VIEWS or N.op(N.x_of(s)) != "add" or not _sole_use(N.x_of(s), s):
            return None
        add = N.x_of(s)
        for a, m in N.commuted(add, "add"):
            if N.op(a) in VIEWS and _sole_use(a, add) and isinstance(m, fx.Node) \
                    and _reaches_matmul(N.x_of(a)) and not _reaches_matmul(m):
                return N.x_of(a), (m, _view_args(a), _view_args(s)), (s, add, a)
        return None

    def _operands(self, mm):
        if self.nodes and not _sole_use(mm, self.nodes[-1]):
            return "the attention scores are used elsewhere"
        self.nodes.append(mm)
        q, kt, self.k_rows = product(mm)
        return self._prescaled(q, mm), self._prescaled(kt, mm)

    def _prescaled(self, x, user):
        """timm's `q = q * self.scale` (and Whisper's scaled q and k): the factor joins the
        scale when the scaled tensor has no other use."""
        while (scaled := _scale_factor(x)) is not None and _sole_use(x, user):
            self.factors.append(scaled[1:])
            self.nodes.append(x)
            user, x = x, scaled[0]
        return x


def _softmax(n):
    """(input, dim, dtype kwarg) of a softmax node."""
    m = N.module(n)
    if m is not None:
        return N.x_of(n), m.dim, None
    dim = N.arg(n, 1, "dim")
    dtype = n.kwargs.get("dtype")
    if dtype is None and n.op == "call_function" and n.target is F.softmax and len(n.args) > 3:
        dtype = n.args[3]
    elif dtype is None and n.target in (torch.softmax, "softmax") and len(n.args) > 2:
        dtype = n.args[2]
    return N.x_of(n), dim, dtype


def _cast_target(n):
    """The dtype (or tensor whose dtype) a cast back names."""
    if N.op(n) == "type_as":
        return N.arg(n, 1, "other")
    return N.arg(n, 1, "dtype")


def _dtype_of(target, like: torch.Tensor) -> torch.dtype:
    if isinstance(target, torch.Tensor):
        return target.dtype
    return target if isinstance(target, torch.dtype) else like.dtype


def _scale(factors: tuple, divides: tuple) -> float:
    s = 1.0
    for f, d in zip(factors, divides):
        s = s / f if d else s * f
    return float(s)


def _mask(masks: tuple, kinds: tuple):
    """SDPA's attn_mask for the code's masks: bool (True = attend) for fills alone, else the
    additive masks summed with the fills' positions set to -inf."""
    if not masks:
        return None
    adds = [m for m, k in zip(masks, kinds) if k == "add"]
    fills = [m for m, k in zip(masks, kinds) if k == "fill"]
    if not adds:
        keep = ~fills[0]
        for c in fills[1:]:
            keep = keep & ~c
        return keep
    m = adds[0]
    for a in adds[1:]:
        m = m + a
    for c in fills:
        m = m.masked_fill(c, -math.inf)
    return m


def _not_taken(q, k, v, masks, kinds, dim) -> str | None:
    """Why SDPA cannot take these tensors as the code wrote them; None when it can."""
    if not (q.dim() >= 3 and q.dim() == k.dim() == v.dim()):
        return f"q, k, v of {q.dim()}, {k.dim()}, {v.dim()} dims"
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        return "q, k, v batch dims that broadcast against each other"
    if dim % q.dim() != q.dim() - 1:
        return f"a softmax over dim {dim}, not the keys"
    # under autocast SDPA casts q, k, v itself (HF's RoPE leaves q, k in float32, v in bf16)
    if not (q.dtype == k.dtype == v.dtype) and not torch.is_autocast_enabled(q.device.type):
        return "q, k, v of different dtypes"
    scores = (*q.shape[:-1], k.shape[-2])
    for m, kind in zip(masks, kinds):
        if kind == "window":
            continue                    # _unwindowed's
        if kind == "add" and not (m.is_floating_point() and m.dtype in (q.dtype, torch.float32)):
            return f"an additive mask of dtype {m.dtype}"
        try:
            wide = torch.broadcast_shapes(m.shape, scores) != scores
        except RuntimeError:
            wide = True
        if wide:
            return f"a mask of shape {tuple(m.shape)} that does not broadcast to the scores"
    return None


def _unwindowed(masks: tuple, kinds: tuple, scores: tuple):
    """(masks, kinds) with each windowed mask (Swin's, `_Scores._window`) as the additive mask
    it is on the scores: where the 5-D view splits the batch into (B // nW, nW) and the mask
    is the same for every head, m broadcast to (B // nW, nW, 1, N, N) and viewed (B, 1, N, N)
    (a head's share of the scores, not all of them). A reason for anything else."""
    out = []
    for m, kind in zip(masks, kinds):
        if kind != "window":
            out.append(m)
            continue
        m, shape, back = m
        try:
            five = torch.empty(scores, device="meta").view(shape).shape
            same = torch.empty(five, device="meta").view(back).shape == scores
        except RuntimeError:
            return "a windowed mask whose views do not fit the scores"
        if not (same and len(scores) == 4 and len(five) == 5 and five[2:] == scores[1:]
                and m.dim() <= 5):
            return "a windowed mask other than over (batch // windows, windows, heads, L, S)"
        m = m.reshape((1,) * (5 - m.dim()) + tuple(m.shape))
        if not m.is_floating_point():
            return "a windowed mask that is not floating point"
        if m.shape[2] != 1:
            return "a windowed mask that differs per head"
        try:
            full = m.expand(five[0], five[1], 1, *five[3:])
        except RuntimeError:
            return f"a windowed mask of shape {tuple(m.shape)} that does not broadcast"
        out.append(full.reshape(scores[0], 1, *scores[2:]))
    return tuple(out), tuple("add" if k == "window" else k for k in kinds)


def _causal_only(masks, causal: tuple, q, k) -> bool:
    """Every mask is the causal pattern (fx/causal.py) at the scores' own (L, S): SDPA's
    is_causal computes the same, with no mask to read."""
    return bool(masks) and all(causal) and all(
        tuple(m.shape[-2:]) == (q.shape[-2], k.shape[-2]) for m in masks)


def attention_site(divides: tuple, kinds: tuple, values: tuple, dim: int, up: bool,
                   cast: str | None, contiguous: bool, causal: tuple = (),
                   k_rows: bool = False) -> Site:
    """fn(q, kT, v, factors, masks, cast_target) = the written-out attention, by SDPA.
    up: the softmax runs in float32 (`.float()` or dtype=); cast: the op that casts the
    probabilities back (its target is cast_target); contiguous: the code reads the output
    as eager's matmul laid it out (a view), so lay it out that way; causal: per mask, whether
    the code builds the causal pattern (then SDPA's is_causal where the shapes allow);
    k_rows: the second argument is k itself (an einsum over d), not k^T."""
    def manual(q, kt, v, scale, masks, cast_target):     # the code's own ops
        s = torch.matmul(q, kt.transpose(-2, -1) if k_rows else kt)
        s = s * scale if scale != 1.0 else s
        for m, kind, value in zip(masks, kinds, values):
            if kind == "window":
                m, shape, back = m
                s = (s.view(shape) + m).view(back)
            else:
                if value is LOWEST:
                    value = torch.finfo(s.dtype).min
                s = s + m if kind == "add" else s.masked_fill(m, value)
        p = F.softmax(s.float() if up else s, dim=dim)
        return torch.matmul(p.to(_dtype_of(cast_target, q)) if cast else p, v)

    def run(q, kt, v, factors, masks, cast_target):
        scale = _scale(factors, divides)
        k = kt if k_rows else kt.transpose(-2, -1)
        want = _dtype_of(cast_target, q)
        if up and q.dtype == torch.float64:     # the code's float32 softmax: compute it
            return manual(q, kt, v, scale, masks, cast_target)
        why = _not_taken(q, k, v, masks, kinds, dim)
        sdpa_masks, sdpa_kinds = masks, kinds       # Swin's windowed masks as additive ones
        if why is None and "window" in kinds:
            got = _unwindowed(masks, kinds, (*q.shape[:-1], k.shape[-2]))
            if isinstance(got, str):
                why = got
            else:
                sdpa_masks, sdpa_kinds = got
        if why is None and q.device.type == "cpu" and torch.is_grad_enabled() and any(
                m.requires_grad for m in sdpa_masks if isinstance(m, torch.Tensor)):
            why = LEARNED_MASK
        if why is None and cast and want != q.dtype:
            why = f"probabilities cast to {want} for q of {q.dtype}"
        if why is not None:
            warnings.warn(f"attention: SDPA does not take {why}; ran the attention as written")
            return manual(q, kt, v, scale, masks, cast_target)
        is_causal = _causal_only(sdpa_masks, causal, q, k)
        mask = None if is_causal else _mask(sdpa_masks, sdpa_kinds)
        three = q.dim() == 3            # (B*H, L, D): SDPA's flash kernel wants heads apart
        if three:
            q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
            mask = mask.unsqueeze(1) if mask is not None and mask.dim() == 3 else mask
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                           is_causal=is_causal)
        o = o.squeeze(1) if three else o
        return o.contiguous() if contiguous else o
    return Site("fused_attention", run)


def _probabilities(n, bench: str):
    """(softmax node, cast back node or None, absorbed nodes) under `p @ v`'s p; a reason
    for a live dropout; None when p is no softmax."""
    p, between = n, ()
    while N.identity_dropout(p, bench):     # their other users: checked with the chain's
        p, between = N.x_of(p), (*between, p)
    if N.op(p) == "dropout":
        live = _softmax_of(N.x_of(p))
        return None if live is None else \
            "a live dropout on the attention weights (SDPA would draw its own mask)"
    got = _softmax_of(p)
    if got is None:
        return None
    sm, cast = got
    return sm, cast, between if cast is None else (*between, cast)


def _softmax_of(p):
    """(softmax node, the cast back after it or None) when p is a softmax or its cast back."""
    if N.op(p) == "softmax":
        return p, None
    if N.op(p) in CASTS_BACK and N.op(N.x_of(p)) == "softmax":
        return N.x_of(p), p
    return None


@register_pattern("attention", benches=("train", "infer"))
def attention(n, scope):
    """softmax(q @ k^T * scale [+ mask]) @ v written out -> one SDPA call (module doc)."""
    pv = product(n)
    if pv is None or pv.b_rows:
        return None
    probs, v = pv.a, pv.b
    got = _probabilities(probs, scope.ctx.bench)
    if got is None:
        return None
    if isinstance(got, str):
        return Miss("attention", got) if _reaches_matmul(probs) else None
    sm, cast, between = got
    s, dim, dtype = _softmax(sm)
    if not _reaches_matmul(s):
        return None                     # a softmax over something else (attention pooling)
    chain = [*between, sm]              # p @ v's operand first, up to the softmax
    if not all(_sole_use(b, a) for a, b in zip([n, *chain], chain)):
        return Miss("attention", "the attention weights are used elsewhere")
    if not isinstance(dim, int):
        return Miss("attention", "a softmax over a dim that is not a constant")
    up = dtype is torch.float32
    if dtype is not None and not up:
        return Miss("attention", f"a softmax in {dtype}")
    if N.op(s) == "float" or (N.op(s) == "to" and N.arg(s, 1, "dtype") is torch.float32):
        if not _sole_use(s, sm):
            return Miss("attention", "the attention scores are used elsewhere")
        chain.append(s)
        s, up = N.x_of(s), True
    scores = _Scores()
    scores.nodes.append(chain[-1])
    qk = scores.parse(s)
    if isinstance(qk, str):
        return Miss("attention", qk)
    out_user = next(iter(n.users)) if len(n.users) == 1 else None
    site = attention_site(tuple(d for _, d in scores.factors),
                          tuple(k for k, _, _ in scores.masks),
                          tuple(fill for _, _, fill in scores.masks), dim, up,
                          N.op(cast) if cast is not None else None,
                          contiguous=N.op(out_user) not in ("transpose", "permute"),
                          causal=tuple(causal.fill_is_causal(m) if k == "fill" else
                                       k == "add" and causal.add_is_causal(m)
                                       for k, m, _ in scores.masks),
                          k_rows=scores.k_rows)
    args = (*qk, v, tuple(f for f, _ in scores.factors), tuple(m for _, m, _ in scores.masks),
            _cast_target(cast) if cast is not None else None)
    return Hit("attention", n, site, args, (*chain, *scores.nodes[1:], *scores.extra))
