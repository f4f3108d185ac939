"""Does compare call noise a regression? Issue 13.4's targets, end to end on this machine:
A/A pairs (two runs of the same build) are "not significant" in >= 9 of 10, and pairs with an
injected 25% slowdown are flagged "slower" in >= 9 of 10.

Each pair round is one run of three cells (MODEL eager train, 1 thread): A, A2 (the same
build under a second name) and S (the same, with the injected slowdown: benchmarks/aa_models.py
sleeps 25% of each step's own time). Each cell is measured by --repeat worker processes
through the real launcher (fork server, one worker per process); by default their processes
are interleaved (process k of A, A2 and S, then k+1: run/schedule.py), as `fusebench run` does
for the cells of one run; --sequential runs each cell's processes back to back, which is what
two separate runs a minute apart see. Each record is saved as its own results file under one
model name, and every pair goes through `compare` (compare_files).

From the same runs it also prints what a one-process-per-side comparison (the first process
of each run, the bootstrap over steps only: fusebench before --repeat) would have said.

    python benchmarks/aa_variance.py                        # 10 + 10 pairs, --repeat 3
    python benchmarks/aa_variance.py --pairs 2 --repeat 2   # a smoke run
    python benchmarks/aa_variance.py --sequential           # each cell's processes in a row
Run it on a quiet machine: it prints the load before and after, and the contended cells.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from fusebench.measure.contention import current_load, is_contended
from fusebench.results import stats
from fusebench.results.compare import compare_files
from fusebench.results.document import new_document, save
from fusebench.results.env import collect_env
from fusebench.run.runner import RunOptions, run_cells
from fusebench.spec import CellSpec, Record

MODELS = Path(__file__).resolve().parent / "aa_models.py"
SIDES = ("A", "A2", "S")                      # aa_models.py: a, a2, slowed


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3, help="worker processes per run")
    ap.add_argument("--model", default="convnext_atto", help="zoo model to run")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--img", type=int, default=96)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--slowdown", type=float, default=0.25)
    ap.add_argument("--out", type=Path, default=None, help="folder for the results files")
    ap.add_argument("--sequential", action="store_true",
                    help="each cell's processes back to back (as two separate runs)")
    return ap.parse_args()


def _run(a, env: dict, i: int, out: Path) -> tuple[dict[str, Record], dict[str, Path]]:
    """One run of the three cells; each record saved under one model name as its own file."""
    os.environ["FUSEBENCH_AA_MODEL"] = a.model          # inherited by the workers
    os.environ["FUSEBENCH_AA_SLOWDOWN"] = str(a.slowdown)
    names = dict(zip(SIDES, ("a", "a2", "slowed")))
    order = SIDES[i % 3:] + SIDES[:i % 3]                 # rotate which cell starts the run
    specs = [CellSpec.for_model(f"{MODELS}:{names[t]}", "eager", batch_size=a.batch,
                                img_size=a.img, check=False, warmup=a.warmup, steps=a.steps,
                                threads=1) for t in order]
    opts = RunOptions(repeat=a.repeat, interleave=not a.sequential)
    recs, paths = {}, {}
    for rec in run_cells(specs, opts=opts, show_progress=False):
        tag = next(t for t in SIDES if rec.spec.model.name.endswith(f":{names[t]}"))
        if rec.status != "ok":
            raise SystemExit(f"run failed: {tag}: {rec.status}: {rec.error}")
        recs[tag] = rec.replace(spec=rec.spec.with_model(name=f"{MODELS}:model"))
        paths[tag] = out / f"run{i:02d}_{tag}.json"
        save(new_document(env, [recs[tag]], command=["benchmarks/aa_variance.py"]), paths[tag])
    return recs, paths


def _verdicts(a_path: Path, b_path: Path, a: Record, b: Record) -> tuple[str, str, float]:
    """(verdict through compare, verdict of one process per side, steps only, the smallest
    change compare could resolve)."""
    row = next(r for r in compare_files([a_path, b_path], metric="step_ms").rows
               if not r.baseline)
    one = stats.speedup_ci(a.step_ms.process_groups()[0], b.step_ms.process_groups()[0])
    return row.verdict, stats.describe(one), row.ratio.min_effect


def _load() -> str:
    load = current_load(1.0)
    return f"others busy {load['busy_frac']:.0%} of {load['cpu_count']} cores, load1 {load['load1']:.2f}"


def main() -> int:
    a = _args()
    out = a.out or Path(tempfile.mkdtemp(prefix="fusebench-aa-"))
    out.mkdir(parents=True, exist_ok=True)
    env = collect_env()
    print(f"{a.pairs} A/A + {a.pairs} slowdown pairs of {a.model} b{a.batch} {a.img}px "
          f"{a.warmup}+{a.steps} steps, 1 thread, --repeat {a.repeat} "
          f"{'sequential' if a.sequential else 'interleaved'}; injected slowdown "
          f"{a.slowdown:.0%}; files in {out}\nload before: {_load()}")
    t0 = time.perf_counter()
    aa, slow, contended = [], [], 0
    for i in range(a.pairs):
        recs, paths = _run(a, env, i, out)
        contended += sum(is_contended(r.extra.get("contention")) for r in recs.values())
        aa.append(_verdicts(paths["A"], paths["A2"], recs["A"], recs["A2"]))
        slow.append(_verdicts(paths["A"], paths["S"], recs["A"], recs["S"]))
        print(f"pair {i + 1}: A/A {aa[-1][0]:28s} (resolves {aa[-1][2]:4.0%}) | slow "
              f"{slow[-1][0]} (resolves {slow[-1][2]:.0%})", flush=True)
    n = a.pairs
    print(f"\nwall {time.perf_counter() - t0:.0f} s; load after: {_load()}; "
          f"contended runs: {contended} of {3 * n}")
    for label, i in (("--repeat (processes, then steps)", 0), ("one process per side", 1)):
        ok_aa = sum(v[i].endswith("not significant") for v in aa)
        ok_slow = sum("slower" in v[i] for v in slow)
        print(f"{label:34s} A/A not significant {ok_aa}/{n}; slowdown flagged {ok_slow}/{n}")
    ok = (sum(v[0].endswith("not significant") for v in aa) >= 0.9 * n
          and sum("slower" in v[0] for v in slow) >= 0.9 * n)
    print(f"targets (>= 9/10 each): {'MET' if ok else 'NOT MET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
