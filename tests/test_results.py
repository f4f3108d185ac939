"""Specs, records and the results document."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from fusebench.errors import UsageError
from fusebench.results.document import SCHEMA_VERSION, ResultsWriter, load, new_document, save
from fusebench.spec import (CellSpec, Correctness, DistPart, Event, KernelPart, ModelPart, Record,
                            StepStats)
from tests.helpers import ASSETS


def test_stepstats_match_numpy_quantiles():
    xs = [5.0, 1.0, 3.0, 2.0, 8.0, 13.0, 4.0]
    s = StepStats.from_samples(xs)
    q = np.quantile(xs, [0.1, 0.25, 0.5, 0.75, 0.9])
    assert s.median == pytest.approx(q[2]) and s.iqr == pytest.approx(q[3] - q[1])
    assert s.p10 == pytest.approx(q[0]) and s.p90 == pytest.approx(q[4])
    assert s.samples == tuple(xs) and s.n == 7      # raw samples kept in run order


def test_cellspec_roundtrip_is_exact():
    spec = CellSpec.for_model("m", "aot", model_kwargs=(("ln_impl", "sqm"),),
                              mode_options=(("aot_compiler", "ts"),),
                              dist=DistPart("ddp", 2, rdzv_endpoint="h:1"))
    assert CellSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert spec.kind == "model" and spec.dist.world_size == 2


def test_kernel_spec_identity_roundtrips_through_a_document(tmp_path):
    spec = CellSpec.for_kernel("ln2d", "tests/x.py:fn", [8, 96, 56, 56], "compile",
                               direction="bwd", dtype="bfloat16", channels_last=True)
    assert spec.kind == "kernel" and spec.model is None and spec.subject == "ln2d"
    assert CellSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    w = ResultsWriter(tmp_path / "k.json", {})
    w.append(Record(spec, "ok", extra={"gbps": 3.0}))
    (back,) = [Record.from_dict(r) for r in load(tmp_path / "k.json")["records"]]
    k = back.spec.kernel
    assert (k.family, k.impl, k.shape, k.direction) == ("ln2d", "tests/x.py:fn",
                                                        (8, 96, 56, 56), "bwd")
    assert back.spec == spec and back.extra == {"gbps": 3.0}


def test_cellspec_needs_exactly_one_what_part():
    with pytest.raises(ValueError):
        CellSpec(mode="eager")
    with pytest.raises(ValueError):
        CellSpec(mode="eager", model=ModelPart("m"), kernel=KernelPart("ln2d", "cpu", (1,) * 4))
    with pytest.raises(ValueError):
        CellSpec(mode="eager", kernel=KernelPart("ln2d", "cpu", (1,) * 4),
                 dist=DistPart("ddp", 2))


def test_record_roundtrip_keeps_extra_keys(tmp_path):
    rec = Record(CellSpec.for_model("m", "eager"), "mismatch",
                 step_ms=StepStats.from_samples([1, 2, 3]),
                 events=(Event("warning", "python:UserWarning", "w", 3),),
                 correctness=Correctness(False, 0.1, 0.2, ("first", "steady")),
                 extra={"tflops": 0.5, "exit_code": 1})
    w = ResultsWriter(tmp_path / "r.json", {"x": 1})
    w.append(rec)
    doc = load(tmp_path / "r.json")
    assert doc["schema"] == f"fusebench/{SCHEMA_VERSION}" and SCHEMA_VERSION == 2
    back = Record.from_dict(doc["records"][0])
    assert back.to_dict() == rec.to_dict() and back.spec == rec.spec
    assert doc["records"][0]["extra"]["tflops"] == 0.5
    assert "model" not in doc["records"][0]            # identity lives in the spec only


# --- fusebench/1 documents --------------------------------------------------------------------
V1 = ASSETS / "results_v1.json"     # written by fusebench/1 (run + kernel), plus hand-made cases


def test_v1_document_loads_into_specs():
    doc = load(V1)
    assert doc["schema"] == "fusebench/2" and doc["schema_read"] == "fusebench/1"
    eager, aot, function, fused, ddp, crashed, bare = [Record.from_dict(r)
                                                       for r in doc["records"]]
    m = aot.spec.model
    assert aot.spec.kind == "model" and aot.spec.mode == "aot"
    assert (m.name, m.bench, m.batch_size, m.img_size) == (
        "tests/assets/tiny_models.py:tiny_cnn", "train", 2, 16)
    assert aot.extra["tflops"] > 0 and "cell" not in aot.extra
    assert aot.step_ms.n == 3 and aot.correctness.passed
    # kernel records: the family was in `model`, the direction in `bench`; now a kernel part
    for rec, impl in ((function, "function"), (fused, "fused")):
        k = rec.spec.kernel
        assert rec.spec.model is None and rec.spec.kind == "kernel"
        assert (k.family, k.impl, k.shape, k.direction) == ("ln2d", impl, (2, 8, 8, 8),
                                                            "fwdbwd")
        assert not {"family", "impl", "shape", "direction", "cell"} & set(rec.extra)
        assert rec.extra["gbps"] > 0
    assert fused.extra["ran_impl"] == "cpu" and "ran_impl" not in function.extra
    # distributed: the dist keys became the dist part
    assert ddp.spec.dist.strategy == "ddp" and ddp.spec.dist.world_size == 2
    assert "world_size" not in ddp.extra and ddp.extra["ranks_reported"] == [0, 1]
    # a failure after an OOM retry: the record's batch (what ran) is the spec's
    assert crashed.spec.model.batch_size == 1 and crashed.extra["signal"] == "SIGKILL"
    assert crashed.extra["oom_failed_batch_sizes"] == [2]
    # no `cell` key: the spec is rebuilt from the flat fields
    assert bare.spec == dataclasses.replace(eager.spec, warmup=3, steps=10)


def test_v1_document_compares_and_exports():
    from fusebench.results.compare import compare_files
    from fusebench.results.frame import load_results
    cmp = compare_files([V1])
    rows = {(r.model, r.variant): r for r in cmp.rows}
    assert rows[("ln2d", "fused")].config == rows[("ln2d", "function")].config
    assert rows[("ln2d", "function")].group == rows[("ln2d", "fused")].group
    df = load_results(V1)
    kern = df[df["family"] == "ln2d"]
    assert list(kern["impl"]) == ["function", "fused"] and kern["model"].isna().all()


def test_v1_record_missing_keys_is_one_line(tmp_path):
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"schema": "fusebench/1", "records": [{"model": "m"}]}))
    with pytest.raises(UsageError, match="record 0 lacks mode, bench"):
        load(p)


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


def test_events_written_with_the_earlier_name_kind_load_as_category(tmp_path):
    """fusebench/2 files before Event.kind became `category` stay readable, on both paths."""
    from fusebench.results.document import load_records
    rec = Record(CellSpec.for_model("m", "eager"), "ok",
                 events=(Event("warning", "python", "w", 2),))
    doc = new_document({}, [rec])
    doc["records"][0]["events"] = [{"kind": "warning", "source": "python", "message": "w",
                                    "count": 2}]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    _, (fast,) = load_records(path)                  # the exact-schema fast path
    slow = Record.from_dict(json.loads(path.read_text())["records"][0])
    assert fast.events == slow.events == rec.events
    assert rec.to_dict()["events"][0]["category"] == "warning"
