"""compare's two readings of a record (results/items.py) agree: the Item read straight from a
checked record dict equals the one read from its Record, for every kind of record and every
metric; and a whole comparison, table and CSV, is the same either way (issue 14.7)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from fusebench.render.compare_table import TEXT_RENDERERS
from fusebench.results import items, schema
from fusebench.results.compare import METRICS, compare_files, compare_modes
from fusebench.spec import CellSpec, DistPart, ErrorInfo, Event, Record, StepStats
from tests.factories import document, kernel_record, model_record, samples


def _mixed() -> list[Record]:
    """Cells with every shape compare meets: model and kernel parts, failures, options,
    kwargs, amp, dist, NHWC, a noisy side, a busy machine, --repeat processes, no samples."""
    tuned = CellSpec.for_model("m.py:make", "compile", batch_size=4, img_size=None,
                               model_kwargs={"depth": 2, "act": "gelu"}, amp=True,
                               amp_dtype="bfloat16", channels_last=True,
                               mode_options=(("compile_mode", "max-autotune"),))
    dist = CellSpec.for_model("resnet18", "eager", dist=DistPart("ddp", 2, 2))
    busy = {"contention": {"others_frac": 0.5, "steal_frac": 0.0, "worker_cores": 2}}
    repeat = StepStats.from_processes([samples(100.0, 8, seed=s) for s in range(3)])
    return [
        model_record("convnext_tiny", "eager"),
        model_record("convnext_tiny", "compile", base_ms=80.0, extra=busy),
        model_record("convnext_tiny", "aot", status="timeout"),
        model_record("convnext_tiny", "fused", base_ms=120.0, sigma=0.3),    # noisy
        model_record("resnet", "eager", status="crashed", batch_size=2),
        model_record("resnet", "compile", batch_size=2),
        model_record(spec=dataclasses.replace(tuned, mode="eager", mode_options=())),
        model_record("tuned", spec=tuned, base_ms=90.0),
        model_record(spec=dist), model_record(spec=CellSpec.for_model("resnet18", "aot",
                                                                    dist=DistPart("ddp", 2, 2))),
        Record(CellSpec.for_model("rep", "eager"), "ok", step_ms=repeat, throughput=80.0,
               events=(Event("contention", "fusebench", "others 40%"),)),
        Record(CellSpec.for_model("rep", "compile"), "ok", step_ms=repeat, throughput=90.0),
        Record(CellSpec.for_model("nos", "eager"), "ok", peak_mem_bytes=10, throughput=5.0),
        Record(CellSpec.for_model("nos", "compile"), "ok", peak_mem_bytes=8, throughput=6.0),
        Record(CellSpec.for_model("err", "compile"), "error", error=ErrorInfo("X", "boom")),
        kernel_record("permute"), kernel_record("sqm", base_ms=0.5),
        kernel_record("cpu", mode="compile", shape=(2, 8, 4, 4), direction="fwdbwd"),
        kernel_record("triton", status="unavailable"),
    ]


def _doc_dicts() -> list[dict]:
    raw = json.dumps(document(_mixed())).encode()
    doc = schema.parse_exact(raw)
    assert doc is not None      # the fixture is a current-layout file: the fast path's input
    return doc["records"]


def _plain(item: items.Item) -> tuple:
    """An Item with its sample sequences as tuples (dicts hold lists, Records tuples)."""
    tup = lambda s: None if s is None else tuple(s)  # noqa: E731
    return item._replace(samples=tup(item.samples), groups=[tuple(g) for g in item.groups])


@pytest.mark.parametrize("metric", list(METRICS))
def test_item_from_dict_is_item_from_record(metric):
    m = METRICS[metric]
    fast = items.from_dicts(_doc_dicts(), m)
    slow = [items.from_record(Record.from_dict(d), m) for d in _doc_dicts()]
    assert [_plain(f) for f in fast] == [_plain(s) for s in slow]
    assert {i.noise for i in fast} > {None}         # the fixture has noisy and busy records


@pytest.mark.parametrize("metric", list(METRICS))
@pytest.mark.parametrize("fmt", list(TEXT_RENDERERS))
def test_fast_and_plain_comparisons_render_the_same(tmp_path, metric, fmt):
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(document(_mixed())))
    fast = compare_files([path], metric)               # one exact file: from the dicts
    plain = compare_modes([Record.from_dict(d) for d in json.loads(path.read_text())["records"]],
                          METRICS[metric])
    plain.env_summary = fast.env_summary
    assert fast.rows and TEXT_RENDERERS[fmt](fast) == TEXT_RENDERERS[fmt](plain)
    assert [r.verdict for r in fast.rows] == [r.verdict for r in plain.rows]
