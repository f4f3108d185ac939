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

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from fusebench.errors import UsageError
from fusebench.results.bulk import paused_gc
from fusebench.results.document import load_checked
from fusebench.spec import PARTS, CellSpec

if TYPE_CHECKING:      # imported where a DataFrame is built: the CSV export needs none (~0.5 s)
    import pandas as pd

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


def _defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING}


_DEFAULTS = {"spec": _defaults(CellSpec), **{k: _defaults(c) for k, c in PARTS.items()}}


def _identity_exact(spec: dict[str, Any]) -> dict[str, Any]:
    """_identity of a spec dict of an exact document (schema.parse_exact: one part, known keys,
    right types), read from the dict: no CellSpec per row (100,000 rows)."""
    m, k, d = spec.get("model"), spec.get("kernel"), spec.get("dist")
    dm, dk, dd, ds = (_DEFAULTS[x] for x in ("model", "kernel", "dist", "spec"))
    row: dict[str, Any] = {"model": m["name"]} if m else {"family": k["family"]}
    row["mode"] = spec["mode"]
    if m:
        row.update(bench=m.get("bench", dm["bench"]),
                   batch_size=m.get("batch_size", dm["batch_size"]),
                   img_size=m.get("img_size", dm["img_size"]))
    else:
        row.update(impl=k["impl"], shape=list(k["shape"]),
                   direction=k.get("direction", dk["direction"]))
    row.update(channels_last=spec.get("channels_last", ds["channels_last"]),
               dtype=spec.get("dtype", ds["dtype"]), device=spec.get("device", ds["device"]))
    if d:
        nproc, nnodes = d["nproc"], d.get("nnodes", dd["nnodes"])
        row.update(dist=d.get("strategy", d.get("kind")), nproc=nproc, nnodes=nnodes,
                   node_rank=d.get("node_rank", dd["node_rank"]), world_size=nproc * nnodes)
    return row


def _record_row(rec: dict[str, Any], exact: bool = False) -> dict[str, Any]:
    """One current-layout record dict -> one flat row. exact: the document passed
    schema.parse_exact, so the spec needs no CellSpec to vouch for it."""
    rec = dict(rec)
    events = rec.pop("events", None) or []
    spec = rec.pop("spec")
    extra = rec.pop("extra", None) or {}
    ident = _identity_exact(spec) if exact else _identity(CellSpec.from_dict(spec))
    row = {**ident, **_flatten(rec), **_flatten(extra), "spec": spec}
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


def as_paths(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    if isinstance(paths, (str, Path)):
        return [Path(paths)]
    return [Path(p) for p in paths]


class FileRows(NamedTuple):
    """One file's rows, before any DataFrame: what load_results and the CSV export share."""
    rows: list[dict[str, Any]]      # one flat dict per record
    columns: list[str]              # the rows' keys, in first-seen order
    head: dict[str, Any]            # constant columns put first: file, created
    env: dict[str, Any]             # constant env columns put last (those the rows lack)


def _first_seen(rows: list[dict[str, Any]]) -> list[str]:
    """Every key of the rows in first-seen order (pandas' column order for a list of dicts);
    rows mostly share one key order, so each distinct order is merged once."""
    orders = dict.fromkeys(tuple(r) for r in rows)
    return list(dict.fromkeys(k for keys in orders for k in keys))


def file_rows(p: Path) -> FileRows:
    """One file's rows; its env columns are constants, kept once, not copied per row."""
    with paused_gc():
        return _file_rows(p)


def _file_rows(p: Path) -> FileRows:
    doc, exact = load_checked(p)     # type-checked; specs are parsed once, below
    rows, records = [], doc.pop("records")
    for i, rec in enumerate(records):
        try:
            rows.append(_record_row(rec, exact))
        except (TypeError, ValueError, KeyError) as e:   # what only the dataclasses check
            raise UsageError(f"{p}: record {i} is malformed ({type(e).__name__}: "
                             f"{' '.join(str(e).split())[:120]})") from None
        records[i] = None   # the row holds what it needs: one copy of the file in memory
    columns = _first_seen(rows)
    have = set(columns)
    env = {k: v for k, v in _env_columns(doc.get("env") or {}).items() if k not in have}
    return FileRows(rows, columns, {"file": str(p), "created": doc.get("created")}, env)


def _file_frame(p: Path) -> pd.DataFrame:
    import pandas as pd
    rows, _, head, env = file_rows(p)
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows)
    df.insert(0, "created", head["created"])
    df.insert(0, "file", head["file"])
    if env:     # a list or dict in env stays one value per row (an object column)
        df = pd.concat([df, pd.DataFrame({
            k: pd.Series([v] * len(df), dtype=object if isinstance(v, (list, dict)) else None)
            for k, v in env.items()})], axis=1)
    return df


def ordered_columns(columns: Iterable[str]) -> list[str]:
    """Record columns first, env columns last, each in first-seen order."""
    cols = list(columns)
    return [c for c in cols if not c.startswith("env.")] + [c for c in cols
                                                             if c.startswith("env.")]


def load_results(paths: str | Path | Iterable[str | Path]) -> pd.DataFrame:
    """One row per record of every file; see the module docstring for the columns."""
    with paused_gc():
        return _load_results(paths)


def _load_results(paths: str | Path | Iterable[str | Path]) -> pd.DataFrame:
    import pandas as pd
    frames = [f for f in (_file_frame(p) for p in as_paths(paths)) if not f.empty]
    if not frames:
        return pd.DataFrame()
    df = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True, sort=False)
    return df[ordered_columns(df.columns)]
