"""Optional arguments of a traced forward: which ones the trace must fix to their default, and
the check at call time that sends each call to a graph traced for it.

fx traces every argument as a Proxy, defaults included, and a Proxy `is not None`: nanoGPT's
`forward(idx, targets=None)` traced the `if targets is not None:` branch (the loss), and a call
without targets then ran `cross_entropy(logits, None)`; `c = x if context is None else context`
(Stable Diffusion's cross-attention) traced `k(context)`, and a call without a context ran
`k(None)`. An argument whose default is a flag (`if return_features:`) stops the trace outright
(a Proxy has no truth value).

So, per argument with a None default: trace once with it fixed to None (fx's concrete_args);
unless that graph is the Proxy one with None in the argument's place (it only flows into ops
that take None: a mask into SDPA), the forward branches on it. Such arguments are fixed to None
in the first graph (the call with the defaults, as fusebench makes it); beside it, a graph for
each mix of them passed and not (the Proxy graph: all passed; 2^3 graphs at most) takes the
calls that pass some. Where the Proxy trace fails, the arguments with a bool / int / float /
str default are fixed first (then the None ones are tried as above), then those and one None
argument at a time (Stable Diffusion's `-torch.finfo(sim.dtype).max` under `if mask is not
None` stops the trace: mask is fixed, context still gets its graphs), and failing that every
argument with a default. A call that fits no graph (another flag; a mix of more than three
branching arguments) runs the module's own forward (eager, no fused sites for that call) and
warns once per module class."""
from __future__ import annotations

import inspect
import itertools
import warnings
from collections.abc import Callable

import torch
import torch.fx as fx
import torch.fx._symbolic_trace as fx_trace

CONSTANTS = (bool, int, float, str)
MAX_BRANCHING = 3           # None-default arguments a forward branches on: 2^3 graphs at most
# the checks fx adds for a fixed argument (`targets` must be None, `flag == True`)
_FX_CHECKS = {torch._assert, fx_trace._assert_is_none}
_warned: set[str] = set()


def defaults(fn) -> dict[str, object]:
    """fn's parameters with a None or constant default; {} where it takes *args (fx's code
    then moves keyword-only parameters before *args: a call could not be passed on as made).
    A **kwargs does not stop it: HF's forwards take one beside `attention_mask=None`."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return {}
    return {p.name: p.default for p in params if p.default is not p.empty
            and (p.default is None or type(p.default) in CONSTANTS)}


class _Given:
    """A variant's key for an argument the call must pass (any value but None)."""

    def __repr__(self):
        return "<given>"


GIVEN = _Given()
_ABSENT = object()


def _body(graph: fx.Graph) -> list[fx.Node]:
    return [n for n in graph.nodes if n.op != "placeholder" and n.target not in _FX_CHECKS]


def _flows(proxy: fx.Graph, alone: fx.Graph, index: int) -> bool:
    """`alone` (traced with argument `index` fixed to None) is `proxy` with None where that
    argument was: the forward only passes it on, it does not branch on it."""
    a_in = [n for n in proxy.nodes if n.op == "placeholder"]
    b_in = [n for n in alone.nodes if n.op == "placeholder"]
    if len(a_in) != len(b_in):
        return False
    env: dict = dict(zip(a_in, b_in))
    env[a_in[index]] = None
    a_body, b_body = _body(proxy), _body(alone)
    if len(a_body) != len(b_body):
        return False
    for a, b in zip(a_body, b_body):
        if (a.op, a.target) != (b.op, b.target) or not (
                _same_arg(a.args, b.args, env) and _same_arg(a.kwargs, b.kwargs, env)):
            return False
        env[a] = b
    return True


def _same_arg(x, y, env: dict) -> bool:
    if isinstance(x, fx.Node):
        return env.get(x, _ABSENT) is y
    if isinstance(x, (tuple, list)):
        return type(x) is type(y) and len(x) == len(y) and all(
            _same_arg(a, b, env) for a, b in zip(x, y))
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(
            _same_arg(x[k], y[k], env) for k in x)
    if isinstance(x, slice):
        return isinstance(y, slice) and _same_arg((x.start, x.stop, x.step),
                                                  (y.start, y.stop, y.step), env)
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return x is y
    try:
        return type(x) is type(y) and bool(x == y)
    except Exception:                                # noqa: BLE001 - no comparable equality
        return x is y


def traced(attempt: Callable[[dict | None], fx.Graph], fn) -> list[tuple[fx.Graph, dict]]:
    """[(graph, key)], as the module doc says: the graph for the defaults first, then one per
    mix of the arguments it fixed passed and not (the Proxy graph: all passed). A key maps an
    argument to the value a call must have (or GIVEN: any but None). Raises the Proxy trace's
    error when no fixing traces either."""
    opts = defaults(fn)
    names = list(inspect.signature(fn).parameters)
    base: dict = {}
    try:
        graph = attempt(None)
    except Exception as err:
        # the flags first (a None default may be a mask that flows through), then the flags
        # and one None argument (the others keep their graphs), then everything
        flags = {k: v for k, v in opts.items() if v is not None}
        tries = [f for f in (flags, *({**flags, k: None} for k, v in opts.items() if v is None),
                             opts) if f]
        for fix in tries:
            try:
                graph, base = attempt(dict(fix)), dict(fix)
                break
            except Exception:                        # noqa: BLE001 - report the first one
                continue
        else:
            raise err
    fixed = dict(base)
    for name in (k for k, v in opts.items() if v is None and k not in base):
        try:
            alone = attempt({**base, name: None})
        except Exception:                            # noqa: BLE001 - a tensor it cannot lack
            continue
        if not _flows(graph, alone, names.index(name)):
            fixed[name] = None
    branching = [k for k in fixed if k not in base]
    if not branching:
        return [(graph, fixed)]
    out = []
    for nones in _combinations(branching):
        key = {**base, **{k: None if k in nones else GIVEN for k in branching}}
        try:
            out.append((attempt({**base, **{k: None for k in nones}}) if nones else graph, key))
        except Exception:                            # noqa: BLE001 - that mix does not trace
            if not out:
                raise                                # the defaults' graph: it traced before
    return out


def _combinations(branching: list[str]) -> list[tuple[str, ...]]:
    """Which of the branching arguments are None, per graph: all of them first (the call
    with the defaults); every mix up to MAX_BRANCHING arguments, else all or none."""
    if len(branching) > MAX_BRANCHING:
        return [tuple(branching), ()]
    return [c for r in range(len(branching), -1, -1)
            for c in itertools.combinations(branching, r)]


def _fits(value, want) -> bool:
    if want is GIVEN:
        return value is not None
    return value is want if want is None else (type(value) is type(want) and value == want)


def guarded(variants: list[tuple[dict, Callable]], signature: inspect.Signature,
            own) -> Callable:
    """fn(self, *args, **kwargs): the first variant's code whose key the call fits, else `own`
    (the class's forward). The call is passed on as made, less the fixed arguments given by
    name (fx renamed those; each has its default there, the value the key asked for)."""
    params = signature.parameters

    def run(self, *args, **kwargs):
        bound = signature.bind(*args, **kwargs).arguments
        for key, code in variants:
            if all(_fits(bound.get(k, params[k].default), v) for k, v in key.items()):
                return code(self, *args, **{k: v for k, v in kwargs.items()
                                            if key.get(k, GIVEN) is GIVEN})
        off = [k for k in variants[0][0] if not any(
            _fits(bound.get(k, params[k].default), key[k]) for key, _ in variants)]
        name = type(self).__qualname__
        if name not in _warned:
            _warned.add(name)
            traced_for = " or ".join(", ".join(f"{k}={v!r}" for k, v in key.items())
                                     for key, _ in variants)
            warnings.warn(f"fused: {name}'s graph was traced for {traced_for}; called with "
                          f"other values ({', '.join(off) or 'a mix'}) it runs its own "
                          f"forward (no fused sites there)")
        return own(self, *args, **kwargs)
    return run
