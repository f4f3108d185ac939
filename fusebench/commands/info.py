"""fusebench info MODEL: parameters, default input sizes, forward GFLOPs per sample."""
from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from fusebench.commands import add_command, guarded
from fusebench.commands.listing import console_for_rows


def model_summary(text: str, model_kwargs: dict[str, str] | None = None) -> dict:
    """Build the model once (eval mode) and describe it; FLOPs at the infer size, batch 1."""
    from fusebench.measure.flops import count_params, forward_gflops_per_sample
    from fusebench.models.source import coerce_kwargs, resolve_model

    src = resolve_model(text)
    kwargs = coerce_kwargs(src.factory, model_kwargs or {})   # timm: factory None, any kwargs
    model = src.build(**kwargs).eval()
    probe = src.example_inputs(model, "infer", 1)
    train = infer = probe.describe()    # the model's own example_inputs, e.g. "int64[1, 16]"
    if probe.image_size is not None:
        train, infer = (list(src.input_size(b, model=model)) for b in ("train", "infer"))
    gflops = forward_gflops_per_sample(model, *probe.args)
    return {"name": src.name, "kind": src.kind, "family": src.family,
            "description": src.description, "params": count_params(model),
            "train_input_size": train, "infer_input_size": infer,
            "gflops_per_sample": round(gflops, 4), "model_kwargs": model_kwargs or {}}


def info(
    model: Annotated[str, typer.Argument(help="zoo name, timm:NAME or path/to/file.py:factory")],
    model_kwarg: Annotated[list[str] | None, typer.Option(
        "--model-kwarg", "-k", help="KEY=VALUE passed to the model factory (repeatable)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Parameters, default train/infer input sizes and forward GFLOPs of a model."""
    from fusebench.models.source import parse_model_kwargs

    s = model_summary(model, parse_model_kwargs(model_kwarg))
    if as_json:
        print(json.dumps(s, indent=2))
        return
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    fmt = lambda size: (size if isinstance(size, str)  # noqa: E731  (example_inputs models)
                        else "x".join(str(v) for v in size))
    for key, value in (("model", s["name"]), ("family", s["family"] or s["kind"]),
                       ("description", s["description"]), ("parameters", f"{s['params']:,}"),
                       ("train input", fmt(s["train_input_size"])),
                       ("infer input", fmt(s["infer_input_size"])),
                       ("forward GFLOPs/sample", f"{s['gflops_per_sample']:.3f} "
                                                 f"(at {fmt(s['infer_input_size'])})")):
        if value:
            table.add_row(key, Text(str(value)))
    console_for_rows().print(table)


def register(app: typer.Typer) -> None:
    add_command(app, "info", guarded(info))
