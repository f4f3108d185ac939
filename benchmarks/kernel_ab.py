"""A/B a change to the bundled C++ kernels inside a whole fused train step, in one process.

    python benchmarks/kernel_ab.py                         # working tree vs HEAD, efficientnet_b0 cl
    python benchmarks/kernel_ab.py --base HEAD~3 --model efficientnet_b3 --nchw --threads 1
    python benchmarks/kernel_ab.py --base-cflags "-O3 -march=native -fopenmp" --model convnext_atto

The C++ families the fuser calls (act, bn_act, dwconv, ln2d) are built twice: from the working
tree (what `fuse` loads) and from `--base` (git show of each family's cpu.cpp and the shared
headers, built under a `_base` extension name); with --base-cflags, the A side is the working
tree's sources built with those compiler flags instead of build.py's DEFAULT_CFLAGS (a
`_cflags` extension name): a flag's effect on a whole step. One fused model and one eager model (same seed)
run train steps in rounds: base, new, eager, each round in a rotated order, so that the VM's
drift (its speed moves by 10-40% within minutes here) and the heap's state hit all three alike:
whole-model A/Bs taken as separate processes minutes apart were too noisy to resolve a 10%
kernel change. Prints the medians and base/new, eager/new with the load average."""
from __future__ import annotations

import importlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from fusebench.kernels.build import cache_root, load_extension
from fusebench.measure.memory import pin_malloc

sys.path.insert(0, str(Path(__file__).parent))
from fused_profile import KERNEL_MODULES, batch_of, build, step, step_parser  # noqa: E402
from paired_rounds import ab_ratios  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
KERNELS = "fusebench/kernels"


def _git_show(rev: str, path: str) -> bytes | None:
    r = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{path}"], capture_output=True)
    return r.stdout if r.returncode == 0 else None


def _family_headers(sha: str, family: str) -> dict[str, bytes]:
    """The headers in a kernel family's own folder at commit sha (name -> contents)."""
    names = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only",
                            f"{sha}:{KERNELS}/{family}"], capture_output=True, text=True,
                           check=True).stdout.split()
    return {h: _git_show(sha, f"{KERNELS}/{family}/{h}") for h in names if h.endswith(".h")}


def base_extensions(rev: str, new: dict[str, object]) -> dict[str, object]:
    """family -> the extension built from `rev`'s sources, or the working tree's own where the
    family's cpu.cpp, its own headers and the shared ones are the same at `rev` (nothing to
    build). Sources go to a directory per commit under the build cache, so a second run
    reuses the build."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", rev], capture_output=True,
                         text=True, check=True).stdout.strip()
    root = cache_root() / "ab" / sha[:16]
    names = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", f"{sha}:{KERNELS}"],
                           capture_output=True, text=True, check=True).stdout.split()
    headers = {h: _git_show(sha, f"{KERNELS}/{h}") for h in names if h.endswith(".h")}
    same_headers = all((REPO / KERNELS / h).exists() and (REPO / KERNELS / h).read_bytes() == b
                       for h, b in headers.items())
    for h, b in headers.items():
        root.mkdir(parents=True, exist_ok=True)
        (root / h).write_bytes(b)
    out = {}
    for family in KERNEL_MODULES:
        src = _git_show(sha, f"{KERNELS}/{family}/cpu.cpp")
        if src is None:
            continue
        own = _family_headers(sha, family)      # act/'s gelu_rows.h, mlp_blocks.h
        if same_headers and src == (REPO / KERNELS / family / "cpu.cpp").read_bytes() and all(
                (REPO / KERNELS / family / h).exists()
                and (REPO / KERNELS / family / h).read_bytes() == b for h, b in own.items()):
            out[family] = new[family]
            continue
        (root / family).mkdir(parents=True, exist_ok=True)
        (root / family / "cpu.cpp").write_bytes(src)
        for h, b in own.items():
            (root / family / h).write_bytes(b)
        mod = importlib.import_module(f"fusebench.kernels.{family}.cpu")
        out[family] = load_extension(f"{mod.EXT_NAME}_base", [root / family / "cpu.cpp"])
    return out


def cflags_extensions(cflags: tuple[str, ...]) -> dict[str, object]:
    """family -> the working tree's sources built with `cflags` (their own build directory:
    the flags are in build.py's fingerprint)."""
    out = {}
    for family in KERNEL_MODULES:
        mod = importlib.import_module(f"fusebench.kernels.{family}.cpu")
        out[family] = load_extension(f"{mod.EXT_NAME}_cflags", [mod.SOURCE], cflags=cflags)
    return out


def use(exts: dict[str, object]) -> None:
    """Point each family's `extension()` at exts[family] (what the fused Functions call)."""
    for family, ext in exts.items():
        importlib.import_module(f"fusebench.kernels.{family}.cpu").extension = \
            lambda ext=ext: ext


def main(argv=None) -> int:
    ap = step_parser(__doc__)
    ap.add_argument("--base", default="HEAD", help="git revision of the A side (default HEAD)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--base-cflags", default=None,
                    help="A side: the working tree's kernels built with these flags (quoted)")
    a = ap.parse_args(argv)
    pin_malloc(a.heap)          # glibc's thresholds as a model cell fixes them (measure/heap.py)
    torch.set_num_threads(a.threads)
    new = {f: importlib.import_module(f"fusebench.kernels.{f}.cpu").extension()
           for f in KERNEL_MODULES}
    if a.base_cflags is not None:
        a.base = f"cflags '{a.base_cflags}'"
        base = cflags_extensions(tuple(a.base_cflags.split()))
    else:
        base = base_extensions(a.base, new)
    print("built from " + a.base + ": " + (", ".join(f for f in base if base[f] is not new[f])
                                           or "nothing (no kernel source differs)"))
    x, target = batch_of(a)
    fused = build(a.model, not a.nchw, True, rebuild=a.fused_recompute)
    eager = build(a.model, not a.nchw, False)
    sides = {"base": (fused, base), "new": (fused, new), "eager": (eager, new)}
    times: dict[str, list[float]] = {k: [] for k in sides}
    load0 = os.getloadavg()[0]
    names = list(sides)
    for r in range(a.warmup + a.rounds):
        for k in names[r % 3:] + names[:r % 3]:          # rotated: no side always runs first
            model, exts = sides[k]
            use(exts)
            t0 = time.perf_counter()
            step(model, x, target)
            if r >= a.warmup:
                times[k].append(time.perf_counter() - t0)
    use(new)
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    print(f"{a.model}, train, float32, {'NCHW' if a.nchw else 'channels-last'}, batch {a.batch},"
          f" {a.img} px, threads {a.threads}, {a.rounds} rounds; kernels: working tree vs "
          f"{a.base}; load {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    print("  " + ", ".join(f"{k} {v:.1f} ms" for k, v in med.items())
          + f" | base/new {med['base'] / med['new']:.3f}x, eager/new {med['eager'] / med['new']:.3f}x"
          + f", eager/base {med['eager'] / med['base']:.3f}x")
    print(ab_ratios(times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
