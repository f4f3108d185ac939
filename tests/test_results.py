"""Specs, records and the results document."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fusebench.errors import UsageError
from fusebench.results.document import ResultsWriter, load, new_document, save
from fusebench.spec import CellSpec, Correctness, Event, Record, StepStats


def test_stepstats_match_numpy_quantiles():
    xs = [5.0, 1.0, 3.0, 2.0, 8.0, 13.0, 4.0]
    s = StepStats.from_samples(xs)
    q = np.quantile(xs, [0.1, 0.25, 0.5, 0.75, 0.9])
    assert s.median == pytest.approx(q[2]) and s.iqr == pytest.approx(q[3] - q[1])
    assert s.p10 == pytest.approx(q[0]) and s.p90 == pytest.approx(q[4])
    assert s.samples == tuple(xs) and s.n == 7      # raw samples kept in run order


def test_cellspec_roundtrip_is_exact():
    spec = CellSpec(model="m", mode="aot", model_kwargs=(("ln_impl", "sqm"),),
                    mode_options=(("aot_compiler", "ts"),), extra=(("shape", [1, 2]),))
    assert CellSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_record_roundtrip_keeps_extra_keys(tmp_path):
    rec = Record.for_spec(CellSpec(model="m", mode="eager"), "mismatch",
                          step_ms=StepStats.from_samples([1, 2, 3]),
                          events=(Event("warning", "python:UserWarning", "w", 3),),
                          correctness=Correctness(False, 0.1, 0.2, ("first", "steady")),
                          extra={"family": "ln2d", "gbps": 1.5})
    w = ResultsWriter(tmp_path / "r.json", {"x": 1})
    w.append(rec)
    doc = load(tmp_path / "r.json")
    back = Record.from_dict(doc["records"][0])
    assert back.to_dict() == rec.to_dict()
    assert doc["records"][0]["gbps"] == 1.5


@pytest.mark.parametrize("text,needle", [
    ("{not json", "not valid JSON"),
    ('{"benchmarks": []}', "not a fusebench results document"),
    ('{"schema": "fusebench/99", "records": []}', "newer than this fusebench"),
    ('{"schema": "fusebench/1", "records": [{"model": "m"}]}', "lacks"),
    ('[1, 2]', "not a fusebench results document"),
])
def test_load_rejects_bad_documents(tmp_path, text, needle):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(UsageError, match=needle):
        load(p)


def test_nan_is_never_written(tmp_path):
    doc = new_document({})
    doc["records"].append({"x": float("nan")})
    with pytest.raises(ValueError):
        save(doc, tmp_path / "r.json")
    assert not list(tmp_path.iterdir())             # no partial or temp file left behind
