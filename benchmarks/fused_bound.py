"""How fast could fused mode be, with its fusion boundaries as they are? A roofline bound per step.

    python benchmarks/fused_bound.py                        # efficientnet_b0, channels-last, b8 160 px
    python benchmarks/fused_bound.py --model efficientnet_b3 --nchw --threads 1
    python benchmarks/fused_bound.py --model convnext_official --json bound.json

Issue 15.2 asks for fused >= 1.3x eager, or the profile that shows why not. One process builds
the model eager and fused (same seed), warms both, then times `--steps` whole train steps of
each, alternating step by step, without a profiler (perf_counter). In the fused steps every call
into a bundled C++ kernel (bn_act, act, dwconv, ln2d) is timed on its own and its bytes counted:
the storages of its tensor arguments and outputs, each once (what the call must at least read
or write: an optimistic traffic count, since a BN's statistics pass reads x before its write
pass reads it again). Afterwards a fresh copy (the faster of a plain and a huge-page-hinted
clone, as `fusebench kernel`'s "% of copy") is timed at each call's size: the kernel family's
roofline on this machine. At sizes under the last-level cache that copy runs from the cache,
so a second roofline holds the kernels to a copy whose operands were evicted first (memory
speed): a step's backward reads the activations saved in forward from memory.

Printed per kernel family: ms per step, MB moved, GB/s, % of copy (cached) and % of a memory
copy. Then four bounds:
  - measured:  eager / fused, as timed here;
  - roofline:  eager / (fused - our kernels' time + their bytes at copy speed), i.e. every bundled
               kernel at the speed of a copy of its own bytes, everything else as it is;
  - memory roofline: the same with the copy timed from memory, what a kernel whose operands are
               not in the cache can at best reach;
  - aten only: eager / (the fused step's share of aten convolutions and GEMMs, from one profiled
               fused step), i.e. everything but the convs/GEMMs fused mode leaves to aten free;
  - free (with `--free act,ln2d`, any of the families): eager / a third step, timed in the same
               rounds, in which the fused model's calls into those families do no work at all
               and return unwritten tensors of the shapes their real calls returned. What is
               left is measured, not derived: what fused mode could reach if those kernels
               cost nothing (e.g. LN and GELU folded into the GEMMs around them for free).
If the roofline bound is below a target, no faster kernel reaches it without moving the fusion
boundary (fewer passes over memory, or replacing aten's convolutions); if the aten-only bound is
below it, nothing short of faster convolutions does. Read it on a quiet machine: the load
average at start and end is printed, and the VM's speed drifts (alternating steps is for that).
"""
from __future__ import annotations

import functools
import importlib
import json
import math
import os
import resource
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from torch.profiler import ProfilerActivity, profile

from fusebench.measure.memory import pin_malloc

sys.path.insert(0, str(Path(__file__).parent))
from fused_profile import KERNEL_MODULES, batch_of, step, step_parser, warm_pair  # noqa: E402

# self-CPU op names of the work fused mode leaves to libraries: convolutions (oneDNN and THNN)
# and GEMMs, aten's (MKL) and oneDNN's matmul, which the sites' GEMMs run on since fuse/gemm.py
ATEN_HEAVY = ("convolution", "conv2d", "conv_depthwise", "mkldnn_conv", "aten::mm", "aten::addmm",
              "aten::bmm", "aten::baddbmm", "aten::linear", "mkldnn::_linear_pointwise")


def is_heavy(op: str) -> bool:
    """A profiled op name that is a library convolution or GEMM."""
    return any(h in op for h in ATEN_HEAVY)


def _storages(obj, seen: dict[int, int]) -> None:
    """Each distinct CPU tensor in obj (a tensor, or a tuple/list of them) once, keyed by its
    data pointer: bytes of the elements it covers."""
    if isinstance(obj, torch.Tensor):
        if obj.device.type == "cpu" and obj.numel():
            p = obj.data_ptr()
            seen[p] = max(seen.get(p, 0), obj.numel() * obj.element_size())
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            _storages(o, seen)


@dataclass
class CallLog:
    """Per kernel label: seconds and minor page faults over all calls; per (label, call size: its
    largest tensor's bytes): the bytes those calls moved. Filled only while `on` (the timed
    fused steps)."""
    on: bool = False
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_size: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    faults: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    @property
    def nbytes(self) -> dict[str, int]:
        """label -> bytes over all its calls (the sizes summed)."""
        out: dict[str, int] = defaultdict(int)
        for (label, _), b in self.by_size.items():
            out[label] += b
        return out


class _Timed:
    """A C++ extension whose calls are timed and their bytes counted into a CallLog."""

    def __init__(self, family: str, ext, log: CallLog):
        self._family, self._ext, self._log = family, ext, log

    def __getattr__(self, fn: str):
        impl, label, log = getattr(self._ext, fn), f"{self._family}.{fn}", self._log

        def call(*args, **kwargs):
            if not log.on:
                return impl(*args, **kwargs)
            f0, t0 = _minflt(), time.perf_counter()
            out = impl(*args, **kwargs)
            log.seconds[label] += time.perf_counter() - t0
            log.faults[label] += _minflt() - f0
            seen: dict[int, int] = {}
            _storages((args, tuple(kwargs.values()), out), seen)
            log.by_size[(label, max(seen.values(), default=0))] += sum(seen.values())
            return out
        return call


@dataclass
class Replay:
    """Kernel families made free: while `on`, a call into one of `families` returns unwritten
    tensors shaped as the last real call with the same arguments' shapes returned (no work, no
    pass over memory; `missed` counts calls with no such record, which run for real). Off,
    calls run and record their outputs' shapes."""
    families: frozenset[str] = frozenset()
    on: bool = False
    outs: dict = field(default_factory=dict)
    missed: int = 0


class TensorSig(NamedTuple):
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


def _signature(obj):
    """A hashable key of a call's arguments (or record of its outputs): each tensor as its
    TensorSig, tuples and lists as tuples, other values as they are."""
    if isinstance(obj, torch.Tensor):
        return TensorSig(tuple(obj.shape), obj.stride(), obj.dtype)
    if isinstance(obj, (tuple, list)):
        return tuple(_signature(o) for o in obj)
    return obj


def _unwritten(sig):
    """Fresh tensors of a call's recorded output signature (other values as they were)."""
    if isinstance(sig, TensorSig):
        return torch.empty_strided(sig.shape, sig.stride, dtype=sig.dtype)
    if isinstance(sig, tuple):
        return tuple(_unwritten(s) for s in sig)
    return sig


# calls into a family's extension that are mostly aten's GEMMs (the MLP's row blocks run fc1
# and fc2 around their GELU rows): never made free, or `--free act` would free the MLPs' GEMMs
# too (forty-eighth session: convnext_atto's "bound" read 3.5x that way); their GELU rows then
# count as not free, so the bound with act free is an underestimate where row blocks run
GEMM_CALLS = frozenset({"mlp_forward", "mlp_backward"})


class _Free:
    """A C++ extension whose calls, for the families in `replay`, are replayed for nothing
    while `replay.on` (the free step); other families, and GEMM_CALLS, pass straight through."""

    def __init__(self, family: str, ext, replay: Replay):
        self._family, self._ext, self._replay = family, ext, replay

    def __getattr__(self, fn: str):
        impl, replay = getattr(self._ext, fn), self._replay
        if self._family not in replay.families or fn in GEMM_CALLS:
            return impl

        def call(*args, **kwargs):
            key = (fn, _signature(args), _signature(tuple(kwargs.items())))
            if replay.on and key in replay.outs:
                return _unwritten(replay.outs[key])
            replay.missed += replay.on
            out = impl(*args, **kwargs)
            replay.outs[key] = _signature(out)
            return out
        return call


def _minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_kernels(log: CallLog, replay: Replay | None = None) -> None:
    """Route each bundled C++ family's `extension()` through _Timed, and _Free where `replay`
    names it (for this process)."""
    for family in KERNEL_MODULES:
        mod = importlib.import_module(f"fusebench.kernels.{family}.cpu")
        if not mod.available("cpu")[0]:
            continue
        ext = _Timed(family, mod.extension(), log)
        if replay is not None and family in replay.families:
            ext = _Free(family, ext, replay)
        mod.extension = lambda ext=ext: ext


def copy_seconds_per_byte(size: int, reps: int = 5) -> float:
    """Seconds per byte (read plus write) of the fastest copy of a float32 tensor of `size`
    bytes this machine makes: a plain clone, a huge-page-hinted clone, or a copy into memory
    it already holds (no page faults). The optimistic roofline: a bound, not a target."""
    from fusebench.cell.kernel_cell import copy_gbps
    r = copy_gbps(torch.randn(max(1, size // 4)), reps, "cpu")
    return 1.0 / (max(r["copy_gbps"], r["copy_prealloc_gbps"]) * 1e9)


FLUSH_BYTES = 128 << 20    # written between copies: 4x the 32 MiB L3 of the VMs measured here


@functools.cache
def _flush_buffer() -> torch.Tensor:
    """One FLUSH_BYTES buffer for every size's memory copy (not 128 MiB allocated per size)."""
    return torch.empty(FLUSH_BYTES // 4)


def memory_copy_seconds_per_byte(size: int, reps: int = 5) -> float:
    """Seconds per byte (read plus write) of the fastest of `reps` copies of a float32 tensor of
    `size` bytes into memory it already holds, each after FLUSH_BYTES written elsewhere (both
    operands evicted): the copy at memory speed, without page faults."""
    x = torch.randn(max(1, size // 4))
    out, flush = torch.empty_like(x), _flush_buffer()
    best = math.inf
    for _ in range(reps):
        flush.fill_(1.0)
        t0 = time.perf_counter()
        out.copy_(x)
        best = min(best, time.perf_counter() - t0)
    return best / (2 * x.numel() * x.element_size())


def aten_heavy_share(model, x, target) -> float:
    """Share of one profiled step's self CPU time spent in aten convolutions and GEMMs."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(model, x, target)
    times = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    heavy = sum(v for k, v in times.items() if is_heavy(k))
    return heavy / max(1e-9, sum(times.values()))


def _free_step(replay: Replay, model, x, target) -> None:
    """The fused step with replay's families free. Denormals flush here only: an unwritten
    tensor may hold any bits, and a slow denormal must not count against the bound."""
    replay.on, flush = True, torch.set_flush_denormal(True)
    try:
        step(model, x, target)
    finally:
        replay.on = False
        if flush:
            torch.set_flush_denormal(False)


def measure(args) -> dict:
    log, replay = CallLog(), Replay(frozenset(args.free))
    time_kernels(log, replay if args.free else None)
    x, target = batch_of(args)
    models = warm_pair(args, x, target)
    # the free side runs the fused model, after a real fused step has recorded its calls
    sides = dict(models, **({"free": models["fused"]} if args.free else {}))
    wall: dict[str, list[float]] = {k: [] for k in sides}
    faults: dict[str, list[int]] = {k: [] for k in sides}
    for _ in range(args.steps):
        for name, m in sides.items():
            log.on = name == "fused"
            f0, t0 = _minflt(), time.perf_counter()
            if name == "free":
                _free_step(replay, m, x, target)
            else:
                step(m, x, target)
            wall[name].append(time.perf_counter() - t0)
            faults[name].append(_minflt() - f0)
            log.on = False
    share = aten_heavy_share(models["fused"], x, target)
    r = summarise(log, wall, share, args.steps)
    r["faults_per_step"] = {k: statistics.median(v) for k, v in faults.items()}
    if args.free:
        free = statistics.median(wall["free"])
        r.update(free_ms=1e3 * free, free=sorted(args.free), free_missed=replay.missed)
        r["bound"]["free"] = statistics.median(wall["eager"]) / free
    return r


def summarise(log: CallLog, wall: dict[str, list[float]], share: float, steps: int) -> dict:
    sizes = {s for _, s in log.by_size}
    refs = {"copy": {size: copy_seconds_per_byte(size) for size in sizes},
            "memory": {size: memory_copy_seconds_per_byte(size) for size in sizes}}
    # label -> seconds its bytes take at each reference's speed, over all steps
    roof: dict[str, dict[str, float]] = {k: defaultdict(float) for k in refs}
    for (label, size), nbytes in log.by_size.items():
        for k, spb in refs.items():
            roof[k][label] += nbytes * spb[size]
    fams, nbytes = {}, log.nbytes
    for label in sorted(log.seconds, key=lambda k: -log.seconds[k]):
        s, b = log.seconds[label] / steps, nbytes[label] / steps
        fams[label] = {"ms": 1e3 * s, "mb": b / 1e6, "gbps": b / s / 1e9,
                       "pct_of_copy": 100.0 * roof["copy"][label] / log.seconds[label],
                       "pct_of_memory_copy": 100.0 * roof["memory"][label] / log.seconds[label],
                       "faults": log.faults[label] / steps}
    eager, fused = (statistics.median(wall[k]) for k in ("eager", "fused"))
    ours = sum(log.seconds.values()) / steps
    at = {k: sum(v.values()) / steps for k, v in roof.items()}
    return {"eager_ms": 1e3 * eager, "fused_ms": 1e3 * fused, "kernels": fams,
            "kernels_ms": 1e3 * ours, "kernels_roofline_ms": 1e3 * at["copy"],
            "kernels_memory_roofline_ms": 1e3 * at["memory"],
            "aten_heavy_share": share,
            "bound": {"measured": eager / fused,
                      "roofline": eager / (fused - ours + at["copy"]),
                      "memory_roofline": eager / (fused - ours + at["memory"]),
                      "aten_only": eager / (share * fused)}}


def report(r: dict, head: str) -> None:
    print(head)
    print(f"  step ms: eager {r['eager_ms']:.1f}, fused {r['fused_ms']:.1f}; bundled kernels "
          f"{r['kernels_ms']:.1f} ms of the fused step ({r['kernels_roofline_ms']:.1f} at copy "
          f"speed, {r['kernels_memory_roofline_ms']:.1f} at memory speed); aten convs + GEMMs "
          f"{100 * r['aten_heavy_share']:.0f}% of it; minor page faults per step: eager "
          f"{r['faults_per_step']['eager']:.0f}, fused {r['faults_per_step']['fused']:.0f}")
    print(f"  {'kernel':28s} {'ms/step':>8} {'MB/step':>8} {'GB/s':>6} {'% copy':>7} "
          f"{'% mem':>6} {'faults':>7}")
    for label, k in r["kernels"].items():
        print(f"  {label:28s} {k['ms']:8.1f} {k['mb']:8.1f} {k['gbps']:6.1f} "
              f"{k['pct_of_copy']:6.0f}% {k['pct_of_memory_copy']:5.0f}% {k['faults']:7.0f}")
    b = r["bound"]
    print(f"  fused / eager: measured {b['measured']:.2f}x, roofline bound {b['roofline']:.2f}x"
          f" (our kernels at copy speed), memory roofline {b['memory_roofline']:.2f}x (at a "
          f"copy's speed from memory), aten-only bound {b['aten_only']:.2f}x (all but aten's"
          f" convs/GEMMs free)")
    if "free" in b:
        missed = f"; {r['free_missed']} calls had no record and ran" if r["free_missed"] else ""
        print(f"  with {', '.join(r['free'])} free (their calls do no work): fused "
              f"{r['free_ms']:.1f} ms, bound {b['free']:.2f}x{missed}")


def main(argv=None) -> int:
    ap = step_parser(__doc__)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--free", default="", help=f"kernel families to time a free step without "
                    f"(comma-separated: {', '.join(KERNEL_MODULES)})")
    args = ap.parse_args(argv)
    args.free = [f for f in args.free.split(",") if f]
    bad = [f for f in args.free if f not in KERNEL_MODULES]
    if bad:
        ap.error(f"--free: unknown kernel famil{'ies' if len(bad) > 1 else 'y'} "
                 f"{', '.join(bad)}; known: {', '.join(KERNEL_MODULES)}")
    pin_malloc(args.heap)       # glibc's thresholds as a model cell fixes them (measure/heap.py)
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()[0]
    r = measure(args)
    r.update(model=args.model, layout="nchw" if args.nchw else "channels_last",
             batch=args.batch, img=args.img, threads=args.threads, steps=args.steps,
             load=[load0, os.getloadavg()[0]])
    report(r, f"{args.model}, train, float32, {r['layout']}, batch {args.batch}, {args.img} px, "
              f"threads {args.threads}, medians of {args.steps} steps per mode (alternating); "
              f"load {r['load'][0]:.2f} at start, {r['load'][1]:.2f} at end")
    if args.json:
        args.json.write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
