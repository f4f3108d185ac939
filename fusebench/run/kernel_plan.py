"""Kernel cells, coordinator side: `fusebench kernel` arguments -> one CellSpec per impl x mode x
shape (the cell side, which runs one, is cell/kernel_cell.py). Every bad value is a UsageError
here, before any worker starts; a user impl file is imported once, in the probe, to check it."""
from __future__ import annotations

import dataclasses
import math

from fusebench.dtypes import DTYPES
from fusebench.run.plan import check_timeout
from fusebench.errors import UsageError, unknown_name
from fusebench.registry import parse_int_list, parse_list
from fusebench.spec import CellSpec

DIRECTIONS = ("fwd", "bwd", "fwdbwd")
DIMS = "NCHW"


@dataclasses.dataclass(frozen=True)
class KernelRequest:
    family: str
    impls: str = "all"
    shapes: tuple[str, ...] | None = None      # None: the family's default shape
    sweep: str | None = None
    dtype: str = "float32"
    channels_last: bool = False
    direction: str = "fwdbwd"
    modes: str = "eager"
    device: str = "cpu"
    warmup: int = 3
    steps: int = 10
    seed: int = 0
    timeout: float = 900.0


MAX_ELEMENTS = 1 << 31   # per tensor; beyond this a shape is a typo, not a benchmark


def parse_shape(text: str) -> list[int]:
    dims = parse_int_list(text, "shape")
    if len(dims) != 4:
        raise UsageError(f"--shape '{text}': expected 4 comma-separated sizes N,C,H,W")
    if math.prod(dims) > MAX_ELEMENTS:
        raise UsageError(f"--shape '{text}': {math.prod(dims):,} elements is more than the "
                         f"{MAX_ELEMENTS:,} a kernel cell allows")
    return dims


def apply_sweep(shapes: list[list[int]], sweep: str | None) -> list[list[int]]:
    """'C=32,64' -> every shape once per value of C."""
    if not sweep:
        return shapes
    dim, sep, values = sweep.partition("=")
    dim = dim.strip().upper()
    if not sep or dim not in DIMS or len(dim) != 1:
        raise UsageError(f"--sweep '{sweep}': expected DIM=v1,v2,... with DIM one of N, C, H, W")
    vals = parse_int_list(values, f"--sweep {dim}")
    out = []
    for s in shapes:
        for v in vals:
            t = list(s)
            t[DIMS.index(dim)] = v
            out.append(t)
    return out


def user_impls(text: str) -> list[str]:
    """The --impl entries that are files (path/file.py:fn), checked as far as the CLI can
    without running them; the probe imports them (run/probe.py)."""
    from fusebench.kernels.registry import is_user_impl
    from fusebench.loading import check_ref
    refs = [n for n in parse_list(text, "--impl") if is_user_impl(n)]
    for ref in refs:
        check_ref(ref, "user impl", "function")
    return refs


def resolve_impls(family: str, text: str) -> list[str]:
    from fusebench.kernels.registry import family as family_registry
    from fusebench.kernels.registry import is_user_impl
    reg = family_registry(family)
    names = parse_list(text, "--impl")
    if names == ["all"]:
        return reg.names()
    reg.resolve([n for n in names if not is_user_impl(n)])   # every unknown name in one error
    return list(dict.fromkeys(names))


def resolve_modes(text: str) -> list[str]:
    from fusebench.modes import MODES, list_modes
    names = parse_list(text, "--mode")
    if names == ["all"]:
        return list_modes()
    list_modes()
    MODES.resolve(names)
    return list(dict.fromkeys(names))


def plan_kernel(req: KernelRequest) -> list[CellSpec]:
    from fusebench.kernels.registry import families
    from fusebench.run import probe
    check_timeout(req.timeout)
    # plugins and user impl files are loaded in a probe, before the family is looked up (a
    # plugin may add it): fail at planning time, not in a worker
    probe.load(device=req.device, timeout=req.timeout, impls=user_impls(req.impls))
    if req.family not in families():
        raise unknown_name("kernel family", [req.family], families())
    from fusebench.kernels import PROBLEMS
    if req.family not in PROBLEMS:   # a plugin registered impls but no register_problem()
        raise UsageError(f"kernel family '{req.family}' has no registered problem "
                         f"(benchmarkable: {', '.join(PROBLEMS.names())})")
    problem = PROBLEMS[req.family]
    if req.direction not in DIRECTIONS:
        raise UsageError(f"--direction must be one of {', '.join(DIRECTIONS)}, "
                         f"got '{req.direction}'")
    if req.dtype not in DTYPES:
        raise unknown_name("dtype", [req.dtype], DTYPES)
    if req.warmup < 0 or req.steps < 1:
        raise UsageError("--warmup must be >= 0 and --steps >= 1")
    impls = resolve_impls(req.family, req.impls)
    modes = resolve_modes(req.modes)
    shapes = apply_sweep([parse_shape(s) for s in (req.shapes or (problem.default_shape,))],
                         req.sweep)
    specs = []
    for shape in shapes:
        for impl in impls:
            for mode in modes:
                specs.append(CellSpec.for_kernel(
                    req.family, impl, shape, mode, direction=req.direction,
                    channels_last=req.channels_last, dtype=req.dtype, device=req.device,
                    warmup=req.warmup, steps=req.steps, seed=req.seed, timeout=req.timeout))
    return specs

