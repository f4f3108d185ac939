"""Peak memory, honest per process: CUDA allocator peak on GPU, VmHWM on CPU, and the bytes of
tensors saved for backward (unique storages) on any device."""
from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from fusebench.measure.heap import heap_policy, set_trim_threshold

_STATUS = Path("/proc/self/status")
T = TypeVar("T")


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


def file_rss_bytes() -> int | None:
    """Resident pages mapped from files: shared-library code and data, read-only weights."""
    kib = _status_kib("RssFile")
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


def pin_malloc(policy: str | None = None) -> bool:
    """Fix glibc's malloc thresholds to a named heap policy (heap.py); False without glibc."""
    return heap_policy(policy).apply()


def _in_own_thread(fn: Callable[[], T]) -> T:
    """fn() on a new thread; its exception re-raised here. Returns once the OS thread is
    gone: join() returns when its Python code is done, but glibc releases the thread's stack
    pages only as the thread exits, and until then they count in the RSS (a race that moved
    what the check left behind by 2 MB from run to run)."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:          # handed to the caller
            box["error"] = e
    t = threading.Thread(target=run, name="fusebench-aside")
    t.start()
    t.join()
    task, end = Path(f"/proc/self/task/{t.native_id}"), time.monotonic() + 2.0
    while task.exists() and time.monotonic() < end:
        time.sleep(0.001)
    if "error" in box:
        raise box["error"]
    return box["value"]


class PeakMemory:
    """Call reset() after the model is built, peak() after a measured window: bytes above the
    post-build baseline (weights and framework libraries are not counted). reset_peak() starts
    a new window on the same baseline (the timed steps after the first call and the check)."""

    def __init__(self, device: str | torch.device, heap: str | None = None):
        self.device = torch.device(device)
        self.heap = heap_policy(heap).name
        self.heap_set: bool | None = None   # whether reset() could set it (CPU, glibc)
        self.baseline = 0
        self.file_baseline = 0
        self.harness = 0        # bytes the harness left allocated above the baseline

    def reset(self) -> None:
        if self.device.type == "cpu":
            self.heap_set = pin_malloc(self.heap)
            _trim_heap()
        self.reset_peak()
        if self.device.type == "cuda":
            self.baseline = torch.cuda.memory_allocated(self.device)
        else:
            self.baseline = rss_bytes() or 0
            self.file_baseline = file_rss_bytes() or 0

    def _private(self) -> int:
        """What the harness can leave behind: allocator bytes (CUDA), anonymous RSS (CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.memory_allocated(self.device)
        _trim_heap()
        return (rss_bytes() or 0) - (file_rss_bytes() or 0)

    @contextlib.contextmanager
    def excluded(self):
        """Harness work between windows (the correctness reference): what it leaves allocated
        (caches of a float64 run, ~3 MB for convnext_atto) is not the mode's and is taken out
        of every later peak; it made --no-check change a cell's peak by ~5%."""
        before = self._private()
        try:
            yield
        finally:
            self.harness += max(0, self._private() - before)

    def settle(self) -> None:
        """Before the warm-up: give back what the first call and the check freed, so that the
        warm-up steps grow the heap to the step's own working set and the timed steps start
        from it. A trim right before the timed steps (as reset_peak did) made the first of them
        re-fault that whole working set: ~6,400 minor faults (25 MB) for convnext_atto b4
        96 px, where the steps after it fault none."""
        gc.collect()
        if self.device.type == "cpu":
            _trim_heap()

    def aside(self, fn: Callable[[], T]) -> T:
        """fn() as harness work between windows (the correctness reference), in a thread of its
        own and inside excluded(). glibc gives a new thread its own malloc arena, so the float64
        run's blocks (twice the step's) never enter the heap the timed steps allocate from:
        run on the main thread, they left that heap's layout different from a --no-check run's
        and the timed peak of the same aot convnext_atto cell read 60.0-64.3 MB with the check
        against 60.0-61.3 MB without. The CUDA allocator is shared by threads: same peak rule."""
        def on_device():               # a new thread's current CUDA device is device 0
            with torch.cuda.device(self.device):
                return fn()
        with self.excluded(), self._trimming():
            return _in_own_thread(on_device if self.device.type == "cuda" else fn)

    @contextlib.contextmanager
    def _trimming(self):
        """glibc shrinks a thread's arena only when its free top exceeds the trim threshold,
        which the heap policy sets to 64 MiB or to never: the float64 run's memory would stay
        resident after it (43 MB for convnext_atto b4 64 px). The main thread only waits
        meanwhile, so a low threshold for that time changes nothing of its heap."""
        if self.device.type != "cpu":
            yield
            return
        set_trim_threshold(128 << 10)
        try:
            yield
        finally:
            pin_malloc(self.heap)

    def reset_peak(self) -> None:
        """Start a window here: the peak from now on (CUDA: allocator peak; CPU: VmHWM)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _reset_hwm()

    def peak(self) -> int | None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return max(0, torch.cuda.max_memory_allocated(self.device) - self.baseline
                       - self.harness)
        hwm = hwm_bytes()
        if hwm is None:
            return None
        # Library code the step runs for the first time is paged in from the page cache and
        # counts in the RSS, though it is neither the mode's data nor private. A worker forked
        # from the fork server starts without the parent's file-backed page-table entries (fork
        # does not copy them), so it faults in ~5 MB more of libtorch than a fresh process that
        # touched them while importing: without this, the same cell's peak differed by ~10%
        # between the two launch paths. File pages stay mapped, so their growth until now is
        # what the high-water mark holds of them (a slight underestimate if some came after it).
        grown = max(0, (file_rss_bytes() or 0) - self.file_baseline)
        return max(0, hwm - self.baseline - grown - self.harness)

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
