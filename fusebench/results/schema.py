"""The typed schema of a results record: types and ranges of every field, checked on load.

One pydantic (v2, installed with typer) model per record layout: RecordV2 for fusebench/2 and
RecordV1 for the flat fusebench/1 records (read through the v1 reader afterwards). The models
only *check*: the Record dataclasses are still built by spec.py / document.py, so the schema
can never change what a valid file means. Strict types: a batch size of [8] or "8", a model
name of 5, a sample of "1.0" or a negative median are refused, as are NaN and infinities.
Unknown keys are ignored here (the dataclass constructors decide about them, as before).

`check_records(version, records)` returns None or (record index, dotted field, message).
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError
from typing_extensions import NotRequired, TypedDict

from fusebench.spec import STATUSES

# Nested JSON (extra, model kwargs, mode options) deeper than this is refused: a results file
# never needs it, and recursive code downstream (flattening, json.dumps) would overflow.
MAX_DEPTH = 32

Text = Annotated[str, Field(max_length=100_000)]
Name = Annotated[str, Field(min_length=1, max_length=4096)]
NonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=2 ** 63 - 1)]
Positive = Annotated[int, Field(ge=1, le=2 ** 63 - 1)]
Shape = Annotated[list[Positive], Field(min_length=1, max_length=8)]
Status = Literal[STATUSES]  # type: ignore[valid-type]


def plain_json(v: Any) -> Any:
    """A JSON object no deeper than MAX_DEPTH whose numbers are finite (json.loads reads 1e400
    as inf). Iterative: the check itself must not overflow on deep input."""
    stack = [(v, 0)]
    while stack:
        x, d = stack.pop()
        if d > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        for y in (x.values() if isinstance(x, dict) else x):
            if isinstance(y, (dict, list)):
                stack.append((y, d + 1))
            elif type(y) is float and not math.isfinite(y):
                raise ValueError(f"number {y} is out of range")
    return v


def _or_empty(checked: Any) -> Any:
    """`checked`, or an empty dict recognised in pydantic-core first: kwargs, mode_options and
    extra are {} in nearly every record, and the Python check (plain_json) of each one was a
    call out of Rust per field (~0.3 s of 100,000 records). first_problem words the errors
    of this union as those of `checked` alone."""
    return Annotated[Union[_EmptyDict, checked], Field(union_mode="left_to_right")]


_EmptyDict = Annotated[dict[str, Any], Field(max_length=0)]
_EMPTY_TAG = "dict[str,any]"            # pydantic's name of that branch in an error's loc
JsonObject = _or_empty(Annotated[dict[str, Any], AfterValidator(plain_json)])
# a constraint per sample, checked in pydantic-core: faster on 100,000 records x 40 samples
# than one Python min() + sum() per list (a call out of Rust per record), and the error names
# the sample (step_ms.samples.3)
Samples = list[NonNeg]
# TypedDicts, not models: pydantic only checks, it builds nothing (twice as fast on big files).
# No TypedDict carries its own config: the adapter's config (strict; extra keys ignored or, for
# the fast document path, forbidden) reaches every nesting level.
_STRICT = ConfigDict(strict=True)
_EXACT = ConfigDict(strict=True, extra="forbid")


class ModelPartT(TypedDict):
    name: Name
    bench: NotRequired[Name]
    batch_size: NotRequired[Positive]
    img_size: NotRequired[Optional[Positive]]
    kwargs: NotRequired[JsonObject]
    amp: NotRequired[bool]
    check: NotRequired[bool]
    amp_dtype: NotRequired[Optional[Name]]
    size_preset: NotRequired[bool]     # img_size was --quick's preset (spec.ModelPart)


class KernelPartT(TypedDict):
    family: Name
    impl: Name
    shape: Shape
    direction: NotRequired[Name]


class DistPartT(TypedDict):
    strategy: NotRequired[Name]        # ddp | fsdp1 | fsdp2 (DistPart.from_dict also reads
    kind: NotRequired[Name]            # the earlier name `kind`)
    nproc: Positive
    nnodes: NotRequired[Positive]
    node_rank: NotRequired[Count]
    rdzv_endpoint: NotRequired[Optional[Text]]


class SpecT(TypedDict):
    mode: Name
    model: NotRequired[Optional[ModelPartT]]
    kernel: NotRequired[Optional[KernelPartT]]
    dist: NotRequired[Optional[DistPartT]]
    mode_options: NotRequired[Optional[JsonObject]]
    channels_last: NotRequired[bool]
    dtype: NotRequired[Name]
    device: NotRequired[Name]
    warmup: NotRequired[Count]
    steps: NotRequired[Count]
    budget: NotRequired[Optional[Annotated[float, Field(gt=0, allow_inf_nan=False)]]]
    seed: NotRequired[int]
    timeout: NotRequired[Annotated[float, Field(gt=0, allow_inf_nan=False)]]
    cache_dir: NotRequired[Optional[Text]]
    threads: NotRequired[Optional[Positive]]
    heap: NotRequired[Optional[Name]]


def _one_part(spec: dict[str, Any]) -> dict[str, Any]:
    """What CellSpec.__post_init__ refuses, refused here as a field error of the spec."""
    if (spec.get("model") is None) == (spec.get("kernel") is None):
        raise ValueError("a spec has exactly one of a model part and a kernel part")
    if spec.get("dist") is not None and spec.get("model") is None:
        raise ValueError("only model cells run distributed")
    return spec


Spec = Annotated[SpecT, AfterValidator(_one_part)]


class StepStatsT(TypedDict):
    median: NonNeg
    iqr: NonNeg
    p10: NonNeg
    p90: NonNeg
    n: Count
    samples: NotRequired[Samples]
    process_sizes: NotRequired[list[Positive]]      # --repeat: steps of each worker process
    process_medians: NotRequired[Samples]           # and each one's median (ms)


def _named_event(e: dict[str, Any]) -> dict[str, Any]:
    if ("category" in e) == ("kind" in e):
        raise ValueError("an event has a category (or the earlier `kind`), and only one")
    return e


class EventT(TypedDict):
    category: NotRequired[Text]        # warning, graph_break, ... (Event.from_dict also reads
    kind: NotRequired[Text]            # the earlier name `kind`)
    source: Text
    message: Text
    count: NotRequired[Count]


class CorrectnessT(TypedDict):
    passed: bool
    max_rel_err_out: NotRequired[Optional[NonNeg]]
    max_rel_err_grad: NotRequired[Optional[NonNeg]]
    checked_at: NotRequired[list[Text]]
    detail: NotRequired[Optional[Text]]


class ErrorT(TypedDict):
    type: Text
    message: Text


class _Measured(TypedDict):
    """status and the measured fields: the same in every schema version."""
    status: Status
    params: NotRequired[Optional[Count]]
    gflops: NotRequired[Optional[NonNeg]]
    throughput: NotRequired[Optional[NonNeg]]
    step_ms: NotRequired[Optional[StepStatsT]]
    compile_s: NotRequired[Optional[NonNeg]]
    peak_mem_bytes: NotRequired[Optional[Count]]
    activation_bytes: NotRequired[Optional[Count]]
    events: NotRequired[list[Annotated[EventT, AfterValidator(_named_event)]]]
    correctness: NotRequired[Optional[CorrectnessT]]
    error: NotRequired[Optional[ErrorT]]


class ExtraT(TypedDict, total=False):
    """`extra` is any plain JSON; these keys, when present, have a fixed type: GPU energy and
    clocks (measure/telemetry.py) and CUDA kernel device time (measure/cuda_timing.py)."""
    __pydantic_config__ = ConfigDict(strict=True, extra="allow")  # type: ignore[misc]
    energy_j: Optional[NonNeg]
    energy_per_sample_j: Optional[NonNeg]
    power_w_mean: Optional[NonNeg]
    sm_clock_mhz_mean: Optional[NonNeg]
    throttle_reasons: Optional[list[Text]]
    device_ms: Optional[NonNeg]
    pct_of_copy_device: Optional[NonNeg]


class RecordV2(_Measured):
    spec: Spec
    extra: NotRequired[Optional[_or_empty(Annotated[ExtraT, AfterValidator(plain_json)])]]


class RecordV1(_Measured):
    """A flat fusebench/1 record; identity keys of kernel and distributed records optional."""
    model: Name
    mode: Name
    bench: Name
    batch_size: Positive
    img_size: Optional[Positive]
    channels_last: bool
    dtype: Name
    device: Name
    cell: NotRequired[Optional[JsonObject]]
    family: NotRequired[Optional[Name]]
    impl: NotRequired[Optional[Name]]
    requested_impl: NotRequired[Optional[Name]]
    shape: NotRequired[Optional[Shape]]
    direction: NotRequired[Optional[Name]]
    dist: NotRequired[Optional[Name]]
    nproc: NotRequired[Optional[Positive]]
    nnodes: NotRequired[Optional[Positive]]
    node_rank: NotRequired[Optional[Count]]


class DocumentV2(TypedDict):
    """A whole fusebench/2 document as written by results/document.py (ResultsWriter). A new
    document key needs its entry here, or such files take the slow path (tests/test_scale.py)."""
    __pydantic_config__ = _EXACT  # type: ignore[misc]   # every level below inherits it
    schema: Literal["fusebench/2"]
    created: NotRequired[Optional[Text]]
    command: NotRequired[list[Text]]
    env: NotRequired[JsonObject]
    records: list[RecordV2]


# one adapter per version, built once: validating the whole list is one call into pydantic-core
_ADAPTERS = {1: TypeAdapter(list[RecordV1], config=_STRICT),
             2: TypeAdapter(list[RecordV2], config=_STRICT)}
# The fast path (document.py): parse and check the JSON text in one pass of pydantic-core, no
# intermediate objects. Exact: any key the schema does not name is refused, so what passes has
# nothing the Record dataclasses could still object to; anything else (older versions, unknown
# keys, a bad field) goes the slow path, which words the error.
_DOCUMENT = TypeAdapter(DocumentV2)


_RECORDS = TypeAdapter(list[RecordV2], config=_EXACT)


def parse_exact(raw: bytes) -> dict[str, Any] | None:
    """A current-layout document with nothing unknown or wrong in it, parsed and checked; None
    when the text is anything else (the caller then takes the slow, wording path)."""
    try:
        return _in_pieces(raw) or _DOCUMENT.validate_json(raw)
    except ValidationError:
        return None


# How ResultsWriter lays a document out (json.dumps, indent=1): the records list opens on a
# line of its own at depth 1, each record is a block at depth 2, and the list closes at depth
# 1. JSON text holds no raw newline inside a string, so these byte patterns are structure.
_OPEN, _CLOSE, _NEXT = b'\n "records": [\n', b"\n ]", b"\n  },\n  {"
PIECE = 16 * 2 ** 20     # bytes of records checked in one call


def _in_pieces(raw: bytes) -> dict[str, Any] | None:
    """parse_exact of a document written by ResultsWriter, its records checked a piece of the
    text at a time: pydantic-core holds its parse tree of one piece at once, not of the whole
    file (100,000 records: ~400 MiB less at the peak, and the time of touching it). None when
    the text is not laid out so (the caller checks it whole); a ValidationError as the whole
    document's check would raise one (the caller takes the slow path either way)."""
    # the list's ends are looked for from the file's ends (records are its last key: no scan
    # of the whole text); text between them that is not records fails its pieces' check
    a, end = raw.find(_OPEN), raw.rfind(_CLOSE)
    start = a + len(_OPEN) - 1                      # the newline before the first record
    if len(raw) < 2 * PIECE or a < 0 or end < start:
        return None
    rest = raw[:start] + raw[end:]                  # everything but the records
    if rest.count(b'"records"') != 1:               # the key twice: the whole check decides
        return None
    doc = _DOCUMENT.validate_json(rest)
    records: list[Any] = []
    while start < end:
        cut = raw.find(_NEXT, start + PIECE, end)
        stop = end if cut < 0 else cut + 4          # through the record's closing brace
        records += _RECORDS.validate_json(b"[" + raw[start:stop] + b"]")
        start = stop + 1                            # past the comma between records
    doc["records"] = records
    return doc


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _union_tag(part: Any) -> bool:
    """A loc entry naming a branch of an _or_empty union, not a field."""
    return isinstance(part, str) and (part == _EMPTY_TAG or part.startswith("function-after["))


def first_problem(e: ValidationError, indexed: bool = True) -> tuple[int, str, str]:
    """(record index, dotted field, message) of the first error pydantic found."""
    errors = e.errors(include_url=False)
    err = next((x for x in errors if _EMPTY_TAG not in x["loc"]), errors[0])
    loc = [p for p in err["loc"] if not _union_tag(p)]
    index = loc.pop(0) if indexed and loc and isinstance(loc[0], int) else -1
    field = ".".join(str(p) for p in loc) or "(record)"
    msg = err["msg"][0].lower() + err["msg"][1:]
    if err["type"] != "missing":
        msg += f" (got {_short(err.get('input'))})"
    return index, field, msg


def check_records(version: int, records: list[Any]) -> tuple[int, str, str] | None:
    """None when every record of a `version` document is well typed, else its first problem."""
    try:
        _ADAPTERS[version].validate_python(records)
    except ValidationError as e:
        return first_problem(e)
    return None


def check_record(version: int, record: Any) -> tuple[str, str] | None:
    """One record: None, or (dotted field, message). (A list of one: a TypedDict adapter
    cannot take the config that every level of the schema inherits.)"""
    problem = check_records(version, [record])
    return problem[1:] if problem else None
