"""fusebench env [--json]: torch build, Python, CPU, OS, GPUs (NVML), modes and kernel impls."""
from __future__ import annotations

import json
import re
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from fusebench.commands import add_command, guarded
from fusebench.errors import UsageError


def _gib(b: Any) -> str:
    return f"{b / 2 ** 30:.1f} GiB" if isinstance(b, (int, float)) else "?"


def _section(t: Table, name: str, d: dict[str, Any], keys: list[tuple[str, str]]) -> None:
    if "error" in d:
        t.add_row(name, f"[red]could not collect: {d['error']}[/red]")
        return
    for label, key in keys:
        v = d.get(key)
        t.add_row(name, f"{label}: {'—' if v is None else v}")
        name = ""


def _load_text(load: dict[str, Any]) -> str:
    """'others busy 97% of 2 cores, steal 0%, load 2.3 / 1.2 / 1.1' (+ a warning when busy)."""
    from fusebench.measure.contention import CONTENDED
    avg = " / ".join("?" if v is None else f"{v:.2f}" for v in
                     (load.get("load1"), load.get("load5"), load.get("load15")))
    text = (f"others busy {load['busy_frac']:.0%} of {load['cpu_count']} cores, steal "
            f"{load['steal_frac']:.0%}, load average {avg}")
    if max(load["busy_frac"], load["steal_frac"]) > CONTENDED:
        text += (" [yellow](busy: timings now would be unreliable; `run --wait-idle` waits "
                 "for quiet)[/yellow]")
    return text


def _render(env: dict[str, Any], console: Console) -> None:
    t = Table(title="fusebench environment", show_header=False, box=None, padding=(0, 2))
    t.add_column(style="bold cyan")
    t.add_column()
    _section(t, "torch", env.get("torch", {}), [
        ("version", "version"), ("git", "git_version"), ("debug build", "debug"),
        ("CUDA", "cuda"), ("cuDNN", "cudnn"), ("ROCm", "rocm"),
        ("CUDA available", "cuda_available"), ("threads", "num_threads"),
        ("interop threads", "num_interop_threads"), ("parallel backend", "parallel"),
        ("LLVM (TorchScript CPU fusion)", "has_llvm"), ("oneDNN", "mkldnn")])
    _section(t, "python", env.get("python", {}), [("version", "version"),
                                                  ("executable", "executable")])
    _section(t, "os", env.get("os", {}), [("platform", "platform")])
    cpu = env.get("cpu", {})
    _section(t, "cpu", cpu, [("model", "model"), ("logical cores", "logical_cores"),
                             ("physical cores", "physical_cores"),
                             ("usable (affinity)", "affinity")])
    mem = env.get("memory", {})
    if "error" in mem:
        _section(t, "memory", mem, [])
    else:
        t.add_row("memory", f"{_gib(mem.get('total_bytes'))} total, "
                            f"{_gib(mem.get('available_bytes'))} available")
    if env.get("load"):
        t.add_row("load", _load_text(env["load"]))
    console.print(t)

    gpus = env.get("gpus", {})
    if "error" in gpus:
        console.print(f"[red]GPUs: could not collect: {gpus['error']}[/red]")
    elif not gpus.get("nvml"):
        console.print(f"no NVIDIA driver found (NVML: {gpus.get('reason', 'unavailable')})",
                      highlight=False)
    else:
        g = Table(title=f"GPUs (driver {gpus.get('driver')})")
        for h in ("#", "name", "memory", "SM MHz", "mem MHz", "power limit", "temp", "throttle"):
            g.add_column(h)
        for d in gpus.get("devices", []):
            pl = d.get("power_limit_w")
            tr = d.get("throttle_reasons")
            g.add_row(str(d.get("index")), str(d.get("name")), _gib(d.get("memory_total_bytes")),
                      f"{d.get('sm_clock_mhz')} / {d.get('sm_clock_max_mhz')}",
                      str(d.get("mem_clock_mhz")), "—" if pl is None else f"{pl:.0f} W",
                      f"{d.get('temperature_c')} °C",
                      "none" if tr == [] else ("?" if tr is None else ", ".join(tr)))
        console.print(g)
    _render_availability(env.get("availability", {}), console)


def _avail_table(title: str, entries: dict[str, Any], console: Console) -> None:
    t = Table(title=title)
    t.add_column("name")
    t.add_column("available")
    t.add_column("reason")
    for name, a in entries.items():
        ok = a.get("available")
        t.add_row(name, "[green]yes[/green]" if ok else "[red]no[/red]", a.get("reason") or "")
    console.print(t)


def _render_availability(av: dict[str, Any], console: Console) -> None:
    modes = av.get("modes", {})
    if "error" in modes:
        console.print(f"[yellow]modes: could not list: {modes['error']}[/yellow]")
    elif modes:
        _avail_table("modes", modes, console)
    kernels = av.get("kernels", {})
    if "error" in kernels:
        console.print(f"[yellow]kernels: could not list: {kernels['error']}[/yellow]")
    else:
        for fam, impls in kernels.items():
            _avail_table(f"kernel {fam} impls", impls, console)


@guarded
def env(
    as_json: Annotated[bool, typer.Option("--json", help="Print the metadata as JSON.")] = False,
    device: Annotated[str, typer.Option(help="Device to check availability for.")] = "cpu",
) -> None:
    """Show what this machine and torch build can do: the metadata every results file embeds."""
    from fusebench.results.env import collect_env

    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise UsageError(f"--device must be cpu, cuda or cuda:N, got '{device}'")
    from fusebench.measure.contention import current_load
    from fusebench.run import probe
    load = current_load(0.5)        # before the probe and collecting: they are not the machine's
    probe.load(device=device)       # plugins' modes and kernel impls are listed too
    data = {**collect_env(availability=True, device=device), "load": load}
    if as_json:
        sys.stdout.write(json.dumps(data, indent=1, default=str) + "\n")
    else:
        _render(data, Console())


def register(app: typer.Typer) -> None:
    add_command(app, "env", env)
