"""Rich table for kernel results: one row per impl x mode x shape x direction."""
from __future__ import annotations

from fusebench.render.escape import markup as escape

from fusebench.render.fit import Column, FitTable
from fusebench.render.names import display_name, shared_title
from fusebench.render.run_table import STATUS_STYLE
from fusebench.spec import Record


def _impl(r: Record) -> str:
    """The impl that ran; '(for fused)' when the requested one fell back to it."""
    ran = r.extra.get("ran_impl")
    name = display_name(str(ran or r.spec.kernel.impl))
    return f"{name} (for {r.spec.kernel.impl})" if ran else name


# header, justify, drop priority (0: always shown, higher: dropped first at narrow widths)
# shape/dir/mode are shown only when they differ between rows: then they tell rows apart
_KERNEL_COLUMNS = [("impl", "left", 0), ("mode", "left", 0), ("shape", "right", 0),
                   ("dir", "left", 0), ("status", "left", 0), ("ms", "right", 0),
                   ("± IQR", "right", 4), ("GB/s", "right", 1), ("% of copy", "right", 3),
                   ("device ms", "right", 2), ("dev % copy", "right", 3),
                   ("saved MB", "right", 2), ("max err", "right", 1)]
# CUDA cells only (measure/cuda_timing.py): the step's device time, graph-replayed or profiled
_DEVICE_COLUMNS = ("device ms", "dev % copy")


def _kernel_cells(r: Record) -> list[str]:
    k, x, st, corr = r.spec.kernel, r.extra, r.step_ms, r.correctness
    err = x.get("max_err")
    return [escape(_impl(r)), escape(r.spec.mode), "x".join(str(d) for d in k.shape),
            k.direction, f"[{STATUS_STYLE.get(r.status, '')}]{r.status}[/]",
            f"{st.median:.3f}" if st else "-", f"± {st.iqr:.3f}" if st else "-",
            f"{x['gbps']:.2f}" if x.get("gbps") else "-",
            f"{x['pct_of_copy']:.0f}%" if x.get("pct_of_copy") else "-",
            f"{x['device_ms']:.3f}" if x.get("device_ms") is not None else "-",
            f"{x['pct_of_copy_device']:.0f}%" if x.get("pct_of_copy_device") else "-",
            f"{r.activation_bytes / 1e6:.2f}" if r.activation_bytes is not None else "-",
            ("" if corr is None or corr.passed else "[bold red]FAIL[/] ")
            + (f"{err:.1e}" if err is not None else "-")]


def kernel_table(records: list[Record], title: str = "fusebench kernel", wide: bool = False):
    """The kernel table (a FitTable); family, shape, direction and mode go in the title when
    every row shares them."""
    rows = [_kernel_cells(r) for r in records]
    fields = {"family": [escape(r.spec.subject) for r in records],
              "shape": [row[2] for row in rows], "dir": [row[3] for row in rows],
              "mode": [row[1] for row in rows]}
    title, same = shared_title(title, fields)
    if not any(r.extra.get("device_ms") is not None for r in records):
        same = {*same, *_DEVICE_COLUMNS}
    keep = [i for i, (h, _, _) in enumerate(_KERNEL_COLUMNS) if h not in same]
    cols = [Column(h, j, d, fold=h in ("impl", "mode")) for h, j, d in _KERNEL_COLUMNS]
    t = FitTable([cols[i] for i in keep], title=title, wide=wide)
    for row in rows:
        t.add_row(*[row[i] for i in keep])
    return t
