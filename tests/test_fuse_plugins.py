"""A plugin's graph patterns: registered with the same decorator as the built-in ones, run by
the fused mode's graph pass (after the built-in patterns, or where `before=` says), and shown
as `fusion` events of a `fusebench run`."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from typer.testing import CliRunner

from fusebench.cli import app
from fusebench.errors import UsageError
from fusebench.fuse import GRAPH_ORDER, fuse, graph_order
from fusebench.fuse.fx import PATTERNS, Hit, Site, register_pattern
from fusebench.fuse.fx import nodes as N
from fusebench.results.document import load
from tests.helpers import ASSETS, TINY

PLUGIN = str(ASSETS / "pattern_plugin.py")


@pytest.fixture
def toy_relu():
    """Registers `toy_relu` (any relu -> a site of its own) in this process, for one test."""
    made = []

    def register(before=None):
        @register_pattern("toy_relu", benches=("train",), before=before)
        def scan(n, scope):
            if N.op(n) == "relu":
                return Hit("toy_relu", n, Site("toy_relu", torch.relu), (N.x_of(n),))
            return None
        made.append("toy_relu")
    yield register
    for name in made:
        PATTERNS.discard(name)


def bn_relu():
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())


@pytest.mark.parametrize("before, wins", [(None, "bn_act"), ("bn_act", "toy_relu")])
def test_a_plugin_pattern_runs_after_the_built_ins_unless_it_says_before(toy_relu, before, wins):
    toy_relu(before)
    order = graph_order()
    at = order.index("toy_relu")
    assert order[at + 1] == before if before else at == len(GRAPH_ORDER) == len(order) - 1
    model = bn_relu()
    ref = bn_relu()
    ref.load_state_dict(model.state_dict())
    result = fuse(model, "train")
    # where toy_relu takes the ReLU, the BN left alone is a bn_train site
    assert dict(result.sites) == ({wins: 1} if wins == "bn_act" else {wins: 1, "bn_train": 1}), \
        result.sites
    x = torch.randn(2, 3, 4, 4)
    torch.testing.assert_close(model(x), ref(x))


def test_before_names_a_known_pattern():
    with pytest.raises(UsageError, match="before='nope' is not a graph pattern"):
        register_pattern("toy_bad", before="nope")
    assert "toy_bad" not in PATTERNS


def test_a_plugin_pattern_shows_in_a_fused_run(tmp_path, monkeypatch):
    """From the CLI: FUSEBENCH_PLUGINS loads the plugin in the probe and the worker (never in
    this process), its pattern fuses the tiny model's global pool, and the record says so."""
    monkeypatch.setenv("FUSEBENCH_PLUGINS", PLUGIN)
    res = CliRunner().invoke(app, ["run", TINY, "-m", "fused", "-b", "2", "--steps", "1",
                                   "--warmup", "1", "--threads", "1", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "toy_mean" not in PATTERNS                  # the CLI process never imported it
    rec = load(next(tmp_path.glob("*.json")))["records"][0]
    fusions = [e["message"] for e in rec["events"] if e["category"] == "fusion"]
    assert "toy_mean: 1 sites" in fusions, rec["events"]
    assert rec["status"] == "ok" and rec["correctness"]["passed"] is True
