"""Where a train step's time goes: eager vs fused, per-op self CPU time under torch.profiler.

    python benchmarks/fused_profile.py             # efficientnet_b0, channels-last, b8, 160 px
    python benchmarks/fused_profile.py --model convnext_atto --nchw --top 20 --threads 1
    python benchmarks/fused_profile.py --by-kernel    # split the fused Functions by C++ call

One process builds the model twice from the same seed (eager, and rewritten by `fuse(model,
"train")`), warms both up, then profiles `--steps` train steps of each (zero_grad, forward,
cross-entropy, backward), alternating eager and fused step by step so load that comes and goes
hits both alike. Prints the top ops by self CPU time of each mode side by side: ms per step and
share of the step's total self time (the shares are what to read on a busy machine), then the
profiled step totals and the 1-minute load average. With --by-kernel every call into a bundled
C++ extension runs under a record_function named after it (`bn_act.backward`, `bn_act.apply`,
`dwconv.backward_weight`...), so the fused Functions' self time is split by kernel: what is
left under `MultiOpFunction*` is then their Python glue and the aten ops they call."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

from fusebench.fuse import fuse, recompute
from fusebench.measure.heap import DEFAULT_HEAP, HEAP_POLICIES
from fusebench.measure.memory import pin_malloc
from fusebench.models.source import resolve_model

sys.path.insert(0, str(Path(__file__).parent))
# the names fused_mode.py measures (convnext_official: the test asset at convnext_atto's size)
from fused_mode import MODELS  # noqa: E402


class Saved(nn.Module):
    """A fused model run as `--mode fused` runs it by default: BN+act outputs saved for
    backward, not rebuilt (recompute.Saving; `--fused-recompute` measures the rebuilds)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self._run = recompute.Saving(model)     # the mode's own wrapper, not a copy of it

    def forward(self, *args, **kwargs):
        return self._run(*args, **kwargs)


def build(name: str, channels_last: bool, fused: bool, only=None,
          rebuild: bool = False) -> nn.Module:
    """The model, eager or fused; fused runs as the mode's default unless `rebuild`."""
    ref, kwargs = MODELS.get(name, (name, {}))     # else any zoo name or file.py:factory
    torch.manual_seed(0)
    model = resolve_model(ref).build(**kwargs).train()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    if not fused:
        return model
    model = fuse(model, "train", "cpu", only=only).model
    return model if rebuild else Saved(model)


KERNEL_MODULES = ("act", "bn_act", "dwconv", "ln2d")   # the C++ families the fuser calls


class _Labelled:
    """A C++ extension whose every call runs inside record_function("<family>.<fn>"): the
    profile then splits the fused Functions' self time by kernel entry point."""

    def __init__(self, family: str, ext):
        self._family, self._ext = family, ext

    def __getattr__(self, fn: str):
        impl, label = getattr(self._ext, fn), f"{self._family}.{fn}"

        def call(*args, **kwargs):
            with torch.profiler.record_function(label):
                return impl(*args, **kwargs)
        return call


def label_kernels() -> None:
    """--by-kernel: route each bundled C++ family's `extension()` through _Labelled."""
    for family in KERNEL_MODULES:
        mod = importlib.import_module(f"fusebench.kernels.{family}.cpu")
        if not mod.available("cpu")[0]:
            continue                     # the fuser falls back without it: nothing to label
        labelled = _Labelled(family, mod.extension())
        mod.extension = lambda labelled=labelled: labelled


def step(model: nn.Module, x: torch.Tensor, target: torch.Tensor, call=None) -> None:
    """One train step of model; `call` (e.g. fused mode's ChannelsLastInside) runs it if given."""
    model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy((call or model)(x), target).backward()


def self_times(prof) -> dict[str, float]:
    """op name -> total self CPU time in ms over the profiled steps."""
    return {e.key: e.self_cpu_time_total / 1e3 for e in prof.key_averages()}


def batch_of(args) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, target) for --batch / --img / --nchw (the same seeds in every benchmark)."""
    mf = torch.contiguous_format if args.nchw else torch.channels_last
    x = torch.randn(args.batch, 3, args.img, args.img).contiguous(memory_format=mf)
    target = torch.randint(0, 1000, (args.batch,), generator=torch.Generator().manual_seed(0))
    return x, target


def warm_pair(args, x, target) -> dict[str, nn.Module]:
    """{"eager", "fused"} built from one seed, each warmed by --warmup steps, alternating."""
    models = {"eager": build(args.model, not args.nchw, False),
              "fused": build(args.model, not args.nchw, True, rebuild=args.fused_recompute)}
    for _ in range(args.warmup):
        for m in models.values():
            step(m, x, target)
    return models


def profile_both(args) -> dict[str, dict[str, float]]:
    x, target = batch_of(args)
    models = warm_pair(args, x, target)
    acc: dict[str, dict[str, float]] = {name: {} for name in models}
    for _ in range(args.steps):
        for name, m in models.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:   # one per step and mode
                step(m, x, target)
            for k, v in self_times(prof).items():
                acc[name][k] = acc[name].get(k, 0.0) + v / args.steps
    return acc


def print_table(times: dict[str, dict[str, float]], top: int) -> None:
    totals = {m: sum(t.values()) for m, t in times.items()}
    rows = {m: sorted(t.items(), key=lambda kv: -kv[1])[:top] for m, t in times.items()}
    w = max(len(k) for r in rows.values() for k, _ in r)
    print(f"{'#':>2}  {'eager op':{w}} {'ms':>7} {'share':>6}   {'fused op':{w}} {'ms':>7} "
          f"{'share':>6}")
    for i in range(top):
        cells = []
        for m in ("eager", "fused"):
            k, v = rows[m][i] if i < len(rows[m]) else ("", 0.0)
            cells.append(f"{k:{w}} {v:7.1f} {100 * v / totals[m]:5.1f}%" if k else " " * (w + 15))
        print(f"{i + 1:>2}  {cells[0]}   {cells[1]}")
    print(f"    {'total self CPU / step':{w}} {totals['eager']:7.1f} {'':6}   "
          f"{'':{w}} {totals['fused']:7.1f}")


def step_parser(doc: str) -> argparse.ArgumentParser:
    """The options every one-process train-step benchmark here takes (fused_bound, kernel_ab)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--model", default="efficientnet_b0",
                    help="a fused_mode.py name (convnext_official...), a zoo name or file.py:fn")
    ap.add_argument("--nchw", action="store_true", help="NCHW input (default channels-last)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--img", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--fused-recompute", action="store_true",
                    help="fused: rebuild BN+act outputs in backward (the mode's "
                         "--fused-recompute; default: saved, as the mode runs)")
    ap.add_argument("--heap", choices=list(HEAP_POLICIES), default=None,
                    help=f"glibc malloc policy (fusebench run --heap; default {DEFAULT_HEAP})")
    return ap


def main(argv=None) -> int:
    ap = step_parser(__doc__)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--by-kernel", action="store_true",
                    help="label each C++ kernel call (bn_act.backward, dwconv.backward_weight...)")
    args = ap.parse_args(argv)
    if args.by_kernel:
        label_kernels()
    pin_malloc(args.heap)       # glibc's thresholds as a model cell fixes them (measure/heap.py)
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()[0]
    times = profile_both(args)
    print(f"{args.model}, train, float32, {'NCHW' if args.nchw else 'channels-last'}, batch "
          f"{args.batch}, {args.img} px, threads {args.threads}, mean of {args.steps} profiled "
          f"steps per mode (interleaved); load {load0:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end")
    print_table(times, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
