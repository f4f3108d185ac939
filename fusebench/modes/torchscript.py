"""torchscript: torch.jit.script (or trace) under a chosen fuser, and how many fusion groups the
profiling executor really formed. On CPU builds without LLVM that number is 0 — said, not hidden.

Fuser flags are process-global; prepare() sets them and finish() puts back what it found."""
from __future__ import annotations

from collections import Counter

import torch

from fusebench.modes import jit_ids
from fusebench.modes.registry import register_mode
from fusebench.modes.base import Mode, device_of
from fusebench.modes.options import DIST_STRATEGIES, ModeOption

# before any torch.library refresh in this process can free an op whose id the script
# frontend still maps to a builtin (see jit_ids)
jit_ids.install()

# node kinds that mean "a fuser took these ops": NNC, legacy fuser, nvFuser (pre-2.2 builds)
FUSION_KINDS = ("prim::TensorExprGroup", "prim::FusionGroup", "prim::CudaFusionGroup")


def llvm_enabled() -> bool:
    """Whether this torch build's NNC can generate CPU code (LLVM backend compiled in)."""
    fn = getattr(torch._C, "_llvm_enabled", None)
    return bool(fn()) if fn is not None else False


def _fuser_flags() -> dict[str, bool]:
    # read-only getters; _jit_nvfuser_enabled is avoided: it prints a C++ deprecation warning
    return {"cpu": torch._C._jit_can_fuse_on_cpu(), "gpu": torch._C._jit_can_fuse_on_gpu(),
            "texpr": torch._C._jit_texpr_fuser_enabled()}


def _set_fuser_flags(flags: dict[str, bool]) -> None:
    torch._C._jit_override_can_fuse_on_cpu(flags["cpu"])
    torch._C._jit_override_can_fuse_on_gpu(flags["gpu"])
    torch._C._jit_set_texpr_fuser_enabled(flags["texpr"])


def count_fusion_groups(graph) -> Counter:
    """Fusion-group nodes in a graph, walking nested blocks (If/Loop). Subgraph attributes are
    not entered: a group is counted once as a node, and DifferentiableGraph bodies are counted
    from their own execution plans (see executor_fusion_groups)."""
    found: Counter = Counter()
    for node in graph.nodes():
        if node.kind() in FUSION_KINDS:
            found[node.kind()] += 1
        for block in node.blocks():
            found += count_fusion_groups(block)
    return found


def executor_fusion_groups(scripted) -> tuple[Counter, Counter]:
    """(forward, backward) fusion groups over every optimized execution plan the graph executor
    holds for `scripted.forward`, including differentiable subgraphs and their backward."""
    fw: Counter = Counter()
    bw: Counter = Counter()

    def visit(state, into: Counter) -> None:
        for plan in state.execution_plans.values():
            into.update(count_fusion_groups(plan.graph))
            for sub in plan.code.differentiable_op_executor_states():
                visit(sub, into)
            for grad in plan.code.grad_executor_states():
                visit(grad, bw)

    visit(scripted.get_debug_state(), fw)
    return fw, bw


@register_mode
class TorchScript(Mode):
    name = "torchscript"
    description = ("torch.jit.script (or trace) with a chosen fuser (default/nnc/none); counts the "
                   "fusion groups formed; no freeze/optimize_for_inference")
    options = (
        ModeOption("ts_method", choices=("script", "trace"), default="script",
                   help="torchscript: torch.jit.script or torch.jit.trace."),
        ModeOption("ts_fuser", choices=("default", "nnc", "nvfuser", "none"), default="default",
                   help="torchscript: fuser (nvfuser: removed in torch 2.2, reported "
                        "unavailable)."),
    )
    # measured on torch 2.13 (CPU, gloo, 2 ranks) with a conv/BN/GELU model
    dist_unsupported = {k: (f"torch.jit.script/trace cannot compile a {k.upper()}-wrapped model "
                            "(script: forward(*args, **kwargs) is unsupported; trace: the "
                            "process group is not part of the trace)") for k in DIST_STRATEGIES}

    def __init__(self):
        self._scripted = None
        self._saved_flags: dict[str, bool] | None = None
        self._fuser = "default"
        self._device = "cpu"

    def available(self, options, device="cpu"):
        o = self.opts(options)
        dev = torch.device(device).type
        if o["ts_fuser"] == "nvfuser":
            return False, ("nvfuser was removed from TorchScript in torch 2.2; asking for it "
                           "does nothing (use ts_fuser=nnc or default)")
        if o["ts_fuser"] == "nnc" and dev == "cpu" and not llvm_enabled():
            return False, "NNC on CPU needs LLVM, which this torch build lacks"
        if o["ts_fuser"] == "nnc" and dev not in ("cpu", "cuda"):
            return False, f"NNC fuses only on cpu and cuda, not {dev}"
        return True, ""

    def prepare(self, model, example_inputs, options, events):
        o = self.opts(options)
        self._fuser = o["ts_fuser"]
        self._scripted = None
        self._device = torch.device(device_of(model, example_inputs)).type
        self._saved_flags = _fuser_flags()
        try:
            if self._fuser == "nnc":
                _set_fuser_flags({"cpu": self._device == "cpu",
                                  "gpu": self._device == "cuda", "texpr": True})
            elif self._fuser == "none":
                _set_fuser_flags({"cpu": False, "gpu": False, "texpr": False})
            # "default": leave the build's own settings alone
            if o["ts_method"] == "trace":
                # check_trace=False: the worker checks correctness against eager itself, and the
                # check would run extra forwards (BatchNorm statistics) under our name
                self._scripted = torch.jit.trace(model, tuple(example_inputs), check_trace=False)
            else:
                # a scripting failure is an error; we never fall back to tracing
                self._scripted = torch.jit.script(model)
        except BaseException:
            self._restore()
            raise
        events.add("info", "torchscript",
                   f"torch.jit.{o['ts_method']}, fuser={self._fuser}: "
                   + ", ".join(f"{k}={v}" for k, v in _fuser_flags().items()))
        return self._scripted

    def finish(self, events):
        try:
            if self._scripted is None:
                return
            try:
                fw, bw = executor_fusion_groups(self._scripted)
            except Exception as e:  # debug state unavailable: fall back to the last graph run
                events.add("info", "torchscript", f"executor debug state unreadable ({e}); "
                           "counting fusion groups in the last executed graph only")
                fw = count_fusion_groups(torch.jit.last_executed_optimized_graph())
                bw = Counter()
            n = sum(fw.values()) + sum(bw.values())
            if n:
                kinds = ", ".join(f"{k.split('::')[1]} x{c}" for k, c in (fw + bw).items())
                events.add("fusion", "torchscript",
                           f"{n} fusion groups formed ({sum(fw.values())} forward, "
                           f"{sum(bw.values())} backward: {kinds})")
            else:
                events.add("no_fusion", "torchscript", self._why_no_fusion())
        finally:
            self._restore()

    def _why_no_fusion(self) -> str:
        flags = _fuser_flags()
        if self._fuser == "none":
            return "0 fusion groups: fusers disabled (ts_fuser=none)"
        if not torch._C._get_graph_executor_optimize():
            return "0 fusion groups: TorchScript graph executor optimization is off"
        if self._device == "cpu" and not flags["cpu"]:
            why = (" without LLVM" if not llvm_enabled()
                   else " with CPU fusion off (ts_fuser=nnc enables it)")
            return f"0 fusion groups: TorchScript on CPU{why} forms none"
        if self._device == "cuda" and not flags["gpu"]:
            return "0 fusion groups: TorchScript GPU fusion is off in this process"
        if not flags["texpr"]:
            return "0 fusion groups: the NNC (texpr) fuser is disabled"
        return "0 fusion groups: the profiling executor found nothing to fuse"

    def _restore(self) -> None:
        if self._saved_flags is not None:
            _set_fuser_flags(self._saved_flags)
            self._saved_flags = None

