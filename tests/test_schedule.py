"""Interleaved rounds of worker processes (issue 13.4): with --repeat N, process k of every
cell runs before process k+1 of any, so a drift of the machine over minutes hits every cell
alike instead of separating them."""
from __future__ import annotations

import collections

import pytest

from fusebench.run import runner
from fusebench.run.schedule import rounds
from fusebench.spec import CellSpec
from tests.factories import model_record


@pytest.mark.parametrize("n_cells,repeat", [(1, 1), (1, 4), (3, 1), (3, 3), (2, 5), (5, 2)])
@pytest.mark.parametrize("interleave", [True, False])
def test_every_cell_gets_exactly_repeat_processes(n_cells, repeat, interleave):
    order = [i for batch in rounds(n_cells, repeat, interleave) for i in batch]
    assert collections.Counter(order) == {i: repeat for i in range(n_cells)}


def test_sequential_runs_each_cell_back_to_back():
    assert list(rounds(3, 2, interleave=False)) == [[0, 0], [1, 1], [2, 2]]


def test_interleaved_rounds_rotate_so_no_cell_always_runs_first():
    batches = list(rounds(3, 3))
    assert batches == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    for pos in range(3):                       # a Latin square: each cell once in each place
        assert sorted(b[pos] for b in batches) == [0, 1, 2]


# ----- the runner -------------------------------------------------------------------------

_SPECS = [CellSpec.for_model(m, "eager", batch_size=2, img_size=32) for m in ("a", "b", "c")]


class _Writer:
    def __init__(self):
        self.records = []

    def append(self, rec):
        self.records.append(rec)


def _fake(monkeypatch, fail_at=None, interrupt_at=None):
    """run_one replaced: each launch returns a record at a rising median (the launch index),
    so the merged record shows when each of its processes ran."""
    launches = []

    def fake_run_one(spec, opts, on_phase):
        launches.append((spec.model.name, opts.cache_dir))
        k = len(launches)
        if k == interrupt_at:
            raise KeyboardInterrupt
        if k == fail_at:
            return model_record(spec=spec, status="crashed")
        return model_record(spec=spec, base_ms=100.0 * k, n=4, sigma=0.01)
    monkeypatch.setattr(runner, "run_one", fake_run_one)
    return launches


def test_interleaved_run_starts_process_k_of_every_cell_first(monkeypatch):
    launches = _fake(monkeypatch)
    w = _Writer()
    recs = runner.run_cells(_SPECS, w, opts=runner.RunOptions(repeat=3), show_progress=False)
    assert [m for m, _ in launches] == list("abc" "bca" "cab")
    assert [r.spec.model.name for r in w.records] == ["a", "b", "c"] == [
        r.spec.model.name for r in recs]
    # each cell's processes spread over the whole run: a's medians ~ launches 1, 6, 8
    medians = {r.spec.model.name: r.step_ms.process_medians for r in recs}
    assert [round(m / 100) for m in medians["a"]] == [1, 6, 8]
    assert all(r.extra["repeat"] == 3 and "processes_done" not in r.extra for r in recs)
    started = [p["started"] for p in recs[0].extra["processes"]]
    assert started == sorted(started)
    # one compile cache per cell, shared by its processes, removed once the cell is done
    caches = collections.defaultdict(set)
    for m, c in launches:
        caches[m].add(c)
    assert all(len(c) == 1 for c in caches.values()) and len(set.union(*caches.values())) == 3
    assert not any(c.exists() for cs in caches.values() for c in cs)


def test_sequential_option_keeps_the_old_order(monkeypatch):
    launches = _fake(monkeypatch)
    runner.run_cells(_SPECS, opts=runner.RunOptions(repeat=2, interleave=False),
                     show_progress=False)
    assert [m for m, _ in launches] == list("aabbcc")


def test_a_failed_process_ends_only_its_cell_and_is_saved_at_once(monkeypatch):
    launches = _fake(monkeypatch, fail_at=4)        # round 2 starts with b: b's 2nd fails
    w = _Writer()
    recs = runner.run_cells(_SPECS, w, opts=runner.RunOptions(repeat=3), show_progress=False)
    assert [m for m, _ in launches] == list("abc" "bca" "ca")    # b runs no third process
    assert w.records[0].spec.model.name == "b" and w.records[0].status == "crashed"
    assert w.records[0].extra["failed_process"] == 2
    assert {r.spec.model.name: r.status for r in recs} == {"a": "ok", "b": "crashed",
                                                           "c": "ok"}


def test_an_interrupt_between_rounds_keeps_every_finished_process(monkeypatch):
    _fake(monkeypatch, interrupt_at=5)              # round 2: b ok, then c is interrupted
    w = _Writer()
    with pytest.raises(KeyboardInterrupt):
        runner.run_cells(_SPECS, w, opts=runner.RunOptions(repeat=3), show_progress=False)
    done = {r.spec.model.name: r for r in w.records}
    assert {k: v.extra["processes_done"] for k, v in done.items()} == {"a": 1, "b": 2, "c": 1}
    assert all(r.status == "ok" and r.extra["repeat"] == 3 for r in done.values())
    assert done["b"].step_ms.process_sizes == (4, 4)


def test_each_finished_line_names_its_own_cell(monkeypatch):
    from rich.console import Console
    _fake(monkeypatch)
    console = Console(record=True, width=200)
    runner.run_cells(_SPECS[:2], opts=runner.RunOptions(repeat=2), console=console)
    lines = [ln for ln in console.export_text().splitlines() if ": ok" in ln]
    assert [ln.split()[1] for ln in lines] == ["1/2", "2/2"]
    assert " a/eager" in lines[0] and " b/eager" in lines[1]


@pytest.mark.parametrize("flag,want", [([], True), (["--sequential"], False),
                                       (["--interleave"], True)])
def test_the_cli_flag_reaches_the_runner(monkeypatch, tmp_path, flag, want):
    from typer.testing import CliRunner

    from fusebench.cli import app
    from tests.helpers import TINY
    seen = []

    def fake_run_cells(specs, writer=None, *, opts, **kw):
        seen.append(opts)
        return []
    monkeypatch.setattr("fusebench.run.session.run_cells", fake_run_cells)
    res = CliRunner().invoke(app, ["run", TINY, "-m", "eager", "-b", "2", "--img-size", "16",
                                   "--steps", "2", "--repeat", "2", "--no-save", *flag])
    assert res.exit_code == 1, res.output             # no cell ran: not ok
    assert [(o.repeat, o.interleave) for o in seen] == [(2, want)]
