"""Repro scripts for failing cells: `repro_<model>_<mode>.py` next to the results document.

Each script is standalone Python (it needs only fusebench installed): it embeds the cell's
CellSpec as a JSON literal, loads the same plugins, and replays the cell in-process through the
same cell runner the worker uses — same model or user factory, seed, input shape, layout, dtype,
mode and options. It prints the error or the mismatch detail and exits 1 when the failure
reproduces, 0 when it does not. A cell that crashed simply crashes the same way (faulthandler
prints where); a cell that hung is stopped after its timeout with every thread's stack.
"""
from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from fusebench.results.document import ResultsWriter, save, write_atomic
from fusebench.spec import CellSpec

REPRO_STATUSES = ("error", "crashed", "timeout", "mismatch")
_HEADER = "# fusebench repro for results document: "


def _safe(text: str, limit: int = 60) -> str:
    """'tests/assets/tiny.py:tiny_cnn' -> 'tiny.py_tiny_cnn'; only [A-Za-z0-9_.-] survive."""
    path, sep, fn = str(text).rpartition(":")
    if sep and path.endswith(".py"):
        text = f"{Path(path).stem}_{fn}"
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)).strip("._-")
    return (s or "cell")[:limit]


def _absolute_ref(text: Any) -> Any:
    """A relative 'path/file.py:fn' or 'path/file.py' that exists here -> absolute, so the
    script runs from any folder. Anything else is returned unchanged."""
    if not isinstance(text, str) or text.startswith("timm:"):
        return text
    path, sep, fn = text.rpartition(":")
    if not sep:
        path, fn = text, ""
    if not path.endswith(".py"):
        return text
    p = Path(path).expanduser()
    if p.is_absolute() or not p.is_file():
        return text
    return f"{p.resolve()}{':' + fn if sep else ''}"


def _portable_spec(cell: dict[str, Any]) -> dict[str, Any]:
    """A spec dict whose user files (model factory, kernel impl) are absolute paths."""
    cell = dict(cell)
    if cell.get("model"):
        cell["model"] = {**cell["model"], "name": _absolute_ref(cell["model"]["name"])}
    if cell.get("kernel"):
        cell["kernel"] = {**cell["kernel"], "impl": _absolute_ref(cell["kernel"]["impl"])}
    return cell


def _plugins() -> list[str]:
    value = os.environ.get("FUSEBENCH_PLUGINS", "")
    return [_absolute_ref(p.strip()) for p in value.split(",") if p.strip()]


def _variant(spec: CellSpec) -> str:
    """What tells apart cells that share model and mode (impl, bench, batch, size, ...)."""
    m, k = spec.model, spec.kernel
    if m is not None:
        parts = [m.bench, f"b{m.batch_size}"] + ([f"{m.img_size}px"] if m.img_size else [])
    else:
        parts = [_safe(k.impl, 30), k.direction, "x".join(str(d) for d in k.shape)]
    if spec.dtype != "float32":
        parts.append(spec.dtype)
    if spec.channels_last:
        parts.append("cl")
    return "_".join(p for p in parts if p)


def _owned_by_other(path: Path, results_name: str) -> bool:
    """True when `path` is a repro written for a different results document (keep it)."""
    if not path.exists():
        return False
    try:
        with open(path) as f:
            head = f.read(4096)
    except OSError:
        return True
    return f"{_HEADER}{results_name}\n" not in head


def _names(cells: list[dict[str, Any]], folder: Path, results_name: str) -> list[str]:
    specs = [CellSpec.from_dict(c) for c in cells]
    bases = [f"repro_{_safe(s.subject)}_{_safe(s.mode)}" for s in specs]
    counts = Counter(bases)
    taken: set[str] = set()
    out = []
    for base, spec in zip(bases, specs):
        stem = base if counts[base] == 1 else f"{base}_{_variant(spec)}"
        name, i = f"{stem}.py", 2
        while name in taken or _owned_by_other(folder / name, results_name):
            name, i = f"{stem}-{i}.py", i + 1
        taken.add(name)
        out.append(name)
    return out


def write_repros(writer: ResultsWriter, results_path: Path) -> list[Path]:
    """Write one repro script per failing record of `writer`'s document, point each record at
    its script (extra["repro"]) and re-save the document atomically. Returns the paths."""
    results_path = Path(results_path)
    folder = results_path.parent
    failing = [r for r in writer.doc["records"]
               if r.get("status") in REPRO_STATUSES and isinstance(r.get("spec"), dict)]
    if not failing:
        return []
    cells = [_portable_spec(r["spec"]) for r in failing]
    names = _names(cells, folder, results_path.name)
    plugins = _plugins()
    written = []
    for rec, cell, name in zip(failing, cells, names):
        path = folder / name
        try:
            write_atomic(path, script_text(rec, cell, plugins, results_path.name))
            path.chmod(0o755)
        except OSError as e:    # a repro is a convenience: never lose the results over it
            print(f"fusebench: warning: could not write {path}: {e}", file=sys.stderr)
            continue
        rec.setdefault("extra", {})["repro"] = str(path)
        written.append(path)
    if written:
        save(writer.doc, writer.path or results_path)
    return written


def script_text(rec: dict[str, Any], cell: dict[str, Any], plugins: list[str],
                results_name: str) -> str:
    err = rec.get("error") or {}
    corr = rec.get("correctness") or {}
    if rec["status"] == "mismatch":
        what = corr.get("detail") or "results differ from eager"
    elif err:
        what = f"{err.get('type')}: {err.get('message')}"
    else:
        what = rec["status"]
    signal_name = (rec.get("extra") or {}).get("signal")
    if signal_name:
        what += f" (signal {signal_name})"
    spec_json = json.dumps(cell, indent=1, sort_keys=True, allow_nan=False)
    label = CellSpec.from_dict(cell).title()
    return _TEMPLATE.format(
        header=f"{_HEADER}{results_name}", label=_comment(label), status=rec["status"],
        what=_comment(what), spec=spec_json, plugins=json.dumps(plugins),
        expected=json.dumps(rec["status"]), cwd=json.dumps(os.getcwd()))


def _comment(text: str) -> str:
    """One docstring-safe line."""
    return " ".join(str(text).split()).replace('"""', "'''").replace("\\", "/")[:400]


# The script replays the cell in this process (no worker) so a debugger, faulthandler and the
# full traceback all point at the failing code.
_TEMPLATE = '''#!/usr/bin/env python
{header}
"""Reproduces a failing fusebench cell: {label}.

Recorded status: {status} -- {what}

Run it with plain `python` (fusebench must be importable). Exit code 1: the failure reproduced
(the error, traceback or mismatch detail is printed); 0: the cell ran clean this time. A cell
that crashed crashes the same way (faulthandler prints the Python stack); a cell that hung is
stopped after its timeout with every thread's stack printed.
"""
import faulthandler
import json
import os
import sys
import tempfile
import traceback

SPEC = json.loads(r"""
{spec}
""")
PLUGINS = {plugins}          # FUSEBENCH_PLUGINS of the original run
CWD = {cwd}                  # the original run's folder (relative paths in the spec)
EXPECTED = {expected}


def main() -> int:
    # the cell captures fd 2 for its events; faulthandler writes to a copy of the real stderr
    err = os.fdopen(os.dup(2), "w")
    faulthandler.enable(file=err)
    if os.path.isdir(CWD):
        os.chdir(CWD)
    if PLUGINS:
        os.environ["FUSEBENCH_PLUGINS"] = ",".join(PLUGINS)
    # a fresh compile cache, as the worker had: cold-compile bugs reproduce
    cache = tempfile.mkdtemp(prefix="fusebench-repro-")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(cache, "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(cache, "triton"))
    import importlib
    from fusebench.plugins import load_plugins
    from fusebench.spec import CellSpec
    from fusebench.cell.worker import CELL_RUNNERS

    spec = CellSpec.from_dict(SPEC)
    load_plugins()
    run_cell = importlib.import_module(CELL_RUNNERS[spec.kind]).run_cell
    if spec.timeout:
        faulthandler.dump_traceback_later(spec.timeout, exit=True, file=err)
    print(f"repro: {{spec.title()}} ({{spec.config_label()}}) seed {{spec.seed}} "
          f"(recorded: {{EXPECTED}})", flush=True)
    try:
        rec = run_cell(spec, lambda phase: print(f"  phase: {{phase}}", flush=True))
    except Exception as e:
        traceback.print_exc()
        print(f"REPRODUCED: status error: {{type(e).__name__}}: {{e}}", flush=True)
        return 1
    finally:
        faulthandler.cancel_dump_traceback_later()
    if rec.status == "ok":
        print("not reproduced: the cell ran ok", flush=True)
        return 0
    print(f"REPRODUCED: status {{rec.status}}", flush=True)
    if rec.error is not None:
        print(f"  {{rec.error.type}}: {{rec.error.message}}", flush=True)
    c = rec.correctness
    if c is not None and not c.passed:
        print(f"  mismatch: {{c.detail}} (max rel err out {{c.max_rel_err_out}}, "
              f"grad {{c.max_rel_err_grad}})", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
'''
