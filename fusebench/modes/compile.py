"""compile: torch.compile(model, backend, mode, fullgraph, dynamic), with what it did reported as
events after the run: graph breaks, unique graphs, recompiles (+reason), inductor fallback kernels
and compile errors that fell back to eager (only with compile_fallback=True; otherwise a compile
error is an error)."""
from __future__ import annotations

import logging
import os
import shutil

from fusebench.modes.registry import register_mode
from fusebench.modes.base import Mode
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
    return name.removesuffix(".default")


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
        self._metrics_start = len(du.get_compilation_metrics())
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
        return torch.compile(model, **kwargs)

    def finish(self, events):
        import torch._dynamo
        import torch._dynamo.utils as du
        try:
            for key, n in du.counters["graph_break"].items():
                events.add("graph_break", "dynamo", key, count=n)
            graphs = du.counters["stats"].get("unique_graphs", 0)
            events.add("graphs", "dynamo", f"{graphs} unique graphs compiled")
            for m in du.get_compilation_metrics()[getattr(self, "_metrics_start", 0):]:
                if getattr(m, "recompile_reason", None):
                    events.add("recompile", "dynamo", m.recompile_reason)
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
