"""Fabricated, valid results documents for tests: records with synthetic per-step samples.

    recs = [model_record("convnext_tiny", "eager", base_ms=100.0, seed=1),
            model_record("convnext_tiny", "compile", base_ms=80.0, seed=2)]
    path = write_results(tmp_path / "a.json", recs)

Samples are lognormal noise around base_ms (multiplicative noise, like real step times), drawn
from a seeded generator so every test is reproducible.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from fusebench.results.document import new_document, save
from fusebench.spec import CellSpec, Correctness, Event, Record, StepStats

FAKE_ENV: dict[str, Any] = {
    "fusebench": "0.1.0",
    "torch": {"version": "2.13.0+cpu", "git_version": "cf30153c", "debug": False, "cuda": None,
              "cudnn": None, "rocm": None, "cuda_available": False, "num_threads": 8,
              "num_interop_threads": 8, "parallel": "OpenMP 201511", "has_llvm": False},
    "python": {"version": "3.11.7", "implementation": "CPython", "executable": "/usr/bin/python"},
    "os": {"system": "Linux", "release": "6.1.0", "machine": "x86_64", "platform": "Linux-6.1",
           "hostname": "bench-1"},
    "cpu": {"model": "Intel(R) Xeon(R) Platinum 8481C", "logical_cores": 16, "physical_cores": 8},
    "memory": {"total_bytes": 64 << 30, "available_bytes": 60 << 30},
    "gpus": {"nvml": False, "reason": "NVML Shared Library Not Found", "devices": []},
}


def fake_env(**overrides: Any) -> dict[str, Any]:
    """FAKE_ENV with dotted-path overrides: fake_env(**{"torch.version": "2.12.0"})."""
    env = copy.deepcopy(FAKE_ENV)
    for path, value in overrides.items():
        cur = env
        *parents, last = path.split(".")
        for k in parents:
            cur = cur.setdefault(k, {})
        cur[last] = value
    return env


def samples(base_ms: float, n: int = 40, sigma: float = 0.03, seed: int = 0) -> list[float]:
    """n lognormal step times (ms) whose median is ~base_ms; sigma ~ relative spread."""
    rng = np.random.default_rng(seed)
    return (base_ms * rng.lognormal(0.0, sigma, size=n)).round(6).tolist()


def model_record(model: str = "convnext_tiny", mode: str = "eager", *, base_ms: float = 100.0,
                 n: int = 40, sigma: float = 0.03, seed: int = 0, bench: str = "train",
                 batch_size: int = 8, img_size: int | None = 224, channels_last: bool = False,
                 dtype: str = "float32", device: str = "cpu", status: str = "ok",
                 peak_mem_bytes: int | None = 1_500_000_000,
                 activation_bytes: int | None = 600_000_000, compile_s: float | None = 1.5,
                 extra: dict[str, Any] | None = None, spec: CellSpec | None = None) -> Record:
    """One model record (or one for `spec`); status != 'ok' gives a failure record."""
    spec = spec or CellSpec.for_model(model, mode, bench=bench, batch_size=batch_size,
                                      img_size=img_size, channels_last=channels_last,
                                      dtype=dtype, device=device)
    if status != "ok":
        return Record(spec, status, extra=dict(extra or {}))
    st = StepStats.from_samples(samples(base_ms, n, sigma, seed))
    return Record(
        spec, "ok", params=28_600_000, gflops=4.5,
        throughput=spec.samples_per_step * 1000.0 / st.median, step_ms=st,
        compile_s=compile_s, peak_mem_bytes=peak_mem_bytes, activation_bytes=activation_bytes,
        events=(Event("warning", "python", "synthetic warning"),) if mode != "eager" else (),
        correctness=Correctness(True, 1e-6, 1e-5, ("first", "steady")),
        extra=dict(extra or {}))


def kernel_record(impl: str = "permute", *, family: str = "ln2d", base_ms: float = 1.0,
                  shape: tuple[int, ...] = (8, 64, 56, 56), direction: str = "fwd",
                  seed: int = 0, n: int = 40, sigma: float = 0.03, mode: str = "eager",
                  **kw: Any) -> Record:
    """A kernel record as `fusebench kernel` writes it: identity in spec.kernel, GB/s in extra."""
    numel = int(np.prod(shape))
    extra = {"gbps": 2 * 4 * numel / (base_ms * 1e-3) / 1e9, "pct_of_copy": 50.0}
    spec = CellSpec.for_kernel(family, impl, shape, mode, direction=direction,
                               **{k: kw.pop(k) for k in ("channels_last", "dtype", "device")
                                  if k in kw})
    return model_record(family, mode, base_ms=base_ms, seed=seed, n=n, sigma=sigma,
                        extra=extra, peak_mem_bytes=None, activation_bytes=None,
                        compile_s=None, spec=spec, **kw)


def document(records: list[Record], env: dict[str, Any] | None = None) -> dict[str, Any]:
    return new_document(env if env is not None else fake_env(), records,
                        command=["fusebench", "run", "synthetic"])


def write_results(path: Path, records: list[Record], env: dict[str, Any] | None = None) -> Path:
    return save(document(records, env), Path(path))


def modes_run(model: str = "convnext_tiny", speed: dict[str, float] | None = None, *,
              seed: int = 0, **kw: Any) -> list[Record]:
    """One record per mode; speed maps mode -> base step ms (default eager 100, compile 80)."""
    speed = speed or {"eager": 100.0, "compile": 80.0}
    return [model_record(model, mode, base_ms=ms, seed=seed + i, **kw)
            for i, (mode, ms) in enumerate(speed.items())]
