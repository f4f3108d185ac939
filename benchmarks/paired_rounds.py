"""Two timings taken in alternating rounds, as the *_parts benchmarks take them: the per-round
ratios' median and its 95% bootstrap interval (scipy.stats.bootstrap). Pairing by round lets
the VM's drift, which moves both sides of a round alike, cancel out of each ratio."""
from __future__ import annotations

import argparse
import statistics
import time


def ratio_ci(num, den) -> str:
    """'median x [low, high]' of num[i] / den[i] over the rounds."""
    from scipy import stats
    ratios = [a / b for a, b in zip(num, den)]
    if len(ratios) < 3:                 # the bootstrap needs a spread to resample
        return f"{statistics.median(ratios):.3f}x (no interval from {len(ratios)} rounds)"
    ci = stats.bootstrap((ratios,), statistics.median, n_resamples=2000,
                         random_state=0).confidence_interval
    return f"{statistics.median(ratios):.3f}x [{ci.low:.3f}, {ci.high:.3f}]"


def ab_ratios(times: dict[str, list[float]]) -> str:
    """kernel_ab.py's and fusion_ab.py's line for their base / new / eager rounds: the per-round
    ratios (a round's three steps ran back to back, so the VM's drift cancels in each; the
    medians' ratio moved by several percent between runs of one A/B on the VM)."""
    return ("  paired per round: base/new " + ratio_ci(times["base"], times["new"])
            + ", eager/new " + ratio_ci(times["eager"], times["new"]))


def timed(fn) -> float:
    """Seconds one call of fn takes (perf_counter)."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def alternate(steps: dict, rounds: int, warmup: int = 3) -> dict:
    """{name: [seconds per round]}: after `warmup` calls of each, `rounds` rounds that call
    each step once, in the dict's order; glibc's heap fixed as a model cell fixes it
    (docs/benchmarks.md)."""
    from fusebench.measure.memory import pin_malloc
    pin_malloc(None)
    for _ in range(warmup):
        for fn in steps.values():
            fn()
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            times[name].append(timed(fn))
    return times


def saved_bytes(model, *inputs, params=None) -> int:
    """Bytes autograd saves for backward in one forward of model, its Parameters (or `params`:
    a wrapper's model's) left out."""
    from fusebench.measure.memory import SavedTensorBytes
    counter = SavedTensorBytes(exclude=list(model.parameters() if params is None else params))
    with counter.track():
        out = model(*inputs)
    del out
    return counter.bytes


def against_site(label: str, eager, inputs: tuple, step, rounds: int, site: str,
                 variants: dict[str, dict] | None = None) -> None:
    """eager, fused (fusebench.fuse) and fused without graph pattern `site` (about fused mode
    before it) on copies of `eager`, `step(model, inputs)` alternately for `rounds` rounds:
    prints each median, the eager/other ratios [95% CI] and the bytes each saves for backward.
    variants: more fused copies, name -> fuse()'s keyword arguments (e.g. `impls`), each also
    timed against fused (fused/variant's inverse: variant/fused > 1 means fused is faster)."""
    import copy
    import statistics

    from fusebench.fuse import ORDER, fuse, graph_order
    fused, before = copy.deepcopy(eager), copy.deepcopy(eager)
    sites = fuse(fused, "train").sites
    fuse(before, "train", only=[n for n in (*ORDER, *graph_order()) if n != site])
    without = f"no {site} site"
    models = {"eager": eager, "fused": fused, without: before}
    for name, kw in (variants or {}).items():
        models[name] = copy.deepcopy(eager)
        fuse(models[name], "train", **kw)
    t = alternate({k: (lambda m=m: step(m, inputs)) for k, m in models.items()}, rounds)
    mib = {k: saved_bytes(m, *inputs) / 2**20 for k, m in models.items()}
    print(f"{label} (sites {dict(sites)}):",
          ", ".join(f"{k} {statistics.median(v) * 1e3:.1f} ms" for k, v in t.items()))
    for k in (k for k in models if k != "eager"):
        print(f"  eager/{k} {ratio_ci(t['eager'], t[k])} over {rounds} rounds; saved for "
              f"backward {mib[k]:.1f} vs eager's {mib['eager']:.1f} MiB "
              f"({mib[k] / mib['eager']:.2f}x)", flush=True)
    for k in variants or {}:
        print(f"  {k}/fused {ratio_ci(t[k], t['fused'])}", flush=True)


def train_step(loss):
    """step(m, inputs) for against_site: loss(m(*inputs)) backward, then the gradients dropped
    (so that each step allocates them as a training loop's first step does)."""
    def step(m, inputs):
        loss(m(*inputs)).backward()
        for p in m.parameters():
            p.grad = None
    return step


def asset_args(doc: str, batches: dict[str, int], argv=None) -> argparse.Namespace:
    """`--threads N --rounds N --size NAME` of the benchmarks that time one test asset against
    its fused twin (hf_llama.py, conformer.py, pointnet.py): parsed, torch's thread count set,
    the load printed and the seed fixed; `batches` maps each size to its batch (args.batch)."""
    import os

    import torch
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--size", default="bench", choices=sorted(batches))
    args = ap.parse_args(argv)
    args.batch = batches[args.size]
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}; load {os.getloadavg()[0]:.2f}")
    torch.manual_seed(0)
    return args


def shape_args(doc: str, shapes: dict, rounds: int, argv=None) -> tuple[list[str], list[int], int]:
    """(shape sets, thread counts, rounds) from `--shapes a,b --threads 1,2 --rounds N`, the
    arguments of the per-shape benchmarks (patchify.py, mlp_blocks.py); a bad one exits 2."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(shapes), help=f"of {list(shapes)}")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=rounds)
    a = ap.parse_args(argv)
    names = a.shapes.split(",")
    try:
        thread_counts = [int(t) for t in a.threads.split(",")]
    except ValueError:
        thread_counts = []
    if any(n not in shapes for n in names) or a.rounds < 3 or min(thread_counts, default=0) < 1:
        ap.error(f"--shapes: of {list(shapes)}; --rounds >= 3; --threads: counts >= 1, "
                 f"e.g. 1,2")
    return names, thread_counts, a.rounds
