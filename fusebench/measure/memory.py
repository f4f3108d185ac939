"""Peak memory, honest per process: CUDA allocator peak on GPU, VmHWM on CPU, and the bytes of
tensors saved for backward (unique storages) on any device."""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")


def _status_kib(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes() -> int | None:
    kib = _status_kib("VmRSS")
    return kib * 1024 if kib is not None else None


def hwm_bytes() -> int | None:
    """Peak RSS of this process. ru_maxrss is inherited across fork/exec; VmHWM is not."""
    kib = _status_kib("VmHWM")
    return kib * 1024 if kib is not None else None


def _reset_hwm() -> bool:
    # Writing "5" to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _trim_heap() -> None:
    """Give freed malloc memory back to the OS (glibc), so that what the harness freed before
    a window (a float64 reference, clones) does not stay in the RSS the window starts from."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):   # not glibc: nothing to trim
        pass


class PeakMemory:
    """Call reset() after the model is built, peak() after a measured window: bytes above the
    post-build baseline (weights and framework libraries are not counted). reset_peak() starts
    a new window on the same baseline (the timed steps after the first call and the check)."""

    def __init__(self, device: str | torch.device):
        self.device = torch.device(device)
        self.baseline = 0

    def reset(self) -> None:
        self.reset_peak()
        if self.device.type == "cuda":
            self.baseline = torch.cuda.memory_allocated(self.device)
        else:
            self.baseline = rss_bytes() or 0

    def reset_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _trim_heap()
            _reset_hwm()

    def peak(self) -> int | None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return max(0, torch.cuda.max_memory_allocated(self.device) - self.baseline)
        hwm = hwm_bytes()
        return None if hwm is None else max(0, hwm - self.baseline)

    def total_peak(self) -> int | None:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        return hwm_bytes()


class SavedTensorBytes:
    """Counts unique storages saved for backward inside the context. Storages of `exclude`
    tensors (the parameters) are not activations and are left out."""

    def __init__(self, exclude=()):
        self._exclude = {self._key(t) for t in exclude}
        self._seen: dict[tuple, int] = {}

    @staticmethod
    def _key(t: torch.Tensor) -> tuple:
        s = t.untyped_storage()
        return (t.device.type, t.device.index, s.data_ptr())

    def _pack(self, t):
        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
            try:
                k = self._key(t)
            except (RuntimeError, NotImplementedError):  # e.g. fake/functional tensors
                return t
            if k not in self._exclude:
                self._seen[k] = max(self._seen.get(k, 0), t.untyped_storage().nbytes())
        return t

    @contextlib.contextmanager
    def track(self):
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield self

    @property
    def bytes(self) -> int:
        return sum(self._seen.values())
