"""fusebench run MODEL: every mode, isolated per cell, measured honestly."""
from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from fusebench.commands import guarded


class Bench(str, Enum):
    train = "train"
    infer = "infer"
    both = "both"


class Dtype(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class TsMethod(str, Enum):
    script = "script"
    trace = "trace"


class TsFuser(str, Enum):
    default = "default"
    nnc = "nnc"
    nvfuser = "nvfuser"
    none = "none"


class Dist(str, Enum):
    ddp = "ddp"
    fsdp1 = "fsdp1"
    fsdp2 = "fsdp2"


class AotCompiler(str, Enum):
    nop = "nop"
    ts = "ts"


class AotPartitioner(str, Enum):
    default = "default"
    min_cut = "min_cut"


def _value(x):
    return x.value if isinstance(x, Enum) else x


@guarded
def run(
    model: Annotated[str, typer.Argument(help="Model name(s), comma-separated; or "
                                               "path/file.py:factory, or timm:NAME.")],
    mode: Annotated[str, typer.Option("--mode", "-m", help="Modes, comma-separated, or 'all'.")]
    = "all",
    bench: Annotated[Bench, typer.Option(help="train step, inference, or both.")] = Bench.train,
    batch_size: Annotated[Optional[str], typer.Option("--batch-size", "-b",
                                                      help="Batch size(s): 32 or 8,16,32.")]
    = None,
    img_size: Annotated[Optional[str], typer.Option(help="Input side length(s): 224 or "
                                                          "224,288. Default: the model's.")]
    = None,
    channels_last: Annotated[bool, typer.Option("--channels-last")] = False,
    dtype: Annotated[Dtype, typer.Option()] = Dtype.float32,
    amp: Annotated[bool, typer.Option("--amp", help="autocast (bf16 on CPU, fp16 on CUDA).")]
    = False,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    warmup: Annotated[Optional[int], typer.Option(help="Warm-up steps (default 5).")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Timed steps (default 20).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Smoke run: batch 4, 96px, 2+5 "
                                                        "steps.")] = False,
    model_kwarg: Annotated[Optional[list[str]], typer.Option(
        "--model-kwarg", help="KEY=VALUE for the model factory (repeatable).")] = None,
    ts_method: Annotated[TsMethod, typer.Option()] = TsMethod.script,
    ts_fuser: Annotated[TsFuser, typer.Option()] = TsFuser.default,
    aot_compiler: Annotated[AotCompiler, typer.Option()] = AotCompiler.nop,
    aot_partitioner: Annotated[AotPartitioner, typer.Option()] = AotPartitioner.default,
    compile_backend: Annotated[str, typer.Option()] = "inductor",
    compile_mode: Annotated[Optional[str], typer.Option()] = None,
    compile_fallback: Annotated[bool, typer.Option(
        "--compile-fallback", help="Let dynamo fall back to eager on compile errors "
                                   "(recorded as events).")] = False,
    timeout: Annotated[float, typer.Option(help="Per-cell timeout, seconds.")] = 900.0,
    warm_cache: Annotated[bool, typer.Option("--warm-cache", help="Share one compile cache "
                                                                  "(default: cold per cell).")]
    = False,
    no_retry: Annotated[bool, typer.Option("--no-retry", help="Do not retry OOM cells with a "
                                                             "smaller batch.")] = False,
    no_check: Annotated[bool, typer.Option("--no-check", help="Skip correctness vs eager.")]
    = False,
    seed: Annotated[int, typer.Option()] = 0,
    threads: Annotated[Optional[int], typer.Option(
        help="torch.set_num_threads in each worker (default: torch's choice).")] = None,
    nproc: Annotated[Optional[int], typer.Option(
        "--nproc", help="Processes per node for --dist (torchrun).")] = None,
    dist: Annotated[Optional[Dist], typer.Option(
        "--dist", help="Data-parallel wrapper: ddp, fsdp1 (use_orig_params) or fsdp2.")] = None,
    nnodes: Annotated[int, typer.Option("--nnodes", help="Nodes (multi-node --dist).")] = 1,
    node_rank: Annotated[int, typer.Option("--node-rank", help="This node's rank.")] = 0,
    rdzv_endpoint: Annotated[Optional[str], typer.Option(
        "--rdzv-endpoint", help="HOST:PORT of node 0 (default: 127.0.0.1, a free port).")]
    = None,
    out: Annotated[Path, typer.Option(help="Folder for the results document.")] = Path("results"),
    no_save: Annotated[bool, typer.Option("--no-save")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print only the results document "
                                                          "on stdout.")] = False,
):
    """Benchmark MODEL in every requested mode, one isolated worker process per cell."""
    from fusebench.run.plan import RunRequest, plan_run
    from fusebench.run.session import execute

    req = RunRequest(
        models=model, modes=mode, bench=bench.value, batch_sizes=batch_size, img_sizes=img_size,
        channels_last=channels_last, dtype=dtype.value, amp=amp, device=device, warmup=warmup,
        steps=steps, quick=quick, seed=seed, timeout=timeout, check=not no_check, threads=threads,
        model_kwargs=tuple(model_kwarg or ()),
        mode_options={"ts_method": _value(ts_method), "ts_fuser": _value(ts_fuser),
                      "aot_compiler": _value(aot_compiler),
                      "aot_partitioner": _value(aot_partitioner),
                      "compile_backend": compile_backend, "compile_mode": compile_mode,
                      "compile_fallback": compile_fallback},
        dist=_value(dist), nproc=nproc, nnodes=nnodes, node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint)
    specs = plan_run(req)
    code = execute(specs, stem=model.split(",")[0], out=out, save=not no_save,
                   json_out=json_out, warm_cache=warm_cache, retry_oom=not no_retry,
                   argv=sys.argv)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("run")(run)
