"""compile: torch.compile(model, backend, mode, fullgraph, dynamic), with what it did reported as
events after the run: graph breaks, unique graphs, recompiles (+reason), inductor fallback kernels
and compile errors that fell back to eager (only with compile_fallback=True; otherwise a compile
error is an error)."""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import shutil

from fusebench.modes.registry import register_mode
from fusebench.modes.base import Mode, Twin
from fusebench.modes.options import ModeOption

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# modes whose point is CUDA graphs (max-autotune also uses them on CUDA, but it autotunes on
# CPU too, so it stays available there)
CUDA_GRAPH_MODES = ("reduce-overhead",)
_FALLBACK_PREFIX = "Using FallbackKernel:"


def dynamo_backends() -> tuple[str, ...]:
    import torch._dynamo
    # exclude_tags=() lists debug backends too (eager, aot_eager), which are legitimate here
    return tuple(torch._dynamo.list_backends(exclude_tags=()))


def cpp_compiler() -> str | None:
    """The C++ compiler inductor would use on CPU, or None if none is on PATH."""
    import torch._inductor.config as ic
    cxx = ic.cpp.cxx
    candidates = [c for c in (cxx if isinstance(cxx, (tuple, list)) else (cxx,)) if c]
    for name in [os.environ.get("CXX")] + candidates + ["g++", "c++", "clang++"]:
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def kernel_name(text: str) -> str:
    """'torch.ops.aten.convolution_backward.default' -> 'aten.convolution_backward'."""
    name = text.strip().removeprefix("torch.ops.")
    if name == "None":
        # torch 2.4 logs the hint before the kernel's name is set: the fallback is real, its
        # op unnamed, and an event reading "None" would say neither
        return "an aten op inductor did not name (torch 2.4 logs None)"
    return name.removesuffix(".default")


def _recompile(m) -> str | None:
    """Why dynamo compiled this frame again, or None if it was the frame's first compile.
    torch 2.4's metrics carry no reason, only the frame's cache entries matched before this
    compile (dynamo's own test for a recompile: at least one)."""
    if hasattr(m, "recompile_reason"):
        return m.recompile_reason or None
    entries = getattr(m, "cache_size", 0)
    if not isinstance(entries, int) or entries < 1:
        return None
    return (f"'{m.co_name}' ({os.path.basename(m.co_filename)}:{m.co_firstlineno}) compiled "
            f"again, cache entry {entries + 1}: this torch's compilation metrics give no "
            "reason (TORCH_LOGS=recompiles prints it)")


def _ids(objects) -> set[int]:
    return {id(o) for o in objects}


def _twin_kwargs(kwargs: dict) -> dict:
    """The plan's torch.compile kwargs for a twin that compiles anew: dynamo reuses a cache
    entry whose backend compares equal, and equal is the same compiler with the same options.
    Inductor: its mode as options plus fallback_random (the two cannot be given together); any
    other backend: a new callable around the same compiler."""
    import functools

    from torch._dynamo.backends.registry import lookup_backend
    twin = dict(kwargs)
    if twin["backend"] == "inductor":
        from torch._inductor import list_mode_options
        mode = twin.pop("mode", None)
        # list_mode_options(None) lists every mode's options, not the default's (none)
        options = list_mode_options(mode, twin["dynamic"]) if mode else {}
        twin["options"] = {**options, "fallback_random": True}
    else:
        twin["backend"] = functools.partial(lookup_backend(twin["backend"]))
    return twin


class _PerfHints(logging.Handler):
    """Collects inductor perf-hint log records (e.g. 'Using FallbackKernel: ...')."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@register_mode
class Compile(Mode):
    name = "compile"
    description = ("torch.compile (backend/mode/fullgraph/dynamic); reports graph breaks, "
                   "recompiles, inductor fallback kernels")
    options = (
        ModeOption("compile_backend", choices=dynamo_backends, default="inductor",
                   help="compile: dynamo backend.",
                   choices_help="a registered dynamo backend, e.g. inductor, aot_eager, "
                                "eager"),
        ModeOption("compile_mode", choices=COMPILE_MODES,
                   help="compile: torch.compile mode (default: torch's)."),
        ModeOption("compile_fullgraph", bool, default=False,
                   help="compile: fullgraph=True, a graph break is an error."),
        ModeOption("compile_dynamic", bool,
                   help="compile: dynamic=True or False (default: None, dynamo decides)."),
        ModeOption("compile_fallback", bool, default=False,
                   help="compile: let dynamo fall back to eager on compile errors (recorded "
                        "as events)."),
    )

    def __init__(self):
        self._hints: _PerfHints | None = None
        self._hint_log: logging.Logger | None = None
        self._hint_level = logging.NOTSET
        self._saved_suppress: bool | None = None
        self._compiled: tuple | None = None    # (model, torch.compile kwargs) for check_twin
        # compilation metrics not this plan's: those before prepare and the twin's. Held (not
        # their ids, which a freed object passes on), and compared by identity: dynamo keeps
        # the last 64 only, so a position in its list does not say which are new
        self._not_ours: list = []

    def available(self, options, device="cpu"):
        o = self.opts(options)
        try:
            import torch._dynamo
        except Exception as e:
            return False, f"torch._dynamo does not import: {type(e).__name__}: {e}"
        if not torch._dynamo.is_dynamo_supported():
            return False, "torch.compile is not supported on this Python/platform"
        backend = o["compile_backend"]
        if backend not in dynamo_backends():
            return False, f"dynamo backend '{backend}' is not registered in this torch build"
        if o["compile_mode"] in CUDA_GRAPH_MODES and torch.device(device).type != "cuda":
            return False, (f"compile_mode={o['compile_mode']} is CUDA graphs; on {device} "
                           "torch.compile would silently run it without them")
        if backend == "inductor" and torch.device(device).type == "cpu" and cpp_compiler() is None:
            return False, "inductor on CPU needs a C++ compiler (g++/c++), none found on PATH"
        return True, ""

    def prepare(self, model, example_inputs, options, events):
        import torch._dynamo
        import torch._dynamo.utils as du
        o = self.opts(options)
        torch._dynamo.reset()          # no graphs or guards from an earlier model in this process
        du.counters.clear()
        self._not_ours = du.get_compilation_metrics()
        self._saved_suppress = torch._dynamo.config.suppress_errors
        torch._dynamo.config.suppress_errors = bool(o["compile_fallback"])
        self._hints = None
        if o["compile_backend"] == "inductor":
            self._attach_perf_hints()
        kwargs = {"backend": o["compile_backend"], "fullgraph": o["compile_fullgraph"],
                  "dynamic": o["compile_dynamic"]}
        if o["compile_mode"] is not None:
            kwargs["mode"] = o["compile_mode"]
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        events.add("info", "dynamo",
                   f"torch.compile({args}), compile_fallback={o['compile_fallback']}")
        self._compiled = (model, kwargs)
        return torch.compile(model, **kwargs)

    def check_twin(self):
        """The same torch.compile call, compiled under inductor's fallback_random=True: aten's
        random ops stay aten's (otherwise inductor replaces them by its own generator's, so a
        dropout mask can never match eager's). Any backend: the flag is read by inductor's
        lowering and by the decompositions aot_eager_decomp_partition shares with it; where a
        backend ignores it, the twin is the plan itself compiled again."""
        import torch
        if self._compiled is None:
            return None
        model, kwargs = self._compiled
        return Twin(torch.compile(model, **_twin_kwargs(kwargs)), self._twin_scope,
                    "compiled again under torch._inductor.config.fallback_random=True, which "
                    "keeps aten's random ops (the timed plan's compiler may draw its own)")

    @contextlib.contextmanager
    def _twin_scope(self):
        """fallback_random on while a twin step runs (compiles), and what it compiles kept out
        of the counters, compilation metrics and perf hints finish() reports for the plan."""
        import torch._dynamo.utils as du
        import torch._inductor.config as ic
        counters = copy.deepcopy(du.counters)
        before = du.get_compilation_metrics()   # held: no id of theirs passes on meanwhile
        hints = len(self._hints.messages) if self._hints is not None else 0
        try:
            with ic.patch(fallback_random=True):
                yield
        finally:
            du.counters.clear()
            du.counters.update(counters)
            old = _ids(before)
            self._not_ours += [m for m in du.get_compilation_metrics() if id(m) not in old]
            if self._hints is not None:
                del self._hints.messages[hints:]

    def finish(self, events):
        import torch._dynamo
        import torch._dynamo.utils as du
        try:
            for key, n in du.counters["graph_break"].items():
                events.add("graph_break", "dynamo", key, count=n)
            graphs = du.counters["stats"].get("unique_graphs", 0)
            events.add("graphs", "dynamo", f"{graphs} unique graphs compiled")
            not_ours = _ids(self._not_ours)
            for m in du.get_compilation_metrics():
                if id(m) in not_ours:
                    continue
                recompile = _recompile(m)
                if recompile:
                    events.add("recompile", "dynamo", recompile)
                if getattr(m, "fail_type", None):
                    # the run got here, so this frame ran in eager instead of compiled
                    reason = " ".join(str(m.fail_reason or "").split())
                    events.add("compile_fallback", "dynamo", f"{m.fail_type}: {reason}")
            if self._hints is not None:
                for msg in self._hints.messages:
                    if msg.startswith(_FALLBACK_PREFIX):
                        events.add("fallback_kernel", "inductor",
                                   kernel_name(msg[len(_FALLBACK_PREFIX):]))
                    else:
                        events.add("perf_hint", "inductor", msg)
        finally:
            self._compiled, self._not_ours = None, []
            self._detach_perf_hints()
            if self._saved_suppress is not None:
                torch._dynamo.config.suppress_errors = self._saved_suppress
                self._saved_suppress = None

    def _attach_perf_hints(self) -> None:
        # The artifact logger is off by default (level NOTSET, propagate=False): a handler on it
        # plus level INFO captures its records without printing them or touching TORCH_LOGS.
        import torch._inductor.graph as ig
        self._hint_log = ig.perf_hint_log
        self._hint_level = self._hint_log.level
        self._hints = _PerfHints()
        self._hint_log.addHandler(self._hints)
        self._hint_log.setLevel(logging.INFO)

    def _detach_perf_hints(self) -> None:
        if self._hint_log is not None and self._hints is not None:
            self._hint_log.removeHandler(self._hints)
            self._hint_log.setLevel(self._hint_level)
        self._hint_log = None
