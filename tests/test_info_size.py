"""info --bench/--img-size: the GFLOPs say at which input size they are counted (issue 13.6)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fusebench.cli import app

runner = CliRunner()


def _info(*args):
    r = runner.invoke(app, ["info", "convnext_atto", "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_info_gflops_size_follows_bench_and_img_size():
    infer, train, small = _info(), _info("--bench", "train"), _info("--img-size", "112")
    assert infer["gflops_input_size"] == [3, 288, 288] and infer["gflops_bench"] == "infer"
    assert train["gflops_input_size"] == [3, 224, 224]
    assert small["gflops_input_size"] == [3, 112, 112]
    # conv FLOPs scale with H*W
    assert train["gflops_per_sample"] == pytest.approx(
        infer["gflops_per_sample"] * (224 / 288) ** 2, rel=0.05)
    assert small["gflops_per_sample"] < train["gflops_per_sample"]


def test_info_table_names_the_size():
    r = runner.invoke(app, ["info", "convnext_atto", "--img-size", "160"],
                      env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "(at 3x160x160, batch 1" in r.stdout


def test_info_bad_img_size_exit2():
    assert runner.invoke(app, ["info", "convnext_atto", "--img-size", "0"]).exit_code == 2
