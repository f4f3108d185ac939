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
import errno
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from fusebench.errors import UsageError
from fusebench.spec import (CellSpec, Correctness, DistPart, ErrorInfo, Event, KernelPart,
                            ModelPart, Record, StepStats, measured_from_dict, spec_from_v1)

SCHEMA_VERSION = 2
SCHEMA = f"fusebench/{SCHEMA_VERSION}"


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def new_document(env: dict[str, Any], records: list[Record] | None = None,
                 command: list[str] | None = None) -> dict[str, Any]:
    return {"schema": SCHEMA, "created": now_iso(), "command": command or [], "env": env,
            "records": [r.to_dict() for r in records or []]}


def _umask() -> int:
    """The process umask, read without setting it where Linux allows (os.umask(0) would
    briefly loosen it for every other thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def write_temp(folder: Path, prefix: str, text: str | Iterable[str]) -> Path:
    """`text` (or its pieces, in order) in a new temp file of `folder`, on disk (fsync), with
    the permissions a plain open() would give (mkstemp's are 0600: results are meant to be
    shared)."""
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as f:
            # pieces: a big export never holds its whole text (nor its encoding) at once
            f.writelines([text] if isinstance(text, str) else text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)


def write_atomic(path: Path, text: str | Iterable[str]) -> None:
    """Temp file in the same folder + fsync + rename: a crash never leaves a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = write_temp(path.parent, f".{path.name}.", text)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
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


def _lacks(version: int, d: dict[str, Any]) -> list[str]:
    required = V1_RECORD_KEYS if version == 1 else ("spec", "status")
    return [k for k in required if k not in d]


def _schema_error(where: str, version: int, records: list[Any], i: int, field: str,
                  msg: str) -> UsageError:
    d = records[i] if 0 <= i < len(records) else None
    if not isinstance(d, dict):
        return UsageError(f"{where}: record {i} is not an object")
    missing = _lacks(version, d)
    if missing:
        return UsageError(f"{where}: record {i} lacks {', '.join(missing)}")
    return UsageError(f"{where}: record {i}: field {field}: {msg}")


def read_record(version: int, d: Any, where: str, i: int) -> Record:
    """One type-checked record dict of a document of `version` -> Record; problems are one
    UsageError naming the record and the field."""
    if not isinstance(d, dict):
        raise UsageError(f"{where}: record {i} is not an object")
    try:        # what the schema cannot see (a spec with both parts, ...) fails here, once
        rec = READERS[version](d)
        if version != SCHEMA_VERSION:   # the v1 reader's output (its `cell`) is checked too
            from fusebench.results.schema import check_record
            problem = check_record(SCHEMA_VERSION, rec.to_dict())
            if problem:
                raise UsageError(f"{where}: record {i}: field {problem[0]}: {problem[1]}")
        return rec
    except KeyError as e:
        msg = str(e.args[0]) if e.args else "missing key"
        raise UsageError(f"{where}: record {i} {msg if msg.startswith('lacks') else 'lacks ' + msg}"
                         ) from None
    except (TypeError, ValueError, AttributeError) as e:
        if isinstance(e, UsageError):
            raise
        raise UsageError(f"{where}: record {i} is malformed ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:120]})") from None


def check_document(doc: Any, where: str = "results") -> int:
    """Schema version, layout and the type of every record field; returns the version."""
    version = schema_version(doc, where)
    records = doc.get("records")
    if not isinstance(records, list):
        raise UsageError(f"{where}: 'records' is missing or not a list")
    if not isinstance(doc.get("env", {}), dict):
        raise UsageError(f"{where}: 'env' is not an object")
    from fusebench.results.schema import check_records, plain_json   # pydantic: on first load
    try:
        plain_json(doc.get("env") or {})
    except ValueError as e:
        raise UsageError(f"{where}: field env: {e}") from None
    problem = check_records(version, records)
    if problem:
        raise _schema_error(where, version, records, *problem)
    return version


def parse_records(doc: dict[str, Any], version: int, where: str) -> list[Record]:
    return [read_record(version, r, where, i) for i, r in enumerate(doc["records"])]


def validate(doc: Any, where: str = "results") -> dict[str, Any]:
    """Check a document of any known version; returns it in the current layout."""
    version = check_document(doc, where)
    parsed = parse_records(doc, version, where)
    if version == SCHEMA_VERSION:
        return doc
    return {**doc, "schema": SCHEMA, "schema_read": doc["schema"],
            "records": [r.to_dict() for r in parsed]}


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(text: str, where: str) -> Any:
    """json.loads that refuses NaN and Infinity and too deep nesting, each as one UsageError
    line. (Numbers that overflow to inf, 1e400, are refused by the schema: a scan of the text
    for them costs more than parsing it.)"""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise UsageError(f"{where}: not valid JSON (truncated or corrupt?): {e.msg} at line "
                         f"{e.lineno}") from None
    except RecursionError:
        raise UsageError(f"{where}: not a results document: JSON nested too deeply") from None
    except ValueError as e:     # the hooks above
        raise UsageError(f"{where}: not valid results JSON: {e}") from None


def _read_bytes(path: str | Path) -> bytes:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{path}: no such results file")
    try:
        return p.read_bytes()
    except OSError as e:
        raise UsageError(f"{path}: cannot read ({e.__class__.__name__})") from None


def _decode(raw: bytes, path: str | Path) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: cannot read ({e.__class__.__name__})") from None


def _read_text(path: str | Path) -> str:
    return _decode(_read_bytes(path), path)


def _exact(raw: bytes) -> dict[str, Any] | None:
    from fusebench.results.schema import parse_exact      # pydantic: on first load
    return parse_exact(raw)


def load(path: str | Path, parse: bool = True) -> dict[str, Any]:
    """Load and validate one results file; every problem is a UsageError with one clear line.
    A current-layout file with nothing unknown in it is parsed and checked in one pass
    (schema.parse_exact); anything else takes the slow path, which also words the errors.
    parse=False: a current-layout document is only type-checked (its records are not built;
    the caller reports what its own parsing finds, as frame.py does)."""
    raw = _read_bytes(path)
    doc = _exact(raw)
    if doc is not None:     # exact: the Record dataclasses cannot object to anything in it
        return doc
    doc = parse_json(_decode(raw, path), str(path))
    if not parse and check_document(doc, str(path)) == SCHEMA_VERSION:
        return doc
    return validate(doc, str(path))


def load_checked(path: str | Path) -> tuple[dict[str, Any], bool]:
    """load(path, parse=False), and whether the document was exact (schema.parse_exact: its
    records need no dataclass to vouch for them; otherwise the caller builds what it reads)."""
    raw = _read_bytes(path)
    doc = _exact(raw)
    if doc is not None:
        return doc, True
    del raw
    return load(path, parse=False), False


def load_exact(path: str | Path) -> dict[str, Any] | None:
    """The document, parsed and checked in one pass, when it is exact (schema.parse_exact);
    None otherwise (the caller then takes load or load_records, which word any error)."""
    return _exact(_read_bytes(path))


def load_records(path: str | Path) -> tuple[dict[str, Any], list[Record]]:
    """The document's metadata (env, created, ...: everything but its records), checked, and
    its records, each parsed once. On the fast path each record dict becomes its Record in
    place and is dropped from the document as it goes: one copy of 100,000 records in memory."""
    raw = _read_bytes(path)
    doc = _exact(raw)
    del raw
    if doc is not None:
        dicts = doc.pop("records")
        records = []
        for i, d in enumerate(dicts):
            records.append(record_exact(d))
            dicts[i] = None
        return doc, records
    doc = parse_json(_read_text(path), str(path))
    version = check_document(doc, str(path))
    records = parse_records(doc, version, str(path))
    del doc["records"]
    return doc, records


def record_from_worker(path: Path, spec: CellSpec) -> Record:
    """The record a worker wrote for `spec`; one that does not parse or validate becomes an
    `error` record for the cell (the run goes on), never an exception in the runner."""
    try:
        from fusebench.results.schema import check_record
    except ImportError as e:   # a declared dependency missing (pydantic on a bare GPU image)
        return Record(spec, "error", error=ErrorInfo(
            "ImportError", f"could not check the worker's record: {e} (a dependency of "
                           f"fusebench: pip install -e . brings it)"[:500]))
    try:
        d = parse_json(Path(path).read_text(), str(path))
        problem = check_record(SCHEMA_VERSION, d)
        if problem:
            raise UsageError(f"field {problem[0]}: {problem[1]}")
        return read_record(SCHEMA_VERSION, d, str(path), 0)
    except (UsageError, OSError, UnicodeDecodeError) as e:
        why = str(e).replace(f"{path}: ", "")
        return Record(spec, "error", error=ErrorInfo(
            "MalformedRecord", f"the worker's record was malformed: {why}"[:500]))


# --- records of the fast path ---------------------------------------------------------------------
def _defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING}


_DEFAULTS = {cls: _defaults(cls) for cls in (CellSpec, ModelPart, KernelPart, DistPart,
                                             StepStats, Event, Correctness, ErrorInfo, Record)}


_N_FIELDS = {cls: len(dataclasses.fields(cls)) for cls in _DEFAULTS}
# fields declared as tuples arrive as JSON lists: converted by declaration, so a tuple field
# added to a dataclass later cannot come back as a list from this path
_TUPLES = {cls: tuple(f.name for f in dataclasses.fields(cls) if str(f.type).startswith("tuple"))
           for cls in _DEFAULTS}


def _new(cls: type, fields: dict[str, Any]) -> Any:
    """A frozen dataclass from fields schema.parse_exact has checked, without its __init__ (a
    frozen __init__ sets every field through object.__setattr__ and re-checks what the schema
    did: most of the cost of 100,000 records). `fields` (a dict of the parsed document, named
    only fields: the schema forbids other keys) becomes the object's own __dict__, with the
    defaults of absent fields: the same object __init__ builds, without a copy
    (tests/test_scale.py compares the two for every part)."""
    if len(fields) != _N_FIELDS[cls]:
        for k, v in _DEFAULTS[cls].items():
            fields.setdefault(k, v)
    for k in _TUPLES[cls]:
        if isinstance(fields.get(k), list):
            fields[k] = tuple(fields[k])
    obj = object.__new__(cls)
    object.__setattr__(obj, "__dict__", fields)
    return obj


def _pairs(d: dict[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(d.items())) if d else ()


def _spec_exact(s: dict[str, Any]) -> CellSpec:
    m, k, dist = s.get("model"), s.get("kernel"), s.get("dist")
    if m:
        m["kwargs"] = _pairs(m.get("kwargs"))
    if dist and "kind" in dist:     # the earlier name of `strategy` (DistPart.from_dict)
        dist = {("strategy" if key == "kind" else key): v for key, v in dist.items()}
    s["model"] = _new(ModelPart, m) if m else None
    s["kernel"] = _new(KernelPart, k) if k else None
    s["dist"] = _new(DistPart, dist) if dist else None
    s["mode_options"] = _pairs(s.get("mode_options"))
    return _new(CellSpec, s)


def _event_fields(x: dict[str, Any]) -> dict[str, Any]:
    if "kind" in x:     # the earlier name of `category` (Event.from_dict)
        x["category"] = x.pop("kind")
    return x


def record_exact(d: dict[str, Any]) -> Record:
    """Record.from_dict for a record dict of a document schema.parse_exact accepted; the dict
    and its parts are taken over (they become the dataclasses' fields)."""
    st, c, e = d.get("step_ms"), d.get("correctness"), d.get("error")
    d["spec"] = _spec_exact(d["spec"])
    d["step_ms"] = _new(StepStats, st) if st is not None else None
    d["events"] = tuple(_new(Event, _event_fields(x)) for x in d.get("events", ()))
    d["correctness"] = _new(Correctness, c) if c is not None else None
    d["error"] = _new(ErrorInfo, e) if e else None
    d["extra"] = d.get("extra") or {}
    return _new(Record, d)


# --- output files (export -o, plot -o) ---------------------------------------------------------
def check_output_file(out: str | Path, inputs: Iterable[str | Path] = (),
                      flag: str = "-o") -> Path:
    """Refuse an output path that is a folder, cannot be written, or is one of the inputs."""
    out = Path(out)
    if out.is_dir():
        raise UsageError(f"{flag} {out}: is a folder; give a file name")
    for src in inputs:      # resolve(): a symlink to the input is the input
        if out.resolve() == Path(src).resolve():
            raise UsageError(f"{flag} {out}: is the input file {src}; refusing to overwrite it")
    parent = next((p for p in out.absolute().parents if p.exists()), Path("/"))
    if not parent.is_dir():
        raise UsageError(f"{flag} {out}: {parent} is not a folder")
    if out.exists() and not os.access(out, os.W_OK):
        raise UsageError(f"{flag} {out}: not writable")
    try:    # a probe file: permissions, read-only mounts and /proc all answer here, up front
        fd, probe = tempfile.mkstemp(prefix=".fusebench-probe-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"{flag} {out}: cannot write in {parent} "
                         f"({errno.errorcode.get(e.errno or 0, 'error')}: {e.strerror})") from None
    return out
