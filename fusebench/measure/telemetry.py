"""GPU telemetry during timed steps: a thread samples NVML power, utilisation, SM clock,
temperature and clock-event (throttle) reasons.

    with GpuTelemetry(device_index) as tel:
        ... timed steps ...
    fields = tel.result(samples=steps * batch)   # None when there is no NVML / no GPU

Without NVML (no driver, no nvidia-ml-py) or on a CPU device, the sampler does nothing and
result() returns None: the record simply has no telemetry fields.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

# Bits we name (NVML "clocks event reasons", formerly "throttle reasons"). GpuIdle is left out on
# purpose: an idle GPU between steps is not a throttle.
_REASON_NAMES = (
    ("ApplicationsClocksSetting", "applications_clocks"),
    ("SwPowerCap", "sw_power_cap"),
    ("HwSlowdown", "hw_slowdown"),
    ("SyncBoost", "sync_boost"),
    ("SwThermalSlowdown", "sw_thermal"),
    ("HwThermalSlowdown", "hw_thermal"),
    ("HwPowerBrakeSlowdown", "hw_power_brake"),
    ("DisplayClockSetting", "display_clock"),
)


def _reason_bits() -> dict[int, str]:
    import pynvml
    bits = {}
    for suffix, name in _REASON_NAMES:
        for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
            v = getattr(pynvml, prefix + suffix, None)
            if v is not None:
                bits[int(v)] = name
                break
    return bits


def throttle_reason_names(mask: int) -> list[str]:
    """NVML reason bitmask -> names, e.g. ['sw_power_cap', 'hw_thermal']; [] when none."""
    try:
        bits = _reason_bits()
    except ImportError:
        return [f"0x{mask:x}"] if mask else []
    names = [n for b, n in sorted(bits.items()) if mask & b]
    unknown = mask & ~sum(bits) & ~_idle_bit()
    if unknown:
        names.append(f"other(0x{unknown:x})")
    return names


def _idle_bit() -> int:
    import pynvml
    return int(getattr(pynvml, "nvmlClocksEventReasonGpuIdle",
                       getattr(pynvml, "nvmlClocksThrottleReasonGpuIdle", 1)))


def _device_index(device: str | int | None) -> int | None:
    """'cuda' -> 0, 'cuda:1' -> 1, 1 -> 1, 'cpu' / None -> None (no telemetry)."""
    if device is None:
        return None
    if isinstance(device, int):
        return device
    d = str(device)
    if not d.startswith("cuda"):
        return None
    return int(d.split(":", 1)[1]) if ":" in d else 0


@dataclass
class _Samples:
    t: list[float] = field(default_factory=list)
    power_w: list[float] = field(default_factory=list)
    util: list[float] = field(default_factory=list)
    sm_mhz: list[float] = field(default_factory=list)
    temp_c: list[float] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


class GpuTelemetry:
    """Context manager (or start()/stop()) around the timed steps of one cell."""

    def __init__(self, device_index: str | int | None, interval_s: float = 0.05):
        self.index = _device_index(device_index)
        self.interval_s = interval_s
        self.reason: str | None = None   # why telemetry is off, if it is
        self._nvml = None
        self._handle = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._s = _Samples()
        self._energy0_mj: int | None = None
        self._energy1_mj: int | None = None
        self._t0 = self._t1 = 0.0

    # -- lifecycle ---------------------------------------------------------------------------
    def _init(self) -> bool:
        if self.index is None:
            self.reason = "not a CUDA device"
            return False
        try:
            import pynvml
        except ImportError:
            self.reason = "nvidia-ml-py not installed"
            return False
        try:
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except pynvml.NVMLError as e:
            self.reason = f"NVML: {e}"
            return False
        self._nvml = pynvml
        return True

    def start(self) -> "GpuTelemetry":
        if not self._init():
            return self
        self._energy0_mj = self._energy_mj()
        self._t0 = time.perf_counter()
        self._sample()  # one sample even if the steps are shorter than the interval
        self._thread = threading.Thread(target=self._loop, name="fusebench-nvml", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._t1 = time.perf_counter()
        self._sample()
        self._energy1_mj = self._energy_mj()
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass  # shutdown failing after a good run changes nothing we report

    def __enter__(self) -> "GpuTelemetry":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- sampling ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _q(self, fn, *args):
        try:
            return fn(self._handle, *args)
        except self._nvml.NVMLError:
            return None  # this query is not supported on this GPU: leave that series empty

    def _energy_mj(self) -> int | None:
        # Volta+: millijoules since driver load; exact, unlike integrating sampled power.
        return self._q(self._nvml.nvmlDeviceGetTotalEnergyConsumption)

    def _sample(self) -> None:
        n, s = self._nvml, self._s
        now = time.perf_counter()
        s.t.append(now)
        p = self._q(n.nvmlDeviceGetPowerUsage)
        if p is not None:
            s.power_w.append(p / 1000.0)  # mW -> W
        u = self._q(n.nvmlDeviceGetUtilizationRates)
        if u is not None:
            s.util.append(float(u.gpu))
        c = self._q(n.nvmlDeviceGetClockInfo, n.NVML_CLOCK_SM)
        if c is not None:
            s.sm_mhz.append(float(c))
        tc = self._q(n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU)
        if tc is not None:
            s.temp_c.append(float(tc))
        fn = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or n.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = self._q(fn)
        if mask:
            names = throttle_reason_names(int(mask))
            if names and (not s.events or s.events[-1]["reasons"] != names):
                # record transitions only: one event per change of reasons
                s.events.append({"t_s": round(now - (self._t0 or now), 4), "reasons": names})

    # -- result ------------------------------------------------------------------------------
    def result(self, samples: int | None = None) -> dict[str, Any] | None:
        """Telemetry fields for the record, or None when nothing was measured.
        samples: how many samples (images) the timed steps processed, for energy per sample."""
        if self._nvml is None or not self._s.t:
            return None
        s = self._s
        duration = max(self._t1 - self._t0, 0.0)
        mean = (lambda xs: sum(xs) / len(xs) if xs else None)
        power = mean(s.power_w)
        if self._energy0_mj is not None and self._energy1_mj is not None:
            energy_j = (self._energy1_mj - self._energy0_mj) / 1000.0
            source = "nvml_total_energy"
        elif power is not None:
            energy_j = power * duration
            source = "mean_power_x_time"
        else:
            energy_j, source = None, None
        return {
            "telemetry_samples": len(s.t),
            "power_w_mean": power,
            "energy_j": energy_j,
            "energy_source": source,
            "energy_per_sample_j": (energy_j / samples) if energy_j is not None and samples
            else None,
            "util_mean": mean(s.util),
            "sm_clock_mhz_mean": mean(s.sm_mhz),
            "temp_c_max": max(s.temp_c) if s.temp_c else None,
            "throttle_events": list(s.events),
            # every reason seen while timing, for the table and `compare --metric energy`
            "throttle_reasons": sorted({n for e in s.events for n in e["reasons"]}),
        }
