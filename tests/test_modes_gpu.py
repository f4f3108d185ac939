"""The CUDA-graph modes on a machine without CUDA: `cudagraphs` and compile's reduce-overhead
are `unavailable` with their reason, in the mode API and in a run's records (never run as
something else). Their GPU behaviour is exercised by scripts/gpu_check.sh."""
from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from fusebench.cli import app
from fusebench.modes import get_mode
from tests.helpers import TINY

FAST = ["-b", "2", "--steps", "2", "--warmup", "1", "--threads", "1"]
CPU_UNAVAILABLE = [
    ("cudagraphs", {}, "CUDA graphs need a CUDA device"),
    ("cudagraphs", {"cudagraphs_step": "fused"}, "CUDA graphs need a CUDA device"),
    ("compile", {"compile_mode": "reduce-overhead", "compile_backend": "aot_eager"},
     "reduce-overhead is CUDA graphs"),
]


@pytest.mark.parametrize("name, opts, needle", CPU_UNAVAILABLE)
def test_cuda_graph_modes_unavailable_on_cpu(name, opts, needle):
    ok, reason = get_mode(name).available(opts, "cpu")
    assert not ok and needle in reason


@pytest.mark.parametrize("mode_opts", [{"compile_mode": "max-autotune"}, {"compile_mode": None}])
def test_other_compile_modes_stay_available_on_cpu(mode_opts):
    ok, reason = get_mode("compile").available({**mode_opts, "compile_backend": "aot_eager"},
                                               "cpu")
    assert ok, reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only records")
@pytest.mark.parametrize("args, needle", [
    (["-m", "cudagraphs"], "CUDA graphs need a CUDA device"),
    (["-m", "compile", "--compile-mode", "reduce-overhead", "--compile-backend", "aot_eager"],
     "reduce-overhead is CUDA graphs"),
])
def test_run_records_cuda_graph_modes_as_unavailable(args, needle, tmp_path):
    res = CliRunner().invoke(app, ["run", TINY, *args, *FAST, "--json", "--no-save",
                                   "--out", str(tmp_path)])
    assert res.exit_code == 1, res.output        # a cell not ok, not a usage error or a crash
    (rec,) = json.loads(res.stdout)["records"]
    assert rec["status"] == "unavailable" and needle in rec["error"]["message"]
    assert rec["step_ms"] is None                 # nothing ran in its place
