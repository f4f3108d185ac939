"""The fused step's GEMMs per backend (fuse/gemm.py), at the shapes one fused train step calls.

    python benchmarks/gemm.py                                   # efficientnet_b3 cl, 2 threads
    python benchmarks/gemm.py --model convnext_atto --threads 1

One fused train step runs with every call into fuse/gemm.py recorded (nt, nn, nt_add, wgrad,
with their operand shapes); then each distinct call is timed on every route: aten's mm and
oneDNN's matmul; for nn also oneDNN given a contiguous copy of the transposed weight (which
fuse/gemm.py does not do: it hands oneDNN the strided view); for wgrad oneDNN's 1x1-conv
weight gradient (which fuse/gemm.py does not use). Interleaved call by call, medians of
--reps. Prints ms per call and, weighted by how often the step made the call, the step's
total per route and pass, with the load average."""
from __future__ import annotations

import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from fusebench.fuse import gemm
from fusebench.measure.memory import pin_malloc

sys.path.insert(0, str(Path(__file__).parent))
from fused_profile import batch_of, build, step, step_parser  # noqa: E402


def _lp(a, w, b=None):
    return torch.ops.mkldnn._linear_pointwise(a, w, b, "none", [], "")


# pass -> route -> fn(*operands), the operands as the step passed them (bias None or not)
_ATEN, _ONEDNN = gemm.GEMMS["aten"], gemm.GEMMS["onednn"]
ROUTES = {
    "nt": {"aten": _ATEN.nt, "onednn": _ONEDNN.nt},
    "nt_add": {"aten": _ATEN.nt_add, "onednn": _ONEDNN.nt_add},
    "nn": {"aten": _ATEN.nn, "onednn": _ONEDNN.nn,
           "onednn copy": lambda a, w: _lp(a, w.t().contiguous())},
    "wgrad": {"aten": gemm.wgrad, "onednn conv": lambda dy, x: _conv_wgrad(dy, x)},
}


def _as_image(t, image: bool):
    """(N, H, W, C) -> its NCHW channels-last view; else (..., C) rows -> (1, C, 1, rows)."""
    if image:
        return t.permute(0, 3, 1, 2)
    return t.reshape(-1, t.shape[-1]).t()[None, :, None, :]


def _conv_wgrad(dy, x):
    """dy^T x as a 1x1 conv's weight gradient (oneDNN's, through aten); the image view where
    both are (N, H, W, C) alike, the rows view otherwise (an MLP's flattened dy)."""
    image = dy.dim() == x.dim() == 4 and dy.shape[:3] == x.shape[:3]
    return torch.ops.aten.convolution_backward(
        _as_image(dy, image), _as_image(x, image), torch.empty(dy.shape[-1], x.shape[-1], 1, 1), None,
        (1, 1), (0, 0), (1, 1), False, (0, 0), 1, (False, True, False))[1]


def record(a) -> Counter:
    """(pass, operand shapes, None for an absent bias) -> calls in one fused train step."""
    calls: Counter = Counter()
    originals = {k: getattr(gemm, k) for k in ROUTES}

    def spy(name):
        def f(*args):
            calls[(name, *(None if t is None else tuple(t.shape) for t in args))] += 1
            return originals[name](*args)
        return f
    x, target = batch_of(a)
    model = build(a.model, not a.nchw, True)
    for k in ROUTES:
        setattr(gemm, k, spy(k))
    try:
        step(model, x, target)
    finally:
        for k, f in originals.items():
            setattr(gemm, k, f)
    return calls


def time_calls(calls: Counter, reps: int) -> dict:
    """(pass, shapes) -> route -> median ms, the routes interleaved call by call."""
    out = {}
    for key in calls:
        name, *shapes = key
        ops = [None if s is None else torch.randn(s) for s in shapes]
        routes = ROUTES[name]
        times: dict[str, list[float]] = {r: [] for r in routes}
        for i in range(reps + 2):
            for r, fn in routes.items():
                t0 = time.perf_counter()
                fn(*ops)
                if i >= 2:
                    times[r].append(1e3 * (time.perf_counter() - t0))
        out[key] = {r: statistics.median(v) for r, v in times.items()}
    return out


def main(argv=None) -> int:
    ap = step_parser(__doc__)
    ap.set_defaults(model="efficientnet_b3", threads=2)
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args(argv)
    if gemm.GEMMS["onednn"].missing():
        print(f"gemm: {gemm.GEMMS['onednn'].missing()}", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    pin_malloc(None)
    load0 = os.getloadavg()[0]
    calls = record(a)
    got = time_calls(calls, a.reps)
    totals: dict[tuple[str, str], float] = Counter()
    print(f"{a.model} {'NCHW' if a.nchw else 'channels-last'} T{a.threads}, b{a.batch} "
          f"{a.img}px: ms per call (medians of {a.reps}), calls per step")
    for key in sorted(got, key=str):
        name, *shapes = key
        n = calls[key]
        cells = "  ".join(f"{r} {ms:.3f}" for r, ms in got[key].items())
        operands = " x ".join(str(s) for s in shapes if s is not None)
        print(f"  {name:6s} {operands:40s} x{n}: {cells}")
        for r, ms in got[key].items():
            totals[(name, r)] += n * ms
    print("per step:")
    for name in ROUTES:
        row = {r: v for (p, r), v in totals.items() if p == name}
        if row:
            print(f"  {name:6s} " + "  ".join(f"{r} {v:.1f} ms" for r, v in row.items()))
    print(f"load {load0:.2f} -> {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
