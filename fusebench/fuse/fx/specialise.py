"""Optional arguments of a traced forward: which ones the trace must fix to their default, and
the check at call time that keeps the graph to the calls it was traced for.

fx traces every argument as a Proxy, defaults included, and a Proxy `is not None`: nanoGPT's
`forward(idx, targets=None)` traced the `if targets is not None:` branch (the loss), and a call
without targets then ran `cross_entropy(logits, None)`. An argument whose default is a flag
(`if return_features:`) stops the trace outright (a Proxy has no truth value).

So, per argument with a None default: trace once with it fixed to None (fx's concrete_args);
if that graph computes other ops than the Proxy one, the forward branches on it and the graph
is traced with it fixed. Where the Proxy trace fails, the arguments with a bool / int / float /
str default are fixed first (then the None ones are tried as above), and failing that every
argument with a default. A call that passes another value for a fixed argument runs the
module's own forward (eager, no fused sites for that call) and warns once per module class."""
from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable

import torch
import torch.fx as fx
import torch.fx._symbolic_trace as fx_trace

CONSTANTS = (bool, int, float, str)
# the checks fx adds for a fixed argument (`targets` must be None, `flag == True`)
_FX_CHECKS = {torch._assert, fx_trace._assert_is_none}
_warned: set[str] = set()


def defaults(fn) -> dict[str, object]:
    """fn's parameters with a None or constant default; {} where it takes *args / **kwargs
    (a call cannot then be matched to names)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return {}
    return {p.name: p.default for p in params if p.default is not p.empty
            and (p.default is None or type(p.default) in CONSTANTS)}


def _ops(graph: fx.Graph) -> list[tuple[str, str]]:
    return [(n.op, str(n.target)) for n in graph.nodes if n.op not in ("placeholder", "output")
            and n.target not in _FX_CHECKS]


def traced(attempt: Callable[[dict | None], fx.Graph], fn) -> tuple[fx.Graph, dict]:
    """(graph, the arguments it fixed) for `attempt(concrete_args)`, as the module doc says.
    Raises the Proxy trace's error when no fixing traces either."""
    opts = defaults(fn)
    base: dict = {}
    try:
        graph = attempt(None)
    except Exception as err:
        # the flags first (a None default may be a mask that flows through), then everything
        tries = [f for f in ({k: v for k, v in opts.items() if v is not None}, opts) if f]
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
        if _ops(alone) != _ops(graph):
            fixed[name] = None
    return (attempt(fixed) if fixed != base else graph), fixed


def _same(value, default) -> bool:
    return value is default if default is None else (type(value) is type(default)
                                                      and value == default)


def guarded(code, signature: inspect.Signature, fixed: dict, own) -> Callable:
    """fn(self, *args, **kwargs): the traced code where the fixed arguments have their
    values (passed on without them: fx renamed them), else `own` (the class's forward)."""
    def run(self, *args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        off = [k for k, v in fixed.items() if k in bound.arguments
               and not _same(bound.arguments[k], v)]
        if off:
            key = type(self).__qualname__
            if key not in _warned:
                _warned.add(key)
                warnings.warn(f"fused: {key}'s graph was traced with "
                              f"{', '.join(f'{k}={fixed[k]!r}' for k in off)}; called with "
                              f"another value it runs its own forward (no fused sites there)")
            return own(self, *args, **kwargs)
        return code(self, **{k: v for k, v in bound.arguments.items() if k not in fixed})
    return run
