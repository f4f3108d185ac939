"""What `fusebench info` shows of a model: built once (eval mode) and described. It runs the
model's factory, so for a user's file it runs in the probe process (cell/probe.py), never in the
CLI."""
from __future__ import annotations


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
    return {"name": src.name, "origin": src.origin, "family": src.family,
            "description": src.description, "params": count_params(model),
            "train_input_size": train, "infer_input_size": infer,
            "gflops_per_sample": round(gflops, 4), "gflops_bench": bench,
            "gflops_input_size": at, "model_kwargs": model_kwargs or {}}
