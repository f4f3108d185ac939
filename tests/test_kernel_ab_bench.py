"""benchmarks/kernel_ab.py builds the A side from a commit's kernel sources: with them go the
headers in the family's own folder (act/'s gelu_rows.h and mlp_blocks.h), which its cpu.cpp
includes, and the build cache's fingerprint covers those headers too."""
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
