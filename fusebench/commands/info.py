"""fusebench info MODEL: parameters, default input sizes, forward GFLOPs per sample."""
from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from fusebench.commands import add_command, choices, guarded
from fusebench.commands.listing import console_for_rows

InfoBench = choices("InfoBench", ("train", "infer"))


def model_summary(text: str, model_kwargs: dict[str, str] | None = None,
                  bench: str = "infer", img_size: int | None = None) -> dict:
    """Build the model once (eval mode) and describe it; forward FLOPs at batch 1 and the
    input of `bench` (img_size overrides H and W), said in gflops_input_size. A model with its
    own example_inputs() shows those (e.g. "int64[1, 16]") instead of image sizes."""
    from fusebench.measure.flops import count_params, forward_gflops_per_sample
    from fusebench.models.source import coerce_kwargs, resolve_model

    src = resolve_model(text)
    kwargs = coerce_kwargs(src.factory, model_kwargs or {})   # timm: factory None, any kwargs
    model = src.build(**kwargs).eval()
    probe = src.example_inputs(model, bench, 1, img_size)
    train = infer = at = probe.describe()
    if probe.image_size is not None:
        train, infer = (list(src.input_size(b, model=model)) for b in ("train", "infer"))
        at = list(probe.image_size)
    gflops = forward_gflops_per_sample(model, *probe.args)
    return {"name": src.name, "kind": src.kind, "family": src.family,
            "description": src.description, "params": count_params(model),
            "train_input_size": train, "infer_input_size": infer,
            "gflops_per_sample": round(gflops, 4), "gflops_bench": bench,
            "gflops_input_size": at, "model_kwargs": model_kwargs or {}}


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
    from fusebench.models.source import parse_model_kwargs

    s = model_summary(model, parse_model_kwargs(model_kwarg), bench.value, img_size)
    if as_json:
        print(json.dumps(s, indent=2))
        return
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    where = f"at {_size(s['gflops_input_size'])}, batch 1, forward only" + (
        "" if img_size else f", the {s['gflops_bench']} default")
    for key, value in (("model", s["name"]), ("family", s["family"] or s["kind"]),
                       ("description", s["description"]), ("parameters", f"{s['params']:,}"),
                       ("train input", _size(s["train_input_size"])),
                       ("infer input", _size(s["infer_input_size"])),
                       ("forward GFLOPs/sample", f"{s['gflops_per_sample']:.3f} ({where})")):
        if value:
            table.add_row(key, Text(str(value)))
    console_for_rows().print(table)


def register(app: typer.Typer) -> None:
    add_command(app, "info", guarded(info))
