"""fusebench kernel FAMILY: bundled and user kernels side by side, each through every mode."""
from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from fusebench.run.kernel_plan import DIRECTIONS
from fusebench.commands import add_command, choices, guarded
from fusebench.dtypes import DTYPES
from fusebench.kernels import PROBLEMS, families, get_problem
from fusebench.render.kernel_table import kernel_table


Direction = choices("Direction", DIRECTIONS)
# from the registry: each family's problem says how a user impl is called
_IMPL_HELP = ("Impls, comma-separated: registered names, path/to/file.py:fn (called like the "
              "family's impls: " + "; ".join(f"{f} {get_problem(f).signature}"
                                             for f in PROBLEMS.names()) + "), or 'all'.")
Dtype = choices("Dtype", DTYPES)


@guarded
def kernel(
    family: Annotated[str, typer.Argument(
        help=f"Kernel family: {', '.join(families())}.")],
    impl: Annotated[str, typer.Option("--impl", "-i", help=_IMPL_HELP)] = "all",
    shape: Annotated[Optional[list[str]], typer.Option(
        "--shape", help="N,C,H,W (repeatable). Default: the family's, 8,96,56,56.")] = None,
    sweep: Annotated[Optional[str], typer.Option(help="DIM=v1,v2,... e.g. C=32,64,96,192.")]
    = None,
    dtype: Annotated[Dtype, typer.Option(help="Input and parameter dtype.")] = Dtype("float32"),
    channels_last: Annotated[bool, typer.Option(
        "--channels-last", help="Inputs in channels_last memory format.")] = False,
    direction: Annotated[Direction, typer.Option(help="Time forward, backward or both.")] = (
        Direction("fwdbwd")),
    mode: Annotated[str, typer.Option("--mode", "-m", help="Modes, comma-separated, or 'all'.")]
    = "eager",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    warmup: Annotated[int, typer.Option(help="Warm-up steps.")] = 3,
    steps: Annotated[int, typer.Option(help="Timed steps.")] = 20,
    seed: Annotated[int, typer.Option()] = 0,
    timeout: Annotated[float, typer.Option(help="Per-cell timeout, seconds.")] = 900.0,
    repeat: Annotated[int, typer.Option(help="Worker processes per cell (>= 3 for runs you "
                                              "compare).")] = 1,
    out: Annotated[Path, typer.Option(help="Folder for the results document.")] = Path("results"),
    no_save: Annotated[bool, typer.Option(
        "--no-save", help="Do not write the results document.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print only the results document "
                                                          "on stdout.")] = False,
    wide: Annotated[bool, typer.Option(
        "--wide", help="Every table column, even wider than the terminal.")] = False,
):
    """Time kernel impls side by side: GB/s, % of copy bandwidth, saved bytes, correctness."""
    from fusebench.run.kernel_plan import KernelRequest, plan_kernel
    from fusebench.run.plan import resolve_device
    from fusebench.render.run_table import print_details
    from fusebench.run.session import execute

    req = KernelRequest(family=family, impls=impl, shapes=tuple(shape) if shape else None,
                        sweep=sweep, dtype=dtype.value, channels_last=channels_last,
                        direction=direction.value, modes=mode, device=resolve_device(device),
                        warmup=warmup, steps=steps, seed=seed, timeout=timeout)
    from fusebench.run.repeat import resolve_repeat
    specs = plan_kernel(req)
    repeat = resolve_repeat(repeat, quick=True)
    code = execute(specs, stem=f"kernel-{family}", out=out, save=not no_save, json_out=json_out,
                   retry_oom=False, argv=sys.argv, details=print_details,
                   table=functools.partial(kernel_table, wide=wide), repeat=repeat)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    add_command(app, "kernel", kernel)
