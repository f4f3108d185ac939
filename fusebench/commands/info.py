"""fusebench info MODEL: parameters, default input sizes, forward GFLOPs per sample (computed by
models/summary.py; for a user's file in the probe, run/probe.py)."""
from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from fusebench.commands import add_command, choices, guarded
from fusebench.commands.listing import console_for_rows

InfoBench = choices("InfoBench", ("train", "infer"))


def _summary(model: str, model_kwarg: list[str] | None, bench: str,
             img_size: int | None) -> dict:
    """A zoo or timm model is described here; a user file, or any model once plugins are set,
    in the probe (the factory is user code: it never runs in the CLI process)."""
    from fusebench.loading import check_ref
    from fusebench.models.source import parse_model_kwargs
    from fusebench.models.summary import model_summary
    from fusebench.run import probe

    kwargs = parse_model_kwargs(model_kwarg)
    if probe.is_user_model(model):
        check_ref(model, "model", "factory")
    elif not probe.plugins_value():
        probe.load()                                  # drops stand-ins a former run left
        return model_summary(model, kwargs, bench, img_size)
    request = {"model": model, "kwargs": kwargs, "bench": bench, "img_size": img_size}
    return probe.load(summary=request)["summary"]


def _size(size) -> str:
    # a model's own example_inputs are described as text ("int64[1, 16]"), images as C x H x W
    return size if isinstance(size, str) else "x".join(str(v) for v in size)


def info(
    model: Annotated[str, typer.Argument(help="zoo name, timm:NAME or path/to/file.py:factory")],
    model_kwarg: Annotated[list[str] | None, typer.Option(
        "--model-kwarg", "-k", help="KEY=VALUE passed to the model factory (repeatable)")] = None,
    bench: Annotated[InfoBench, typer.Option(
        help="Count the GFLOPs at this bench's default input size.")] = InfoBench("infer"),
    img_size: Annotated[Optional[int], typer.Option(
        "--img-size", min=1, help="Count the GFLOPs at this input side length instead.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Parameters, default train/infer input sizes and forward GFLOPs of a model."""
    s = _summary(model, model_kwarg, bench.value, img_size)
    if as_json:
        print(json.dumps(s, indent=2))
        return
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    where = f"at {_size(s['gflops_input_size'])}, batch 1, forward only" + (
        "" if img_size else f", the {s['gflops_bench']} default")
    for key, value in (("model", s["name"]), ("family", s["family"] or s["origin"]),
                       ("description", s["description"]), ("parameters", f"{s['params']:,}"),
                       ("train input", _size(s["train_input_size"])),
                       ("infer input", _size(s["infer_input_size"])),
                       ("forward GFLOPs/sample", f"{s['gflops_per_sample']:.3f} ({where})")):
        if value:
            table.add_row(key, Text(str(value)))
    console_for_rows().print(table)


def register(app: typer.Typer) -> None:
    add_command(app, "info", guarded(info))
