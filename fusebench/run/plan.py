"""CLI arguments -> list[CellSpec]. Every check of user input that needs no worker lives here,
so bad input fails before anything runs or is written."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from fusebench.dtypes import AMP_DTYPES, MODEL_DTYPES
from fusebench.errors import UsageError
from fusebench.measure.heap import HEAP_POLICIES
from fusebench.registry import parse_int_list, parse_list
from fusebench.spec import CellSpec

BENCHES = ("train", "infer")
MAX_SIZE = 8192        # a bigger side length is a typo, not a benchmark
MAX_BATCH = 1 << 16
MAX_STEPS = 1_000_000  # warm-up or timed steps beyond this are a typo, not a benchmark
MAX_BUDGET_S = 86_400.0
QUICK = dict(batch=4, img=96, warmup=2, steps=5)
DEFAULT_BATCH = 32        # the models' standard batch; a CPU run fits it to the budget
DEFAULT_WARMUP = 5
DEFAULT_BUDGET_S = 30.0   # seconds of timed steps per cell; a fixed --steps replaces it


@dataclass(frozen=True)
class RunRequest:
    models: str
    modes: str = "all"
    bench: str = "train"
    batch_sizes: str | None = None
    img_sizes: str | None = None
    channels_last: bool = False
    dtype: str = "float32"
    amp: bool = False
    amp_dtype: str | None = None        # None: the device's autocast default
    device: str = "auto"
    warmup: int | None = None
    steps: int | None = None
    budget: float | None = None         # seconds of timed steps per cell (None: the default)
    quick: bool = False
    seed: int = 0
    timeout: float = 900.0
    check: bool = True
    threads: int | None = None
    heap: str | None = None             # glibc malloc policy of CPU cells (measure/heap.py)
    model_kwargs: tuple[str, ...] = ()
    mode_options: dict = field(default_factory=dict)
    dist: str | None = None             # ddp | fsdp1 | fsdp2: launch each cell via torchrun
    nproc: int | None = None            # processes per node
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None


def resolve_device(text: str) -> str:
    import torch
    text = text.strip().lower()
    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if text == "cpu":
        return "cpu"
    if text == "cuda" or text.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise UsageError(f"--device {text}: no CUDA device available (this torch build: "
                             f"{'CPU-only' if torch.version.cuda is None else 'CUDA ' + torch.version.cuda})")
        idx = text.partition(":")[2]
        if idx:
            if not idx.isdigit() or int(idx) >= torch.cuda.device_count():
                raise UsageError(f"--device {text}: there are {torch.cuda.device_count()} "
                                 f"CUDA device(s)")
        return text
    raise UsageError(f"--device must be auto, cpu, cuda or cuda:N, got '{text}'")


def plan_run(req: RunRequest) -> list[CellSpec]:
    from fusebench.models.source import parse_model_kwargs

    device, dist = _check_settings(req)
    batches, sizes, warmup, steps = _counts(req)
    budget = timing_budget(req)
    kwargs = parse_model_kwargs(req.model_kwargs)
    models = _check_models(parse_list(req.models, "model"), kwargs, sizes, req.timeout, device,
                           req.img_sizes is not None)
    mode_names = _mode_names(req, device)
    options = _cell_options(mode_names, req.mode_options)
    benches = BENCHES if req.bench == "both" else (req.bench,)

    specs = []
    for model, bench, batch, size in itertools.product(models, benches, batches, sizes):
        for mode in mode_names:
            specs.append(CellSpec.for_model(
                model, mode, bench=bench, batch_size=batch,
                img_size=size,          # None: the worker uses the model's default
                size_preset=req.quick and req.img_sizes is None and size is not None,
                channels_last=req.channels_last, dtype=req.dtype, amp=req.amp or req.amp_dtype is not None,
                amp_dtype=req.amp_dtype, device=device,
                warmup=warmup, steps=steps, budget=budget, seed=req.seed,
                model_kwargs=tuple(sorted(kwargs.items())), mode_options=options[mode],
                timeout=req.timeout, check=req.check, dist=dist, threads=req.threads,
                heap=req.heap))
    return specs


def timing_budget(req: RunRequest) -> float | None:
    """Seconds of timed steps per cell, or None when the count is fixed (--steps, --quick):
    an explicit count overrides calibration."""
    if req.budget is not None and not (math.isfinite(req.budget) and
                                       0 < req.budget <= MAX_BUDGET_S):
        raise UsageError(f"--budget must be seconds in (0, {MAX_BUDGET_S:g}], "
                         f"got {req.budget:g}")
    if req.steps is not None or req.quick:
        return None
    return req.budget if req.budget is not None else DEFAULT_BUDGET_S


def fits_batch(req: RunRequest, specs: list[CellSpec]) -> bool:
    """Whether the run picks its batch (CPU, no --batch-size, no --quick, not distributed):
    the standard batch makes a CPU step take many seconds, so a smaller one is fitted to the
    budget (run/autobatch.py). On CUDA the model's standard batch is kept."""
    return (req.batch_sizes is None and not req.quick and req.dist is None and bool(specs)
            and all(s.device == "cpu" and s.model is not None and s.dist is None
                    for s in specs))


def _check_models(names: list[str], kwargs: dict[str, str], sizes: list[int | None],
                  timeout: float, device: str, sizes_given: bool = False) -> list[str]:
    """Each model resolves and takes the --model-kwargs and every --img-size (sizes_given: the
    user's, not --quick's preset); unknown kwargs fail here, not in every worker. User files
    and plugin models are checked by the probe (run/probe.py): the CLI never imports user
    code."""
    from fusebench.loading import check_ref
    from fusebench.models.source import coerce_kwargs, resolve_model
    from fusebench.run import probe

    files = [m for m in names if probe.is_user_model(m)]
    for m in files:
        check_ref(m, "model", "factory")
    with_plugins = bool(probe.plugins_value())
    probed = [m for m in names if m in files or (with_plugins and not m.startswith("timm:"))]
    probe.load(device=device, timeout=timeout, models=probed, model_kwargs=kwargs,
               img_sizes=[s for s in sizes if s is not None], img_sizes_given=sizes_given)
    for src in (resolve_model(m) for m in names if m not in probed):
        coerce_kwargs(src.factory, kwargs)
        for size in sizes:
            if size is not None:
                src.validate_img_size(size)
    return names


def _check_settings(req: RunRequest):
    """The scalar settings -> (device, DistSettings | None); a bad one is a UsageError."""
    from fusebench.run.distributed import validate as validate_dist

    if req.bench not in (*BENCHES, "both"):
        raise UsageError(f"--bench must be train, infer or both, got '{req.bench}'")
    if req.dtype not in MODEL_DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(MODEL_DTYPES)}, got '{req.dtype}'")
    if (req.amp or req.amp_dtype) and req.dtype != "float32":
        raise UsageError("--amp runs a float32 model under autocast; drop --dtype or --amp")
    if req.amp_dtype is not None and req.amp_dtype not in AMP_DTYPES:
        raise UsageError(f"--amp-dtype must be one of {', '.join(AMP_DTYPES)}, "
                         f"got '{req.amp_dtype}'")
    check_timeout(req.timeout)
    device = resolve_device(req.device)
    dist = validate_dist(req.dist, req.nproc, req.nnodes, req.node_rank, req.rdzv_endpoint)
    if device == "cpu" and req.dtype == "float16":
        raise UsageError("--dtype float16 is not supported on CPU (train or infer); use bfloat16")
    return device, dist


def all_modes(device: str) -> tuple[list[str], list[str]]:
    """(what `-m all` runs on `device`, the registered modes it leaves out: they run only on
    other device types, Mode.device_types)."""
    from fusebench.modes import MODES, list_modes
    registered = list_modes()
    runs = [m for m in registered if MODES[m].runs_on(device)]
    return runs, [m for m in registered if m not in runs]


def _mode_names(req: RunRequest, device: str) -> list[str]:
    """The requested modes, eager first; every given mode option checked against its
    declaration, whether or not its mode was picked (a typo never passes silently)."""
    from fusebench.modes import MODES, list_modes
    from fusebench.modes.options import all_options, check_option_values, check_values

    registered = list_modes()
    mode_names = (all_modes(device)[0] if req.modes.strip() == "all"
                  else parse_list(req.modes, "mode"))
    picked = MODES.resolve(mode_names)     # all unknown names reported at once
    check_values(all_options(MODES.resolve(registered)).values(), req.mode_options)
    for m in picked:
        check_option_values(m, req.mode_options)
    if "eager" in mode_names:   # eager first: the baseline every speedup divides by
        mode_names = ["eager"] + [m for m in mode_names if m != "eager"]
    return mode_names


def _cell_options(mode_names: list[str], given: dict) -> dict[str, tuple]:
    """Each cell carries only the options its mode reads, and only where they differ from the
    mode's defaults: records, compare keys and plot labels then name real variants only."""
    from fusebench.modes import MODES
    out = {}
    for m in mode_names:
        defaults = MODES[m].option_defaults
        out[m] = tuple(sorted((k, v) for k, v in given.items()
                              if k in defaults and v is not None and v != defaults[k]))
    return out


def _counts(req: RunRequest) -> tuple[list[int], list[int | None], int, int]:
    """(batch sizes, image sizes, warm-up steps, timed steps), --quick filling the defaults."""
    from fusebench.measure import timer
    batches = (parse_int_list(req.batch_sizes, "batch size", maximum=MAX_BATCH)
               if req.batch_sizes is not None
               else [QUICK["batch"] if req.quick else DEFAULT_BATCH])
    sizes = (parse_int_list(req.img_sizes, "image size", maximum=MAX_SIZE)
             if req.img_sizes is not None else [QUICK["img"] if req.quick else None])
    warmup = (req.warmup if req.warmup is not None
              else QUICK["warmup"] if req.quick else DEFAULT_WARMUP)
    # with a budget, `steps` is the most the calibration may pick
    steps = req.steps if req.steps is not None else (QUICK["steps"] if req.quick else
                                                     timer.MAX_STEPS)
    if warmup < 0:
        raise UsageError(f"--warmup must be >= 0, got {warmup}")
    if steps < 1:
        raise UsageError(f"--steps must be >= 1, got {steps}")
    if req.threads is not None and not 1 <= req.threads <= 4096:
        raise UsageError(f"--threads must be >= 1, got {req.threads}")
    if req.heap is not None and req.heap not in HEAP_POLICIES:
        raise UsageError(f"--heap must be one of {', '.join(HEAP_POLICIES)}, got '{req.heap}'")
    if max(warmup, steps) > MAX_STEPS:
        raise UsageError(f"--warmup and --steps must be <= {MAX_STEPS}, got {max(warmup, steps)}")
    return batches, sizes, warmup, steps


MAX_TIMEOUT_S = 7 * 24 * 3600.0   # a week: beyond it a timeout is a typo (and 1e10 s overflows
                                  # the platform's time_t in the waits)


def check_timeout(timeout: float) -> None:
    """--timeout as a UsageError up front: nan/inf/<= 0 cannot be waited on, huge values
    overflow the waits deep inside a run."""
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_S):
        raise UsageError(f"--timeout must be seconds in (0, {MAX_TIMEOUT_S:g}], got {timeout:g}")
