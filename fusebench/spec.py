"""Specs (what to run) and records (what came out). Frozen dataclasses, plain JSON in and out."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

STATUSES = ("ok", "mismatch", "error", "unavailable", "crashed", "timeout", "oom")


@dataclass(frozen=True)
class CellSpec:
    """One model x mode x config cell. Everything a worker needs, nothing it has to look up."""
    model: str                      # registry name, "path/file.py:factory" or "timm:NAME"
    mode: str
    bench: str = "train"            # train | infer
    batch_size: int = 8
    img_size: int | None = None     # None: the model's default for this bench
    channels_last: bool = False
    dtype: str = "float32"
    amp: bool = False
    device: str = "cpu"
    warmup: int = 3
    steps: int = 10
    seed: int = 0
    model_kwargs: tuple[tuple[str, Any], ...] = ()
    mode_options: tuple[tuple[str, Any], ...] = ()
    timeout: float = 900.0
    cache_dir: str | None = None    # inductor/triton cache dir; None = worker makes a fresh one
    check: bool = True              # correctness vs eager
    threads: int | None = None      # torch.set_num_threads in the worker; None = torch default
    kind: str = "model"             # which cell runner the worker uses (model | kernel)
    extra: tuple[tuple[str, Any], ...] = ()  # runner-specific fields (kernel shape, dist, ...)

    def options(self) -> dict[str, Any]:
        return dict(self.mode_options)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("model_kwargs", "mode_options", "extra"):
            d[k] = {kk: vv for kk, vv in getattr(self, k)}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CellSpec":
        d = dict(d)
        for k in ("model_kwargs", "mode_options", "extra"):
            d[k] = tuple(sorted((d.get(k) or {}).items()))
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def label(self) -> str:
        return f"{self.model}/{self.mode}/{self.bench}"


@dataclass(frozen=True)
class StepStats:
    """Per-step times in milliseconds: robust summary plus the raw samples."""
    median: float
    iqr: float
    p10: float
    p90: float
    n: int
    samples: tuple[float, ...]

    @classmethod
    def from_samples(cls, samples_ms) -> "StepStats":
        xs = sorted(float(s) for s in samples_ms)
        if not xs:
            raise ValueError("no samples")
        q = _quantile
        return cls(median=q(xs, 0.5), iqr=q(xs, 0.75) - q(xs, 0.25), p10=q(xs, 0.1),
                   p90=q(xs, 0.9), n=len(xs), samples=tuple(float(s) for s in samples_ms))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["samples"] = list(self.samples)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "StepStats | None":
        if d is None:
            return None
        return cls(median=d["median"], iqr=d["iqr"], p10=d["p10"], p90=d["p90"], n=d["n"],
                   samples=tuple(d.get("samples", ())))


def _quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method) without importing numpy."""
    pos = (len(sorted_xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Event:
    kind: str       # warning, cpp_warning, graph_break, recompile, fallback_kernel, fusion, ...
    source: str     # python, stderr, dynamo, inductor, torchscript, fusebench, ...
    message: str    # first line only
    count: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Correctness:
    passed: bool
    max_rel_err_out: float | None
    max_rel_err_grad: float | None
    checked_at: tuple[str, ...] = ()
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["checked_at"] = list(self.checked_at)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "Correctness | None":
        if d is None:
            return None
        return cls(passed=d["passed"], max_rel_err_out=d.get("max_rel_err_out"),
                   max_rel_err_grad=d.get("max_rel_err_grad"),
                   checked_at=tuple(d.get("checked_at", ())), detail=d.get("detail"))


@dataclass(frozen=True)
class ErrorInfo:
    type: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Keys every record carries, in schema order (fusebench/1).
RECORD_KEYS = ("model", "mode", "bench", "batch_size", "img_size", "channels_last", "dtype",
               "device", "status", "params", "gflops", "throughput", "step_ms", "compile_s",
               "peak_mem_bytes", "activation_bytes", "events", "correctness", "error")


@dataclass(frozen=True)
class Record:
    model: str
    mode: str
    bench: str
    batch_size: int
    img_size: int | None
    channels_last: bool
    dtype: str
    device: str
    status: str
    params: int | None = None
    gflops: float | None = None          # forward GFLOPs per sample
    throughput: float | None = None      # samples/s from the median step
    step_ms: StepStats | None = None
    compile_s: float | None = None       # first call (compile + run) seconds
    peak_mem_bytes: int | None = None
    activation_bytes: int | None = None
    events: tuple[Event, ...] = ()
    correctness: Correctness | None = None
    error: ErrorInfo | None = None
    # Fields beyond the core schema (tflops, exit_code, stderr_tail, kernel/dist/telemetry keys, ...)
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"bad status {self.status!r}")

    def to_dict(self) -> dict[str, Any]:
        d = {
            "model": self.model, "mode": self.mode, "bench": self.bench,
            "batch_size": self.batch_size, "img_size": self.img_size,
            "channels_last": self.channels_last, "dtype": self.dtype, "device": self.device,
            "status": self.status, "params": self.params, "gflops": self.gflops,
            "throughput": self.throughput,
            "step_ms": self.step_ms.to_dict() if self.step_ms else None,
            "compile_s": self.compile_s, "peak_mem_bytes": self.peak_mem_bytes,
            "activation_bytes": self.activation_bytes,
            "events": [e.to_dict() for e in self.events],
            "correctness": self.correctness.to_dict() if self.correctness else None,
            "error": self.error.to_dict() if self.error else None,
        }
        for k, v in self.extra.items():
            d.setdefault(k, v)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Record":
        extra = {k: v for k, v in d.items() if k not in RECORD_KEYS}
        return cls(
            model=d["model"], mode=d["mode"], bench=d["bench"], batch_size=d["batch_size"],
            img_size=d["img_size"], channels_last=d["channels_last"], dtype=d["dtype"],
            device=d["device"], status=d["status"], params=d.get("params"),
            gflops=d.get("gflops"), throughput=d.get("throughput"),
            step_ms=StepStats.from_dict(d.get("step_ms")), compile_s=d.get("compile_s"),
            peak_mem_bytes=d.get("peak_mem_bytes"), activation_bytes=d.get("activation_bytes"),
            events=tuple(Event(**e) for e in d.get("events", ())),
            correctness=Correctness.from_dict(d.get("correctness")),
            error=ErrorInfo(**d["error"]) if d.get("error") else None, extra=extra)

    @classmethod
    def for_spec(cls, spec: CellSpec, status: str, **kw) -> "Record":
        """A record that carries the spec's identity fields (used for failures too)."""
        return cls(model=spec.model, mode=spec.mode, bench=spec.bench,
                   batch_size=spec.batch_size, img_size=spec.img_size,
                   channels_last=spec.channels_last, dtype=spec.dtype, device=spec.device,
                   status=status, **kw)

    def replace(self, **kw) -> "Record":
        return dataclasses.replace(self, **kw)
