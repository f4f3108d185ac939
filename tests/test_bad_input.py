"""Bad input, generated with hypothesis, through the real CLI entry point `fusebench.cli.main`.

Every case must give: exit code 2, exactly one non-empty line on stderr starting
"fusebench: error:", no traceback anywhere, nothing written (no --out folder, no -o file) and no
worker started (the runner is replaced by a tripwire for the whole module). A few cases also go
through a real `python -m fusebench` subprocess.
"""
from __future__ import annotations

import copy
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fusebench.cli import main
from fusebench.results.document import SCHEMA_VERSION
from tests.helpers import TINY

ROOT = Path(__file__).resolve().parent.parent
TRIED: set[tuple[str, ...]] = set()    # distinct bad inputs tried (tmp paths normalised)
FAST = settings(max_examples=12, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
ZOO = ["convnext_atto", "convnext_tiny", "efficientnet_b0", "efficientnet_b3"]
BUILTIN_MODES = ["eager", "aot", "compile", "torchscript"]
LETTERS = "abcdefghijklmnopqrstuvwxyz_0123456789"


# ----------------------------------------------------------------------------- the tripwire
class WorkerStarted(AssertionError):
    pass


@pytest.fixture(autouse=True, scope="module")
def no_workers():
    """Bad input must fail before anything runs: starting a run fails the test loudly."""
    def tripwire(*a, **k):
        raise WorkerStarted("bad input got past planning: a run was about to start")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("fusebench.results.env.collect_env", tripwire)   # a run's first step
        mp.setattr("fusebench.run.session.run_cells", tripwire)
        mp.setattr("fusebench.run.runner.run_one", tripwire)        # every worker starts here
        yield


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Model files and results files that are wrong in every way we can think of."""
    d = tmp_path_factory.mktemp("bad")
    f = {}
    f["syntax"] = d / "syntax_error.py"
    f["syntax"].write_text("def make(:\n    return 1\n")
    f["import_raises"] = d / "import_raises.py"
    f["import_raises"].write_text("raise RuntimeError('this model file explodes on import')\n")
    f["no_factory"] = d / "no_factory.py"
    f["no_factory"].write_text("import torch\nSIZE = 3\n\ndef make_model():\n"
                               "    return torch.nn.Linear(2, 2)\n")
    f["not_py"] = d / "model.txt"
    f["not_py"].write_text("not python\n")
    good = {"schema": "fusebench/1", "created": "2026-01-01T00:00:00+00:00", "command": [],
            "env": {"torch": "2.13"}, "records": [{
                "model": "convnext_atto", "mode": "eager", "bench": "train", "batch_size": 8,
                "img_size": 224, "channels_last": False, "dtype": "float32", "device": "cpu",
                "status": "ok", "params": 1, "gflops": 1.0, "throughput": 10.0,
                "step_ms": {"median": 1.0, "iqr": 0.1, "p10": 0.9, "p90": 1.1, "n": 3,
                            "samples": [1.0, 0.9, 1.1]},
                "compile_s": 0.1, "peak_mem_bytes": 1, "activation_bytes": 1, "events": [],
                "correctness": None, "error": None}]}
    f["good_text"] = json.dumps(good, indent=1)
    f["dir"] = d
    return f


def _norm(argv, tmp: Path) -> tuple[str, ...]:
    return tuple(str(a).replace(str(tmp), "<tmp>") for a in argv)


def refused(capsys, argv, *, tmp: Path, expect: str | None = None,
            must_not_exist: tuple[Path, ...] = (), key: tuple[str, ...] | None = None) -> str:
    """Run the CLI in-process and check the one-line refusal. Returns the line. `key` names
    the input in TRIED where argv alone does not (the bad part is in the environment)."""
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (argv, rc, err[-2000:])
    assert "Traceback" not in out + err, (argv, err)
    assert len(lines) == 1, (argv, err)
    assert lines[0].startswith("fusebench: error: ") and len(lines[0]) > 20, (argv, err)
    if expect is not None:
        assert expect.lower() in lines[0].lower(), (argv, lines[0])
    for p in must_not_exist:
        assert not p.exists(), f"{p} was written for bad input {argv}"
    TRIED.add(key or _norm(argv, tmp))
    return lines[0]


def run_argv(tmp: Path, *args) -> tuple[list[str], Path]:
    out = tmp / "out"            # must still not exist afterwards
    return ["run", *args, "--out", out], out


# ----------------------------------------------------------------------------- strategies
def misspell(names: list[str]):
    """One edit (drop, swap, double or replace a character) of a real name."""
    def edit(t):
        name, i, how, c = t
        i %= len(name)
        if how == "drop":
            return name[:i] + name[i + 1:]
        if how == "swap" and i + 1 < len(name):
            return name[:i] + name[i + 1] + name[i] + name[i + 2:]
        if how == "dup":
            return name[:i] + name[i] + name[i:]
        return name[:i] + c + name[i + 1:]
    return st.tuples(st.sampled_from(names), st.integers(0, 40),
                     st.sampled_from(["drop", "swap", "dup", "sub"]),
                     st.sampled_from(LETTERS)).map(edit).filter(lambda s: s not in names)


_not_int = st.text("abcxyz.-+e ", min_size=1, max_size=4).filter(
    lambda s: not re.fullmatch(r"\s*[-+]?\d+\s*", s))


def bad_int_list(maximum: int, minimum: int = 1):
    """Comma lists with at least one element that is empty, not an integer or out of range."""
    bad = st.one_of(st.just(""), _not_int, st.integers(-10**6, minimum - 1).map(str),
                    st.integers(maximum + 1, 10**12).map(str),
                    st.sampled_from(["1e9", "0x10", "1.5", "8;16", "99999999999999999999"]))
    good = st.integers(minimum, min(maximum, 64)).map(str)
    return st.tuples(st.lists(good, max_size=2), bad, st.lists(good, max_size=2)).map(
        lambda t: ",".join([*t[0], t[1], *t[2]]))


# ----------------------------------------------------------------------------- run: names
@FAST
@given(name=misspell(ZOO))
def test_misspelled_model_suggests(capsys, tmp_path, name):
    from fusebench.models import list_models
    assume(name and name not in list_models())
    argv, out = run_argv(tmp_path, name)
    refused(capsys, argv, tmp=tmp_path, expect="did you mean", must_not_exist=(out,))


@FAST
@given(mode=misspell(BUILTIN_MODES), first=st.booleans())
def test_misspelled_mode_suggests(capsys, tmp_path, mode, first):
    from fusebench.modes import list_modes
    assume(mode and mode not in list_modes() and mode != "all")
    modes = f"{mode},eager" if first else f"eager,{mode}"
    argv, out = run_argv(tmp_path, "convnext_atto", "-m", modes)
    refused(capsys, argv, tmp=tmp_path, expect="did you mean", must_not_exist=(out,))


@FAST
@given(text=st.sampled_from(["", ",", "eager,,aot", " , ", "eager,"]),
       where=st.sampled_from(["model", "mode"]))
def test_malformed_name_lists(capsys, tmp_path, text, where):
    args = [text] if where == "model" else ["convnext_atto", "-m", text]
    argv, out = run_argv(tmp_path, *args)
    refused(capsys, argv, tmp=tmp_path, must_not_exist=(out,))


# ----------------------------------------------------------------------------- run: numbers
@settings(FAST, max_examples=20)
@given(batch=bad_int_list(1 << 16))
def test_malformed_batch_lists(capsys, tmp_path, batch):
    argv, out = run_argv(tmp_path, "convnext_atto", "-b", batch)
    refused(capsys, argv, tmp=tmp_path, must_not_exist=(out,))


@settings(FAST, max_examples=20)
@given(size=st.one_of(bad_int_list(8192), st.integers(1, 31).map(str)))
def test_bad_image_sizes(capsys, tmp_path, size):
    # 1..31 parse fine but are below what a zoo model (stride 32) accepts
    argv, out = run_argv(tmp_path, "convnext_atto", "--img-size", size)
    refused(capsys, argv, tmp=tmp_path, must_not_exist=(out,))


@settings(FAST, max_examples=20)
@given(case=st.one_of(
    st.tuples(st.just("--steps"), st.one_of(st.integers(-10**9, 0),
                                             st.integers(10**6 + 1, 10**30)).map(str)),
    st.tuples(st.just("--warmup"), st.one_of(st.integers(-10**9, -1),
                                              st.integers(10**6 + 1, 10**30)).map(str)),
    st.tuples(st.just("--timeout"), st.one_of(
        st.floats(max_value=0, allow_nan=False).map(repr),
        st.floats(min_value=604800.5, allow_nan=False, allow_infinity=False).map(repr),
        st.sampled_from(["nan", "inf", "-inf", "0", "1e10"]))),
    st.tuples(st.sampled_from(["--steps", "--warmup", "--seed"]), _not_int)))
def test_zero_negative_huge_counts(capsys, tmp_path, case):
    argv, out = run_argv(tmp_path, "convnext_atto", *case)
    refused(capsys, argv, tmp=tmp_path, must_not_exist=(out,))


# ----------------------------------------------------------------------------- run: options
CONFLICTS = [
    (["--amp", "--dtype", "bfloat16"], "--amp"),
    (["--amp", "--dtype", "float16"], "--amp"),
    (["--dtype", "float16", "--device", "cpu"], "float16"),
    (["--dtype", "float16", "--device", "cpu", "--bench", "infer"],
     "float16 is not supported on CPU"),
    (["--device", "tpu"], "--device"),
    (["--device", "cuda:x"], None),
    (["--device", "cuda:99"], None),
    (["--bench", "training"], "training"),
    (["--dtype", "fp32"], "fp32"),
    (["--ts-fuser", "nvfuzer"], "nvfuzer"),
    (["--aot-compiler", "tvm"], "tvm"),
    (["--compile-backend", "inductr"], "did you mean"),
    (["--bacth-size", "4"], "--bacth-size"),
    (["--stpes", "4"], "--stpes"),
    (["--model-kwarg", "no_equals_sign"], "KEY=VALUE"),
    (["--model-kwarg", "=3"], "KEY=VALUE"),
    (["--model-kwarg", "no_such_kwarg=3"], "no_such_kwarg"),
    (["--model-kwarg", "num_classes=ten"], "num_classes"),
    (["--out", "/dev/null/sub"], "--out"),
    (["--quick", "--steps", "0"], "--steps"),
    (["--heap", "jemalloc"], "--heap"),
    (["--heap", ""], "--heap"),
]


@settings(FAST, max_examples=len(CONFLICTS) * 2)
@given(case=st.sampled_from(CONFLICTS))
def test_conflicting_or_invalid_options(capsys, tmp_path, case):
    import torch
    args, expect = case
    assume(not (torch.cuda.is_available() and any(a.startswith("cuda") for a in args)))
    argv = ["run", "convnext_atto", *args]
    out = tmp_path / "out"
    if "--out" not in args:
        argv += ["--out", out]
    refused(capsys, argv, tmp=tmp_path, expect=expect, must_not_exist=(out,))


# ----------------------------------------------------------------------------- run: model files
@settings(FAST, max_examples=16)
@given(kind=st.sampled_from(["missing", "syntax", "import_raises", "no_factory", "not_callable",
                             "not_py", "empty_factory", "no_path"]),
       factory=st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True))
def test_bad_model_files(capsys, tmp_path, files, kind, factory):
    assume(factory not in ("make_model", "torch", "SIZE"))
    d = files["dir"]
    model, expect = {
        "missing": (f"{d}/no_such_dir/{factory}.py:make", "not found"),
        "syntax": (f"{files['syntax']}:{factory}", "syntax error"),
        "import_raises": (f"{files['import_raises']}:{factory}", "explodes on import"),
        "no_factory": (f"{files['no_factory']}:{factory}", "make_model"),
        "not_callable": (f"{files['no_factory']}:SIZE", "not callable"),
        "not_py": (f"{files['not_py']}:{factory}", "not a .py"),
        "empty_factory": (f"{files['no_factory']}:", None),
        "no_path": (f":{factory}", None),
    }[kind]
    argv, out = run_argv(tmp_path, model)
    refused(capsys, argv, tmp=tmp_path, expect=expect, must_not_exist=(out,))


def test_factory_that_raises_at_build_is_a_cell_error_not_a_usage_error():
    """Documented boundary: resolving the file is planning (exit 2); *calling* the factory is
    the cell's job, so raising_factory passes planning and becomes an `error` record (tested in
    test_runner.test_factory_error_is_an_error_record)."""
    from fusebench.run.plan import RunRequest, plan_run
    from tests.helpers import RAISING
    specs = plan_run(RunRequest(models=RAISING, modes="eager", batch_sizes="2"))
    assert [s.model.name for s in specs] == [RAISING]


# ----------------------------------------------------------------------------- kernel
@settings(FAST, max_examples=30)
@given(case=st.one_of(
    misspell(["ln2d"]).filter(lambda s: s != "ln2d").map(lambda f: ([f], "did you mean")),
    misspell(["permute", "sqm", "fused", "function", "cpu"]).map(
        lambda i: (["ln2d", "--impl", f"{i},permute"], None)),
    st.sampled_from(["8,96,56", "8,96,56,56,1", "a,b,c,d", "0,96,56,56", "8,-96,56,56",
                     "8,,56,56", "", "8x96x56x56"]).map(
        lambda s: (["ln2d", "--shape", s], None)),
    st.sampled_from(["X=1,2", "C=", "C", "C=0", "=4", "C=a"]).map(
        lambda s: (["ln2d", "--sweep", s], None)),
    st.sampled_from([("--steps", "0"), ("--warmup", "-1"), ("--direction", "sideways"),
                     ("--dtype", "int8"), ("-m", "compil")]).map(
        lambda o: (["ln2d", *o], None)),
    st.sampled_from(["missing.py:fn", "impl.txt:fn", "x.py:"]).map(
        lambda s: (["ln2d", "--impl", s], None))))
def test_kernel_bad_input(capsys, tmp_path, case):
    args, expect = case
    out = tmp_path / "out"
    if "--impl" in args and "missing.py" in args[-1]:
        args = [*args[:-1], str(tmp_path / args[-1])]
    refused(capsys, ["kernel", *args, "--out", out], tmp=tmp_path, expect=expect,
            must_not_exist=(out,))


# ----------------------------------------------------------------------------- hostile user code
# What a user's file does when imported -> what the one line must say. User code is loaded in
# the probe process (run/probe.py), never in the CLI, so none of these can end, hang or print
# into the CLI (#14.3).
HOSTILE = {
    "sys_exit": ("import sys\nsys.exit(0)\n", "called sys.exit(0)"),
    "os_exit": ("import os\nos._exit(0)\n", "ended the probe process (exit code 0)"),
    "hang": ("while True:\n    pass\n", "did not finish within"),
    "raise": ("x = 1\ny = x / 0\n", ":2 failed: ZeroDivisionError"),
}
_HOSTILE_TAIL = "\n\ndef make():\n    pass\n\n\ndef fn(x, weight, bias, eps):\n    return x\n"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    out = {}
    for kind, (code, _) in HOSTILE.items():
        out[kind] = d / f"{kind}.py"
        out[kind].write_text(code + _HOSTILE_TAIL)
    return out


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("where", ["run", "info", "kernel", "plugin"])
def test_user_code_that_exits_hangs_or_raises_at_import(capsys, tmp_path, monkeypatch, hostile,
                                                        where, kind):
    """A model file (run, info), a kernel impl file (kernel) or a plugin (list) that exits, hangs
    or raises at import: one line naming the file, exit 2; a hang is killed at the probe's
    timeout, min(--timeout, FUSEBENCH_PROBE_TIMEOUT)."""
    hang = kind == "hang"        # waits out the limit; the others must not meet it under load
    monkeypatch.setenv("FUSEBENCH_PROBE_TIMEOUT", "3" if hang else "300")
    f, out, limit = hostile[kind], tmp_path / "out", "2" if hang else "300"
    argv = {"run": ["run", f"{f}:make", "--timeout", limit, "--out", out],
            "info": ["info", f"{f}:make"],
            "kernel": ["kernel", "ln2d", "--impl", f"{f}:fn", "--timeout", limit, "--out", out],
            "plugin": ["list", "modes"]}[where]
    if where == "plugin":
        monkeypatch.setenv("FUSEBENCH_PLUGINS", str(f))
    key = (f"FUSEBENCH_PLUGINS={kind}", *argv) if where == "plugin" else (where, kind)
    line = refused(capsys, argv, tmp=tmp_path, expect=HOSTILE[kind][1], must_not_exist=(out,),
                   key=key)
    assert str(f) in line
    if hang:
        assert ("within 2 s" if "--timeout" in argv else "within 3 s") in line


BROKEN_PLUGIN_COMMANDS = [["run", "convnext_atto"], ["kernel", "ln2d"], ["list", "modes"],
                          ["list", "models"], ["list", "kernels"], ["env"],
                          ["info", "convnext_atto"]]


@pytest.mark.parametrize("argv", BROKEN_PLUGIN_COMMANDS, ids=" ".join)
def test_broken_plugin_is_one_line_in_every_command(capsys, tmp_path, monkeypatch, hostile,
                                                    argv):
    """Every command that resolves names loads FUSEBENCH_PLUGINS (in the probe) first (#14.6)."""
    monkeypatch.setenv("FUSEBENCH_PLUGINS", str(hostile["raise"]))
    out = tmp_path / "out"
    full = [*argv, "--out", out] if argv[0] in ("run", "kernel") else argv
    line = refused(capsys, full, tmp=tmp_path, expect="ZeroDivisionError", must_not_exist=(out,),
                   key=("FUSEBENCH_PLUGINS=raise", *argv))
    assert f"plugin {hostile['raise']}" in line


# ----------------------------------------------------------------------------- results files
def _results_file(tmp: Path, kind: str, data, good_text: str) -> Path:
    p = tmp / f"in-{kind}.json"
    if kind == "not_json":
        p.write_text(data)
    elif kind == "other_tool":
        p.write_text(json.dumps(data))
    elif kind == "newer":
        doc = json.loads(good_text)
        doc["schema"] = f"fusebench/{data}"
        p.write_text(json.dumps(doc))
    elif kind == "truncated":
        p.write_text(good_text[:max(1, int(len(good_text) * data))])
    elif kind == "bad_record":
        doc = json.loads(good_text)
        doc["records"][0].update(data)
        p.write_text(json.dumps(doc))
    elif kind == "binary":
        p.write_bytes(data)
    elif kind == "missing":
        pass
    return p


def _not_json(s: str) -> bool:
    try:
        json.loads(s)
        return False
    except ValueError:
        return True


RESULTS_CASES = st.one_of(
    st.tuples(st.just("not_json"), st.text(min_size=0, max_size=30).filter(_not_json)),
    st.tuples(st.just("other_tool"), st.one_of(
        st.dictionaries(st.sampled_from(["benchmarks", "version", "metadata", "results"]),
                        st.integers(), min_size=0, max_size=3),
        st.just({"schema": "pyperf/1.0", "records": []}),
        st.just({"schema": 3, "records": []}),
        st.lists(st.integers(), max_size=3), st.integers(), st.just(None))),
    st.tuples(st.just("newer"), st.integers(SCHEMA_VERSION + 1, 10**6)),
    st.tuples(st.just("truncated"), st.floats(0.05, 0.97)),
    st.tuples(st.just("bad_record"), st.sampled_from([
        {"status": "great"}, {"events": 5}, {"step_ms": {"x": 1}}, {"error": "boom"},
        {"correctness": [1]}])),
    st.tuples(st.just("binary"), st.sampled_from([b"\xff\xfe\x00", b"\x80\x04K\x01."])),
    st.tuples(st.just("missing"), st.just(None)))


@settings(FAST, max_examples=30)
@given(case=RESULTS_CASES, command=st.sampled_from(["compare", "export", "plot"]))
def test_bad_results_files(capsys, tmp_path, files, case, command):
    kind, data = case
    src = _results_file(tmp_path, kind, data, files["good_text"])
    before = src.read_bytes() if src.exists() else None
    target = tmp_path / ("fig.png" if command == "plot" else "table.csv")
    argv = [command, src] + (["-o", target] if command in ("plot", "export") else [])
    refused(capsys, argv, tmp=tmp_path, must_not_exist=(target,))
    TRIED.add((command, kind, repr(data)[:80]))
    # the input is never touched
    assert (src.read_bytes() if src.exists() else None) == before


# fields of the wrong type or range, in both layouts: (dotted path, value) set on record 0
WRONG_V2 = [("spec.model.batch_size", [8]), ("spec.model.batch_size", "8"),
            ("spec.model.batch_size", 0), ("spec.model.batch_size", True),
            ("spec.model.name", 5), ("spec.model.name", ""), ("spec.mode", None),
            ("spec.model.img_size", -224), ("spec.channels_last", "yes"),
            ("spec.timeout", -1), ("spec.steps", 2.5), ("spec.model.kwargs", [1]),
            ("step_ms.samples", ["1.0", "2.0"]), ("step_ms.samples", [1.0, -3.0]),
            ("step_ms.median", -1.0), ("step_ms.n", "40"), ("step_ms", [1, 2]),
            ("throughput", "fast"), ("params", 1.5), ("peak_mem_bytes", -5),
            ("events", [{"kind": 1, "source": "x", "message": "m"}]),
            ("events", [{"kind": "w"}]), ("correctness.passed", "no"),
            ("events", [{"category": "w", "kind": "w", "source": "x", "message": "m"}]),
            ("error", {"type": ["X"], "message": "m"}), ("extra", [1, 2]),
            ("status", 3), ("spec.kernel", {"family": "ln2d"})]
WRONG_V1 = [("batch_size", [8]), ("model", 7), ("img_size", "224"), ("step_ms.median", -2.0),
            ("step_ms.samples", ["x"]), ("nproc", "two"), ("shape", [8, "a"]),
            ("compile_s", -0.5), ("cell", {"model": 5, "mode": "eager"})]


def _good_v2() -> dict:
    from tests.factories import document, model_record
    return json.loads(json.dumps(document([model_record(seed=1)])))


def _set(doc: dict, path: str, value, index: int = 0) -> dict:
    cur = doc["records"][index]
    *parents, last = path.split(".")
    for k in parents:
        cur = cur[k]
    cur[last] = value
    return doc


@settings(FAST, max_examples=40)
@given(case=st.one_of(st.tuples(st.just(2), st.sampled_from(WRONG_V2)),
                      st.tuples(st.just(1), st.sampled_from(WRONG_V1))),
       command=st.sampled_from(["compare", "export", "plot"]), index=st.integers(0, 3))
def test_wrongly_typed_record_fields(capsys, tmp_path, files, case, command, index):
    version, (path, value) = case
    doc = _good_v2() if version == 2 else json.loads(files["good_text"])
    doc["records"] = [copy.deepcopy(doc["records"][0]) for _ in range(index + 1)]
    _set(doc, path, value, index)       # the good records before it must not hide it
    src = tmp_path / f"typed-{version}.json"
    src.write_text(json.dumps(doc))
    target = tmp_path / ("fig.png" if command == "plot" else "table.csv")
    argv = [command, src] + (["-o", target] if command != "compare" else [])
    line = refused(capsys, argv, tmp=tmp_path, must_not_exist=(target,))
    assert str(src) in line and f"record {index}" in line, line
    top = path.split(".")[0] if version == 2 or path != "cell" else "spec"
    assert top in line, line
    TRIED.add((command, "typed", str(version), path, repr(value), str(index)))


NUMBER_CASES = ["NaN", "Infinity", "-Infinity", "1e400", "-1e999", "1" + "0" * 400 + ".0"]


@settings(FAST, max_examples=24)
@given(number=st.sampled_from(NUMBER_CASES),
       where=st.sampled_from(["step_ms.median", "throughput", "extra.gbps", "env"]),
       command=st.sampled_from(["compare", "export", "plot"]))
def test_non_finite_numbers(capsys, tmp_path, number, where, command):
    doc = _good_v2()
    if where == "env":
        doc["env"]["x"] = 0.5
    elif where == "extra.gbps":
        doc["records"][0]["extra"]["gbps"] = 0.5
    else:
        _set(doc, where, 0.5)
    text = json.dumps(doc).replace("0.5", number, 1)
    src = tmp_path / "nonfinite.json"
    src.write_text(text)
    target = tmp_path / ("fig.png" if command == "plot" else "table.csv")
    argv = [command, src] + (["-o", target] if command != "compare" else [])
    refused(capsys, argv, tmp=tmp_path, must_not_exist=(target,))
    TRIED.add((command, "number", number, where))


@settings(FAST, max_examples=12)
@given(depth=st.sampled_from([40, 900, 5000, 200_000]), kind=st.sampled_from(["[", "{"]),
       command=st.sampled_from(["compare", "export", "plot"]))
def test_deeply_nested_json(capsys, tmp_path, depth, kind, command):
    opener, closer = ("[", "]") if kind == "[" else ('{"a":', "}")
    doc = _good_v2()
    doc["records"][0]["extra"]["deep"] = "@@"
    text = json.dumps(doc).replace('"@@"', opener * depth + "1" + closer * depth)
    src = tmp_path / "deep.json"
    src.write_text(text)
    target = tmp_path / ("fig.png" if command == "plot" else "table.csv")
    argv = [command, src] + (["-o", target] if command != "compare" else [])
    refused(capsys, argv, tmp=tmp_path, must_not_exist=(target,))
    TRIED.add((command, "deep", kind, str(depth)))


@settings(FAST, max_examples=16)
@given(where=st.sampled_from(["folder", "input", "input_via_link", "under_a_file", "proc",
                              "readonly_folder"]),
       command=st.sampled_from(["export", "plot"]))
def test_bad_output_paths(capsys, tmp_path, where, command):
    from tests.factories import model_record, write_results
    src = write_results(tmp_path / "in.json", [model_record(seed=1)])
    before = src.read_bytes()
    ext = ".png" if command == "plot" else ".csv"
    ro = tmp_path / "ro"
    ro.mkdir(exist_ok=True)
    if where == "readonly_folder":
        if os.geteuid() == 0:   # root writes anywhere: a read-only mount is the same case
            return
        ro.chmod(0o500)
    link = tmp_path / f"link{ext}"
    if where == "input_via_link" and not link.exists():
        link.symlink_to(src)
    target = {"folder": tmp_path, "input": src, "input_via_link": link,
              "under_a_file": src / f"sub{ext}", "proc": Path(f"/proc/fusebench{ext}"),
              "readonly_folder": ro / f"out{ext}"}[where]
    if command == "plot" and where in ("input", "input_via_link"):
        # an image name that is the input: make the input file carry the image extension
        src = src.rename(tmp_path / "in.png") if src.exists() else src
        target = src if where == "input" else link
        if where == "input_via_link":
            link.unlink()
            link.symlink_to(src)
        before = src.read_bytes()
    refused(capsys, [command, src, "-o", target], tmp=tmp_path)
    assert src.read_bytes() == before
    assert not list(tmp_path.glob(".*probe*")) and not list(tmp_path.glob("*.tmp"))
    TRIED.add((command, "output", where))
    ro.chmod(0o700)


class _Planted:
    """Unpickling this would create a marker file: proof that loading executed code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("command", ["compare", "export", "plot"])
def test_results_are_never_unpickled(capsys, tmp_path, command):
    marker = tmp_path / "code-ran"
    src = tmp_path / "evil.json"
    src.write_bytes(pickle.dumps(_Planted(marker)))
    argv = [command, src] + (["-o", tmp_path / "o.png"] if command == "plot" else [])
    refused(capsys, argv, tmp=tmp_path)
    assert not marker.exists()


def test_package_never_unpickles_or_loads_unsafely():
    """Static guard: no pickle anywhere in fusebench; any torch.load says weights_only=True."""
    offenders = []
    for py in (ROOT / "fusebench").rglob("*.py"):
        text = py.read_text()
        if re.search(r"^\s*(import|from)\s+(c?pickle|dill|shelve|marshal)\b", text, re.M):
            offenders.append(f"{py}: imports a pickle-like module")
        for m in re.finditer(r"torch\.load\(([^)]*)\)", text):
            if "weights_only=True" not in m.group(1):
                offenders.append(f"{py}: torch.load without weights_only=True")
    assert not offenders, offenders


# ----------------------------------------------------------------------------- other commands
@pytest.mark.parametrize("argv", [["frobnicate"], ["run"], ["info", "convnxt_tiny"],
                                  ["list", "modles"]])
def test_unknown_commands_and_missing_arguments(capsys, tmp_path, argv):
    refused(capsys, argv, tmp=tmp_path)


# ----------------------------------------------------------------------------- real processes
def test_bad_input_through_real_subprocesses(tmp_path, files):
    """The same contract through `python -m fusebench`: three processes at once (import torch
    costs seconds each)."""
    trunc = tmp_path / "trunc.json"
    trunc.write_text(files["good_text"][:200])
    out = tmp_path / "out"
    cases = [
        (["run", "convnext_tyni", "--out", out], "did you mean convnext_tiny"),
        (["run", TINY, "--amp", "--dtype", "bfloat16", "--out", out], "--amp"),
        (["plot", trunc, "-o", tmp_path / "fig.png"], "not valid JSON"),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    procs = [(subprocess.Popen([sys.executable, "-m", "fusebench", *map(str, a)], cwd=tmp_path,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True), a, e) for a, e in cases]
    for p, argv, expect in procs:
        stdout, stderr = p.communicate(timeout=120)
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        assert p.returncode == 2, (argv, stderr)
        assert len(lines) == 1 and lines[0].startswith("fusebench: error: "), (argv, stderr)
        assert expect.lower() in lines[0].lower() and "Traceback" not in stdout + stderr
        TRIED.add(_norm(["subprocess", *argv], tmp_path))
    assert not out.exists() and not (tmp_path / "fig.png").exists()
    assert not (tmp_path / "results").exists()


def test_count_of_distinct_bad_inputs(capsys):
    """Runs last in this file: the number for the reliability note (>= 30 required)."""
    n = len(TRIED)
    with capsys.disabled():
        print(f"\n[reliability] distinct bad inputs tried: {n}")
    if n == 0:
        pytest.skip("run with the whole file to count")
    assert n >= 30, n
