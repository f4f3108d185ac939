"""Fused mode vs eager vs torch.compile, train step, float32: issue 15's targets from one run.

    python benchmarks/fused_mode.py                   # the full grid (see below), ~25 min quiet
    python benchmarks/fused_mode.py --quick           # smoke: tiny, eager+fused, 1 thread
    python benchmarks/fused_mode.py --models efficientnet_b3 --layouts cl --threads 2
    python benchmarks/fused_mode.py --json out.json   # also keep the raw records

Grid: models (efficientnet_b0, efficientnet_b3, convnext_atto, and convnext_official: the
official-ConvNeXt-like test asset tests/assets/convnext_official.py loaded as a user model at
convnext_atto's depths and widths; `--models efficientnet_timm,efficientnet_hf` adds
tests/assets/timm_efficientnet.py and hf_efficientnet.py, timm's and HF transformers' layouts at
B0's widths; `--models convnext_v2` adds tests/assets/convnext_v2.py, ConvNeXt V2's layout
(GRN in the MLP) at V2-Atto's depths and widths; `--models efficientnet_v2_s` adds
tests/assets/tv_efficientnet.py's EfficientNetV2 layout (FusedMBConv stages) at V2-S's stages;
`--models mobilenet_v2,mobilenet_v3` adds tests/assets/tv_mobilenet.py, torchvision's layouts at
V2 1.0's and V3-Small's widths) x layouts (NCHW, channels-last) x threads (1, 2) x modes
(eager, fused, compile). Each cell runs in worker processes through fusebench's runner (the
same measurement as `fusebench run`, correctness check included); the modes of one (model,
layout, threads) are the cells of one run, so their --repeat processes are interleaved.

Default size, batch 8 at 160 px, warm-up 2, 6 timed steps: the issue's "b8, 160-224 px" at
its cheap end, so that the eager/fused cells take ~10-20 s each on the 2-vCPU VM. What costs
is torch.compile's cold compile (150-300 s per model and layout for EfficientNet on this VM),
so compile runs only where a target needs it (--compile-models, the EfficientNets) and only at
--compile-threads (default 2). The compile cache is shared between the thread counts of one
(model, layout): a second thread count compiles warm, and its compile seconds say "warm".

OpenMP with all cores busy degrades badly when anything else runs, so before each group the
script waits (up to QUIET_WAIT_S) for the 1-minute load average, which the previous group
raised to ~threads, to fall below LOAD_WARN; every cell prints the load its group started at,
and one that started above it is marked LOADED (its timing is suspect). Targets (issue 15.2):
EfficientNet fused >= 1.3x eager, >= 1.0x compile's steady state, activation bytes <= 0.70x
eager, correctness ok; ConvNeXt (ours and the official layout) fused >= 1.3x eager in both
layouts. One line per target and (model, layout, threads): PASS or FAIL where the ratio's 95%
interval (worker processes and their steps resampled, as `fusebench compare` does) is wholly on
one side of the target, UNSURE where it holds the target, with the processes per cell that
would resolve it; n/a where a cell did not run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fusebench.measure.heap import DEFAULT_HEAP, HEAP_POLICIES
from fusebench.results import stats
from fusebench.run.runner import RunOptions, run_cells
from fusebench.spec import CellSpec

REPO = Path(__file__).resolve().parent.parent
OFFICIAL = f"{REPO / 'tests' / 'assets' / 'convnext_official.py'}:make"
TIMM = f"{REPO / 'tests' / 'assets' / 'timm_efficientnet.py'}:make"
HF = f"{REPO / 'tests' / 'assets' / 'hf_efficientnet.py'}:make"
MOBILENET = f"{REPO / 'tests' / 'assets' / 'tv_mobilenet.py'}"
RESNET = f"{REPO / 'tests' / 'assets' / 'tv_resnet.py'}:make"
V2 = f"{REPO / 'tests' / 'assets' / 'convnext_v2.py'}:make_trained"     # GRN's gamma / beta live
TV_V2 = f"{REPO / 'tests' / 'assets' / 'tv_efficientnet.py'}:make_v2"
# name -> (model reference, factory kwargs); convnext_official at convnext_atto's size,
# efficientnet_timm and efficientnet_hf (timm's and HF transformers' layouts) at B0's,
# resnet18 / resnet50 torchvision's layout (tests/assets/tv_resnet.py)
MODELS = {
    "efficientnet_b0": ("efficientnet_b0", {}),
    "efficientnet_b3": ("efficientnet_b3", {}),
    "convnext_atto": ("convnext_atto", {}),
    "convnext_official": (OFFICIAL, {"depths": [2, 2, 6, 2], "dims": [40, 80, 160, 320],
                                     "num_classes": 1000}),
    "convnext_v2": (V2, {"depths": [2, 2, 6, 2], "dims": [40, 80, 160, 320],
                         "num_classes": 1000}),
    "efficientnet_v2_s": (TV_V2, {"size": "s"}),
    "efficientnet_timm": (TIMM, {"size": "b0"}),
    "efficientnet_hf": (HF, {"size": "b0"}),
    "mobilenet_v2": (f"{MOBILENET}:make_v2", {"size": "full"}),
    "mobilenet_v3": (f"{MOBILENET}:make_v3", {"size": "full"}),
    "resnet18": (RESNET, {"depth": 18}),
    "resnet50": (RESNET, {"depth": 50}),
}
GRID = ("efficientnet_b0", "efficientnet_b3", "convnext_atto", "convnext_official")  # default
# the assets' tiny defaults
QUICK_KWARGS = {"convnext_official": {}, "convnext_v2": {}, "efficientnet_v2_s": {},
                "efficientnet_timm": {}, "efficientnet_hf": {}, "mobilenet_v2": {},
                "mobilenet_v3": {}, "resnet18": {}, "resnet50": {}}
LAYOUTS = {"nchw": False, "cl": True}
MODES = ("eager", "fused", "compile")
LOAD_WARN = 1.5          # 1-minute load average above which a cell's timing is suspect
QUIET_WAIT_S = 120.0     # the previous cell's own load decays below LOAD_WARN in ~20-40 s


@dataclass(frozen=True)
class Target:
    """One issue target: `value(cells)` is a ratio or None (not measured); pass if it meets
    `bound` in direction `op` (">=" or "<=")."""
    name: str
    families: tuple[str, ...]
    what: str            # "speed_eager" | "speed_compile" | "act" | "correct"
    op: str
    bound: float


TARGETS = (
    Target("fused/eager speed", ("efficientnet",), "speed_eager", ">=", 1.3),
    Target("fused/compile speed", ("efficientnet",), "speed_compile", ">=", 1.0),
    Target("act bytes fused/eager", ("efficientnet",), "act", "<=", 0.70),
    Target("fused/eager speed", ("convnext",), "speed_eager", ">=", 1.3),
    Target("correctness", ("efficientnet", "convnext"), "correct", ">=", 1.0),
)

def main(argv=None) -> int:
    args = parse(argv)
    print(f"train, float32, batch {args.batch}, {args.img} px, warm-up {args.warmup}, "
          f"steps {args.steps}; threads {_join(args.threads)}; compile for "
          f"{_join(args.compile_models)} at threads {_join(args.compile_threads)}; "
          f"load now {os.getloadavg()[0]:.2f}", flush=True)
    t0 = time.monotonic()
    grid, records = {}, []
    with tempfile.TemporaryDirectory(prefix="fused_mode_") as tmp:
        for model in args.models:
            for layout in args.layouts:
                cache = Path(tmp) / f"{model}-{layout}"
                for threads in args.threads:
                    for mode, rec, load in run_group(args, model, layout, threads, cache):
                        grid[(model, layout, threads, mode)] = rec
                        records.append({**rec.to_dict(), "load_before": load})
    print(f"\nwall time {(time.monotonic() - t0) / 60:.1f} min")
    print_table(grid, args)
    failed = print_targets(grid, args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(records, indent=1))
    return 1 if failed and args.strict else 0


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(GRID))
    ap.add_argument("--layouts", default="nchw,cl", help="nchw and/or cl (channels-last)")
    ap.add_argument("--threads", default="1,2", help="torch.set_num_threads per worker")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--compile-models", default="efficientnet_b0,efficientnet_b3")
    ap.add_argument("--compile-threads", default="2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--img", type=int, default=160)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    # one process per cell is not enough: eager efficientnet_b0 NCHW measured 533 and 693 ms in
    # two processes minutes apart on a quiet machine (docs/fused.md); the per-process medians
    # are averaged, as `fusebench run` does
    ap.add_argument("--heap", choices=list(HEAP_POLICIES), default=None,
                    help=f"glibc malloc policy (fusebench run --heap; default {DEFAULT_HEAP})")
    ap.add_argument("--repeat", type=int, default=3, help="worker processes per cell")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: batch 2, 64 px, 1+2 steps, eager+fused, 1 thread, no wait")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when a target is not shown to pass (FAIL or UNSURE)")
    ap.add_argument("--json", dest="json_out", help="also write the raw records here")
    args = ap.parse_args(argv)
    if args.quick:
        args.batch, args.img, args.warmup, args.steps = 2, 64, 1, 2
        args.modes, args.threads = "eager,fused", "1"
    args.models = _names(ap, args.models, MODELS, "--models")
    args.layouts = _names(ap, args.layouts, LAYOUTS, "--layouts")
    args.modes = _names(ap, args.modes, MODES, "--modes")
    args.compile_models = _names(ap, args.compile_models, MODELS, "--compile-models")
    args.threads = _ints(ap, args.threads, "--threads")
    args.compile_threads = _ints(ap, args.compile_threads, "--compile-threads")
    return args


def _names(ap, text: str, known, flag: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    bad = [n for n in names if n not in known]
    if bad or not names:
        ap.error(f"{flag}: unknown {', '.join(bad) or '(empty)'}; choose from {', '.join(known)}")
    return names


def _ints(ap, text: str, flag: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v]
    except ValueError:
        vals = []
    if not vals or min(vals) < 1:
        ap.error(f"{flag}: expected positive integers separated by commas, got {text!r}")
    return vals


def modes_for(args, model: str, threads: int) -> list[str]:
    return [m for m in args.modes if m != "compile"
            or (model in args.compile_models and threads in args.compile_threads)]


def run_group(args, model, layout, threads, cache: Path) -> list[tuple[str, object, float]]:
    """Every mode of one (model, layout, threads) as the cells of one run: their --repeat
    processes interleaved (eager 1, fused 1, compile 1, fused 2, ...; run/schedule.py), so the
    machine's drift over minutes (docs/measurement.md) hits every mode alike and the ratios
    are of the same span of time."""
    load = os.getloadavg()[0] if args.quick else wait_quiet()
    ref, kwargs = MODELS[model]
    if args.quick:
        kwargs = QUICK_KWARGS.get(model, kwargs)
    # warm: an earlier compile cell filled the cache (every group creates the folder)
    warm = cache.exists() and any(cache.iterdir())
    cache.mkdir(parents=True, exist_ok=True)
    modes = modes_for(args, model, threads)
    specs = [CellSpec.for_model(ref, mode, batch_size=args.batch, img_size=args.img,
                                model_kwargs=kwargs, channels_last=LAYOUTS[layout],
                                warmup=args.warmup, steps=args.steps, threads=threads,
                                timeout=1800.0, cache_dir=str(cache), heap=args.heap)
             for mode in modes]
    recs = run_cells(specs, opts=RunOptions(retry_oom=False, repeat=args.repeat),
                     show_progress=False)
    out = []
    for rec in sorted(recs, key=lambda r: modes.index(r.spec.mode)):
        w = warm and rec.spec.mode == "compile"
        rec = rec.replace(extra={**rec.extra, "warm_compile": True}) if w else rec
        _print_cell(model, layout, threads, rec, load, w)
        out.append((rec.spec.mode, rec, load))
    return out


def _print_cell(model, layout, threads, rec, load: float, warm: bool) -> None:
    st, mode = rec.step_ms, rec.spec.mode
    comp = (f"{rec.compile_s:6.1f} s{' warm' if warm else ''}" if mode == "compile"
            and rec.compile_s else "")
    # minor page faults per timed step: glibc's heap history makes them differ 5x between
    # processes of one cell, and the step time with them (docs/fused.md, fourteenth session)
    faults = (rec.extra or {}).get("rusage", {}).get("minflt")
    print(f"{model:17} {layout:4} T{threads} {mode:8} {rec.status:8} "
          f"{st.median if st else float('nan'):9.1f} ms (IQR {st.iqr if st else 0:6.1f})  "
          f"act {(rec.activation_bytes or 0) / 1e6:8.1f} MB  "
          f"faults/step {'-' if faults is None else f'{faults:6.0f}'}  {_correct(rec):7} "
          f"load {load:5.2f}{'  LOADED' if load > LOAD_WARN else ''}  {comp}"
          + (f"  {rec.error.message[:80]}" if rec.error else ""), flush=True)


def wait_quiet() -> float:
    """Sleep until the 1-minute load average is below LOAD_WARN (or QUIET_WAIT_S passed)."""
    end = time.monotonic() + QUIET_WAIT_S
    while os.getloadavg()[0] > LOAD_WARN and time.monotonic() < end:
        time.sleep(5.0)
    return os.getloadavg()[0]


def _ok(r) -> bool:
    return r is not None and r.status == "ok" and r.step_ms is not None


def _correct(r) -> str:
    if r is None or r.correctness is None:
        return "-"
    return "ok" if r.correctness.passed else "WRONG"


def ratio(grid, key, what: str) -> stats.Ratio | None:
    """fused vs the other mode for one (model, layout, threads): speed = other ms / fused ms
    (> 1: fused faster) with a 95% interval, act = fused bytes / eager bytes, correct = 1.0 /
    0.0 (these two are exact: no interval). Speed is what `fusebench compare` reports: the
    mean of the worker processes' medians on each side, processes and their steps resampled
    (stats.speedup_ci_processes), because whole processes drift apart on this VM while the
    steps inside one agree (docs/measurement.md)."""
    other, f = _pair(grid, key, what)
    if what == "correct":
        return None if f is None or f.correctness is None else stats.Ratio(
            float(f.correctness.passed))
    if not _ok(f) or not _ok(other):
        return None
    if what == "act":
        if not f.activation_bytes or not other.activation_bytes:
            return None
        return stats.Ratio(f.activation_bytes / other.activation_bytes)
    return stats.speedup_ci_processes(other.step_ms.process_groups(), f.step_ms.process_groups())


def _pair(grid, key, what: str):
    """(the record fused is held against for `what`, the fused record); None where missing."""
    other = "compile" if what == "speed_compile" else "eager"
    return grid.get((*key, other)), grid.get((*key, "fused"))


def verdict(target: Target, r: stats.Ratio | None) -> str:
    """PASS / FAIL where the whole interval is on one side of the bound (an exact value has no
    interval), UNSURE where the interval holds it: the processes cannot tell yet."""
    if r is None:
        return "n/a"
    meets = (lambda v: v >= target.bound) if target.op == ">=" else (lambda v: v <= target.bound)
    ends = (r.low, r.high) if r.has_ci else (r.gain,)
    if all(meets(v) for v in ends):
        return "PASS"
    return "FAIL" if not any(meets(v) for v in ends) else "UNSURE"


def to_resolve(grid, key, target: Target, r: stats.Ratio) -> int | None:
    """Worker processes per cell that would resolve the distance between r and the bound, from
    the spread these processes showed (None: one process a side, nothing to go on)."""
    other, f = _pair(grid, key, target.what)
    gap = abs(r.gain / target.bound - 1.0)
    return stats.processes_to_resolve(other.step_ms.process_groups(),
                                      f.step_ms.process_groups(), max(gap, 0.01))


def _keys(grid):
    return sorted({k[:3] for k in grid}, key=lambda k: (list(MODELS).index(k[0]), k[1], k[2]))


def print_table(grid, args) -> None:
    print(f"\n{'model':17} {'lay':4} {'T':>2} {'eager ms':>9} {'fused ms':>9} {'compile ms':>10} "
          f"{'fused/eager [95% CI]':>21} {'fused/compile [95% CI]':>23} {'act f/e':>8} "
          f"{'compile s':>10}")
    for key in _keys(grid):
        e, f, c = (grid.get((*key, m)) for m in MODES)
        cs = f"{c.compile_s:.0f}{' warm' if c.extra.get('warm_compile') else ''}" \
            if c is not None and c.compile_s else "-"
        print(f"{key[0]:17} {key[1]:4} {key[2]:>2} {_ms(e):>9} {_ms(f):>9} {_ms(c):>10} "
              f"{_x(ratio(grid, key, 'speed_eager')):>21} "
              f"{_x(ratio(grid, key, 'speed_compile')):>23} {_x(ratio(grid, key, 'act')):>8} "
              f"{cs:>10}")
    print("ms: the mean of a cell's worker processes' medians, what the ratios divide")


def print_targets(grid, args) -> int:
    """One line per target and (model, layout, threads); returns how many did not PASS or n/a
    (FAIL, and UNSURE: not shown to pass)."""
    print("\ntargets (issue 15.2; PASS / FAIL: the 95% interval is on that side of the "
          "target, UNSURE: it holds the target):")
    failed = 0
    for key in _keys(grid):
        for t in TARGETS:
            if not key[0].startswith(t.families):
                continue
            r = ratio(grid, key, t.what)
            res = verdict(t, r)
            failed += res in ("FAIL", "UNSURE")
            shown = ("ok" if r.gain else "WRONG") if t.what == "correct" and r is not None \
                else _x(r)
            bound = "" if t.what == "correct" else f" (target {t.op} {t.bound:.2f}x)"
            more = ""
            if res == "UNSURE":
                n = to_resolve(grid, key, t, r)
                more = (f"; ~{n} processes per cell would resolve it" if n
                        else "; one process a side: run --repeat 3 or more")
            print(f"  {res:6}  {key[0]:17} {key[1]:4} T{key[2]}  {t.name:22} {shown}{bound}{more}")
    return failed


def _join(items) -> str:
    return ",".join(map(str, items))


def _ms(r) -> str:
    """The step time the ratios divide: the mean of the processes' medians (the pooled
    median of all steps is on the cell's own line)."""
    if not _ok(r):
        return "-"
    meds = r.step_ms.process_medians or (r.step_ms.median,)
    return f"{sum(meds) / len(meds):.1f}"


def _x(r: stats.Ratio | None) -> str:
    if r is None:
        return "-"
    if not r.has_ci or r.low == r.high:
        return f"{r.gain:.2f}x"
    return f"{r.gain:.2f}x [{r.low:.2f}, {r.high:.2f}]"


if __name__ == "__main__":
    sys.exit(main())
