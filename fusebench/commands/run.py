"""fusebench run MODEL: every mode, isolated per cell, measured honestly.

The command's signature is generated: the general settings are listed once below, and one
option per declared mode option (fusebench.modes.options.ModeOption) is appended, so a new mode
option is on the CLI, in --help and checked without touching this file."""
from __future__ import annotations

import functools
import inspect
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from fusebench.commands import add_command, choices, guarded
from fusebench.dtypes import AMP_DTYPES, MODEL_DTYPES
from fusebench.measure.heap import DEFAULT_HEAP, HEAP_POLICIES
from fusebench.modes import MODES, list_modes
from fusebench.modes.options import DIST_STRATEGIES, ModeOption, all_options
from fusebench.run.plan import BENCHES, DEFAULT_BUDGET_S, RunRequest

Bench = choices("Bench", (*BENCHES, "both"))
Dtype = choices("Dtype", MODEL_DTYPES)
AmpDtype = choices("AmpDtype", AMP_DTYPES)
Dist = choices("Dist", DIST_STRATEGIES)
MODE_OPTIONS = all_options(MODES.resolve(list_modes()))


def _p(name: str, annotation, default, info) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[annotation, info])


_NONE = inspect.Parameter.empty
SETTINGS = (   # --help order; the mode options follow --model-kwarg
    _p("model", str, _NONE, typer.Argument(help="Model name(s), comma-separated; or "
                                                "path/file.py:factory, or timm:NAME.")),
    _p("mode", str, "all", typer.Option("--mode", "-m", help="Modes, comma-separated, or 'all'.")),
    _p("bench", Bench, Bench("train"), typer.Option(help="train step, inference, or both.")),
    _p("batch_size", Optional[str], None, typer.Option(
        "--batch-size", "-b", help="Batch size(s): 32 or 8,16,32. Default: 32 on CUDA; on CPU "
                                   "the largest whose eager step fits --budget / 15.")),
    _p("img_size", Optional[str], None, typer.Option(help="Input side length(s): 224 or "
                                                          "224,288. Default: the model's.")),
    _p("channels_last", bool, False, typer.Option(
        "--channels-last", help="Model and input in channels_last memory format.")),
    _p("dtype", Dtype, Dtype("float32"), typer.Option(help="Model and input dtype.")),
    _p("amp", bool, False, typer.Option("--amp", help="autocast (bf16 on CPU, fp16 on CUDA).")),
    _p("amp_dtype", Optional[AmpDtype], None, typer.Option(
        "--amp-dtype", help="autocast dtype (implies --amp).")),
    _p("device", str, "auto", typer.Option(help="auto, cpu, cuda or cuda:N.")),
    _p("warmup", Optional[int], None, typer.Option(help="Warm-up steps (default 5).")),
    _p("steps", Optional[int], None, typer.Option(
        help="Timed steps; a fixed count replaces the --budget calibration.")),
    _p("budget", Optional[float], None, typer.Option(
        help=f"Seconds of timed steps per cell; the step count is calibrated from the warm-up "
             f"(default {DEFAULT_BUDGET_S:g}).")),
    _p("quick", bool, False, typer.Option("--quick", help="Smoke run: batch 4, 96px, 2+5 "
                                                          "steps.")),
    _p("model_kwarg", Optional[list[str]], None, typer.Option(
        "--model-kwarg", "-k", help="KEY=VALUE for the model factory (repeatable).")),
)
HEAP_HELP = "; ".join(f"{p.name}: {p.short}" + (" (default)" if p.name == DEFAULT_HEAP else "")
                      for p in HEAP_POLICIES.values())
RUNNING = (
    _p("timeout", float, 900.0, typer.Option(help="Per-cell timeout, seconds.")),
    _p("warm_cache", bool, False, typer.Option(
        "--warm-cache", help="Share one compile cache (default: cold per cell).")),
    _p("no_retry", bool, False, typer.Option(
        "--no-retry", help="Do not retry OOM cells with a smaller batch.")),
    _p("no_check", bool, False, typer.Option("--no-check", help="Skip correctness vs eager.")),
    _p("seed", int, 0, typer.Option(help="Seed of the model init and the inputs.")),
    _p("threads", Optional[int], None, typer.Option(
        help="torch.set_num_threads in each worker (default: torch's choice).")),
    _p("heap", Optional[str], None, typer.Option(
        metavar="<" + "|".join(HEAP_POLICIES) + ">",
        help=f"glibc malloc policy of CPU cells' timed steps: {HEAP_HELP}.")),
    _p("repeat", Optional[int], None, typer.Option(
        envvar="FUSEBENCH_REPEAT", help="Worker processes per cell, each with its own warm-up; "
        "compare resamples processes, so runs you compare need >= 3. Default: 3, 1 with "
        "--quick.")),
    _p("interleave", bool, True, typer.Option(
        "--interleave/--sequential", help="With --repeat: start process k of every cell before "
        "process k+1 of any (default), so the machine's drift over minutes hits every cell "
        "alike; --sequential runs each cell's processes back to back.")),
    _p("wait_idle", bool, False, typer.Option(
        "--wait-idle", help="Before each process, wait (up to 5 min) until other processes "
                            "leave the cores idle.")),
)
DISTRIBUTED = (
    _p("nproc", Optional[int], None, typer.Option(
        "--nproc", help="Processes per node for --dist (torchrun).")),
    _p("dist", Optional[Dist], None, typer.Option(
        "--dist", help="Data-parallel wrapper: ddp, fsdp1 (use_orig_params) or fsdp2.")),
    _p("nnodes", int, 1, typer.Option("--nnodes", help="Nodes (multi-node --dist).")),
    _p("node_rank", int, 0, typer.Option("--node-rank", help="This node's rank.")),
    _p("rdzv_endpoint", Optional[str], None, typer.Option(
        "--rdzv-endpoint", help="HOST:PORT of node 0 (default: 127.0.0.1, a free port).")),
)
OUTPUT = (
    _p("out", Path, Path("results"), typer.Option(help="Folder for the results document.")),
    _p("no_save", bool, False, typer.Option(
        "--no-save", help="Do not write the results document (print the table only).")),
    _p("json_out", bool, False, typer.Option(
        "--json", help="Print only the results document on stdout.")),
    _p("wide", bool, False, typer.Option(
        "--wide", help="Every table column, even wider than the terminal.")),
)


def mode_option_param(o: ModeOption) -> inspect.Parameter:
    """One CLI option for a declared mode option. None = not given: the mode's default."""
    text = o.help
    if o.default not in (None, False):     # an absent flag is False: nothing to say
        text += f" Default: {o.default}."
    if o.type is bool:
        flags = o.flag if o.default is False else f"{o.flag}/--no-{o.flag[2:]}"
        return _p(o.name, Optional[bool], None, typer.Option(flags, help=text,
                                                             show_default=False))
    shown = o.shown_choices()
    if callable(o.choices):
        text += f" Choices: {shown}."
    metavar = f"<{shown.replace(', ', '|')}>" if shown and not callable(o.choices) else None
    return _p(o.name, Optional[str], None, typer.Option(o.flag, help=text, metavar=metavar))


def request(p: dict[str, Any]) -> RunRequest:
    """The command's parameters -> the plan's frozen request."""
    return RunRequest(
        models=p["model"], modes=p["mode"], bench=p["bench"].value, batch_sizes=p["batch_size"],
        img_sizes=p["img_size"], channels_last=p["channels_last"], dtype=p["dtype"].value,
        amp=p["amp"],
        amp_dtype=p["amp_dtype"].value if p["amp_dtype"] is not None else None,
        device=p["device"], warmup=p["warmup"], steps=p["steps"],
        budget=p["budget"], quick=p["quick"], seed=p["seed"], timeout=p["timeout"],
        check=not p["no_check"],
        threads=p["threads"], heap=p["heap"], model_kwargs=tuple(p["model_kwarg"] or ()),
        mode_options={name: p[name] for name in MODE_OPTIONS},
        dist=p["dist"].value if p["dist"] is not None else None, nproc=p["nproc"],
        nnodes=p["nnodes"], node_rank=p["node_rank"], rdzv_endpoint=p["rdzv_endpoint"])


@guarded
def run(**params: Any) -> None:
    """Benchmark MODEL in every requested mode, one isolated worker process per cell."""
    from fusebench.run.plan import plan_run
    from fusebench.render.run_table import run_table
    from fusebench.run.session import execute

    from fusebench.run.repeat import resolve_repeat
    req = request(params)
    specs = plan_run(req)
    repeat = resolve_repeat(params["repeat"], params["quick"])
    code = execute(specs, stem=params["model"].split(",")[0], out=params["out"],
                   save=not params["no_save"], json_out=params["json_out"],
                   warm_cache=params["warm_cache"], retry_oom=not params["no_retry"],
                   argv=sys.argv, table=functools.partial(run_table, wide=params["wide"]),
                   prepare=lambda s: fitted(req, s, repeat, params["interleave"]),
                   repeat=repeat,
                   wait_idle=params["wait_idle"], interleave=params["interleave"])
    raise typer.Exit(code)


def left_out(req: RunRequest, specs: list) -> list[str]:
    """`-m all` runs what this device can run: the outline names the modes it left out."""
    from fusebench.modes import MODES
    from fusebench.run.plan import all_modes
    if req.modes.strip() != "all" or not specs:
        return []
    device = specs[0].device
    left = all_modes(device)[1]
    if not left:
        return []
    why = ", ".join(f"{m} (runs on {'/'.join(MODES[m].device_types)})" for m in left)
    return [f"  not in 'all' on {device}: {why}; -m NAME runs it anyway (unavailable, with why)"]


def fitted(req: RunRequest, specs: list, repeat: int = 1, interleave: bool = True
           ) -> tuple[list, list[dict]]:
    """The planned cells with their CPU batch fitted to the budget where the run picks it (and
    per cell the record's `batch_choice`), after printing the run's outline: what it will do
    and roughly how long. Run by the session once every input check has passed."""
    from rich.console import Console

    from fusebench.run import autobatch, outline
    from fusebench.run.plan import fits_batch, timing_budget
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    picks: list = []
    if fits_batch(req, specs):
        budget = timing_budget(req) or req.budget or DEFAULT_BUDGET_S
        specs, picks = autobatch.fit_batches(specs, budget, on_probe=lambda s: err.print(
            f"fitting the CPU batch to the budget: eager probe of {outline.short(s.model.name)}"
            f" at batch {autobatch.PROBE_BATCH}..."))
    for line in outline.describe(specs, picks, repeat, interleave) + left_out(req, specs):
        err.print(line)
    return specs, [{"batch_choice": c.to_dict()} for c in picks] or [{} for _ in specs]


run.__signature__ = inspect.Signature([
    *SETTINGS, *(mode_option_param(o) for o in MODE_OPTIONS.values()), *RUNNING, *DISTRIBUTED,
    *OUTPUT])


def register(app: typer.Typer) -> None:
    add_command(app, "run", run)
