"""cudagraphs: the eager (or fused) model captured in CUDA graphs, replayed every step, so the
host issues one graph launch instead of every kernel.

Capture happens on the first call, inside the step's own context (autocast, inference_mode,
no_grad), so the graph runs the same precision the step asks for; one graph per context and
input layout. With autograd (train): torch.cuda.make_graphed_callables (forward and backward
graphs, static inputs, its warm-up iterations on a side stream). Without (infer, no_grad): one
torch.cuda.graph of the forward after warm-up on a side stream, as the CUDA-graphs notes
prescribe. Inputs are copied into the static inputs at every call; outputs are the graph's
static outputs, overwritten by the next call (as make_graphed_callables' are). Warm-up runs
update BatchNorm running stats: buffers are put back after capture.
CUDA only: on another device this mode is `unavailable`."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from fusebench.modes.base import Mode
from fusebench.modes.options import ModeOption
from fusebench.modes.registry import register_mode

WARMUP = 3   # side-stream iterations before capture (make_graphed_callables' default too)


def _context_key(args: tuple) -> tuple:
    """What a captured graph is specific to: autograd / inference state, autocast, and every
    tensor input's shape, dtype and strides."""
    cast = torch.is_autocast_enabled("cuda")
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), cast,
            torch.get_autocast_dtype("cuda") if cast else None,
            tuple((tuple(a.shape), a.dtype, a.stride()) if torch.is_tensor(a) else repr(a)
                  for a in args))


def _no_autocast_cache():
    """make_graphed_callables refuses autocast's weight-cast cache (cached casts would be
    freed under the graph); the same autocast, uncached, for the capture."""
    cast = torch.is_autocast_enabled("cuda")
    return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), enabled=cast,
                          cache_enabled=False)


def capture_forward(fn: Callable, args: tuple, warmup: int = WARMUP) -> Callable:
    """fn(*args) captured in one CUDA graph -> a callable that copies its inputs into the static
    ones, replays, and returns the static output."""
    static = tuple(a.detach().clone(memory_format=torch.preserve_format)
                   if torch.is_tensor(a) else a for a in args)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static)

    def replay(*call_args):
        for s, a in zip(static, call_args):
            if torch.is_tensor(s) and s.data_ptr() != a.data_ptr():
                s.copy_(a)
        graph.replay()
        return out
    return replay


class _Graphed:
    """The callable a cudagraphs cell runs: captures lazily, one graph per context key."""

    def __init__(self, model: nn.Module, events):
        self.model, self.events = model, events
        self.forward = model.forward          # the eager forward, kept before any graphing
        self.graphs: dict[tuple, Callable] = {}
        self.autograd_graphed = False

    def __call__(self, *args):
        key = _context_key(args)
        run = self.graphs.get(key)
        if run is None:
            run = self.graphs[key] = self._capture(args)
        return run(*args)

    def _capture(self, args: tuple) -> Callable:
        saved = {n: b.detach().clone() for n, b in self.model.named_buffers()}
        needs_grad = torch.is_grad_enabled() and any(
            p.requires_grad for p in self.model.parameters())
        with _no_autocast_cache():
            if needs_grad:
                run = self._capture_autograd(args)
            else:
                run = capture_forward(self.forward, args)
        with torch.no_grad():     # the warm-up iterations were not steps of the benchmark
            for n, b in self.model.named_buffers():
                b.copy_(saved[n])
        return run

    def _capture_autograd(self, args: tuple) -> Callable:
        if self.autograd_graphed:
            raise RuntimeError("cudagraphs: a second input layout under autograd; "
                               "make_graphed_callables graphs one per module")
        static = tuple(a.detach().clone(memory_format=torch.preserve_format)
                       .requires_grad_(a.requires_grad) for a in args)
        torch.cuda.make_graphed_callables(self.model, static, num_warmup_iters=WARMUP)
        self.autograd_graphed = True
        self.events.add("info", "cudagraphs", "forward and backward captured with "
                        f"make_graphed_callables ({WARMUP} warm-up iterations, side stream)")
        return self.model


@register_mode
class CudaGraphs(Mode):
    name = "cudagraphs"
    description = ("eager (or fused) model captured in CUDA graphs and replayed: one launch "
                   "per step instead of one per kernel (CUDA only)")
    options = (
        ModeOption("cudagraphs_step", choices=("eager", "fused"), default="eager",
                   help="cudagraphs: the step to capture: the eager model or the fused one."),
    )
    dist_unsupported = {s: "capturing collectives needs graph-safe NCCL setup, not done here"
                        for s in ("ddp", "fsdp1", "fsdp2")}
    device_types = ("cuda",)

    def __init__(self):
        self._graphed: _Graphed | None = None

    def available(self, options, device="cpu"):
        if torch.device(device).type != "cuda":
            return False, (f"CUDA graphs need a CUDA device; this cell runs on {device} "
                           "(not run as eager instead)")
        if not torch.cuda.is_available():
            return False, "CUDA graphs need a CUDA device; torch.cuda.is_available() is False"
        return True, ""

    def prepare(self, model, example_inputs, options, events):
        if self.opts(options)["cudagraphs_step"] == "fused":
            from fusebench.modes.fused import Fused
            model = Fused().rewrite(model, example_inputs, options, events)
        self._graphed = _Graphed(model, events)
        return self._graphed

    def finish(self, events):
        if self._graphed is not None:
            events.add("graphs", "cudagraphs",
                       f"{len(self._graphed.graphs)} CUDA graph(s) captured")
            self._graphed = None
