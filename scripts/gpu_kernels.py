"""Every kernel family's impls in one process: forward and gradients against the family's
float64 reference, step time and saved bytes, per dtype and layout. For a lent GPU machine,
where a worker process per cell (`fusebench kernel`) would spend the lease on imports:

    python scripts/gpu_kernels.py OUT_DIR [--device cuda] [--dtypes float32,bfloat16]
                                  [--families all] [--shape N,C,H,W] [--steps 10]

Writes OUT_DIR/kernels.json, a results document scripts/gpu_summary.py reads, and prints one
line per cell. Each cell is the kernel command's own cell (fusebench/cell/kernel_cell.py), so
a wrong gradient is `mismatch` and an impl that cannot run here is `unavailable` with its
reason. Exit 1 when a cell is `mismatch` or `error`."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAYOUTS = {"nchw": False, "channels_last": True}


def cells(families, dtypes, device, shape, steps):
    from fusebench.kernels import PROBLEMS
    from fusebench.kernels.registry import family as family_registry
    from fusebench.run.kernel_plan import parse_shape
    from fusebench.spec import CellSpec
    for fam in families:
        dims = shape or parse_shape(PROBLEMS[fam].default_shape)
        for dtype in dtypes:
            for channels_last in LAYOUTS.values():
                for impl in family_registry(fam).names():
                    yield CellSpec.for_kernel(fam, impl, dims, "eager", direction="fwdbwd",
                                              channels_last=channels_last, dtype=dtype,
                                              device=device, warmup=3, steps=steps, seed=0,
                                              timeout=120.0)


def line(rec) -> str:
    k = rec.spec.kernel
    ms = f"{rec.step_ms.median:8.3f} ms" if rec.step_ms else " " * 11
    err = rec.extra.get("max_err")
    why = f"  {rec.error.message}" if rec.error else ""
    detail = rec.correctness.detail if rec.correctness and rec.correctness.detail else ""
    return (f"{k.family:<9} {k.impl:<9} {rec.spec.dtype:<8} "
            f"{'NHWC' if rec.spec.channels_last else 'NCHW'}  {rec.status:<11} {ms}"
            f"  err {err if err is None else f'{err:.1e}'}{why}{'  ' + detail if detail else ''}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--families", default="all")
    ap.add_argument("--shape", default=None, help="N,C,H,W for every family (default: each "
                                                  "family's own)")
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args(argv)
    from fusebench.cell.kernel_cell import run_cell
    from fusebench.kernels import PROBLEMS
    from fusebench.results.document import ResultsWriter
    from fusebench.results.env import collect_env
    fams = PROBLEMS.names() if a.families == "all" else a.families.split(",")
    unknown = sorted(set(fams) - set(PROBLEMS.names()))
    if unknown:
        print(f"error: unknown kernel families {unknown}; known: {PROBLEMS.names()}",
              file=sys.stderr)
        return 2
    from fusebench.errors import UsageError
    from fusebench.run.kernel_plan import parse_shape
    try:
        shape = parse_shape(a.shape) if a.shape else None   # a bad one: one line, before any cell
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    # saved after every cell: a crash that takes the process (a faulting kernel poisons the
    # CUDA context) keeps what finished before it
    writer = ResultsWriter(a.out / "kernels.json", collect_env(), command=sys.argv)
    records, t0 = [], time.perf_counter()
    for spec in cells(fams, a.dtypes.split(","), a.device, shape, a.steps):
        rec = run_cell(spec, phase=lambda _p: None)
        writer.append(rec)
        records.append(rec)
        print(line(rec), flush=True)
    path = writer.path
    bad = [r for r in records if r.status in ("mismatch", "error")]
    print(f"{len(records)} cells in {time.perf_counter() - t0:.0f} s, {len(bad)} mismatch or "
          f"error; results: {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
