"""benchmarks/kernel_ab.py builds the A side from a commit's kernel sources: with them go the
headers in the family's own folder (act/'s gelu_rows.h and mlp_blocks.h), which its cpu.cpp
includes, and the build cache's fingerprint covers those headers too."""
import pytest

from fusebench.kernels import build
from tests.helpers import load_benchmark


def test_a_commits_family_headers_go_with_its_sources():
    got = load_benchmark("kernel_ab")._family_headers("HEAD", "act")
    assert {"gelu_rows.h", "mlp_blocks.h"} <= set(got)
    assert b"namespace fusebench::mlp_blocks" in got["mlp_blocks.h"]


def test_the_fingerprint_covers_a_familys_own_headers(tmp_path):
    fam = tmp_path / "kernels" / "fam"
    fam.mkdir(parents=True)
    (fam / "cpu.cpp").write_text('#include "own.h"\n')
    (fam / "own.h").write_text("// one\n")
    before = build._fingerprint([fam / "cpu.cpp"], ())
    (fam / "own.h").write_text("// two\n")
    assert build._fingerprint([fam / "cpu.cpp"], ()) != before


@pytest.mark.slow
def test_base_cflags_builds_the_a_side_from_the_working_tree_with_those_flags(capsys):
    """--base-cflags: every family built again from the working tree's sources with the given
    flags (forty-sixth session: -fno-trapping-math's effect on a whole step), under its own
    extension name, and the step runs on both sides."""
    bench = load_benchmark("kernel_ab")
    flags = "-O1 -fopenmp"
    assert bench.main(["--base-cflags", flags, "--img", "32", "--batch", "2", "--rounds", "1",
                       "--warmup", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert f"built from cflags '{flags}': act, bn_act, dwconv, ln2d" in out, out
    assert "base/new" in out, out
