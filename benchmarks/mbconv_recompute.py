"""Recompute-instead-of-save (fuse/recompute.py) and bn_train on EfficientNet train: activation
bytes of eager, `before` (fused without bn_train and with recompute off: the fused mode before
this change), `save` (fused with recompute off), `se_save` / `dw_save` (fused with only the SE's /
only the depthwise conv's input saved, the other rebuilt) and fused (load-independent: unique
saved storages, parameters left out, as the worker counts them), then an interleaved
whole-step A/B in one process (medians of `--rounds` rounds of each).

  python benchmarks/mbconv_recompute.py [--model efficientnet_b0] [--cl] [--batch 8]
      [--size 160] [--threads 2] [--rounds 6] [--bytes-only]"""
from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time

import torch
import torch.nn.functional as F

from fusebench.fuse import ORDER, fuse, graph_order, recompute
from fusebench.measure.memory import SavedTensorBytes, pin_malloc
from fusebench.models import create_model


def _variants(name: str, mf) -> dict:
    torch.manual_seed(0)
    base = create_model(name)
    out = {}
    names = [*ORDER, *graph_order()]
    for key in VARIANTS:
        m = copy.deepcopy(base).to(memory_format=mf).train()
        if key != "eager":
            fuse(m, "train", "cpu", only=[n for n in names if key != "before" or n != "bn_train"])
        out[key] = m
    return out


VARIANTS = ("eager", "before", "save", "se_save", "dw_save", "fused")
SAVES = {"before": recompute.ALL, "save": recompute.ALL, "se_save": "se_gate",
         "dw_save": "dwconv"}       # variant -> the consumers that save their input


def _ctx(key: str):
    return recompute.disabled((SAVES[key],)) if key in SAVES else contextlib.nullcontext()


def _step(m, x, t):
    m.zero_grad(set_to_none=True)
    F.cross_entropy(m(x), t).backward()


def act_bytes(m, key, x, t) -> int:
    counter = SavedTensorBytes(exclude=list(m.parameters()))
    with _ctx(key), counter.track():
        loss = F.cross_entropy(m(x), t)
    loss.backward()
    return counter.bytes


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="efficientnet_b0")
    p.add_argument("--cl", action="store_true")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=160)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--bytes-only", action="store_true")
    a = p.parse_args()
    # glibc's malloc thresholds fixed as a model cell fixes them (measure/memory.py): with the
    # defaults, six models' steps in one process moved each other's heap and page faults
    # (the rebuild variants read 1-10% apart run to run, in no stable order)
    pin_malloc()
    torch.set_num_threads(a.threads)
    mf = torch.channels_last if a.cl else torch.contiguous_format
    x = torch.randn(a.batch, 3, a.size, a.size).to(memory_format=mf)
    t = torch.randint(0, 1000, (a.batch,))
    ms = _variants(a.model, mf)
    sizes = {k: act_bytes(m, k, x, t) for k, m in ms.items()}
    layout = "channels-last" if a.cl else "NCHW"
    print(f"{a.model} {layout} b{a.batch} {a.size}px act bytes (MiB): "
          + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in sizes.items())
          + f"; fused/eager {sizes['fused'] / sizes['eager']:.3f}, "
            f"before/eager {sizes['before'] / sizes['eager']:.3f}, "
            f"save/eager {sizes['save'] / sizes['eager']:.3f}, "
            f"se_save/eager {sizes['se_save'] / sizes['eager']:.3f}, "
            f"dw_save/eager {sizes['dw_save'] / sizes['eager']:.3f}")
    if a.bytes_only:
        return
    ts: dict[str, list[float]] = {k: [] for k in ms}
    for k, m in ms.items():
        with _ctx(k):
            _step(m, x, t)
    for _ in range(a.rounds):
        for k, m in ms.items():
            with _ctx(k):
                t0 = time.perf_counter()
                _step(m, x, t)
                ts[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in ts.items()}
    print("  ".join(f"{k} {v * 1e3:.1f} ms" for k, v in med.items())
          + f"  | eager/fused {med['eager'] / med['fused']:.3f}x, "
            f"before/fused {med['before'] / med['fused']:.3f}x, "
            f"save/fused {med['save'] / med['fused']:.3f}x, "
            f"se_save/fused {med['se_save'] / med['fused']:.3f}x, "
            f"dw_save/fused {med['dw_save'] / med['fused']:.3f}x, "
            f"eager/before {med['eager'] / med['before']:.3f}x")


if __name__ == "__main__":
    main()
