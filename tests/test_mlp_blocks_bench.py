"""benchmarks/mlp_blocks.py: a tiny run times one MLP layer by layer and in row blocks, side by
side, and says which `auto` runs; bad arguments are usage errors."""
import pytest

from tests.helpers import load_benchmark


def test_a_tiny_run_prints_both_schedules_and_auto(monkeypatch, capsys):
    bench = load_benchmark("mlp_blocks")
    monkeypatch.setattr(bench, "SHAPES", {"tiny": [("conv", "conv", (2, 4, 4), 8),
                                                   ("linear", "linear", (2, 8), 8)]})
    monkeypatch.setattr(bench, "FLUSH_BYTES", 1 << 20)
    assert bench.main(["--shapes", "tiny", "--threads", "1", "--rounds", "3"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [r.split()[2] for r in rows] == ["conv", "linear"]
    # tiny MLPs stay in L2 layer by layer: auto keeps the layers
    assert all("layers/blocks" in r and r.endswith("auto runs: layers") for r in rows), rows


@pytest.mark.parametrize("argv", [["--shapes", "resnet"], ["--rounds", "2"], ["--threads", "two"],
                                  ["--threads", "0"]])
def test_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as e:
        load_benchmark("mlp_blocks").main(argv)
    assert e.value.code == 2
