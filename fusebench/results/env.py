"""Environment metadata, gathered by small collect_* steps (pyperf _metadata.py style).

Every step is wrapped: a step that fails records {"error": "..."} instead of raising, so a broken
NVML or an odd /proc never stops a benchmark. The same dict is embedded in every results document.
"""
from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from typing import Any


def _step(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one collect_* step; a failure becomes its error string, never an exception."""
    try:
        return fn()
    except Exception as e:  # metadata must never break a run: record what went wrong
        return {"error": f"{e.__class__.__name__}: {e}"}


def collect_torch() -> dict[str, Any]:
    import torch

    cudnn = None
    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # cudnn probing can raise on broken installs; None means "unknown/absent"
        cudnn = None
    return {
        "version": torch.__version__,
        "git_version": getattr(torch.version, "git_version", None),
        "debug": bool(getattr(torch.version, "debug", False)),
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "rocm": getattr(torch.version, "hip", None),
        "cuda_available": torch.cuda.is_available(),
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "parallel": _parallel_backend(torch.__config__.parallel_info()),
        "has_llvm": _has_llvm(torch),
        "mkldnn": bool(torch.backends.mkldnn.is_available()),
    }


def _parallel_backend(info: str) -> str:
    """The backend line of parallel_info(): 'OpenMP 201511 ...' or 'native thread pool'."""
    for line in info.splitlines():
        s = line.strip()
        if s and not s.startswith(("ATen/Parallel", "at::", "omp_", "mkl_")):
            return s
    return "unknown"


def _has_llvm(torch) -> bool | None:
    """CPU TorchScript fusion needs LLVM; None when this build cannot tell us."""
    fn = getattr(torch._C, "_llvm_enabled", None)
    return bool(fn()) if fn is not None else None


def collect_python() -> dict[str, Any]:
    return {"version": platform.python_version(),
            "implementation": platform.python_implementation(), "executable": sys.executable}


def collect_os() -> dict[str, Any]:
    u = platform.uname()
    return {"system": u.system, "release": u.release, "machine": u.machine,
            "platform": platform.platform(), "hostname": u.node}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: fall through to platform.processor()
    return platform.processor() or platform.machine() or "unknown"


def collect_cpu() -> dict[str, Any]:
    import psutil

    d: dict[str, Any] = {"model": _cpu_model(), "logical_cores": psutil.cpu_count(logical=True),
                         "physical_cores": psutil.cpu_count(logical=False)}
    if hasattr(os, "sched_getaffinity"):
        d["affinity"] = len(os.sched_getaffinity(0))
    return d


def collect_memory() -> dict[str, Any]:
    import psutil

    vm = psutil.virtual_memory()
    return {"total_bytes": int(vm.total), "available_bytes": int(vm.available)}


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _nvml_call(fn, *args):
    """One NVML query; 'not supported' on this GPU is None, not a failure."""
    import pynvml
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def collect_gpus() -> dict[str, Any]:
    """GPUs via NVML. Without an NVIDIA driver: {"nvml": False, "reason": ...} and no devices."""
    try:
        import pynvml
    except ImportError as e:
        return {"nvml": False, "reason": f"nvidia-ml-py not installed ({e})", "devices": []}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return {"nvml": False, "reason": str(e), "devices": []}
    try:
        from fusebench.measure.telemetry import throttle_reason_names

        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = _nvml_call(pynvml.nvmlDeviceGetMemoryInfo, h)
            plimit = _nvml_call(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
            reasons = _nvml_call(_clock_event_reasons, h)
            devices.append({
                "index": i,
                "name": _s(pynvml.nvmlDeviceGetName(h)),
                "memory_total_bytes": int(mem.total) if mem else None,
                "sm_clock_mhz": _nvml_call(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
                "mem_clock_mhz": _nvml_call(pynvml.nvmlDeviceGetClockInfo, h,
                                            pynvml.NVML_CLOCK_MEM),
                "sm_clock_max_mhz": _nvml_call(pynvml.nvmlDeviceGetMaxClockInfo, h,
                                               pynvml.NVML_CLOCK_SM),
                "power_limit_w": plimit / 1000.0 if plimit is not None else None,  # mW -> W
                "temperature_c": _nvml_call(pynvml.nvmlDeviceGetTemperature, h,
                                            pynvml.NVML_TEMPERATURE_GPU),
                "throttle_reasons": throttle_reason_names(reasons) if reasons is not None else None,
            })
        return {"nvml": True, "driver": _s(pynvml.nvmlSystemGetDriverVersion()),
                "cuda_driver": _nvml_call(pynvml.nvmlSystemGetCudaDriverVersion),
                "devices": devices}
    finally:
        pynvml.nvmlShutdown()


def _clock_event_reasons(handle) -> int:
    import pynvml
    fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
        or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return fn(handle)


def collect_availability(device: str = "cpu") -> dict[str, Any]:
    """Modes and kernel impls available here, each with its reason; tolerant of either registry
    failing to import (a broken plugin must not cost the whole env)."""
    return {"modes": _step(lambda: _modes_availability(device)),
            "kernels": _step(lambda: _kernels_availability(device))}


def _modes_availability(device: str) -> dict[str, Any]:
    from fusebench.modes import get_mode, list_modes

    out = {}
    for name in list_modes():
        try:
            ok, reason = get_mode(name).available({}, device)
        except Exception as e:  # one broken mode must not hide the others
            ok, reason = False, f"availability check failed: {e.__class__.__name__}: {e}"
        out[name] = {"available": bool(ok), "reason": reason or ""}
    return out


def _kernels_availability(device: str) -> dict[str, Any]:
    from fusebench.kernels import families, get_impl, list_impls

    out: dict[str, Any] = {}
    for fam in families():
        out[fam] = {}
        for name in list_impls(fam):
            try:
                ok, reason = get_impl(fam, name).available(device)
            except Exception as e:  # same: report, don't raise
                ok, reason = False, f"availability check failed: {e.__class__.__name__}: {e}"
            out[fam][name] = {"available": bool(ok), "reason": reason or ""}
    return out


# name -> step; collect_env runs them in this order.
COLLECTORS: dict[str, Callable[[], dict[str, Any]]] = {
    "torch": collect_torch,
    "python": collect_python,
    "os": collect_os,
    "cpu": collect_cpu,
    "memory": collect_memory,
    "gpus": collect_gpus,
}


def collect_env(availability: bool = False, device: str = "cpu") -> dict[str, Any]:
    """The env metadata dict embedded in results documents. availability=True adds the modes and
    kernel impls table (slower: imports every mode)."""
    from fusebench.version import __version__

    env: dict[str, Any] = {"fusebench": __version__}
    for name, fn in COLLECTORS.items():
        env[name] = _step(fn)
    if availability:
        env["availability"] = collect_availability(device)
    return env


def _get(env: dict[str, Any], path: str, default: Any = None) -> Any:
    cur: Any = env
    for k in path.split("."):
        if not isinstance(cur, dict) or k not in cur:
            return default
        cur = cur[k]
    return cur


def gpu_names(env: dict[str, Any]) -> list[str]:
    devs = _get(env, "gpus.devices", []) or []
    return [d.get("name", "?") for d in devs if isinstance(d, dict)]


def env_summary(env: dict[str, Any] | None) -> str:
    """One line for plot footnotes and table captions."""
    if not env:
        return "environment unknown"
    parts = []
    tv = _get(env, "torch.version")
    if tv:
        build = [f"CUDA {_get(env, 'torch.cuda')}"] if _get(env, "torch.cuda") else []
        if _get(env, "torch.rocm"):
            build.append(f"ROCm {_get(env, 'torch.rocm')}")
        parts.append(f"torch {tv}" + (f" ({', '.join(build)})" if build else ""))
    if _get(env, "python.version"):
        parts.append(f"Python {_get(env, 'python.version')}")
    cpu = _get(env, "cpu.model")
    if cpu:
        cores = _get(env, "cpu.logical_cores")
        threads = _get(env, "torch.num_threads")
        extra = ", ".join(x for x in (f"{cores} cores" if cores else "",
                                      f"{threads} threads" if threads else "") if x)
        parts.append(f"{cpu}" + (f" ({extra})" if extra else ""))
    gpus = gpu_names(env)
    if gpus:
        uniq = sorted(set(gpus))
        parts.append(", ".join(f"{gpus.count(g)}x {g}" for g in uniq)
                     + (f", driver {_get(env, 'gpus.driver')}" if _get(env, "gpus.driver") else ""))
    if _get(env, "os.system"):
        parts.append(f"{_get(env, 'os.system')} {_get(env, 'os.release', '')}".strip())
    return " | ".join(parts) if parts else "environment unknown"


# (label, path) pairs whose difference makes two runs hard to compare.
_COMPARABLE = (
    ("torch version", "torch.version"),
    ("torch git version", "torch.git_version"),
    ("torch debug build", "torch.debug"),
    ("CUDA build", "torch.cuda"),
    ("cuDNN", "torch.cudnn"),
    ("ROCm build", "torch.rocm"),
    ("torch threads", "torch.num_threads"),
    ("CPU model", "cpu.model"),
    ("logical cores", "cpu.logical_cores"),
    ("NVIDIA driver", "gpus.driver"),
    ("Python", "python.version"),
    ("host", "os.hostname"),
)


def env_differences(env_a: dict[str, Any] | None, env_b: dict[str, Any] | None) -> list[str]:
    """Human lines for every comparability-relevant difference; [] when they match (or either
    side is missing the field, which is not evidence of a difference)."""
    env_a, env_b = env_a or {}, env_b or {}
    out = []
    for label, path in _COMPARABLE:
        a, b = _get(env_a, path), _get(env_b, path)
        if a is not None and b is not None and a != b:
            out.append(f"{label}: {a} vs {b}")
    ga, gb = gpu_names(env_a), gpu_names(env_b)
    if (ga or gb) and ga != gb:
        out.append(f"GPUs: {', '.join(ga) or 'none'} vs {', '.join(gb) or 'none'}")
    return out
