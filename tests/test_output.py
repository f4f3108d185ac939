"""Where results go: unique names claimed at start, concurrent runs, failing disks."""
from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fusebench.errors import UsageError
from fusebench.run.output import claim_results_path
from tests.helpers import TINY, tiny_spec

ROOT = Path(__file__).resolve().parent.parent


def test_claimed_names_are_unique_absolute_and_exist_at_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths = [claim_results_path(Path("out"), "tiny", "{}\n") for _ in range(50)]  # same second
    assert len(set(paths)) == 50
    assert all(p.is_absolute() and p.read_text() == "{}\n" and p.parent == tmp_path / "out"
               for p in paths)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in paths)


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_results_files_get_the_permissions_a_plain_open_would(tmp_path, umask):
    """mkstemp makes 0600 files; a results file (claimed, then rewritten atomically after each
    cell) follows the umask like any file the user writes."""
    import os
    from fusebench.results.document import write_atomic
    old = os.umask(umask)
    try:
        path = claim_results_path(tmp_path, "tiny", "{}\n")
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask
        write_atomic(path, "{\"a\": 1}\n")
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    finally:
        os.umask(old)


@pytest.mark.parametrize("where", ["/proc/fusebench-out", "file"])
def test_unusable_out_is_one_usage_error(tmp_path, where):
    out = tmp_path / "a_file" if where == "file" else Path(where)
    if where == "file":
        out.write_text("x")
    with pytest.raises(UsageError, match="--out"):
        claim_results_path(out, "tiny", "{}")


def test_two_runs_into_one_folder_keep_every_record(tmp_path):
    """Two real `fusebench run`s started together into the same --out."""
    cmd = [sys.executable, "-m", "fusebench", "run", TINY, "-m", "eager", "-b", "2",
           "--warmup", "1", "--steps", "2", "--no-check", "--out", str(tmp_path / "out")]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "FUSEBENCH_FORKSERVER": "0"}
    import os
    env = {**os.environ, **env}
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    docs = sorted((tmp_path / "out").glob("*.json"))
    assert len(docs) == 2
    assert [len(json.loads(d.read_text())["records"]) for d in docs] == [1, 1]
    printed = {line.split("results: ", 1)[1].strip() for o in outs
               for line in o[0].splitlines() if line.startswith("results: ")}
    assert printed == {str(d) for d in docs}     # absolute paths, one per run


def test_disk_full_mid_run_keeps_saved_cells_and_stops_cleanly(tmp_path, monkeypatch, capsys):
    """ENOSPC on the 2nd save (cell 1 saved, cell 2's save fails): one line naming
    the path and errno, exit 1, cell 1 still on disk, cell 3 never started."""
    from fusebench.results import document
    from fusebench.run import session
    real, calls = document.write_atomic, []

    def flaky(path, text):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, text)
    monkeypatch.setattr(document, "write_atomic", flaky)
    from fusebench.run import runner
    ran, real_run_one = [], runner.run_one
    monkeypatch.setattr(runner, "run_one", lambda spec, *a, **k: ran.append(spec) or
                        real_run_one(spec, *a, **k))
    specs = [tiny_spec(check=False, steps=2, warmup=1) for _ in range(3)]
    rc = session.execute(specs, stem="tiny", out=tmp_path, save=True, json_out=False)
    assert rc == 1
    stderr = capsys.readouterr().err
    err = [line for line in stderr.splitlines() if "error" in line.lower()]
    assert "Traceback" not in stderr
    assert len(err) == 1 and "ENOSPC" in err[0] and str(tmp_path) in err[0], err
    (doc,) = tmp_path.glob("*.json")
    assert len(json.loads(doc.read_text())["records"]) == 1
    assert len(ran) == 2
