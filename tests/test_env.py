"""env metadata, NVML paths (real on this machine: no driver; faked: a GPU) and telemetry."""
from __future__ import annotations

import json
import sys
import time
import types

import pytest
from typer.testing import CliRunner

from tests.factories import fake_env
from fusebench.results import env as E
from fusebench.cli import app
from fusebench.measure.telemetry import GpuTelemetry, throttle_reason_names

runner = CliRunner()


class _NVMLError(Exception):
    pass


def fake_pynvml(fail_init: bool = False) -> types.ModuleType:
    """Enough of pynvml for env and telemetry: one 'H100' drawing 300 W, power-capped."""
    m = types.ModuleType("pynvml")
    m.NVMLError = _NVMLError
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU = 1, 2, 0
    m.nvmlClocksEventReasonGpuIdle = 0x1
    m.nvmlClocksEventReasonSwPowerCap = 0x4
    m.nvmlClocksEventReasonHwThermalSlowdown = 0x40
    state = {"energy": 1_000_000, "inits": 0}

    def init():
        if fail_init:
            raise _NVMLError("Driver Not Loaded")
        state["inits"] += 1

    def energy(h):
        state["energy"] += 300 * 50   # mJ per query: 300 W over 50 ms
        return state["energy"]

    def unsupported(*a):
        raise _NVMLError("Not Supported")

    m.nvmlInit = init
    m.nvmlShutdown = lambda: state.__setitem__("inits", state["inits"] - 1)
    m.nvmlDeviceGetCount = lambda: 1
    m.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 << 30)
    m.nvmlDeviceGetClockInfo = lambda h, which: 1980 if which == m.NVML_CLOCK_SM else 2619
    m.nvmlDeviceGetMaxClockInfo = lambda h, which: 1980
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    m.nvmlDeviceGetTemperature = lambda h, s: 61
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x4 | 0x1
    m.nvmlDeviceGetPowerUsage = lambda h: 300_000
    m.nvmlDeviceGetTotalEnergyConsumption = energy
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=97, memory=40)
    m.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    m.nvmlSystemGetCudaDriverVersion = unsupported
    m.state = state
    return m


def test_collect_env_real_machine():
    env = E.collect_env()
    assert env["torch"]["version"].startswith("2.")
    assert env["python"]["version"].count(".") == 2
    assert env["cpu"]["logical_cores"] >= 1 and env["cpu"]["model"]
    assert env["memory"]["total_bytes"] > 0
    assert "gpus" in env and isinstance(env["gpus"].get("devices", []), list)
    json.dumps(env)                                    # embeddable in a results document
    assert "torch 2." in E.env_summary(env)


def test_failing_step_records_error(monkeypatch):
    def broken():
        raise RuntimeError("no /proc here")
    monkeypatch.setitem(E.COLLECTORS, "cpu", broken)
    env = E.collect_env()
    assert env["cpu"] == {"error": "RuntimeError: no /proc here"}
    assert env["torch"]["version"]


def test_no_driver_is_one_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(fail_init=True))
    g = E.collect_gpus()
    assert g == {"nvml": False, "reason": "Driver Not Loaded", "devices": []}


def test_fake_gpu_collected(monkeypatch):
    fake = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    g = E.collect_gpus()
    assert g["nvml"] and g["driver"] == "550.54.15" and g["cuda_driver"] is None
    (d,) = g["devices"]
    assert d["name"] == "NVIDIA H100 80GB HBM3" and d["power_limit_w"] == 700.0
    assert d["throttle_reasons"] == ["sw_power_cap"]   # GpuIdle is not a throttle
    assert fake.state["inits"] == 0                     # shut down again
    env = fake_env(gpus=g)
    assert "1x NVIDIA H100 80GB HBM3" in E.env_summary(env)


def test_env_differences():
    a = fake_env()
    assert E.env_differences(a, fake_env()) == []
    b = fake_env(**{"torch.version": "2.12.0", "torch.cuda": "12.4"})
    b["gpus"] = {"nvml": True, "devices": [{"name": "NVIDIA A100"}]}
    diffs = E.env_differences(a, b)
    assert any(d.startswith("torch version: 2.13.0+cpu vs 2.12.0") for d in diffs)
    assert any(d.startswith("GPUs: none vs NVIDIA A100") for d in diffs)
    assert not any(d.startswith("CUDA build") for d in diffs)  # None on one side: unknown


def test_availability_tolerates_missing_registry(monkeypatch):
    monkeypatch.setitem(sys.modules, "fusebench.modes", None)   # import fails
    av = E.collect_availability()
    assert "error" in av["modes"]
    assert "kernels" in av


def test_availability_real():
    av = E.collect_availability()
    if "error" not in av["modes"]:
        assert av["modes"]["eager"] == {"available": True, "reason": ""}


# --- telemetry ----------------------------------------------------------------------------------
def test_telemetry_cpu_and_no_nvml_is_none(monkeypatch):
    with GpuTelemetry("cpu") as t:
        pass
    assert t.result(samples=10) is None
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(fail_init=True))
    with GpuTelemetry("cuda:0") as t:
        pass
    assert t.result(samples=10) is None and "Driver Not Loaded" in t.reason


def test_telemetry_with_fake_gpu(monkeypatch):
    fake = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with GpuTelemetry("cuda", interval_s=0.01) as t:
        time.sleep(0.1)
    r = t.result(samples=64)
    assert r["telemetry_samples"] >= 3
    assert r["power_w_mean"] == 300.0 and r["util_mean"] == 97.0
    assert r["sm_clock_mhz_mean"] == 1980.0 and r["temp_c_max"] == 61.0
    assert r["energy_source"] == "nvml_total_energy" and r["energy_j"] == pytest.approx(15.0)
    assert r["energy_per_sample_j"] == pytest.approx(15.0 / 64)
    assert r["throttle_events"] == [{"t_s": 0.0, "reasons": ["sw_power_cap"]}]
    assert fake.state["inits"] == 0
    json.dumps(r)


def test_throttle_reason_names():
    assert throttle_reason_names(0) == []
    names = throttle_reason_names(0x4 | 0x40)
    assert "sw_power_cap" in names and "hw_thermal" in names


# --- CLI ----------------------------------------------------------------------------------------
@pytest.fixture
def quick_availability(monkeypatch):
    """The real availability check imports every mode (functorch alone takes seconds)."""
    monkeypatch.setattr(E, "collect_availability", lambda device="cpu": {
        "modes": {"eager": {"available": True, "reason": ""},
                  "torchscript": {"available": False, "reason": "needs LLVM"}},
        "kernels": {"error": "ModuleNotFoundError: no kernels"}})


def test_cli_env_without_driver(monkeypatch, quick_availability):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(fail_init=True))
    res = runner.invoke(app, ["env"], env={"COLUMNS": "160"})
    assert res.exit_code == 0, res.output
    assert "no NVIDIA driver found (NVML: Driver Not Loaded)" in res.stdout
    assert "needs LLVM" in res.stdout and "torch" in res.stdout


def test_cli_env_json_with_fake_gpu(monkeypatch, quick_availability):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    res = runner.invoke(app, ["env", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["gpus"]["devices"][0]["name"].startswith("NVIDIA H100")
    assert doc["availability"]["modes"]["torchscript"]["available"] is False
    table = runner.invoke(app, ["env"], env={"COLUMNS": "160"})
    assert "NVIDIA H100" in table.stdout and "sw_power_cap" in table.stdout
