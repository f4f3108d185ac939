"""A/B a fusion (or the 1x1 convs' GEMM routing) inside a whole fused train step, in one process.

    python benchmarks/fusion_ab.py --without se_project            # efficientnet_b0 cl, 2 threads
    python benchmarks/fusion_ab.py --aten-1x1 --nchw --threads 1   # 1x1 convs: aten vs GEMMs
    python benchmarks/fusion_ab.py --keep-layout --nchw            # channels-last inside or not
    python benchmarks/fusion_ab.py --gemm aten                     # the sites' GEMMs: aten's mm
    python benchmarks/fusion_ab.py --model convnext_atto --mlp layers   # MLPs not in row blocks
    python benchmarks/fusion_ab.py --model convnext_atto --dwconv-aten-fwd  # oneDNN's fwd, dx
    python benchmarks/fusion_ab.py --model convnext_atto --fold-layer-scale  # gamma always folded

Models from one seed: fused with everything ("new"), fused without the fusions named in
--without ("base"; with --aten-1x1, --gemm, --mlp, --dwconv-aten-fwd and/or --fold-layer-scale
alone base is the new model itself, run with aten's 1x1 convs, on another GEMM backend, on
another MLP schedule, with oneDNN's depthwise forward and grad input or with every layer scale
folded into fc2's weight), and eager; train steps in rounds, each round in a rotated order so
the VM's drift hits all three alike (kernel_ab.py's scheme, for the Python-level choices that
one does not cover). Prints the
medians, base/new and eager/new with the load average. Both fused sides take NCHW input as
given (fused mode's channels-last inside, fuse/layout.py, is not applied) unless --keep-layout,
which A/Bs exactly that: base keeps NCHW, new runs channels-last inside."""
from __future__ import annotations

import contextlib
import functools
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch

from fusebench.fuse import FUSIONS, ORDER, PATTERNS, conv1x1, gemm, layer_scale, mlp_blocks
from fusebench.fuse.layout import ChannelsLastInside
from fusebench.kernels.dwconv import cpu as dwconv_cpu
from fusebench.measure.memory import pin_malloc

sys.path.insert(0, str(Path(__file__).parent))
from fused_profile import batch_of, build, step, step_parser  # noqa: E402
from paired_rounds import ab_ratios  # noqa: E402


def main(argv=None) -> int:
    ap = step_parser(__doc__)
    ap.add_argument("--without", default="", help="fusions / graph patterns off on the base side")
    ap.add_argument("--aten-1x1", action="store_true", help="base side: aten's 1x1 convs")
    ap.add_argument("--gemm", choices=[c for c in gemm.CHOICES if c != "auto"],
                    help="base side: the sites' GEMMs on this backend (fuse/gemm.py; new: auto)")
    ap.add_argument("--mlp", choices=[c for c in mlp_blocks.CHOICES if c != "auto"],
                    help="base side: the MLP sites on this schedule (fuse/mlp_blocks.py; "
                         "new: auto)")
    ap.add_argument("--dwconv-aten-fwd", action="store_true",
                    help="base side: the depthwise convs' rule as on a build without reuse "
                         "blocks (5x5/7x7: oneDNN's forward and grad input, our grad weight)")
    ap.add_argument("--fold-layer-scale", action="store_true",
                    help="base side: every layer scale folded into fc2's weight (new: on the "
                         "smaller operand, layer_scale.on_rows)")
    ap.add_argument("--keep-layout", action="store_true",
                    help="with --nchw: base keeps NCHW, new runs channels-last inside")
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args(argv)
    off = {n for n in a.without.split(",") if n}
    known = {*FUSIONS.names(), *PATTERNS.names()}
    routing = a.aten_1x1 or a.gemm or a.mlp or a.dwconv_aten_fwd or a.fold_layer_scale
    if off - known or not (off or routing or a.keep_layout):
        print(f"fusion_ab: name --without from {sorted(known)} and/or --aten-1x1, --gemm, "
              "--mlp, --dwconv-aten-fwd, --fold-layer-scale or --keep-layout", file=sys.stderr)
        return 2
    if a.keep_layout and not a.nchw:
        print("fusion_ab: --keep-layout A/Bs NCHW input: add --nchw", file=sys.stderr)
        return 2
    pin_malloc(a.heap)
    torch.set_num_threads(a.threads)
    x, target = batch_of(a)
    cl = not a.nchw
    only = [n for n in (*ORDER, *PATTERNS.names()) if n not in off]
    new = build(a.model, cl, True, rebuild=a.fused_recompute)
    # only the routing differs (--aten-1x1 / --gemm / --mlp / --dwconv-aten-fwd /
    # --fold-layer-scale): one model for both sides, so the A/B carries no difference between
    # two instances' heaps
    base = build(a.model, cl, True, only=only, rebuild=a.fused_recompute) \
        if off or a.keep_layout else new
    sides = {"base": (base, functools.partial(_base_within, a), None),
             "new": (new, contextlib.nullcontext,
                     ChannelsLastInside(new) if a.keep_layout else None),
             "eager": (build(a.model, cl, False), contextlib.nullcontext, None)}
    times: dict[str, list[float]] = {k: [] for k in sides}
    names, load0 = list(sides), os.getloadavg()[0]
    for r in range(a.warmup + a.rounds):
        for k in names[r % 3:] + names[:r % 3]:
            model, within, call = sides[k]
            with within():
                t0 = time.perf_counter()
                step(model, x, target, call)
                t = time.perf_counter() - t0
            if r >= a.warmup:
                times[k].append(t)
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    what = ", ".join([*(f"without {n}" for n in sorted(off)), *(["aten 1x1"] * a.aten_1x1),
                      *([f"{a.gemm} GEMMs"] * bool(a.gemm)), *([f"MLPs: {a.mlp}"] * bool(a.mlp)),
                      *(["oneDNN's depthwise fwd + dx"] * a.dwconv_aten_fwd),
                      *(["layer scales folded"] * a.fold_layer_scale),
                      *(["NCHW kept"] * a.keep_layout)])
    print(f"{a.model} {'NCHW' if a.nchw else 'channels-last'} T{a.threads} (base: {what}): "
          + ", ".join(f"{k} {v:.1f} ms" for k, v in med.items())
          + f" | base/new {med['base'] / med['new']:.3f}x, eager/new {med['eager'] / med['new']:.3f}x"
          f" (medians of {a.rounds}); load {load0:.2f} -> {os.getloadavg()[0]:.2f}")
    print(ab_ratios(times))
    return 0


@contextlib.contextmanager
def _base_within(a):
    """The base side's routing: aten's 1x1 convs, the GEMM backend, the MLP schedule, oneDNN's
    depthwise forward and grad input and/or folded layer scales asked for."""
    with contextlib.ExitStack() as stack:
        if a.aten_1x1:
            stack.enter_context(conv1x1.aten_convs())
        if a.gemm:
            stack.enter_context(gemm.using(a.gemm))
        if a.mlp:
            stack.enter_context(mlp_blocks.using(a.mlp))
        if a.dwconv_aten_fwd:
            stack.enter_context(mock.patch.object(dwconv_cpu, "reuse_blocks", lambda: False))
        if a.fold_layer_scale:
            stack.enter_context(mock.patch.object(layer_scale, "on_rows", lambda *_: False))
        yield



if __name__ == "__main__":
    sys.exit(main())
