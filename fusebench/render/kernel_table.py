"""Rich table for kernel results: one row per impl x mode x shape x direction."""
from __future__ import annotations

from rich.table import Table

from fusebench.render.escape import markup
from fusebench.render.run_table import STATUS_STYLE, short_model
from fusebench.spec import Record


def _impl(r: Record) -> str:
    """The impl that ran; '(for fused)' when the requested one fell back to it."""
    ran = r.extra.get("ran_impl")
    name = short_model(str(ran or r.spec.kernel.impl))
    return f"{name} (for {r.spec.kernel.impl})" if ran else name


def kernel_table(records: list[Record], title: str = "fusebench kernel") -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("impl", "mode", "shape", "dir", "status", "ms (median ± IQR)", "GB/s",
                "% of copy", "saved MB", "max err"):
        t.add_column(col, justify="right" if col not in ("impl", "mode", "status") else "left")
    for r in records:
        k, x, st, corr = r.spec.kernel, r.extra, r.step_ms, r.correctness
        err = x.get("max_err")
        t.add_row(
            markup(_impl(r)), markup(r.spec.mode), "x".join(str(d) for d in k.shape),
            markup(k.direction),
            f"[{STATUS_STYLE.get(r.status, '')}]{r.status}[/]",
            f"{st.median:.3f} ± {st.iqr:.3f}" if st else "-",
            f"{x['gbps']:.2f}" if x.get("gbps") else "-",
            f"{x['pct_of_copy']:.0f}%" if x.get("pct_of_copy") else "-",
            f"{r.activation_bytes / 1e6:.2f}" if r.activation_bytes is not None else "-",
            ("" if corr is None or corr.passed else "[bold red]FAIL[/] ")
            + (f"{err:.1e}" if err is not None else "-"))
    return t
