"""benchmarks/gemm.py: a tiny run records the fused step's GEMM calls and times each on every
route, with per-step totals per pass."""
import pytest

from fusebench.fuse import gemm
from tests.helpers import load_benchmark


@pytest.mark.skipif(gemm.GEMMS["onednn"].missing() is not None, reason="no oneDNN")
def test_a_tiny_run_times_every_recorded_call_on_each_route(capsys):
    bench = load_benchmark("gemm")
    assert bench.main(["--model", "efficientnet_b0", "--img", "32", "--batch", "2",
                       "--reps", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("  nt ") or ln.startswith("  nn ")]
    assert rows and all("aten" in r and "onednn" in r for r in rows)
    totals = out.split("per step:")[1]
    for name in ("nt", "nn", "wgrad"):
        assert f"  {name} " in totals
