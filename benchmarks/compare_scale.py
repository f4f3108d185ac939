"""Scale of `compare` and `export` on one big results file (issue 14.7).

    python benchmarks/compare_scale.py                 # 100,000 records (targets below)
    python benchmarks/compare_scale.py --records 20000 --keep /tmp/big.json
    python benchmarks/compare_scale.py --keep /tmp/big.json --phases   # CPU s of each stage

Generates a fusebench/2 document of N records (N/2 cells x {eager, compile}, 40 step samples
each, like a real sweep), then runs each command in a fresh `python -m fusebench` subprocess and
reports its wall time, user and user + sys CPU time (the child's rusage from os.wait4: the
figures a busy machine moves least) and peak RSS (the child's own VmHWM). Targets for 100,000
records: compare <= 10 s and <= 1 GiB, export <= 5 s.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.factories import document, model_record  # noqa: E402

TARGETS = {"compare": (10.0, 1024.0), "compare-csv": (10.0, 1024.0), "export": (5.0, 1024.0)}
COMMANDS = {
    "compare": ["compare", "{file}"],                       # the rich table, to a pipe
    "compare-csv": ["compare", "{file}", "--format", "csv"],
    "export": ["export", "{file}", "--format", "csv", "-o", "{out}"],
}


def generate(path: Path, n_records: int, n_samples: int = 40, seed: int = 0) -> Path:
    """N records: cells differ by model name and batch size; compile ~20% faster than eager."""
    rng = np.random.default_rng(seed)
    doc = document([])
    template = model_record("convnext_tiny", "eager").to_dict()
    base = rng.uniform(5.0, 200.0, size=n_records // 2 + 1)
    noise = rng.lognormal(0.0, 0.03, size=(n_records, n_samples))
    records = []
    for i in range(n_records):
        cell, compiled = divmod(i, 2)
        r = copy.deepcopy(template)
        r["spec"]["mode"] = "compile" if compiled else "eager"
        r["spec"]["model"]["name"] = f"model_{cell // 8:05d}"
        r["spec"]["model"]["batch_size"] = 2 ** (cell % 8)
        xs = (base[cell] * (0.8 if compiled else 1.0) * noise[i]).round(4)
        q10, q25, q50, q75, q90 = np.quantile(xs, [0.1, 0.25, 0.5, 0.75, 0.9])
        r["step_ms"] = {"median": float(q50), "iqr": float(q75 - q25), "p10": float(q10),
                        "p90": float(q90), "n": n_samples, "samples": xs.tolist()}
        r["throughput"] = r["spec"]["model"]["batch_size"] * 1000.0 / float(q50)
        records.append(r)
    doc["records"] = records
    path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    return path


# Runs `fusebench ARGV` in this child and writes its peak RSS (VmHWM, KiB) to PATH at exit.
# Not the child's ru_maxrss: that starts at the parent's peak (it is inherited across fork and
# exec), and the parent has just held the generated document.
_CHILD = """
import atexit, runpy, sys
out, sys.argv = sys.argv[1], ["fusebench", *sys.argv[2:]]
def hwm():
    with open("/proc/self/status") as f:
        kib = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(out, "w") as f:
        f.write(kib)
atexit.register(hwm)
runpy.run_module("fusebench", run_name="__main__", alter_sys=True)
"""


def measure(argv: list[str]) -> dict[str, float | int | str]:
    """Wall s, user s and user + sys s (the child's rusage), peak RSS MiB (its VmHWM), exit
    code and stderr tail of `fusebench argv` in a fresh process. User CPU time is what the
    wall time would be on an idle machine; it moves least with the load of a shared one."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as hwm:
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, hwm.name, *argv], stdout=out,
                                stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        err.seek(0)
        tail = err.read().decode(errors="replace")[-300:]
        peak = int(hwm.read() or 0) / 1024.0
    return {"wall": wall, "user": usage.ru_utime, "cpu": usage.ru_utime + usage.ru_stime,
            "peak": peak, "rc": os.waitstatus_to_exitcode(status), "tail": tail}


def phases(path: Path) -> None:
    """CPU seconds of each stage of compare and export, in this process, as the CLI runs them
    (the cyclic GC paused): where the time goes."""
    import io
    from rich.console import Console
    from fusebench.render.compare_table import render_csv, render_table
    from fusebench.render.export import csv_of_files
    from fusebench.results import compare, items, schema
    from fusebench.results.bulk import paused_gc
    from fusebench.results.columns import file_columns
    from fusebench.results.document import load_exact

    t = time.process_time
    m = compare.get_metric("throughput")
    with paused_gc():
        raw = path.read_bytes()
        t0 = t()
        doc = schema.parse_exact(raw)
        t1 = t()
        its = items.from_dicts(doc.pop("records"), m)
        t2 = t()
        cmp = compare.compare_items(its, m)
        t3 = t()
        render_csv(cmp)
        t4 = t()
        render_table(cmp, Console(file=io.StringIO(), width=200))
        t5 = t()
        del doc, its, cmp, raw
        t6 = t()
        load_exact(path)
        t7 = t()
        file_columns(path)
        t8 = t()
        csv_of_files([path])
        t9 = t()
    print(f"compare: parse + check {t1 - t0:.2f}, items {t2 - t1:.2f}, comparison {t3 - t2:.2f}, "
          f"csv {t4 - t3:.2f}, table (500 rows) {t5 - t4:.2f}")
    print(f"export: parse + check {t7 - t6:.2f}, columns {t8 - t7 - (t7 - t6):.2f}, whole csv "
          f"{t9 - t8:.2f} (text alone {t9 - t8 - (t8 - t7):.2f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--keep", type=Path, help="write the generated file here and keep it")
    ap.add_argument("--only", choices=list(COMMANDS), action="append")
    ap.add_argument("--phases", action="store_true",
                    help="also time each stage in this process (CPU s)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = a.keep or Path(d) / "big.json"
        t0 = time.perf_counter()
        if not path.exists():
            generate(path, a.records)
        print(f"{a.records} records, {path.stat().st_size / 2**20:.0f} MiB "
              f"(generated in {time.perf_counter() - t0:.1f} s); load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
        print(f"{'command':<12} {'wall s':>7} {'user s':>7} {'cpu s':>6} {'peak MiB':>9}  "
              f"target (judged on cpu s)")
        ok = True
        for name in a.only or COMMANDS:
            argv = [x.format(file=path, out=Path(d) / "out.csv") for x in COMMANDS[name]]
            m = measure(argv)
            t_max, m_max = TARGETS[name]
            limit = t_max * max(a.records / 100_000, 0.1)
            # judged on CPU time: wall time on a shared machine measures the neighbours
            passed = m["rc"] == 0 and m["cpu"] <= limit and m["peak"] <= m_max
            ok &= passed
            print(f"{name:<12} {m['wall']:7.1f} {m['user']:7.1f} {m['cpu']:6.1f} "
                  f"{m['peak']:9.0f}  <= {limit:.1f} s, <= {m_max:.0f} MiB: "
                  f"{'PASS' if passed else 'FAIL'}"
                  + (f" (exit {m['rc']}: {m['tail'].strip()})" if m["rc"] else ""))
        if a.phases:
            phases(path)
        print(f"load average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
