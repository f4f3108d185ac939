"""fuse/race.py: the verdict cache and the named choice that gemm.py and patchify.py share."""
from __future__ import annotations

import pytest

from fusebench.errors import UsageError
from fusebench.fuse.race import Choice, Verdicts, best_times


def test_a_key_is_raced_once_and_its_winner_kept():
    v, races = Verdicts(), []

    def race(name):
        return lambda: races.append(name) or name
    assert v.winner(("a", 1), race("x")) == "x"
    assert v.winner(("a", 1), race("y")) == "x"            # kept: not raced again
    assert v.winner(("b", 1), race("y")) == "y"
    assert races == ["x", "y"] and v.tally() == {"x": 1, "y": 1}


def test_the_event_line_follows_the_labels_order_and_leaves_out_sides_that_never_won():
    v = Verdicts()
    assert v.describe("gemm", "call shapes", {"a": "A", "b": "B"}) is None
    v.update({1: "b", 2: "b", 3: "a"})
    assert v.describe("gemm", "call shapes", {"a": "A", "b": "B"}) == \
        "gemm: auto raced 3 call shapes: A faster at 1, B faster at 2"
    v.update({1: "a", 2: "a"})
    assert v.describe("p", "conv shapes", {"b": "the B", "a": "the A"}) == \
        "p: auto raced 3 conv shapes: the A faster at 3"


def _check(name: str) -> str:
    if name not in ("auto", "x"):
        raise UsageError(f"'{name}': valid: auto, x")
    return name


def test_a_choice_holds_for_its_block_and_comes_back_after_an_error():
    c = Choice(_check)
    with c.using("x"):
        assert c.name == "x"
    assert c.name == "auto"
    with pytest.raises(RuntimeError), c.using("x"):
        raise RuntimeError("a failing step")
    assert c.name == "auto"
    with pytest.raises(UsageError, match="valid: auto, x"), c.using("fast"):
        pass
    with pytest.raises(UsageError):
        c.set("fast")
    c.set("x")
    assert c.name == "x"


def test_best_times_runs_each_side_once_to_warm_up_then_alternates():
    order = []
    best = best_times({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 2)
    assert order == ["a", "b", "a", "b", "a", "b"]
    assert set(best) == {"a", "b"} and all(0 <= t < 1 for t in best.values())
