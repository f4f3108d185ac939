"""The results document: schema version, atomic save, validated load. JSON only, never pickle.

Every schema version has its reader (READERS: version -> record dict -> Record); `load` reads a
document of any known version and returns it in the current layout, so callers see one format.

  fusebench/1  flat records: model, mode, bench, batch_size, img_size, ... next to extra keys
               (cell: the flat spec; kernel records: family, impl, shape, direction, with the
               family in `model`, the direction in `bench`, N in batch_size, H in img_size).
  fusebench/2  {spec: CellSpec.to_dict(), status, measured fields..., extra: {...}}.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fusebench.errors import UsageError
from fusebench.spec import (STATUSES, CellSpec, DistPart, KernelPart, Record,
                            measured_from_dict, spec_from_v1)

SCHEMA_VERSION = 2
SCHEMA = f"fusebench/{SCHEMA_VERSION}"


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def new_document(env: dict[str, Any], records: list[Record] | None = None,
                 command: list[str] | None = None) -> dict[str, Any]:
    return {"schema": SCHEMA, "created": now_iso(), "command": command or [], "env": env,
            "records": [r.to_dict() for r in records or []]}


def write_atomic(path: Path, text: str) -> None:
    """Temp file in the same folder + fsync + rename: a crash never leaves a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def dumps(doc: dict[str, Any]) -> str:
    # allow_nan=False: NaN/Infinity are not JSON; records must carry None instead.
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def save(doc: dict[str, Any], path: Path) -> Path:
    write_atomic(Path(path), dumps(doc))
    return Path(path)


class ResultsWriter:
    """Keeps the document on disk current: every finished cell is appended and saved atomically,
    so a run killed half-way keeps what it finished."""

    def __init__(self, path: Path | None, env: dict[str, Any], command: list[str] | None = None):
        self.path = Path(path) if path else None
        self.doc = new_document(env, command=command)

    def append(self, record: Record) -> None:
        self.doc["records"].append(record.to_dict())
        if self.path is not None:
            save(self.doc, self.path)

    def records(self) -> list[Record]:
        return [Record.from_dict(r) for r in self.doc["records"]]


# --- readers, one per schema version ------------------------------------------------------------
# Keys every fusebench/1 record carries, in its schema order.
V1_RECORD_KEYS = ("model", "mode", "bench", "batch_size", "img_size", "channels_last", "dtype",
                  "device", "status", "params", "gflops", "throughput", "step_ms", "compile_s",
                  "peak_mem_bytes", "activation_bytes", "events", "correctness", "error")
# fusebench/1 extra keys that were identity (they now live in the spec)
_V1_IDENTITY = ("cell", "family", "impl", "shape", "direction", "requested_impl", "dist",
                "nproc", "nnodes", "node_rank", "rdzv_endpoint", "world_size")


def _v1_spec(d: dict[str, Any]) -> CellSpec:
    """The spec of a v1 record: its `cell` dict when there is one (then the record's own
    batch/size/device win: they are what ran), else rebuilt from the flat fields."""
    cell = d.get("cell")
    if isinstance(cell, dict):
        spec = spec_from_v1(cell)
        if spec.model is not None:
            spec = spec.with_model(batch_size=d["batch_size"], img_size=d["img_size"])
        return dataclasses.replace(spec, device=d["device"])
    common = dict(mode=d["mode"], channels_last=d["channels_last"], dtype=d["dtype"],
                  device=d["device"])
    if "family" in d and "impl" in d and "shape" in d:
        return CellSpec(kernel=KernelPart(d["family"], d.get("requested_impl") or d["impl"],
                                          tuple(d["shape"]), d.get("direction") or d["bench"]),
                        **common)
    dist = (DistPart(d["dist"], int(d["nproc"]), int(d.get("nnodes") or 1),
                     int(d.get("node_rank") or 0)) if d.get("dist") and d.get("nproc") else None)
    return CellSpec.for_model(d["model"], bench=d["bench"], batch_size=d["batch_size"],
                              img_size=d["img_size"], dist=dist, **common)


def _read_v1(d: dict[str, Any]) -> Record:
    missing = [k for k in V1_RECORD_KEYS if k not in d]
    if missing:
        raise KeyError(f"lacks {', '.join(missing)}")
    extra = {k: v for k, v in d.items() if k not in V1_RECORD_KEYS and k not in _V1_IDENTITY}
    if d.get("requested_impl"):          # v1 kept the impl that ran; the spec names the request
        extra["ran_impl"] = d["impl"]
    return Record(spec=_v1_spec(d), **measured_from_dict(d), extra=extra)


def _read_v2(d: dict[str, Any]) -> Record:
    missing = [k for k in ("spec", "status") if k not in d]
    if missing:
        raise KeyError(f"lacks {', '.join(missing)}")
    return Record.from_dict(d)


READERS: dict[int, Callable[[dict[str, Any]], Record]] = {1: _read_v1, 2: _read_v2}


def schema_version(doc: Any, where: str = "results") -> int:
    if not isinstance(doc, dict) or "schema" not in doc:
        raise UsageError(f"{where}: not a fusebench results document (no 'schema' key)")
    schema = doc["schema"]
    if not isinstance(schema, str) or not schema.startswith("fusebench/"):
        raise UsageError(f"{where}: not a fusebench results document (schema {schema!r})")
    try:
        version = int(schema.split("/", 1)[1])
    except ValueError:
        raise UsageError(f"{where}: unreadable schema version {schema!r}") from None
    if version > SCHEMA_VERSION:
        raise UsageError(f"{where}: schema version {version} is newer than this fusebench "
                         f"understands ({SCHEMA_VERSION}); upgrade fusebench")
    if version not in READERS:
        raise UsageError(f"{where}: unsupported schema version {version}")
    return version


def read_record(version: int, d: Any, where: str, i: int) -> Record:
    """One record dict of a document of `version` -> Record; problems are one UsageError."""
    if not isinstance(d, dict):
        raise UsageError(f"{where}: record {i} is not an object")
    if d.get("status") not in STATUSES and "status" in d:
        raise UsageError(f"{where}: record {i} has unknown status {d['status']!r}")
    try:        # nested fields of the wrong shape (events: 5, step_ms: {}) fail here, once
        return READERS[version](d)
    except KeyError as e:
        msg = str(e.args[0]) if e.args else "missing key"
        raise UsageError(f"{where}: record {i} {msg if msg.startswith('lacks') else 'lacks ' + msg}"
                         ) from None
    except (TypeError, ValueError, AttributeError) as e:
        raise UsageError(f"{where}: record {i} is malformed ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:120]})") from None


def validate(doc: Any, where: str = "results") -> dict[str, Any]:
    """Check a document of any known version; returns it in the current layout."""
    version = schema_version(doc, where)
    records = doc.get("records")
    if not isinstance(records, list):
        raise UsageError(f"{where}: 'records' is missing or not a list")
    if not isinstance(doc.get("env", {}), dict):
        raise UsageError(f"{where}: 'env' is not an object")
    parsed = [read_record(version, r, where, i) for i, r in enumerate(records)]
    if version == SCHEMA_VERSION:
        return doc
    return {**doc, "schema": SCHEMA, "schema_read": doc["schema"],
            "records": [r.to_dict() for r in parsed]}


def load(path: str | Path) -> dict[str, Any]:
    """Load and validate one results file; every problem is a UsageError with one clear line."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{path}: no such results file")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read ({e.__class__.__name__})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not valid JSON (truncated or corrupt?): {e.msg} at line "
                         f"{e.lineno}") from None
    return validate(doc, str(path))
