"""The MLP's row blocks on a GPU (fuse/mlp_blocks.py's Triton impl, act/_triton_kernels.py's
mlp_fwd_kernel), for scripts/gpu_check.sh's `mlp` step. `auto` keeps CUDA's MLP sites layer by
layer until these figures say the blocks pay there.

    python scripts/gpu_mlp.py [--device cuda] [--small]

Per shape (a transformer MLP with its residual, rows x C -> 4C -> C: the widths of ConvNeXt's
and ViT's narrow stages, which the CPU blocks were measured on) and dtype (float32, bfloat16;
float16 with --small on CPU, where the interpreter cannot multiply bfloat16): the module fused
with the device's act binding, one step layer by layer and one in blocks from the same
weights. The line gives each one's worst output / gradient error against float64 (ok when the
blocks' is within 4x the layers' own), the median fwd+bwd time of each (CUDA events), and
layers / blocks. Exit 1 when a shape mismatches or the blocks did not run."""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SHAPES = [(25600, 96), (12800, 128), (6400, 192), (3200, 256)]   # (rows, C)
SMALL = [(70, 16), (33, 40)]
STEPS, WARMUP = 20, 3


def _step(model, x):
    model.zero_grad(set_to_none=True)
    xg = x.detach().requires_grad_()
    y = model(xg)
    y.float().square().mean().backward()
    return [y.detach(), xg.grad, *(p.grad for p in model.parameters())]


def _err(got, ref) -> float:
    """Worst error over the output and every gradient, each scaled by its reference's largest."""
    return max(((g.double() - r).abs().max() / r.abs().max().clamp_min(1e-12)).item()
               for g, r in zip(got, ref))


def check(rows: int, c: int, dtype: torch.dtype, device: str, steps: int = STEPS) -> bool:
    from mlp_blocks import Residual
    from fusebench.fuse import fuse, mlp_blocks
    from fusebench.measure.timer import time_steps
    from tests.helpers import autograd_nodes
    torch.manual_seed(0)
    ref = Residual(c).double().to(device)
    model = copy.deepcopy(ref).to(dtype)
    fuse(model, "train", device=device, impls={"bias_gelu": "triton"})   # CUDA's binding
    x = torch.randn(rows, c, dtype=torch.float64, device=device)
    want = _step(ref, x)
    xd = x.to(dtype)            # cast once: the timed steps time the MLP, not the cast
    errs, ms, ran = {}, {}, {}
    for schedule in ("layers", "blocks"):
        with mlp_blocks.using(schedule):
            y = model(xd)
            ran[schedule] = any(getattr(n, "kernel", None) is not None
                                and n.kernel.name.startswith("mlp_blocks[")
                                for n in autograd_nodes(y))
            errs[schedule] = _err(_step(model, xd), want)
            for _ in range(min(WARMUP, steps)):
                _step(model, xd)
            ms[schedule] = statistics.median(
                time_steps(lambda: _step(model, xd), steps, device))
    ok = ran == {"layers": False, "blocks": True} and errs["blocks"] <= 4 * errs["layers"] + 1e-6
    print(f"{rows:6d} x {c:4d} {str(dtype).removeprefix('torch.'):9s} error layers "
          f"{errs['layers']:.1e}, blocks {errs['blocks']:.1e}; ms layers {ms['layers']:.3f}, "
          f"blocks {ms['blocks']:.3f}, layers/blocks {ms['layers'] / ms['blocks']:.2f}x: "
          f"{'ok' if ok else 'MISMATCH' if ran['blocks'] else 'BLOCKS DID NOT RUN'}",
          flush=True)
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny shapes (a smoke of this script)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing checked")
        return 2
    dtypes = (torch.float32, torch.bfloat16 if args.device == "cuda" else torch.float16)
    results = [check(rows, c, dt, args.device, 2 if args.small else STEPS)
               for rows, c in (SMALL if args.small else SHAPES) for dt in dtypes]
    print(f"{sum(results)} of {len(results)} shapes ok")
    return 0 if all(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
