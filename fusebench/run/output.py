"""Where a run's results document goes: a name unique to the run, claimed when the run starts.

A name chosen at start but created only when the first cell finishes lets two runs started in
the same second pick the same file and overwrite each other's records. The name therefore holds
a random run id and is claimed before any cell runs, already holding the (empty) document:
written to a temp file, then hard-linked to the name, which fails if the name is taken, so the
claim is atomic and a reader never sees an empty or partial file. Writing it is also the probe
that the folder really takes files (permissions, a full disk, /proc), found before an hour of
cells rather than after."""
from __future__ import annotations

import datetime as _dt
import errno
import os
import secrets
from pathlib import Path

from fusebench.errors import UsageError

RUN_ID_BYTES = 3          # 6 hex digits; with the second-resolution stamp, collisions are retried


class SaveError(OSError):
    """Saving a finished cell failed mid-run; str() is the one line a user reads."""


def _safe(stem: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)[:80]


def out_folder(out_dir: Path) -> Path:
    """--out as an absolute folder that exists (created if need be), or one UsageError."""
    folder = Path(out_dir).expanduser().absolute()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {out_dir}: cannot create folder ({_why(e)})") from None
    if not folder.is_dir():
        raise UsageError(f"--out {out_dir}: {folder} is not a folder")
    return folder


def claim_results_path(out_dir: Path, stem: str, text: str) -> Path:
    """An absolute path unique to this run, created holding `text`."""
    folder = out_folder(out_dir)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        tmp = _write_temp(folder, text)
    except OSError as e:
        raise UsageError(f"--out {out_dir}: cannot write there ({_why(e)})") from None
    try:
        for _ in range(100):
            path = folder / f"{_safe(stem)}-{stamp}-{secrets.token_hex(RUN_ID_BYTES)}.json"
            try:
                os.link(tmp, path)       # atomic: fails when another run holds the name
                return path
            except FileExistsError:
                continue
            except OSError as e:
                raise UsageError(f"--out {out_dir}: cannot write there ({_why(e)})") from None
        raise UsageError(f"--out {out_dir}: could not find a free file name")
    finally:
        tmp.unlink(missing_ok=True)


def _write_temp(folder: Path, text: str) -> Path:
    from fusebench.results.document import write_temp
    return write_temp(folder, ".claim-", text)


def _why(e: OSError) -> str:
    name = errno.errorcode.get(e.errno or 0, "")
    return f"{name}: {e.strerror}" if name and e.strerror else str(e)


def save_error(path: Path | None, e: OSError) -> SaveError:
    return SaveError(e.errno, f"cannot save results to {path or e.filename}: {_why(e)}")
