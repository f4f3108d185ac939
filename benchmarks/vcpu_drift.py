"""Does this machine's speed drift by itself? (issue 13.4: why worker processes of the same cell
run 30% apart on a quiet VM.)

One process, one thread, the same buffers throughout, sampled every --every seconds for
--seconds: an in-cache compute probe (a 256x256 matmul: core speed) and an out-of-cache
memory probe (copying a 64 MiB tensor: memory bandwidth), each the median of a few calls. A
process that never reallocates and never changes what it runs should time the same all along;
whatever moves here moves every benchmark on the machine, and no statistic inside one worker
process can remove it (only more processes spread over time can). Prints each probe's median,
p10/p90, the share of samples more than 1.25x its median, and the slow episodes (runs of such
samples) with their lengths; plus the load before and after.

    python benchmarks/vcpu_drift.py [--seconds 60] [--every 0.25]
Run it on a quiet machine: with another process on the second core it measures that instead.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fusebench.measure.contention import current_load  # noqa: E402
from fusebench.measure.memory import pin_malloc  # noqa: E402

SLOW = 1.25     # a sample this much above the probe's median counts as slow


def _probes():
    a, b, c = (torch.randn(256, 256) for _ in range(3))
    src, dst = torch.randn(16 << 20), torch.empty(16 << 20)       # 64 MiB each, float32

    def compute():
        torch.mm(a, b, out=c)

    def memory():
        dst.copy_(src)
    return {"compute (256x256 mm, in cache)": (compute, 20),
            "memory (64 MiB copy)": (memory, 3)}


def _sample(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _episodes(xs: list[float], med: float) -> list[int]:
    """Lengths (in samples) of the runs of consecutive slow samples."""
    runs, n = [], 0
    for x in xs:
        if x > SLOW * med:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return runs + ([n] if n else [])


def _report(name: str, xs: list[float], every: float) -> str:
    q = sorted(xs)
    med = statistics.median(xs)
    eps = _episodes(xs, med)
    slow = sum(eps)
    longest = max(eps, default=0) * every
    return (f"{name:32s} median {med:8.3f} ms  p10 {q[len(q) // 10]:8.3f}  p90 "
            f"{q[9 * len(q) // 10]:8.3f}  max {q[-1]:8.3f}  slow (>{SLOW}x) {slow / len(xs):4.0%}"
            f" in {len(eps)} episode(s), longest ~{longest:.1f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--every", type=float, default=0.25, help="seconds between samples")
    a = ap.parse_args()
    if a.seconds <= 0 or a.every <= 0:
        print("error: --seconds and --every must be positive", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    pin_malloc(None)
    probes = _probes()
    for fn, reps in probes.values():
        _sample(fn, reps)                                   # first touch, caches, dispatch
    load = current_load(1.0)
    print(f"load before: others busy {load['busy_frac']:.0%} of {load['cpu_count']} cores, "
          f"load1 {load['load1']:.2f}; {a.seconds:.0f} s, a sample every {a.every} s")
    series: dict[str, list[float]] = {k: [] for k in probes}
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        for k, (fn, reps) in probes.items():
            series[k].append(_sample(fn, reps))
        time.sleep(a.every)
    for k, xs in series.items():
        print(_report(k, xs, a.every))
    load = current_load(1.0)
    print(f"load after: others busy {load['busy_frac']:.0%}, load1 {load['load1']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
