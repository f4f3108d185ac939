"""The results document: schema version, atomic save, validated load. JSON only, never pickle."""
from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from fusebench.errors import UsageError
from fusebench.spec import RECORD_KEYS, STATUSES, Record

SCHEMA = "fusebench/1"
SCHEMA_VERSION = 1


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


def validate(doc: Any, where: str = "results") -> dict[str, Any]:
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
    if version < 1:
        raise UsageError(f"{where}: unsupported schema version {version}")
    records = doc.get("records")
    if not isinstance(records, list):
        raise UsageError(f"{where}: 'records' is missing or not a list")
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise UsageError(f"{where}: record {i} is not an object")
        missing = [k for k in RECORD_KEYS if k not in r]
        if missing:
            raise UsageError(f"{where}: record {i} lacks {', '.join(missing)}")
        if r["status"] not in STATUSES:
            raise UsageError(f"{where}: record {i} has unknown status {r['status']!r}")
        try:        # nested fields of the wrong shape (events: 5, step_ms: {}) fail here, once
            Record.from_dict(r)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise UsageError(f"{where}: record {i} is malformed ({type(e).__name__}: "
                             f"{' '.join(str(e).split())[:120]})") from None
    if not isinstance(doc.get("env", {}), dict):
        raise UsageError(f"{where}: 'env' is not an object")
    return doc


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


def load_records(path: str | Path) -> list[Record]:
    try:
        return [Record.from_dict(r) for r in load(path)["records"]]
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, UsageError):
            raise
        raise UsageError(f"{path}: malformed record ({e})") from None
