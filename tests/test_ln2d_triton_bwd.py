"""The Triton LN2d backward in two launches (ln2d_bwd_kernel: dx + per-program partial sums;
ln2d_bwd_reduce_kernel: the partials summed into the weight's dtype), under TRITON_INTERPRET=1
on CPU tensors: float64-reference accuracy where several position blocks share one program and
the reduction loops over rows and channel blocks, and the launches counted."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the triton kernels are first imported

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fusebench.kernels.ln2d import triton as ln2d_triton
from tests.test_kernels_ln2d import _impl, assert_close, run_and_compare

pytestmark = pytest.mark.skipif(not ln2d_triton.available("cpu")[0],
                                reason=ln2d_triton.available("cpu")[1] or "triton unavailable")

# (shape, TARGET_PROGRAMS, REDUCE_BLOCK_R): target 1 puts every block of a sample in one
# program; 3 leaves a ragged last program (1147 positions = 3 blocks of 512); reduce rows 2
# makes the reduction loop over 3 partial rows with a masked tail; C=129 is 3 reduce programs
CASES = [((2, 3, 7, 5), 1, 64), ((1, 5, 37, 31), 3, 64), ((1, 5, 37, 31), 2048, 2),
         ((2, 129, 3, 5), 1, 64)]


@pytest.mark.parametrize("shape, target, reduce_r", CASES,
                         ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else str(c))
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_backward_matches_float64_reference(shape, target, reduce_r, layout, monkeypatch):
    fn = _impl("triton")
    monkeypatch.setattr(ln2d_triton, "TARGET_PROGRAMS", target)
    monkeypatch.setattr(ln2d_triton, "REDUCE_BLOCK_R", reduce_r)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3)) * 2 + 1
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    assert_close(run_and_compare(fn, x), 1e-4)


def test_bwd_grid_groups_blocks_once_samples_fill_the_gpu():
    assert ln2d_triton.bwd_grid(N=2, HW=3136, block_hw=32) == (98, 2, 1)
    progs, n, per_prog = ln2d_triton.bwd_grid(N=32, HW=3136, block_hw=32)   # 32x96x56x56
    assert (n, per_prog) == (32, 2) and progs * per_prog >= 98 and progs * n <= 2048


class _Ops(TorchDispatchMode):
    """aten ops run outside the Triton kernels (allocations aside): each would be a launch."""
    ALLOC = {"empty", "empty_like", "empty_strided", "detach", "alias", "view"}

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if not self.paused and name not in self.ALLOC:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


class _Counted:
    def __init__(self, kernel, launches: list, ops: _Ops, name: str):
        self.kernel, self.launches, self.ops, self.name = kernel, launches, ops, name

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(self.name)
            self.ops.paused = True          # the interpreter's own tensor work is the kernel
            try:
                return self.kernel[grid](*args, **kwargs)
            finally:
                self.ops.paused = False
        return launch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_is_two_launches(dtype, monkeypatch):
    k = ln2d_triton._kernels()
    launches, ops = [], _Ops()
    for name in ("ln2d_fwd_kernel", "ln2d_bwd_kernel", "ln2d_bwd_reduce_kernel"):
        monkeypatch.setattr(k, name, _Counted(getattr(k, name), launches, ops, name))
    x = torch.randn(2, 6, 5, 7, dtype=dtype)
    w, b = torch.ones(6, dtype=dtype), torch.zeros(6, dtype=dtype)
    y, mean, rstd = ln2d_triton.ln2d_triton_fwd(x, w, b, 1e-6)
    dy = torch.randn_like(y)
    launches.clear()
    with ops:
        dx, dw, db = ln2d_triton.ln2d_triton_bwd(dy, x, w, mean, rstd)
    assert launches == ["ln2d_bwd_kernel", "ln2d_bwd_reduce_kernel"]
    assert ops.ops == [], f"torch ops besides the two kernels: {ops.ops}"
    assert dw.dtype == db.dtype == dtype and dx.dtype == dtype
