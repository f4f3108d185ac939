"""LN2d roofline check, one process, ratios from one run: 32x96x56x56 float32, fwd+bwd.

    python benchmarks/kernels.py [--shape 32,96,56,56] [--steps 15]

Prints each impl's median time, GB/s, % of the copy bandwidth measured in the same run, and
saved activation bytes; then the targets: cpu >= 3x the faster of permute/sqm, >= 70% of copy,
saved bytes <= 0.5x sqm's. With CUDA: triton vs copy (target >= 85%).

The cpu kernel asks for transparent huge pages on its outputs (see ln2d/cpu.cpp); the copy it
is held to may do the same, and the run repeats the kernel without the hint so the reader sees
what the hint buys and what the kernel alone does."""
from __future__ import annotations

import argparse

import torch

from fusebench.cell.kernel_cell import run_cell
from fusebench.run.kernel_plan import KernelRequest, plan_kernel


def measure(impls: str, shape: str, device: str, steps: int) -> dict[str, dict]:
    specs = plan_kernel(KernelRequest("ln2d", impls=impls, shapes=(shape,), device=device,
                                      direction="fwdbwd", warmup=3, steps=steps))
    out = {}
    for spec in specs:
        r = run_cell(spec, lambda p: None)
        d = r.to_dict()
        out[d["impl"]] = d
        ms = f"{d['step_ms']['median']:8.2f} ms" if d["step_ms"] else "       -   "
        gb = f"{d['gbps']:6.2f} GB/s {d['pct_of_copy']:5.1f}% of copy" if d["gbps"] else ""
        act = f"saved {d['activation_bytes'] / 1e6:7.1f} MB" if d["activation_bytes"] else ""
        print(f"{device:5s} {d['impl']:14s} {d['status']:11s} {ms} {gb}  {act}"
              + (f"  ({d['error']['message']})" if d["error"] else ""), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="32,96,56,56")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--cuda-only", action="store_true", help="skip the CPU part")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if not args.cuda_only:
        cpu_part(args)
    if torch.cuda.is_available():
        cuda_part(args)


def cpu_part(args) -> None:
    from fusebench.kernels.ln2d import cpu as ln2d_cpu
    r = measure("permute,sqm,channels_last,function,cpu", args.shape, "cpu", args.steps)
    ln2d_cpu.extension().set_huge_pages(False)
    try:
        plain = measure("cpu", args.shape, "cpu", args.steps)["cpu"]
    finally:
        ln2d_cpu.extension().set_huge_pages(True)
    cpu = r["cpu"]
    best = min(r["permute"]["step_ms"]["median"], r["sqm"]["step_ms"]["median"])
    ratio = best / cpu["step_ms"]["median"]
    act = cpu["activation_bytes"] / r["sqm"]["activation_bytes"]
    huge = cpu["copy_huge_gbps"]
    print(f"\ncopy bandwidth this run (fresh output each call, as every impl allocates): "
          f"{cpu['copy_plain_gbps']:.2f} GB/s plain clone, "
          + (f"{huge:.2f} GB/s with the huge-page hint; " if huge else "")
          + f"{cpu['copy_prealloc_gbps']:.2f} GB/s into a preallocated tensor")
    print(f"cpu vs faster of permute/sqm: {ratio:.2f}x   (target >= 3x)")
    print(f"cpu % of copy bandwidth:      {cpu['pct_of_copy']:.0f}% of {cpu['copy_gbps']:.2f} GB/s"
          f"   (target >= 70%)")
    print(f"cpu saved bytes / sqm's:      {act:.2f}   (target <= 0.5)")
    print(f"without the huge-page hint:   {plain['step_ms']['median']:.2f} ms, "
          f"{best / plain['step_ms']['median']:.2f}x the faster baseline, "
          f"{100 * plain['gbps'] / cpu['copy_plain_gbps']:.0f}% of the plain clone")


def cuda_part(args) -> None:
    g = measure("permute,sqm,function,triton", args.shape, "cuda", max(args.steps, 50))
    t = g["triton"]
    if t["gbps"]:
        print(f"\ntriton % of copy bandwidth: {t['pct_of_copy']:.0f}% of "
              f"{t['copy_gbps']:.0f} GB/s  (target >= 85%)")
        graphed(args)


def graphed(args, reps: int = 100) -> None:
    """The same fwd+bwd without host cost: triton's forward and backward functions (no
    autograd) and a clone, each captured once in a CUDA graph and replayed `reps` times between
    two events. At ~0.1 ms of kernel time per step the autograd step above is launch-bound;
    this is what the kernels themselves reach against the same copy."""
    from fusebench.kernels.ln2d.triton import ln2d_triton_bwd, ln2d_triton_fwd
    from fusebench.kernels.problems import PROBLEMS

    shape = [int(v) for v in args.shape.split(",")]
    x = torch.randn(shape, device="cuda")
    dy, w, b = torch.randn_like(x), torch.randn(shape[1], device="cuda"), torch.zeros(
        shape[1], device="cuda")

    def step():
        y, mean, rstd = ln2d_triton_fwd(x, w, b, 1e-6)
        return y, ln2d_triton_bwd(dy, x, w, mean, rstd)

    def ms_per_replay(fn) -> float:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):   # triton compiles and the allocator warms outside capture
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        graph.replay()
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / reps

    nbytes = PROBLEMS["ln2d"].bytes_moved(shape, x.dtype, "fwdbwd")
    kern = nbytes / ms_per_replay(step) / 1e6
    copy = 2 * x.nbytes / ms_per_replay(lambda: x.clone()) / 1e6
    print(f"graph-replayed (no host cost): triton fwd+bwd {kern:.0f} GB/s, clone {copy:.0f} "
          f"GB/s -> {100 * kern / copy:.0f}% of copy  (target >= 85%)")


if __name__ == "__main__":
    main()
