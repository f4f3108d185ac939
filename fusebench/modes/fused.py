"""fused: the model rewritten by fusebench's op fuser (fusebench.fuse), run eagerly.

Coverage is reported as events: one `fusion` event per fusion that fired ("ln2d: 17 sites"),
one `unfused` event listing the leaf module types no fusion covered, and a `kernel_fallback`
event when the fused LN2d kernel cannot build and the `function` impl runs instead.

Train: submodules are swapped in place, keeping the same Parameters under the same names (the
optimizer, the correctness check and FSDP see them). Infer: a fused copy (conv+BN folded)."""
from __future__ import annotations

import contextlib

from fusebench.modes.options import ModeOption
from fusebench.modes.registry import register_mode
from fusebench.modes.base import Mode, device_of


@register_mode
class Fused(Mode):
    name = "fused"
    same_plan_with_input_grads = True   # no guards: a module run eagerly
    description = ("fusebench op fuser (matches what the code computes, via torch.fx): LN2d "
                   "kernel, BN+act, GroupNorm+act, SE gate, bias+GELU+fc2 MLP, depthwise-conv "
                   "backward, RMSNorm, gated MLP, self-attention without MultiheadAttention's "
                   "copies, written-out attention as one SDPA call; "
                   "conv+BN folding for inference")

    options = (
        ModeOption("fused_layout", str, choices=("auto", "channels_last", "keep"),
                   default="auto",
                   help="fused: run NCHW image inputs channels-last inside (converted at each "
                        "call, 4-D outputs converted back): auto (on CPU, where a BN+act or a "
                        "GroupNorm+act site fired and a step timed both ways is not 10% faster "
                        "NCHW), channels_last, keep."),
        ModeOption("fused_recompute", bool, default=False,
                   help="fused: rebuild each fused BN+act output in backward instead of "
                        "saving it (least activation memory; one more pass per rebuilt "
                        "tensor, 5-9% slower per EfficientNet step on CPU; off by default)."),
        ModeOption("fused_gemm", str, choices=("auto", "onednn", "aten"), default="auto",
                   help="fused: the library the fused sites' GEMMs (1x1 convs on channels-last "
                        "views, MLP linears) run on: auto (per call shape, the faster of "
                        "oneDNN's matmul and aten's mm, timed the first time it runs; aten "
                        "where oneDNN cannot take it), onednn, aten."),
        ModeOption("fused_bn_act", str, choices=("auto", "aten", "cpu", "triton"),
                   default="auto",
                   help="fused: the BN(train) + activation kernel, a residual block's BN + "
                        "add + act too: auto (the C++ kernel on CPU, aten's sequence on CUDA "
                        "until the Triton kernel wins there), aten, cpu, triton; one that "
                        "cannot run here runs aten's sequence with a kernel_fallback event."),
        ModeOption("fused_gn_act", str, choices=("auto", "aten", "cpu", "triton"),
                   default="auto",
                   help="fused: the GroupNorm + activation kernel: auto (the C++ kernel on CPU, "
                        "aten's sequence on CUDA until the Triton kernel is timed there), aten, "
                        "cpu, triton; one that cannot run here runs aten's sequence with a "
                        "kernel_fallback event."),
        ModeOption("fused_mlp", str, choices=("auto", "blocks", "layers"), default="auto",
                   help="fused: how a GELU MLP runs, fc1 -> bias + GELU -> fc2 per block of "
                        "rows with the hidden activation kept in cache (blocks; C++ on CPU, "
                        "Triton on CUDA) or one layer after the other (layers); auto runs blocks "
                        "on CPU where fc1's output outgrows L2, layers on CUDA until the Triton "
                        "blocks are timed there."),
        ModeOption("fused_ln_linear", bool, default=False,
                   help="fused: LayerNorm -> Linear in one Function that recomputes LN(x) in "
                        "backward (one activation less per site, one LayerNorm pass more; off by "
                        "default)."),
    )

    def __init__(self):
        self._rewritten = False
        self._channels_last = False    # decided in rewrite, applied to prepare's callable
        self._saving = False           # likewise: recompute.Saving around the model

    def rewrite(self, model, example_inputs, options, events):
        """Apply the fusions. Called by prepare, or before a distributed wrapper is built (the
        wrapper must record the fused modules' Parameters, not the replaced ones)."""
        from fusebench.fuse import fuse
        from fusebench.fuse.layout import decide
        bench = options.get("bench", "train")
        opt_in = ("ln_linear",) if self.opts(options)["fused_ln_linear"] else ()
        device = device_of(model, example_inputs)
        impls = {family: choice for family in ("bn_act", "gn_act")
                 if (choice := self.opts(options)[f"fused_{family}"]) != "auto"}
        result = fuse(model, bench, device, impls=impls, opt_in=opt_in)
        for category, msg in result.notes:
            events.add(category, "fuser", msg)
        for fusion, n in result.sites.items():
            events.add("fusion", "fuser", f"{fusion}: {n} sites")
        if not result.sites:
            events.add("fusion", "fuser", "0 sites: no registered fusion matched this model")
        if result.unfused:
            listed = ", ".join(f"{t} x{n}" for t, n in result.unfused.most_common())
            events.add("unfused", "fuser", f"left unfused: {listed}",
                       count=sum(result.unfused.values()))
        self._saving = self._recompute_choice(result.sites, bench, options, events)
        from fusebench.fuse import gemm, mlp_blocks
        gemm.set_default(self.opts(options)["fused_gemm"])   # this process runs this cell
        mlp_blocks.set_default(self.opts(options)["fused_mlp"])
        events.add("info", "fuser", gemm.describe())         # (and the layout trial below)
        layout = decide(self.opts(options)["fused_layout"], result.sites, result.model,
                        example_inputs, device, self._wrapped(result.model), bench == "train",
                        options.get("autocast", contextlib.nullcontext))
        if layout.category:
            events.add(layout.category, "fuser", layout.message)
        self._channels_last = layout.inside
        self._rewritten = True
        return result.model

    def finish(self, events):
        from fusebench.fuse import gemm, mlp_blocks, patchify
        from fusebench.fuse.fusions import dwconv
        for raced in (gemm.describe_raced(), patchify.describe_raced(), *mlp_blocks.describe(),
                      dwconv.describe()):
            if raced:                          # auto's choices are made as calls first run
                events.add("info", "fuser", raced)

    def _wrapped(self, model):
        """The model as prepare hands it to the cell, but for the layout."""
        from fusebench.fuse.recompute import Saving
        return Saving(model) if self._saving else model

    def _recompute_choice(self, sites, bench: str, options, events) -> bool:
        """True: run the model with the rebuilds off (its BN+act outputs saved); says which."""
        from fusebench.fuse.recompute import PRODUCERS
        if bench != "train" or not PRODUCERS & set(sites):
            return False
        if self.opts(options)["fused_recompute"]:
            events.add("info", "fuser", "recompute: fused BN+act outputs rebuilt in backward "
                                        "where a consumer can (fused_recompute=True)")
            return False
        events.add("info", "fuser", "recompute off: fused BN+act outputs saved for backward "
                                    "(--fused-recompute rebuilds them: less memory, slower)")
        return True

    def prepare(self, model, example_inputs, options, events):
        if not self._rewritten:    # else fused before the distributed wrapper was built
            model = self.rewrite(model, example_inputs, options, events)
        self._rewritten = False
        from fusebench.fuse.layout import ChannelsLastInside
        call = self._wrapped(model)
        return ChannelsLastInside(call) if self._channels_last else call

