"""aot: functorch.compile.aot_module — AOTAutograd traces forward and backward into FX graphs,
partitions them, and hands each to a compiler (nop: run the FX graph as is; ts: TorchScript).

Parameters stay owned by the model: they are passed in as graph inputs, so gradients land on
model.parameters() and an optimizer built on the model keeps working. Tied parameters (a GPT's
lm_head.weight is wte.weight) are passed once, under their first name, and
torch.func.functional_call (tie_weights=True) puts the same tensor back under every alias, as
aot_module_simplified does; functorch's aot_module passes every alias and fails ("functional_call
got multiple values for keys [...], which are tied")."""
from __future__ import annotations

from collections.abc import Callable

import torch

from fusebench.modes.registry import register_mode
from fusebench.modes.base import Mode
from fusebench.modes.options import ModeOption

COMPILERS = {"nop": "nop", "ts": "ts_compile"}
PARTITIONERS = {"default": "default_partition", "min_cut": "min_cut_rematerialization_partition"}


def _functorch_compile():
    import functorch.compile as fc
    return fc


def aot_module(fc, model: torch.nn.Module, **aot_kwargs):
    """functorch's aot_module with every parameter and buffer passed once (tied ones too)."""
    params = dict(model.named_parameters())     # remove_duplicate=True: one name per tensor
    buffers = dict(model.named_buffers())

    def call(params, buffers, *args, **kwargs):
        return torch.func.functional_call(model, {**params, **buffers}, args, kwargs,
                                          tie_weights=True)
    compiled = fc.aot_function(call, num_params_buffers=len(params) + len(buffers),
                               **aot_kwargs)

    def run(*args, **kwargs):
        return compiled(params, buffers, *args, **kwargs)
    return run


@register_mode
class AOT(Mode):
    name = "aot"
    description = ("functorch aot_module: AOTAutograd forward/backward graphs, compiler nop|ts, "
                   "partitioner default|min_cut")
    options = (
        ModeOption("aot_compiler", choices=tuple(COMPILERS), default="nop",
                   help="aot: forward/backward graph compiler (nop: run the FX graph; ts: "
                        "TorchScript)."),
        ModeOption("aot_partitioner", choices=tuple(PARTITIONERS), default="default",
                   help="aot: forward/backward partitioner (min_cut: rematerialize to save "
                        "activations)."),
    )
    # measured on torch 2.13 (CPU, gloo, 2 ranks) with a conv/BN/GELU model
    dist_unsupported = {
        "fsdp1": ("functorch aot_module cannot trace FSDP1's flat-parameter views "
                  "(aten.detach multiple-dispatch failure)"),
        "fsdp2": ("functorch aot_module cannot trace FSDP2's DTensor parameters "
                  "(invalid python storage)"),
    }

    def available(self, options, device="cpu"):
        o = self.opts(options)
        try:
            fc = _functorch_compile()
        except Exception as e:
            return False, f"functorch.compile does not import: {type(e).__name__}: {e}"
        needed = ("aot_function", COMPILERS[o["aot_compiler"]], PARTITIONERS[o["aot_partitioner"]])
        for attr in needed:
            if not hasattr(fc, attr):
                return False, f"functorch.compile has no {attr} in this torch build"
        return True, ""

    def prepare(self, model, example_inputs, options, events):
        o = self.opts(options)
        fc = _functorch_compile()
        compiler = getattr(fc, COMPILERS[o["aot_compiler"]])
        partition = getattr(fc, PARTITIONERS[o["aot_partitioner"]])
        self._compiled = {"fw": 0, "bw": 0}

        def counted(graph):
            def compile_one(gm, inputs):
                self._compiled[graph] += 1
                return compiler(gm, inputs)  # a failing compiler raises: no silent fallback
            return compile_one

        def build():
            return aot_module(fc, model, fw_compiler=counted("fw"), bw_compiler=counted("bw"),
                              partition_fn=partition)

        # aot_module compiles once, on its first call, for the autograd state of that call: a
        # graph compiled with grad cannot run under inference_mode, and one compiled without
        # grad would silently return outputs that do not require grad. One module per state.
        per_state: dict[bool, Callable] = {}

        def run(*args, **kwargs):
            key = torch.is_grad_enabled()
            if key not in per_state:
                per_state[key] = build()
            return per_state[key](*args, **kwargs)

        events.add("info", "aot", f"aot_module, fw/bw compiler={o['aot_compiler']} "
                   f"({COMPILERS[o['aot_compiler']]}), partitioner={o['aot_partitioner']} "
                   f"({PARTITIONERS[o['aot_partitioner']]})")
        return run

    def finish(self, events):
        c = getattr(self, "_compiled", None)
        if c is not None:
            events.add("graphs", "aot", f"{c['fw']} forward, {c['bw']} backward graphs compiled")
