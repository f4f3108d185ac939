"""Channels-last inside: a fused model given NCHW images runs its activations channels-last.

The bundled BN + act, SE and depthwise kernels and the 1x1 convs as GEMMs (conv1x1.py) are
fastest on channels-last data, whose (N, H, W, C) view is free; fed NCHW, the fused blocks
either run their slower NCHW paths or keep aten's convs. Converting the 4-D image inputs at the
call (a copy of the input, paid inside every timed step) makes every conv after it produce
channels-last output, so the whole fused network runs as in a `--channels-last` cell. 4-D
outputs go back to the caller's NCHW layout, so the caller sees the same values and strides.
In-process, fused NCHW without / with it (b8, 160 px, train, this 2-core CPU; docs/fused.md,
fourteenth session): EfficientNet 1.19-1.39x, ConvNeXt 0.97-1.03x (noise: its stem already
hands channels-last data to the blocks); a diffusion UNet (gn_act sites, benchmarks/
unet_parts.py, twenty-sixth session) 1.10x, from its 3x3 convs, which oneDNN runs faster on
channels-last data, and the gn_act kernel, faster there too. So `auto` turns it on where a
BN-family or a gn_act site fired, on CPU (not yet measured on a GPU: there `auto` keeps NCHW
and says so).

The rewrite is checked before it is used: one forward under no_grad on the example inputs
(buffers and RNG restored after), because user code written for NCHW (`x.view(n, c, -1)`)
fails on a channels-last tensor. A model that fails it keeps its layout, and says why.

Then `auto` times it, as cudnn.benchmark times its algorithms: the sites prefer channels-last,
but the model's own dense convs may not. oneDNN runs a 3x3 conv at 512 channels on a 3x3 or
5x5 map 1.2-1.3x slower channels-last (33rd session), and a torchvision ResNet-18 fed NCHW ran
0.66x eager at b4, 96 px with it and 0.96x without (0.97x / 1.07x at b8, 160 px). A step
(forward and, for training, backward) in each layout after one warm-up each, then up to PAIRS
pairs (in alternating order) while they take under TRIAL_S; channels-last inside stays unless
NCHW's median is at least MARGIN faster. Buffers, gradients and the RNG are put back. Not
under a distributed run: ranks timing apart could choose different layouts, so there the
sites' rule stands.

The sites' preference is a float32 / float64 fact: their CPU kernels take only those. Where
the step computes in another dtype (a CPU autocast to bfloat16, or a bfloat16 model), the sites
run eager's ops, so `auto` keeps the user's layout there, untimed, and says why; the user's
own `--channels-last` is the way to run such a model channels-last. Measured (35th session,
efficientnet_b0 fused, b4 96 px, 2 threads, in one process), channels-last inside / NCHW step
time: float32 0.72-0.77x, bfloat16 autocast 0.97-1.03x; and under bf16 the cell's peak memory
read 201 MiB channels-last inside vs 118 MiB NCHW. Timing both layouts there would not help
either: the trial's other layout leaves its oneDNN primitives cached (41 MiB more RSS after
the steps, gone with ONEDNN_PRIMITIVE_CACHE_CAPACITY=0). The check and the trial run under the
cell's autocast (`decide(autocast=...)`), the step the cell times."""
from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from fusebench.dtypes import dtype_name
from fusebench.errors import describe
from fusebench.fuse.engine import forward_autocast
from fusebench.fuse.recompute import PRODUCERS
from fusebench.kernels.bn_act import cpu as bn_act_cpu
from fusebench.kernels.gn_act import cpu as gn_act_cpu

# the fused BN + act sites (the recompute producers): their kernels, and the dwconv / SE
# consumers around them, were measured faster on channels-last data; the GroupNorm + act sites
# of a UNet likewise, with the 3x3 convs around them (the module docstring)
PREFERS_CHANNELS_LAST = PRODUCERS | {"gn_act"}
# ...in the dtypes those CPU kernels take
KERNEL_DTYPES = frozenset(bn_act_cpu.DTYPES) & frozenset(gn_act_cpu.DTYPES)
MARGIN = 1.10     # NCHW this much faster keeps it: the trial's few early steps vary by ~7%
TRIAL_S = 3.0     # timed pairs stop once the trial has spent this long (at least one pair)
PAIRS = 4         # at most


def nchw_image(t) -> bool:
    """A 4-D float tensor in NCHW layout (not already channels-last; C > 1)."""
    return (torch.is_tensor(t) and t.dim() == 4 and t.is_floating_point() and t.shape[1] > 1
            and t.is_contiguous() and not t.is_contiguous(memory_format=torch.channels_last))


def _to_cl(t):
    return t.contiguous(memory_format=torch.channels_last) if nchw_image(t) else t


def _to_nchw(t):
    return t.contiguous() if torch.is_tensor(t) and t.dim() == 4 else t


@dataclass(frozen=True)
class ChannelsLastInside:
    """fn(*args) with its NCHW image args converted to channels-last and, where any was, its
    4-D outputs back to NCHW (a tuple, list or dict of outputs elementwise; a named tuple or
    other container as it is)."""
    fn: Callable

    def __call__(self, *args, **kwargs):
        if not any(map(nchw_image, (*args, *kwargs.values()))):
            return self.fn(*args, **kwargs)
        out = self.fn(*map(_to_cl, args), **{k: _to_cl(v) for k, v in kwargs.items()})
        if isinstance(out, dict):
            return type(out)((k, _to_nchw(v)) for k, v in out.items())
        if isinstance(out, (tuple, list)) and not hasattr(out, "_fields"):
            return type(out)(_to_nchw(o) for o in out)
        return _to_nchw(out)


@dataclass(frozen=True)
class Layout:
    inside: bool          # run channels-last inside
    category: str = ""    # the event: "" for none
    message: str = ""


def decide(choice: str, sites, model: nn.Module, example_inputs: tuple,
           device: str = "cpu", run: Callable | None = None, train: bool = True,
           autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
           ) -> Layout:
    """Whether to run channels-last inside, for layout option `choice` after fuse() fired
    `sites` for `device`, and the event that says so (a fusion, a kept layout, a fallback).
    `run`: what the mode will call (the model, or a wrapper of it), timed under `auto`;
    `autocast`: the cell's autocast, which the check and the trial run under."""
    if choice == "keep":
        return Layout(False, "info", "layout kept (fused_layout=keep)")
    if not any(nchw_image(x) for x in example_inputs):
        return Layout(False)                  # nothing to convert: nothing to say
    if not any(isinstance(m, nn.Conv2d) for m in model.modules()):
        return Layout(False)                  # a kernel's module, not a network: nothing to say
    fired = sorted(PREFERS_CHANNELS_LAST & set(sites))
    if choice == "auto" and not device.startswith("cpu"):
        return Layout(False, "info", f"layout kept NCHW: channels-last inside is measured on "
                      f"CPU only, not on {device}; fused_layout=channels_last forces it")
    if choice == "auto" and not fired:
        return Layout(False, "info", "layout kept NCHW: no channels-last-preferring site fired "
                      f"({', '.join(sorted(PREFERS_CHANNELS_LAST))}); fused_layout="
                      "channels_last forces it")
    # what the trials' NCHW and channels-last calls warned, said again for the layout kept
    # only: a kernel says a thing once per shape (dwconv.passes_for), at its first call
    said: tuple[list, list] = ([], [])
    with autocast():
        out = _checked_and_timed(choice, fired, model, example_inputs, run or model, train,
                                 said)
    for w in said[out.inside]:
        warnings.warn(w.message, stacklevel=2)
    return out


def _checked_and_timed(choice: str, fired: list[str], model: nn.Module, example_inputs: tuple,
                       run: Callable, train: bool, said: tuple[list, list]) -> Layout:
    """decide's dtype rule, check and trial, in the caller's autocast."""
    why = f"{', '.join(fired)} sites" if choice == "auto" else "fused_layout=channels_last"
    dtype = compute_dtype(model, example_inputs)
    if choice == "auto" and dtype not in KERNEL_DTYPES:
        return Layout(False, "info", f"layout kept NCHW: {why} prefer channels-last for their "
                      f"float32 / float64 CPU kernels, but this step computes in "
                      f"{dtype_name(dtype)}, where they run eager's ops; "
                      "fused_layout=channels_last forces it")
    with _recorded(said[1]):
        err = trial_error(model, example_inputs)
    if err:
        return Layout(False, "fallback",
                      f"layout kept NCHW: the model fails on channels-last input ({err})")
    out = Layout(True, "fusion", "channels-last inside: NCHW image inputs converted at each "
                 f"call, 4-D outputs converted back ({why})")
    if choice == "auto" and not _distributed():
        nchw, cl = timed_trial(run, model, example_inputs, train, said)
        timed = (f"timed on the example inputs, a {'train' if train else 'forward'} step took "
                 f"{nchw:.1f} ms NCHW and {cl:.1f} ms channels-last inside")
        out = Layout(False, "info", f"layout kept NCHW: {why} prefer channels-last, but "
                     f"{timed}; fused_layout=channels_last forces it") if cl > MARGIN * nchw \
            else Layout(True, "fusion", f"{out.message[:-1]}; {timed})")
    return out


def compute_dtype(model: nn.Module, example_inputs: tuple) -> torch.dtype:
    """The dtype a step of model computes its convs and norms in: the first float input's (else
    the first float parameter's), or its device's autocast's where one is on."""
    t = next((t for t in (*example_inputs, *model.parameters())
              if torch.is_tensor(t) and t.is_floating_point()), None)
    if t is None:
        return torch.get_default_dtype()
    cast = forward_autocast(t)
    return cast[1] if cast else t.dtype


@contextlib.contextmanager
def _recorded(into: list):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            into.extend(caught)


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def timed_trial(run: Callable, model: nn.Module, example_inputs: tuple, train: bool,
                said: tuple[list, list] | None = None) -> tuple[float, float]:
    """(NCHW, channels-last inside) median ms of a step of `run` on the example inputs: the
    forward and, for training, the backward of its first output's mean square. One warm-up
    each, then pairs in alternating order (at least one, at most PAIRS, while under TRIAL_S).
    What each side warned goes to said[0] / said[1]."""
    sides = (run, ChannelsLastInside(run))
    times: tuple[list, list] = ([], [])
    said = said or ([], [])
    with _restored(model, example_inputs):
        for side, into in zip(sides, said):
            with _recorded(into):
                _step(side, example_inputs, train)
        start = time.perf_counter()
        while not times[0] or len(times[0]) < PAIRS and time.perf_counter() - start < TRIAL_S:
            order = (0, 1) if len(times[0]) % 2 == 0 else (1, 0)   # ABBA: drift cancels
            for i in order:
                with _recorded(said[i]):
                    t0 = time.perf_counter()
                    _step(sides[i], example_inputs, train)
                    times[i].append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def _step(fn: Callable, args: tuple, train: bool) -> None:
    with contextlib.nullcontext() if train else torch.no_grad():
        out = fn(*args)
        first = next((t for t in (out if isinstance(out, (tuple, list)) else (out,))
                      if torch.is_tensor(t)), None)
        if train and first is not None and first.requires_grad:
            first.float().pow(2).mean().backward()
    if first is not None and first.is_cuda:
        torch.cuda.synchronize(first.device)


@contextlib.contextmanager
def _restored(model: nn.Module, example_inputs: tuple):
    """The model's buffers (BN running stats) and parameter gradients, and the RNG, as before
    the block: a trial must leave no trace in what the cell then checks and times."""
    saved = {n: b.detach().clone() for n, b in model.named_buffers()}
    grads = {p: p.grad for p in model.parameters()}
    devices = [x.device for x in example_inputs if torch.is_tensor(x) and x.is_cuda]
    try:
        with torch.random.fork_rng(devices=devices[:1]):
            yield
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(saved[n])
        for p, g in grads.items():
            p.grad = g


def trial_error(model: nn.Module, example_inputs: tuple) -> str | None:
    """None if model runs on the channels-last example inputs, else the error's first line.
    No grad; the buffers (BN running stats) and the RNG are as before afterwards."""
    try:
        with _restored(model, example_inputs), torch.no_grad():
            ChannelsLastInside(model)(*example_inputs)
        return None
    except Exception as e:   # any failure keeps the user's layout; the message says which
        return describe(e, 200)
