"""fusebench kernel FAMILY: bundled and user kernels side by side, each through every mode."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from fusebench.cell.kernel_cell import DIRECTIONS
from fusebench.commands import add_command, choices, guarded
from fusebench.dtypes import DTYPES
from fusebench.kernels import families


Direction = choices("Direction", DIRECTIONS)
Dtype = choices("Dtype", DTYPES)


def kernel_table(records, title: str = "fusebench kernel") -> Table:
    from fusebench.render.run_table import STATUS_STYLE, short_model
    t = Table(title=title, title_justify="left")
    for col in ("impl", "mode", "shape", "dir", "status", "ms (median ± IQR)", "GB/s",
                "% of copy", "saved MB", "max err"):
        t.add_column(col, justify="right" if col not in ("impl", "mode", "status") else "left")
    for r in records:
        x, st = r.extra, r.step_ms
        impl = short_model(str(x.get("impl", "?")))
        if x.get("requested_impl"):
            impl += f" (for {x['requested_impl']})"
        corr = r.correctness
        err = x.get("max_err")
        t.add_row(
            impl, r.mode, "x".join(str(d) for d in x.get("shape", [])), str(x.get("direction", "")),
            f"[{STATUS_STYLE.get(r.status, '')}]{r.status}[/]",
            f"{st.median:.3f} ± {st.iqr:.3f}" if st else "-",
            f"{x['gbps']:.2f}" if x.get("gbps") else "-",
            f"{x['pct_of_copy']:.0f}%" if x.get("pct_of_copy") else "-",
            f"{r.activation_bytes / 1e6:.2f}" if r.activation_bytes is not None else "-",
            ("" if corr is None or corr.passed else "[bold red]FAIL[/] ")
            + (f"{err:.1e}" if err is not None else "-"))
    return t


@guarded
def kernel(
    family: Annotated[str, typer.Argument(
        help=f"Kernel family: {', '.join(families())}.")],
    impl: Annotated[str, typer.Option("--impl", "-i", help="Impls, comma-separated: registered "
                                      "names, path/to/file.py:fn (called like the family's impls: "
                                      "ln2d fn(x, weight, bias, eps), silu fn(x), se_gate "
                                      "fn(x, gate_logits), bias_gelu fn(x, bias)), or 'all'.")]
    = "all",
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
    out: Annotated[Path, typer.Option(help="Folder for the results document.")] = Path("results"),
    no_save: Annotated[bool, typer.Option(
        "--no-save", help="Do not write the results document.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print only the results document "
                                                          "on stdout.")] = False,
):
    """Time kernel impls side by side: GB/s, % of copy bandwidth, saved bytes, correctness."""
    from fusebench.cell.kernel_cell import KernelRequest, plan_kernel
    from fusebench.run.plan import resolve_device
    from fusebench.render.run_table import print_details
    from fusebench.run.session import execute

    req = KernelRequest(family=family, impls=impl, shapes=tuple(shape) if shape else None,
                        sweep=sweep, dtype=dtype.value, channels_last=channels_last,
                        direction=direction.value, modes=mode, device=resolve_device(device),
                        warmup=warmup, steps=steps, seed=seed, timeout=timeout)
    specs = plan_kernel(req)
    code = execute(specs, stem=f"kernel-{family}", out=out, save=not no_save, json_out=json_out,
                   retry_oom=False, argv=sys.argv, table=kernel_table, details=print_details)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    add_command(app, "kernel", kernel)
