"""Every benchmark that times work in its own process fixes glibc's heap as a model cell does
(measure/heap.py's default policy, `pin_malloc(None)`), directly or through the shared timing
helpers. Left dynamic, glibc's mmap and trim thresholds follow what the process freed before,
and a kernel's fresh outputs may re-fault every page on every call: a bias_gelu backward at
12800 x 160 timed 4.24 ms that way against 1.30 ms with the heap fixed, where aten's gelu
backward took 1.38 ms (35th session, 2 threads): the ratio flipped. Scripts that time whole
`fusebench` runs (their cells fix their own heap) or a sleep are listed with the reason."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
# the timing helpers other scripts call instead of timing themselves
HELPERS = {"paired_rounds.py": "alternate", "mlp_residual.py": "interleaved_medians"}
EXEMPT = {
    "aa_models.py": "the models of aa_variance.py: times its own forward only to sleep a share",
    "aa_variance.py": "times whole `fusebench run` processes, whose cells fix their heap",
    "compare_scale.py": "times `fusebench compare` / `export` subprocesses (no kernels)",
    "overhead.py": "times process start and imports around tiny cells",
}


def _timed(src: str) -> bool:
    return "perf_counter" in src


def _pins(src: str) -> bool:
    return "pin_malloc(" in src


def _calls(src: str, name: str) -> bool:
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None))
               == name for n in ast.walk(ast.parse(src)))


TIMING = [p for p in sorted(BENCH.glob("*.py")) if p.name not in EXEMPT and _timed(p.read_text())]


def test_there_are_in_process_timing_scripts_to_hold():
    assert len(TIMING) >= 10, [p.name for p in TIMING]


@pytest.mark.parametrize("path", TIMING, ids=lambda p: p.name)
def test_a_benchmark_that_times_in_process_fixes_the_heap(path):
    assert _pins(path.read_text()), \
        f"{path.name} times with perf_counter but never calls pin_malloc(None)"


@pytest.mark.parametrize("helper, fn", sorted(HELPERS.items()))
def test_the_shared_timing_helpers_fix_the_heap(helper, fn):
    tree = ast.parse((BENCH / helper).read_text())
    body = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == fn)
    assert _calls(ast.unparse(body), "pin_malloc"), f"{helper}:{fn} does not fix the heap"


def test_the_exemptions_are_still_scripts_that_time():
    for name in EXEMPT:
        assert _timed((BENCH / name).read_text()), f"{name} no longer times: drop its exemption"
