"""Grad and autocast modes a forward enters with `with`, kept in its traced graph.

fx runs a forward's Python while tracing, so `with torch.no_grad():` (a teacher's targets, an
EMA branch, a codebook lookup) or `with torch.autocast(..., enabled=False):` (HF's rotary
embedding, a float32 softmax) took effect at trace time only: the graph ran those ops with
grad on, and a fused model gave the input gradients eager does not (checked: `x * 2` under
no_grad added 2 to every input's gradient). Here, while tracing, entering one of torch's grad
or autocast managers puts a node in the graph that enters the same manager at run time, and
leaving it one that leaves it: relative to the caller's modes, as the `with` does (a no_grad
region inside an inference call stays no_grad; the caller's mode comes back after it).
A mode changed any other way (`torch.inference_mode`, `torch.set_grad_enabled(False)` called
as a function, torch._C directly) fails the trace with a reason, so the module keeps its own
forward. Each node records its region, and a site may not take ops from two regions."""
from __future__ import annotations

import contextlib
import threading

import torch
import torch.fx as fx
from torch.autograd import grad_mode

REGION = "fusebench_region"        # node.meta key: the regions the node was traced in
# torch's own managers whose __enter__/__exit__ the trace records (subclasses, such as the
# deprecated torch.cuda.amp.autocast, reach these through super())
GRAD_MANAGERS = (grad_mode.no_grad, grad_mode.enable_grad, grad_mode.set_grad_enabled)
DEVICES = ("cpu", "cuda")

_open = threading.local()          # managers the running graphs entered, innermost last


def _entered() -> list:
    if not hasattr(_open, "stack"):
        _open.stack = []
    return _open.stack


def enter_grad(enabled: bool):
    cm = torch.set_grad_enabled(enabled)     # sets it now; its __exit__ restores the caller's
    _entered().append(cm)
    return cm


class _AutocastOff:
    """`autocast(device, enabled=False)`, whatever device the code named: the region's intent
    is float32 math, and the device a traced forward computes (HF's `x.device.type if
    isinstance(x.device.type, str) ... else "cpu"`) reads "cpu" from a Proxy even where the
    model runs on CUDA. Turning autocast off for a device the region's tensors are not on
    changes nothing for them."""

    def __init__(self, cache_enabled: bool | None):
        self.cms = [torch.autocast(d, enabled=False, cache_enabled=cache_enabled)
                    for d in DEVICES if torch.is_autocast_enabled(d)]

    def __enter__(self):
        for cm in self.cms:
            cm.__enter__()

    def __exit__(self, *exc):
        for cm in reversed(self.cms):
            cm.__exit__(*exc)


def enter_autocast(device: str, dtype, enabled: bool, cache_enabled: bool | None):
    cm = (torch.autocast(device, dtype=dtype, enabled=True, cache_enabled=cache_enabled)
          if enabled else _AutocastOff(cache_enabled))
    cm.__enter__()
    _entered().append(cm)
    return cm


def leave(cm) -> None:
    if _entered()[-1] is cm:
        _entered().pop()
    cm.__exit__(None, None, None)


@contextlib.contextmanager
def unwound():
    """Around a call of a graph with mode nodes: an exception between an enter and its leave
    leaves the managers the graph entered, innermost first, as `with` would have."""
    stack = _entered()
    depth = len(stack)
    try:
        yield
    finally:
        while len(stack) > depth:
            stack.pop().__exit__(None, None, None)


for _fn in (enter_grad, enter_autocast, leave):   # a pass that drops unused nodes keeps these
    fx.node.has_side_effect(_fn)


def has_modes(graph: fx.Graph) -> bool:
    return any(n.op == "call_function" and n.target in (enter_grad, enter_autocast)
               for n in graph.nodes)


def now() -> tuple:
    """The modes an op runs under (what a trace compares to what the `with`s it saw set)."""
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            torch.is_autocast_cache_enabled(),
            *((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in DEVICES))


class Recorder:
    """Used by the tracer: `with recorder.patched():` around a trace makes torch's grad and
    autocast managers record themselves through `create_node`; `check()` before each node
    fails the trace where the modes moved without one of them; `region()` is the node's."""

    def __init__(self, create_node):
        self.create_node = create_node
        self.regions: list[tuple[fx.Node, tuple]] = []        # (enter node, modes inside)
        self.outside = now()

    def region(self) -> tuple[str, ...]:
        return tuple(n.name for n, _ in self.regions)

    def check(self) -> None:
        expected = self.regions[-1][1] if self.regions else self.outside
        if now() != expected:
            raise RuntimeError("its forward changes grad, inference or autocast mode other "
                               "than by `with torch.no_grad()` / `enable_grad()` / "
                               "`set_grad_enabled(b)` / `autocast(...)`, which a traced "
                               "graph would not do")

    def _enter(self, fn, args):
        node = self.create_node("call_function", fn, args, {})
        self.regions.append((node, now()))

    def _leave(self):
        if not self.regions:
            raise RuntimeError("its forward leaves a grad or autocast mode it did not enter")
        node, _ = self.regions.pop()
        self.create_node("call_function", leave, (node,), {})

    @contextlib.contextmanager
    def patched(self):
        kept = [(cls, cls.__enter__, cls.__exit__) for cls in (*GRAD_MANAGERS, torch.autocast)]
        rec, tracing = self, threading.get_ident()     # another thread's blocks are its own

        def grad_enter(enter):
            def entered(cm):
                out = enter(cm)
                if threading.get_ident() == tracing:
                    rec._enter(enter_grad, (torch.is_grad_enabled(),))
                return out
            return entered

        def autocast_enter(enter):
            def entered(cm):
                out = enter(cm)
                if threading.get_ident() == tracing:
                    rec._enter(enter_autocast, (cm.device, cm.fast_dtype, cm._enabled,
                                                cm._cache_enabled))
                return out
            return entered

        def leaving(exit_):
            def left(cm, *exc):
                if threading.get_ident() == tracing:
                    rec._leave()
                return exit_(cm, *exc)
            return left
        try:
            for cls, enter, exit_ in kept:
                cls.__enter__ = (autocast_enter if cls is torch.autocast else grad_enter)(enter)
                cls.__exit__ = leaving(exit_)
            yield
            if self.regions:
                raise RuntimeError("its forward leaves a grad or autocast mode entered")
        finally:
            for cls, enter, exit_ in kept:
                cls.__enter__, cls.__exit__ = enter, exit_
            self._restore()

    def _restore(self) -> None:
        """The trace's modes put back as they were before it (a failed trace, a forward that
        set one as a function)."""
        grad, _, cache, *per_device = self.outside
        torch._C._set_grad_enabled(grad)
        torch.set_autocast_cache_enabled(cache)
        for d, (on, dtype) in zip(DEVICES, per_device):
            torch.set_autocast_enabled(d, on)
            torch.set_autocast_dtype(d, dtype)
