"""Results files -> pandas.DataFrame (exported to CSV / markdown by render/export.py).

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

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from fusebench.errors import UsageError
from fusebench.results.document import load
from fusebench.spec import CellSpec

# Columns of the compact (markdown) export, in this order, when present (render/export.py).
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
        row.update(dist=d.strategy, nproc=d.nproc, nnodes=d.nnodes, node_rank=d.node_rank,
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
