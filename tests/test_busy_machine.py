"""A busy machine shows (issue 13.5): `env` prints the load, the run table marks a cell timed
while others used its cores, other processes on the GPU are seen through NVML."""
from __future__ import annotations

import os
import sys
import types

from rich.console import Console
from typer.testing import CliRunner

from fusebench.cli import app
from fusebench.measure import contention
from fusebench.render.run_table import run_table
from fusebench.results import env as E
from tests.factories import model_record

BUSY = {"window_s": 1.0, "worker_cores": 1, "cpu_count": 2, "others_cpu_s": 0.6,
        "others_frac": 0.6, "steal_frac": 0.0, "load1": 2.5}
_RUN_HEADERS = ["mode", "status", "samples/s", "step ms"]   # the first columns shown here
QUIET = {**BUSY, "others_cpu_s": 0.01, "others_frac": 0.01}


def _text(table) -> str:
    c = Console(record=True, width=200)
    c.print(table)
    return c.export_text()


def test_run_table_marks_the_contended_cell_only():
    recs = [model_record(mode="eager", base_ms=100.0, extra={"contention": BUSY}),
            model_record(mode="compile", base_ms=80.0, seed=1, extra={"contention": QUIET})]
    text = _text(run_table(recs))
    cells = {c[0]: c for c in ([x.strip() for x in line.split("│")[1:-1]]
                               for line in text.splitlines() if line.startswith("│"))}
    step = _RUN_HEADERS.index("step ms")
    assert cells["eager"][step] == f"{recs[0].step_ms.median:.2f}!"
    assert cells["compile"][step] == f"{recs[1].step_ms.median:.2f}"     # no mark
    assert "! eager: machine busy: other processes 60% of 1 core(s)" in text
    assert "? compile vs eager: eager machine busy" in text      # and the ratio is suspect


def test_quiet_run_has_no_busy_footer():
    recs = [model_record(mode="eager", extra={"contention": QUIET})]
    assert "machine busy" not in _text(run_table(recs))


def test_env_shows_the_current_load(monkeypatch):
    monkeypatch.setattr(E, "collect_availability", lambda device="cpu": {})
    monkeypatch.setattr(contention, "current_load", lambda window_s=0.5: {
        "busy_frac": 0.97, "steal_frac": 0.0, "load1": 2.3, "load5": 1.2, "load15": 1.1,
        "cpu_count": 2})
    res = CliRunner().invoke(app, ["env"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "others busy 97% of 2 cores" in res.stdout and "--wait-idle" in res.stdout
    js = CliRunner().invoke(app, ["env", "--json"])
    assert '"busy_frac": 0.97' in js.stdout


def _fake_nvml(pids: list[int]) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.nvmlInit = lambda: None
    m.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in pids]
    m.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []
    return m


def test_gpu_other_processes_through_nvml(monkeypatch):
    me = os.getpid()
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml([me, 4242]))
    g = contention.gpu_other_processes(0)
    assert g == {"others": [{"pid": 4242, "used_memory": 1 << 30}], "self_listed": True}
    fields = {**QUIET, "gpu_processes": g}
    assert contention.is_contended(fields) and "pids 4242" in contention.describe(fields)
    # alone on the card
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml([me]))
    assert not contention.is_contended({**QUIET,
                                        "gpu_processes": contention.gpu_other_processes(0)})
    # another pid namespace (a container): the one entry we cannot match is us
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml([99999]))
    g = contention.gpu_other_processes(0)
    assert not g["self_listed"] and not contention.gpu_shared(g)


def test_no_nvml_is_none(monkeypatch):
    broken = types.ModuleType("pynvml")

    def fail():
        raise RuntimeError("NVML Shared Library Not Found")
    broken.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert contention.gpu_other_processes(0) is None
