"""compare/export at scale (issue 14.7): the one-pass load builds exactly what the slow path
builds, refuses (to the slow path, which words the error) anything it cannot vouch for, and the
compare table is capped. Timing lives in benchmarks/compare_scale.py, not here."""
from __future__ import annotations

import dataclasses
import json

import pytest

from fusebench.errors import UsageError
from fusebench.results import document, schema
from fusebench.results.compare import compare_modes, get_metric
from fusebench.results.document import ResultsWriter, load, load_records
from fusebench.render.compare_table import comparison_table, more_rows_line, shown_rows
from fusebench.spec import (CellSpec, Correctness, DistPart, ErrorInfo, Event, Record,
                            StepStats)
from tests.factories import document as make_doc, fake_env, kernel_record, model_record


def _records() -> list[Record]:
    """One record of every shape: model (kwargs, options, dist), kernel, failures."""
    spec = CellSpec.for_model("m.py:make", "compile", batch_size=4, img_size=None,
                              model_kwargs={"depth": 2, "act": "gelu"}, amp=True,
                              mode_options=(("compile_mode", "max-autotune"),),
                              dist=DistPart("ddp", 2), threads=2, cache_dir="/tmp/c")
    return [
        model_record("convnext_tiny", "eager"),
        model_record("convnext_tiny", "compile", extra={"contention": {"others_frac": 0.1}}),
        model_record(spec=spec, extra={"ranks": [1, 2]}),
        kernel_record("permute"), kernel_record("sqm", mode="compile"),
        Record(CellSpec.for_model("a", "eager"), "error", error=ErrorInfo("X", "boom"),
               events=(Event("warning", "python", "w", 3),)),
        Record(CellSpec.for_model("a", "aot"), "mismatch",
               step_ms=StepStats(1.0, 0.1, 0.9, 1.1, 3, ()),
               correctness=Correctness(False, 0.5, None, ("first",), "bad")),
    ]


def _write(tmp_path, doc) -> str:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_fast_path_builds_what_the_dataclasses_build(tmp_path):
    recs = _records()
    path = _write(tmp_path, make_doc(recs))
    assert schema.parse_exact(open(path, "rb").read()) is not None   # the fast path ran
    meta, fast = load_records(path)
    assert "records" not in meta and meta["env"] == fake_env()
    slow = [Record.from_dict(d) for d in json.load(open(path))["records"]]
    assert fast == slow == recs
    for f, s in zip(fast, slow):
        assert f.to_dict() == s.to_dict() and f.extra == s.extra
        # every field of every part is the object's own, as __init__ would set it
        for a, b in ((f, s), (f.spec, s.spec), (f.spec.what, s.spec.what),
                     (f.step_ms, s.step_ms), (f.correctness, s.correctness)):
            if a is not None:
                assert type(a) is type(b) and vars(a).keys() == {
                    x.name for x in dataclasses.fields(a)}
                assert hash(a) == hash(b) if not isinstance(a, Record) else True


def test_files_the_writer_writes_take_the_fast_path(tmp_path):
    """A field added to a record, spec or document without its schema entry would send every
    file down the slow path (correct, but minutes at 100,000 records): caught here."""
    w = ResultsWriter(tmp_path / "w.json", fake_env(), command=["fusebench", "run", "x"])
    for r in _records():
        w.append(r)
    assert schema.parse_exact((tmp_path / "w.json").read_bytes()) is not None


def test_legacy_dist_kind_is_read_on_the_fast_path(tmp_path):
    doc = make_doc([_records()[2]])
    dist = doc["records"][0]["spec"]["dist"]
    dist["kind"] = dist.pop("strategy")
    _, (rec,) = load_records(_write(tmp_path, doc))
    assert rec.spec.dist.strategy == "ddp" and rec == _records()[2]


def _bad(doc, where: str, value) -> dict:
    """doc with the value at dotted `where` of record 0 replaced (or added)."""
    cur = doc["records"][0]
    *parents, last = where.split(".")
    for p in parents:
        cur = cur[p]
    cur[last] = value
    return doc


@pytest.mark.parametrize("where, text, says", [
    ("step_ms.samples", "[1.0, NaN]", "not valid results JSON: NaN"),
    ("step_ms.samples", "[1.0, 1e400]", "field step_ms.samples"),
    ("extra.x", "Infinity", "not valid results JSON: Infinity"),
    ("extra.x", "[1e400]", "field extra"),
    ("spec.kernel", '{"family": "ln2d", "impl": "x", "shape": [1]}', "field spec"),
    ("spec.model.batch_size", '"8"', "field spec.model.batch_size"),
    ("throughput", "1e400", "field throughput"),
    ("step_ms.median", "-1", "field step_ms.median"),
])
def test_what_the_fast_path_refuses_the_slow_path_words(tmp_path, where, text, says):
    """Numbers JSON does not allow, and 1e400, which parses as inf: pydantic-core's parser
    takes both, so the schema must refuse them wherever a number can stand."""
    doc = _bad(make_doc(_records()[:1]), where, "@@")
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc).replace('"@@"', text))
    assert schema.parse_exact(path.read_bytes()) is None
    for fn in (load, load_records):
        with pytest.raises(UsageError) as e:
            fn(path)
        assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_unknown_keys_go_the_slow_path_as_before(tmp_path):
    """Exact means exact: an unknown key is not an error, but only the slow path takes it."""
    doc = make_doc(_records()[:1])
    doc["records"][0]["newer_field"] = 1
    doc["records"][0]["spec"]["newer_spec_field"] = 2
    doc["later_key"] = {"a": 1}
    path = _write(tmp_path, doc)
    assert schema.parse_exact(open(path, "rb").read()) is None
    assert load(path)["records"][0]["newer_field"] == 1
    assert load_records(path)[1] == _records()[:1]
    doc["records"][0]["spec"]["model"]["unknown"] = 1       # a part refuses it, as before
    with pytest.raises(UsageError, match="record 0 is malformed"):
        load_records(_write(tmp_path, doc))


# --- the capped table ----------------------------------------------------------------------------
def _many(cells: int, modes=("eager", "compile", "aot")) -> list[Record]:
    return [model_record(f"m{c}", m, seed=c, n=5, base_ms=10 + i)
            for c in range(cells) for i, m in enumerate(modes)]


@pytest.mark.parametrize("max_rows, shown", [(7, 6), (6, 6), (2, 3), (0, 30), (30, 30),
                                             (None, 30)])
def test_table_shows_whole_cells_up_to_max_rows(max_rows, shown):
    cmp = compare_modes(_many(10), get_metric("throughput"))
    assert shown_rows(cmp, max_rows) == shown
    line = more_rows_line(cmp, shown)
    if shown == 30:
        assert line is None
    else:
        assert line.startswith(f"... {30 - shown:,} more rows ({(30 - shown) // 3} cells)")
        t = comparison_table(cmp, max_rows=max_rows)
        assert len(t.rows) == shown + len(cmp.geomean)   # + a geometric mean per mode
        assert "more rows" in t.caption and "--max-rows 0" in t.caption
