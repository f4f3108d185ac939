"""Specs (what to run) and records (what came out). Frozen dataclasses, plain JSON in and out.

A CellSpec is typed by its parts: a ModelPart (model cells) or a KernelPart (kernel cells), plus
a DistPart for torchrun-launched model cells; no field means one thing for models and another
for kernels. A Record holds the CellSpec it ran (as torch.utils.benchmark's Measurement holds its
TaskSpec): identity, cell key, variant and labels all come from `record.spec`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any
from fusebench.dtypes import DTYPES

STATUSES = ("ok", "mismatch", "error", "unavailable", "crashed", "timeout", "oom")


def _pairs(d: dict[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((d or {}).items()))


@dataclass(frozen=True)
class ModelPart:
    """What a model cell runs: a model at one config, trained or inferred."""
    name: str                       # registry name, "path/file.py:factory" or "timm:NAME"
    bench: str = "train"            # train | infer
    batch_size: int = 8
    img_size: int | None = None     # None: the model's default for this bench
    kwargs: tuple[tuple[str, Any], ...] = ()
    amp: bool = False
    check: bool = True              # correctness vs eager
    amp_dtype: str | None = None    # autocast dtype; None: the device's default (dtypes.py)
    # img_size is --quick's preset, not asked for: a model that makes its own inputs
    # (example_inputs: token ids, ...) runs without it instead of failing on it
    size_preset: bool = False

    runner = "model"                # cell/worker.py CELL_RUNNERS key (class attribute)

    @property
    def subject(self) -> str:
        return self.name

    @property
    def samples_per_step(self) -> int:
        return self.batch_size

    def key(self) -> tuple:
        return ("model", self.name, self.bench, self.batch_size, self.img_size, self.amp,
                _freeze(dict(self.kwargs))) + ((self.amp_dtype,) if self.amp_dtype else ())

    def variant(self, mode: str) -> str:
        return mode

    def config_parts(self) -> list[str]:
        return [self.bench, f"b{self.batch_size}"] + ([str(self.img_size)] if self.img_size
                                                       else [])

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "kwargs": dict(self.kwargs)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelPart":
        return cls(**{**d, "kwargs": _pairs(d.get("kwargs"))})


@dataclass(frozen=True)
class KernelPart:
    """What a kernel cell runs: one impl of a kernel family on one N,C,H,W shape."""
    family: str
    impl: str                       # registered name or "path/file.py:fn" (as requested)
    shape: tuple[int, ...]          # N, C, H, W
    direction: str = "fwdbwd"       # fwd | bwd | fwdbwd

    runner = "kernel"

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))

    @property
    def subject(self) -> str:
        return self.family

    @property
    def samples_per_step(self) -> int:
        return self.shape[0]

    def key(self) -> tuple:
        return ("kernel", self.family, self.shape, self.direction)

    def variant(self, mode: str) -> str:
        return self.impl        # impls are compared within one mode (the mode is in the key)

    def config_parts(self) -> list[str]:
        return [self.direction, "x".join(str(s) for s in self.shape)]

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KernelPart":
        return cls(**d)


@dataclass(frozen=True)
class DistPart:
    """A model cell launched data-parallel by torchrun (see run/distributed.py)."""
    strategy: str                       # ddp | fsdp1 | fsdp2 (the --dist value)
    nproc: int                          # processes per node
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None    # host:port of node 0; None: loopback, a free port

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    def key(self) -> tuple:
        return ("dist", self.strategy, self.world_size)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DistPart":
        if "kind" in d:     # fusebench/2 files written before the field was named `strategy`
            d = {("strategy" if k == "kind" else k): v for k, v in d.items()}
        return cls(**d)


# spec dict key -> part class; a cell has exactly one of the "what" parts (model, kernel)
PARTS = {"model": ModelPart, "kernel": KernelPart, "dist": DistPart}
WHAT_PARTS = ("model", "kernel")


def _freeze(v: Any) -> Any:
    """JSON-ish value -> hashable, order-independent for dicts."""
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


@dataclass(frozen=True)
class CellSpec:
    """One cell: what runs (a model part or a kernel part, plus a dist part for torchrun), in
    which mode, how it is measured. Everything a worker needs, nothing it has to look up."""
    mode: str
    model: ModelPart | None = None
    kernel: KernelPart | None = None
    dist: DistPart | None = None
    mode_options: tuple[tuple[str, Any], ...] = ()
    channels_last: bool = False
    dtype: str = "float32"
    device: str = "cpu"
    warmup: int = 3
    steps: int = 10                 # timed steps; with a budget, the most calibration may pick
    budget: float | None = None     # seconds of timed steps (count calibrated); None: `steps`
    seed: int = 0
    timeout: float = 900.0
    cache_dir: str | None = None    # inductor/triton cache dir; None = worker makes a fresh one
    threads: int | None = None      # torch.set_num_threads in the worker; None = torch default
    heap: str | None = None         # glibc malloc policy of a CPU cell (measure/heap.py); None:
                                    # its default

    def __post_init__(self):
        if (self.model is None) == (self.kernel is None):
            raise ValueError("a CellSpec has exactly one of a model part and a kernel part")
        if self.dist is not None and self.model is None:
            raise ValueError("only model cells run distributed")

    @classmethod
    def for_model(cls, name: str, mode: str, *, bench: str = "train", batch_size: int = 8,
                  img_size: int | None = None, model_kwargs=(), amp: bool = False,
                  check: bool = True, amp_dtype: str | None = None,
                  size_preset: bool = False, **common) -> "CellSpec":
        kw = _pairs(model_kwargs) if isinstance(model_kwargs, dict) else tuple(model_kwargs)
        return cls(mode=mode, model=ModelPart(name, bench, batch_size, img_size, kw, amp, check,
                                              amp_dtype, size_preset), **common)

    @classmethod
    def for_kernel(cls, family: str, impl: str, shape, mode: str = "eager", *,
                   direction: str = "fwdbwd", **common) -> "CellSpec":
        return cls(mode=mode, kernel=KernelPart(family, impl, tuple(shape), direction), **common)

    @property
    def what(self) -> ModelPart | KernelPart:
        return self.model if self.model is not None else self.kernel

    @property
    def kind(self) -> str:
        """Which cell runner the worker uses: declared by the part, not guessed."""
        return self.what.runner

    @property
    def subject(self) -> str:
        """The model name, or the kernel family."""
        return self.what.subject

    @property
    def samples_per_step(self) -> int:
        """Batch size of a model cell, N of a kernel shape: what throughput counts."""
        return self.what.samples_per_step

    def options(self) -> dict[str, Any]:
        return dict(self.mode_options)

    def with_model(self, **kw) -> "CellSpec":
        return dataclasses.replace(self, model=dataclasses.replace(self.model, **kw))

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for k in PARTS:
            d[k] = d[k].to_dict() if d[k] is not None else None
        d["mode_options"] = dict(self.mode_options)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CellSpec":
        if isinstance(d.get("model"), str):     # fusebench/1 layout (old repro scripts)
            return spec_from_v1(d)
        d = dict(d)
        for k, part in PARTS.items():
            d[k] = part.from_dict(d[k]) if d.get(k) else None
        d["mode_options"] = _pairs(d.get("mode_options"))
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def cell_key(self) -> tuple:
        """Everything that defines the configuration, but not the variant (mode / impl):
        records with equal keys are compared with each other. Run-only settings (warm-up,
        steps, budget, seed, timeout, threads, heap) are not part of it."""
        key = (self.what.key(), self.channels_last, self.dtype, self.device)
        if self.kernel is not None:
            key += (("mode", self.mode),)
        return key + ((self.dist.key(),) if self.dist else ())

    def variant(self) -> str:
        """What is compared inside a cell: the mode (or kernel impl); mode options make a
        distinct variant (compile[mode=max-autotune])."""
        name = self.what.variant(self.mode)
        if self.mode_options:
            name += "[" + ",".join(f"{k}={v}" for k, v in sorted(self.mode_options)) + "]"
        return name

    def config_label(self) -> str:
        """Short human label of the configuration (without the model name)."""
        parts = self.what.config_parts()
        if self.kernel is not None and self.mode != "eager":
            parts.append(self.mode)
        if self.channels_last:
            parts.append("NHWC")
        parts.append(self.dtype.replace("float", "fp").replace("bfp16", "bf16"))
        if self.model is not None and self.model.amp:
            dt = self.model.amp_dtype
            parts.append(f"amp-{DTYPES[dt].short}" if dt in DTYPES else "amp")
        parts.append(self.device)
        if self.dist is not None:
            parts.append(f"ws{self.dist.world_size}")
        if self.model is not None and self.model.kwargs:
            parts.append(",".join(f"{k}={v}" for k, v in sorted(self.model.kwargs)))
        return " ".join(parts)

    def title(self, subject: str | None = None) -> str:
        """'convnext_atto / eager / train b8' or 'ln2d / eager / fwdbwd 8x96x56x56'."""
        m = self.model
        what = (f"{m.bench} b{m.batch_size}" if m is not None
                else " ".join(self.kernel.config_parts()))
        return f"{subject or self.subject} / {self.mode} / {what}"

    def label(self) -> str:
        bench = self.model.bench if self.model is not None else self.kernel.direction
        name = self.mode if self.kernel is None else (   # kernels: the impl, not eager
            self.variant() + ("" if self.mode == "eager" else f"[{self.mode}]"))
        return f"{self.subject}/{name}/{bench}"


# fusebench/1 flat spec keys that are common to every cell (the rest went into the parts)
_V1_COMMON = ("mode", "channels_last", "dtype", "device", "warmup", "steps", "seed", "timeout",
              "cache_dir", "threads")


def spec_from_v1(d: dict[str, Any]) -> CellSpec:
    """A fusebench/1 flat spec dict (model, bench, ..., kind, extra) -> CellSpec. A v1 kernel
    spec kept the family in `model` and the impl/shape/direction in `extra`."""
    extra = d.get("extra") or {}
    common = {k: d[k] for k in _V1_COMMON if k in d}
    common["mode_options"] = _pairs(d.get("mode_options"))
    if d.get("kind") == "kernel":
        return CellSpec(kernel=KernelPart(d["model"], extra["impl"], tuple(extra["shape"]),
                                          extra.get("direction") or d.get("bench", "fwdbwd")),
                        **common)
    dist = None
    if extra.get("dist"):
        dist = DistPart(extra["dist"], int(extra["nproc"]), int(extra.get("nnodes") or 1),
                        int(extra.get("node_rank") or 0), extra.get("rdzv_endpoint"))
    model = ModelPart(d["model"], d.get("bench", "train"), d.get("batch_size", 8),
                      d.get("img_size"), _pairs(d.get("model_kwargs")), bool(d.get("amp")),
                      d.get("check", True))
    return CellSpec(model=model, dist=dist, **common)


@dataclass(frozen=True)
class StepStats:
    """Per-step times in milliseconds: robust summary plus the raw samples."""
    median: float
    iqr: float
    p10: float
    p90: float
    n: int
    samples: tuple[float, ...]
    # --repeat N: `samples` is N worker processes' steps one after the other; process_sizes
    # splits them back, process_medians are each process's median. Empty: one process.
    process_sizes: tuple[int, ...] = ()
    process_medians: tuple[float, ...] = ()

    @classmethod
    def from_samples(cls, samples_ms) -> "StepStats":
        xs = sorted(float(s) for s in samples_ms)
        if not xs:
            raise ValueError("no samples")
        q = _quantile
        return cls(median=q(xs, 0.5), iqr=q(xs, 0.75) - q(xs, 0.25), p10=q(xs, 0.1),
                   p90=q(xs, 0.9), n=len(xs), samples=tuple(float(s) for s in samples_ms))

    @classmethod
    def from_processes(cls, groups) -> "StepStats":
        """Pooled statistics of several worker processes' samples, keeping who measured what."""
        groups = [[float(s) for s in g] for g in groups if len(g)]
        pooled = cls.from_samples([s for g in groups for s in g])
        if len(groups) < 2:
            return pooled
        meds = tuple(_quantile(sorted(g), 0.5) for g in groups)
        return dataclasses.replace(pooled, process_sizes=tuple(len(g) for g in groups),
                                   process_medians=meds)

    def process_groups(self) -> list[tuple[float, ...]]:
        """The samples of each worker process (one group when there was one process, or when
        the sizes do not add up, as in a hand-edited file)."""
        if len(self.process_sizes) < 2 or sum(self.process_sizes) != len(self.samples):
            return [self.samples]
        out, i = [], 0
        for n in self.process_sizes:
            out.append(self.samples[i:i + n])
            i += n
        return out

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["samples"] = list(self.samples)
        for k in ("process_sizes", "process_medians"):   # one process: the old layout
            if d[k]:
                d[k] = list(d[k])
            else:
                del d[k]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "StepStats | None":
        if d is None:
            return None
        return cls(median=d["median"], iqr=d["iqr"], p10=d["p10"], p90=d["p90"], n=d["n"],
                   samples=tuple(d.get("samples", ())),
                   process_sizes=tuple(d.get("process_sizes") or ()),
                   process_medians=tuple(d.get("process_medians") or ()))


def _quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method) without importing numpy."""
    pos = (len(sorted_xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Event:
    category: str   # warning, cpp_warning, graph_break, recompile, fallback_kernel, fusion, ...
    source: str     # python, stderr, dynamo, inductor, torchscript, fusebench, ...
    message: str    # first line only
    count: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Event":
        if "kind" in d:     # files written before the field was named `category`
            d = {("category" if k == "kind" else k): v for k, v in d.items()}
        return cls(**d)


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


# Measured fields of a Record, in schema order (after spec and status).
MEASURED = ("params", "gflops", "throughput", "step_ms", "compile_s", "peak_mem_bytes",
            "activation_bytes", "events", "correctness", "error")


@dataclass(frozen=True)
class Record:
    """What came out of one cell, holding the spec it ran (identity comes only from `spec`).

    `extra` holds runner-specific facts that are not identity, documented where they are
    written: model cells (first_call_s, input_shape, tflops, peak_mem_total_bytes, GPU
    telemetry), kernel cells (gbps, pct_of_copy, copy_*_gbps, bytes, max_err, ran_impl when
    `fused` fell back), the runner (exit_code, signal, stderr_tail, oom_failed_batch_sizes,
    requested_batch_size), distributed runs (ranks_reported, rank_step_ms_median, ...) and
    repro (the script's path)."""
    spec: CellSpec
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
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"bad status {self.status!r}")

    def to_dict(self) -> dict[str, Any]:
        """The fusebench/2 record layout: {spec, status, measured fields..., extra}."""
        return {
            "spec": self.spec.to_dict(), "status": self.status, "params": self.params,
            "gflops": self.gflops, "throughput": self.throughput,
            "step_ms": self.step_ms.to_dict() if self.step_ms else None,
            "compile_s": self.compile_s, "peak_mem_bytes": self.peak_mem_bytes,
            "activation_bytes": self.activation_bytes,
            "events": [e.to_dict() for e in self.events],
            "correctness": self.correctness.to_dict() if self.correctness else None,
            "error": self.error.to_dict() if self.error else None,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Record":
        """A fusebench/2 record dict (results/document.py reads older layouts)."""
        return cls(spec=CellSpec.from_dict(d["spec"]), **measured_from_dict(d),
                   extra=dict(d.get("extra") or {}))

    def replace(self, **kw) -> "Record":
        return dataclasses.replace(self, **kw)


def measured_from_dict(d: dict[str, Any]) -> dict[str, Any]:
    """status and the measured fields of a record dict (same layout in every schema version)."""
    return dict(
        status=d["status"], params=d.get("params"), gflops=d.get("gflops"),
        throughput=d.get("throughput"), step_ms=StepStats.from_dict(d.get("step_ms")),
        compile_s=d.get("compile_s"), peak_mem_bytes=d.get("peak_mem_bytes"),
        activation_bytes=d.get("activation_bytes"),
        events=tuple(Event.from_dict(e) for e in d.get("events", ())),
        correctness=Correctness.from_dict(d.get("correctness")),
        error=ErrorInfo(**d["error"]) if d.get("error") else None)
