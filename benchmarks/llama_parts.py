"""LLaMA's fused pieces on CPU: the rms_norm and glu kernels against aten, and a LLaMA-style train
step eager vs fused mode, side by side in one process.

    python benchmarks/llama_parts.py --threads 2          # ~2 min on the 2-vCPU VM
    python benchmarks/llama_parts.py --threads 1 --rounds 20

Kernels: forward + backward of each impl at the bench model's shapes (8 x 256 tokens, width 256,
MLP hidden 688), interleaved, medians of --reps; ratio = eager's time / the impl's. Then the
gated MLP alone, eager and fused, as LLaMA writes it (gate and up projections) and as Phi-3
does (one projection split by chunk).
Step: tests/assets/llama.py at size "bench" (HF's RMSNorm spelling, SwiGLU MLPs), fused by
fusebench.fuse, the two models' steps (forward, cross-entropy, backward) alternating for
--rounds rounds after a warm-up; per-round eager/fused ratios, their median and a 95% bootstrap
interval (scipy.stats.bootstrap), and the bytes each step saves for backward.
Measure on a quiet machine: the script prints the 1-minute load before and after."""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from assets import llama  # noqa: E402
from paired_rounds import alternate, ratio_ci, saved_bytes, timed  # noqa: E402

from fusebench.fuse import fuse  # noqa: E402
from fusebench.kernels import get_impl  # noqa: E402

TOKENS, WIDTH, HIDDEN = (8, 256), 256, 688


def kernels(reps: int) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*TOKENS, WIDTH, generator=g, requires_grad=True)
    w = torch.ones(WIDTH, requires_grad=True)
    a, b = (torch.randn(*TOKENS, HIDDEN, generator=g, requires_grad=True) for _ in range(2))
    cases = {"rms_norm": (("naive", "eager", "function", "cpu"),
                          lambda f: f(x, w, 1e-6), torch.randn(*TOKENS, WIDTH)),
             "glu": (("eager", "function", "cpu"), lambda f: f(a, b),
                     torch.randn(*TOKENS, HIDDEN))}
    for family, (impls, call, dy) in cases.items():
        fns = {n: get_impl(family, n).fn for n in impls}
        times = {n: [] for n in impls}
        for _ in range(3 + reps):
            for n, f in fns.items():                      # interleaved: drift hits all alike
                times[n].append(timed(lambda: call(f).backward(dy)))
        med = {n: statistics.median(t[3:]) * 1e3 for n, t in times.items()}
        row = ", ".join(f"{n} {m:.3f} ms ({med['eager'] / m:.2f}x)" for n, m in med.items())
        print(f"{family} fwd+bwd {tuple(dy.shape)}: {row}")


class PackedMlp(torch.nn.Module):
    """Phi-3's gated MLP: one gate_up projection split by chunk(2, -1)."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_up_proj = torch.nn.Linear(dim, 2 * hidden, bias=False)
        self.down_proj = torch.nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(up * F.silu(gate))


def mlps(reps: int) -> None:
    """The gated MLP alone, eager and fused (glu_mlp site), in both spellings."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*TOKENS, WIDTH, generator=g, requires_grad=True)
    dy = torch.randn(*TOKENS, WIDTH, generator=g)
    for name, make in (("two projections (LLaMA)", lambda: llama.MLP(WIDTH, HIDDEN)),
                       ("one packed projection (Phi-3)", lambda: PackedMlp(WIDTH, HIDDEN))):
        torch.manual_seed(0)
        eager = make()
        fused = copy.deepcopy(eager)
        fuse(fused, "train")
        times = {"eager": [], "fused": []}
        for _ in range(3 + reps):
            for k, m in (("eager", eager), ("fused", fused)):
                times[k].append(timed(lambda: m(x).backward(dy)))
        e, f = (statistics.median(t[3:]) * 1e3 for t in times.values())
        print(f"gated MLP fwd+bwd, {name}: eager {e:.2f} ms, fused {f:.2f} ms ({e / f:.2f}x)")


def _step(model, idx):
    out = model(idx)
    F.cross_entropy(out.view(-1, out.shape[-1]), idx.view(-1)).backward()
    for p in model.parameters():
        p.grad = None


def step(rounds: int) -> None:
    torch.manual_seed(0)
    eager = llama.make(size="bench")
    fused = copy.deepcopy(eager)
    sites = fuse(fused, "train").sites
    idx = torch.randint(0, eager.vocab, (TOKENS[0], eager.context))
    t = alternate({"eager": lambda: _step(eager, idx), "fused": lambda: _step(fused, idx)},
                  rounds)
    te, tf = t["eager"], t["fused"]
    be, bf = saved_bytes(eager, idx), saved_bytes(fused, idx)
    print(f"step (sites {dict(sites)}): eager {statistics.median(te) * 1e3:.1f} ms, fused "
          f"{statistics.median(tf) * 1e3:.1f} ms; eager/fused {ratio_ci(te, tf)} over {rounds} "
          f"rounds; saved for backward {be / 2**20:.1f} vs {bf / 2**20:.1f} MiB "
          f"({bf / be:.2f}x)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}; load {os.getloadavg()[0]:.2f}")
    kernels(args.reps)
    mlps(args.reps)
    step(args.rounds)
    print(f"load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
