"""benchmarks/patchify.py: a tiny run times aten's conv and the GEMM per shape, side by side,
and says what auto's race picks; an unknown shape set is a usage error."""
import pytest

from tests.helpers import load_benchmark


def test_a_tiny_run_prints_both_sides_and_the_race(monkeypatch, capsys):
    bench = load_benchmark("patchify")
    monkeypatch.setattr(bench, "SHAPES", {"tiny": [("down", 2, 4, 8, 8, 2, True),
                                                   ("stem", 2, 3, 8, 8, 4, False)]})
    assert bench.main(["--shapes", "tiny", "--threads", "1", "--rounds", "3"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [r.split()[2] for r in rows] == ["down", "stem"]
    assert all("conv/GEMM" in r and r.split()[-1] in ("gemm", "conv") for r in rows), rows


@pytest.mark.parametrize("argv", [["--shapes", "resnet"], ["--rounds", "2"], ["--threads", "two"],
                                  ["--threads", "0"]])
def test_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as e:
        load_benchmark("patchify").main(argv)
    assert e.value.code == 2
