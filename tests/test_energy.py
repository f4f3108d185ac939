"""Energy and clocks per cell from NVML (a fake pynvml): the telemetry fields, their schema
entry, `compare --metric energy`, and a CUDA kernel cell's timing path (fake CUDA backend)
putting telemetry, device time and launch_bound into its record."""
from __future__ import annotations

import json
import sys
import time

import pytest
import torch
from typer.testing import CliRunner

from fusebench.cli import app
from fusebench.measure.events import EventLog
from fusebench.measure.telemetry import GpuTelemetry
from fusebench.results.compare import compare_files
from fusebench.results.schema import check_record
from fusebench.spec import CellSpec
from tests.factories import model_record, write_results
from tests.test_cuda_timing import FakeBackend
from tests.test_env import fake_pynvml


def test_telemetry_reports_energy_clock_and_throttle_reasons_seen(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    with GpuTelemetry("cuda:0", interval_s=0.01) as t:
        time.sleep(0.05)
    r = t.result(samples=10)
    assert r["energy_per_sample_j"] == pytest.approx(r["energy_j"] / 10)
    assert r["sm_clock_mhz_mean"] == 1980.0
    assert r["throttle_reasons"] == ["sw_power_cap"]       # idle bit left out
    rec = model_record(device="cuda", extra=r).to_dict()
    assert check_record(2, rec) is None
    rec["extra"]["energy_per_sample_j"] = "1.5"
    assert check_record(2, rec)[0] == "extra.energy_per_sample_j"


def _energy_records(j_eager, j_cudagraphs):
    return [model_record(mode=m, device="cuda", seed=i, extra={"energy_per_sample_j": j})
            for i, (m, j) in enumerate((("eager", j_eager), ("cudagraphs", j_cudagraphs)))]


def test_compare_metric_energy(tmp_path):
    p = write_results(tmp_path / "e.json", _energy_records(0.004, 0.002))
    cmp = compare_files([p], metric="energy")
    row = next(r for r in cmp.rows if r.variant == "cudagraphs")
    assert row.value == pytest.approx(0.002) and "less energy" in row.verdict
    res = CliRunner().invoke(app, ["compare", str(p), "--metric", "energy", "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["metric"] == "energy"
    values = {r["variant"]: r["value"] for r in doc["rows"] if r.get("variant")}
    assert values["cudagraphs"] == pytest.approx(2.0)          # shown in mJ


def test_compare_energy_without_telemetry_says_so(tmp_path):
    p = write_results(tmp_path / "cpu.json", [model_record(mode=m, seed=i)
                                              for i, m in enumerate(("eager", "compile"))])
    cmp = compare_files([p], metric="energy")
    row = next(r for r in cmp.rows if r.variant == "compile")
    assert row.value is None and "energy" in row.verdict


def test_cuda_kernel_cell_timing_path_with_fakes(monkeypatch):
    """kernel_cell._timed on a 'cuda' spec: the do_bench loop (fake backend), NVML telemetry
    (fake pynvml) and the figures that reach the record."""
    from fusebench.cell import kernel_cell
    from fusebench.measure import cuda_timing
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    be = FakeBackend(capture_ok=False, kernel_ms=0.001)     # device time from the "profiler"
    monkeypatch.setattr(cuda_timing, "Backend", lambda device: be)
    spec = CellSpec.for_kernel("ln2d", "function", (2, 4, 8, 8), direction="fwd",
                               device="cuda:0", steps=3)
    x = torch.randn(2, 4, 8, 8)
    events = EventLog()
    samples, fig = kernel_cell._timed(lambda: time.sleep(0.001), None, x, 4096, spec, events)
    assert len(samples) == 3 and "flush" in be.log
    assert fig["device_time_source"] == "profiler" and fig["device_ms"] == pytest.approx(0.001)
    assert fig["pct_of_copy"] is not None and fig["pct_of_copy_device"] is not None
    assert fig["energy_per_sample_j"] is not None and fig["throttle_reasons"] == ["sw_power_cap"]
    assert events.count("launch_bound") == 1      # ~1 ms steps vs 1 us of "kernels"
