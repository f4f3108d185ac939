"""Results files -> pandas.DataFrame, and export to CSV / markdown.

    >>> import fusebench
    >>> df = fusebench.load_results(["results/a.json", "results/b.json"])
    >>> df.groupby(["model", "mode"])["step_ms.median"].min()

One row per record. The record's spec gives the identity columns (model, bench, batch_size,
img_size for model cells; family, impl, shape, direction for kernel cells; dist, nproc,
world_size for distributed ones; mode, dtype, device, ... for all) and a `spec` column with the
whole spec; nested fields are flattened with dots (step_ms.median, correctness.passed,
error.type); extra record keys (gbps, tflops, telemetry, exit_code) become their own columns;
the run's environment is flattened into columns prefixed "env." (env.torch.version,
env.cpu.model, ...); "file" says which document a row came from.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from fusebench.render.escape import cell as safe_cell
from fusebench.errors import UsageError
from fusebench.results.document import load
from fusebench.spec import CellSpec

# Columns of the compact (markdown) export, in this order, when present.
SUMMARY_COLUMNS = ("model", "mode", "impl", "family", "shape", "direction", "bench",
                   "batch_size", "img_size", "channels_last", "dtype", "device", "status",
                   "throughput", "step_ms.median", "step_ms.iqr",
                   "step_ms.n", "compile_s", "peak_mem_bytes", "activation_bytes", "gbps",
                   "correctness.passed", "n_events", "error.type")


def _flatten(d: dict[str, Any], prefix: str = "", out: dict[str, Any] | None = None,
             keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay lists; keys in `keep` are not descended into."""
    out = {} if out is None else out
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key not in keep and v:
            _flatten(v, key + ".", out, keep)
        else:
            out[key] = v
    return out


def _identity(spec: CellSpec) -> dict[str, Any]:
    """Flat identity columns of a spec, by part (model records keep the fusebench/1 order)."""
    m, k, d = spec.model, spec.kernel, spec.dist
    row: dict[str, Any] = {"model": m.name} if m is not None else {"family": k.family}
    row["mode"] = spec.mode
    if m is not None:
        row.update(bench=m.bench, batch_size=m.batch_size, img_size=m.img_size)
    else:
        row.update(impl=k.impl, shape=list(k.shape), direction=k.direction)
    row.update(channels_last=spec.channels_last, dtype=spec.dtype, device=spec.device)
    if d is not None:
        row.update(dist=d.kind, nproc=d.nproc, nnodes=d.nnodes, node_rank=d.node_rank,
                   world_size=d.world_size)
    return row


def _record_row(rec: dict[str, Any]) -> dict[str, Any]:
    """One current-layout record dict -> one flat row."""
    rec = dict(rec)
    events = rec.pop("events", None) or []
    spec = rec.pop("spec")
    extra = rec.pop("extra", None) or {}
    row = {**_identity(CellSpec.from_dict(spec)), **_flatten(rec), **_flatten(extra),
           "spec": spec}
    for k in ("step_ms", "correctness", "error"):
        if rec.get(k) is None:   # keep absent sub-objects from vanishing as one None column
            row.pop(k, None)
    row["events"] = events
    row["n_events"] = sum(int(e.get("count", 1)) for e in events if isinstance(e, dict))
    return row


def _env_columns(env: dict[str, Any]) -> dict[str, Any]:
    cols = _flatten(env or {}, "env.")
    devices = (env or {}).get("gpus", {}).get("devices") if isinstance(env, dict) else None
    if isinstance(devices, list):
        cols["env.gpus.names"] = ", ".join(str(d.get("name", "?")) for d in devices
                                           if isinstance(d, dict))
    return cols


def _paths(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    if isinstance(paths, (str, Path)):
        return [Path(paths)]
    return [Path(p) for p in paths]


def load_results(paths: str | Path | Iterable[str | Path]) -> pd.DataFrame:
    """One row per record of every file; see the module docstring for the columns."""
    rows = []
    for p in _paths(paths):
        doc = load(p, parse=False)     # type-checked; specs are parsed once, below
        env = _env_columns(doc.get("env") or {})
        base = {"file": str(p), "created": doc.get("created")}
        for i, rec in enumerate(doc["records"]):
            try:
                rows.append({**base, **_record_row(rec), **env})
            except (TypeError, ValueError, KeyError) as e:   # what only the dataclasses check
                raise UsageError(f"{p}: record {i} is malformed ({type(e).__name__}: "
                                 f"{' '.join(str(e).split())[:120]})") from None
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    # record columns first, env columns last, in first-seen order
    cols = [c for c in df.columns if not c.startswith("env.")] + \
           [c for c in df.columns if c.startswith("env.")]
    return df[cols]


def _cell_text(v: Any) -> Any:
    """Lists/dicts as JSON so CSV cells stay one value each; text made safe for spreadsheets."""
    if v is None or type(v) in (int, float, bool):      # the common case, first
        return v
    if isinstance(v, (list, tuple, dict)):
        return safe_cell(json.dumps(v, default=str))
    return safe_cell(v)


def to_csv(df: pd.DataFrame) -> str:
    # only non-numeric columns hold text, lists or dicts: numeric columns pass untouched
    out = df.copy(deep=False)
    for col in [c for c in out.columns if not pd.api.types.is_numeric_dtype(out[c])]:
        values = out[col].to_numpy(dtype=object)     # iterating a Series is slow
        out[col] = pd.Series([_cell_text(v) for v in values], index=out.index, dtype=object)
    return out.to_csv(index=False)


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(_cell_text(v))


def to_markdown(df: pd.DataFrame, columns: Iterable[str] | None = None) -> str:
    """A markdown table of the summary columns (or `columns`); no tabulate dependency."""
    from fusebench.render.compare_table import markdown_table

    cols = [c for c in (columns or SUMMARY_COLUMNS) if c in df.columns]
    if df.empty or not cols:
        return markdown_table(cols or ["(no records)"], [])
    rows = [[_fmt(v) for v in rec] for rec in df[cols].itertuples(index=False, name=None)]
    return markdown_table(cols, rows)


EXPORTERS = {"csv": to_csv, "markdown": to_markdown}
