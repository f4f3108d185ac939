"""The probe: `python -m fusebench.cell.probe REQUEST.json ANSWER.json`.

User code (plugins, model factories, kernel impl files) never runs in the CLI process: the CLI
starts this child under a timeout (run/probe.py) and gets back, as JSON, what planning and
`info`/`list`/`env` need. Whatever the user code prints goes to stderr (stdout is stderr here);
if it exits, the answer says so; if it hangs or ends the process, the CLI names the file from
ANSWER.json.loading (protocol.probe_note_path), which says what is being loaded right now.

REQUEST: {"plugins": "a,b", "device": "cpu", "models": [ref, ...], "model_kwargs": {k: text},
"img_sizes": [int, ...], "impls": [ref, ...], "summary": {"model", "kwargs", "bench",
"img_size"} or null}. ANSWER: {"error": one line} or {"plugins": [...], "catalog": {...},
"models": {ref: {...}}, "summary": {...}}; the catalog holds what the plugins registered."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from fusebench.protocol import probe_note_path

_NOTE: dict[str, object] = {"what": "the probe", "path": None}


def note(what: str) -> None:
    """Say (in memory and on disk) what is being loaded: the name in every failure message."""
    _NOTE["what"] = what
    if _NOTE["path"] is not None:
        Path(_NOTE["path"]).write_text(what)


# ----------------------------------------------------------------------------- registries
def _registered() -> dict[str, set]:
    """Names in each registry whose module is imported (importing none: a plugin-free probe
    stays free of torch)."""
    mods = {k: sys.modules.get(f"fusebench.{k}") for k in
            ("modes.registry", "models.registry", "kernels.registry", "kernels.problem")}
    out = {"modes": set(), "models": set(), "impls": set(), "problems": set()}
    if mods["modes.registry"]:
        out["modes"] = set(mods["modes.registry"].MODES.names())
    if mods["models.registry"]:
        out["models"] = set(mods["models.registry"].MODELS.names())
    if mods["kernels.registry"]:
        reg = mods["kernels.registry"]
        out["impls"] = {(f, n) for f in reg.families() for n in reg.list_impls(f)}
    if mods["kernels.problem"]:
        out["problems"] = set(mods["kernels.problem"].PROBLEMS.names())
    return out


def _available(fn, *args) -> tuple[bool, str]:
    try:
        ok, reason = fn(*args)
        return bool(ok), str(reason or "")
    except Exception as e:   # a broken check says so in its row; it costs nothing else
        from fusebench.errors import describe
        return False, f"availability check failed: {describe(e)}"


def catalog(before: dict[str, set], device: str) -> dict:
    """What the plugins added to the registries, as plain data for the CLI's stand-ins."""
    after = _registered()
    cat: dict = {"modes": {}, "models": {}, "impls": {}, "problems": {}}
    if after["modes"] - before["modes"]:
        from fusebench.modes.registry import MODES
        for name in sorted(after["modes"] - before["modes"]):
            m = MODES[name]
            ok, reason = _available(m.available, dict(m.option_defaults), device)
            cat["modes"][name] = {"description": m.description, "available": ok,
                                  "reason": reason, "dist_unsupported": dict(m.dist_unsupported)}
    if after["models"] - before["models"]:
        from fusebench.models.registry import MODELS
        for name in sorted(after["models"] - before["models"]):
            i = MODELS[name]
            cat["models"][name] = {"family": i.family, "train_size": i.train_size,
                                   "infer_size": i.infer_size, "in_chans": i.in_chans,
                                   "description": i.description}
    if after["impls"] - before["impls"]:
        from fusebench.kernels.registry import get_impl
        for fam, name in sorted(after["impls"] - before["impls"]):
            impl = get_impl(fam, name)
            ok, reason = _available(impl.available, device)
            cat["impls"].setdefault(fam, {})[name] = {"available": ok, "reason": reason,
                                                      "description": impl.description}
    if after["problems"] - before["problems"]:
        from fusebench.kernels.problem import PROBLEMS
        for fam in sorted(after["problems"] - before["problems"]):
            p = PROBLEMS[fam]
            cat["problems"][fam] = {"signature": p.signature, "default_shape": p.default_shape}
    return cat


# ----------------------------------------------------------------------------- the checks
def check_user_files(refs: list[str]) -> None:
    """Import the user's model files first: a bad one is found before torch is imported."""
    from fusebench.loading import is_file_ref, load_ref
    for ref in refs:
        if is_file_ref(ref) and not ref.startswith("timm:"):
            note(f"model '{ref}'")
            load_ref(ref, "model", "factory")


def check_models(refs: list[str], kwargs: dict[str, str], sizes: list[int],
                 sizes_given: bool = False) -> dict:
    """What `run` plans with: each model resolves, takes the --model-kwargs and every size
    (sizes_given: the user's --img-size, which a model with its own inputs refuses)."""
    check_user_files(refs)
    from fusebench.models.source import coerce_kwargs, resolve_model
    out = {}
    for ref in refs:
        note(f"model '{ref}'")
        src = resolve_model(ref)
        coerce_kwargs(src.factory, kwargs)
        for size in sizes:
            src.validate_img_size(size)
        if sizes_given:
            src.refuse_img_size()
        out[ref] = {"origin": src.origin, "family": src.family}
    return out


def check_impls(refs: list[str]) -> list[str]:
    # load_ref as kernels.registry.load_user_impl does, without importing fusebench.kernels
    # (every bundled family, and torch) before the user's file
    from fusebench.loading import load_ref
    for ref in refs:
        note(f"user impl '{ref}'")
        load_ref(ref, "user impl", "function")
    return refs


def answer(req: dict) -> dict:
    from fusebench.plugins import load_plugins
    before = _registered()
    plugins = load_plugins(req.get("plugins") or "", on_load=note)
    out: dict = {"plugins": plugins, "catalog": {}}
    if plugins:       # before the checks load the zoo: what the plugins added, only that
        note("the plugins' registrations")
        out["catalog"] = catalog(before, req.get("device") or "cpu")
    if req.get("models"):
        out["models"] = check_models(req["models"], req.get("model_kwargs") or {},
                                     req.get("img_sizes") or [],
                                     bool(req.get("img_sizes_given")))
    if req.get("impls"):
        out["impls"] = check_impls(req["impls"])
    if req.get("summary"):
        from fusebench.models.summary import model_summary
        s = req["summary"]
        check_user_files([s["model"]])
        note(f"model '{s['model']}'")
        out["summary"] = model_summary(s["model"], s.get("kwargs") or {}, s.get("bench", "infer"),
                                       s.get("img_size"))
    return out


def _failure(e: BaseException) -> str:
    from fusebench.errors import UsageError, describe
    what = _NOTE["what"]
    if isinstance(e, UsageError):
        return str(e)
    if isinstance(e, SystemExit):
        return f"{what} called sys.exit({e.code!r}) while loading; user code must not exit"
    return f"{what} failed: {describe(e)}"


def main(argv: list[str]) -> int:
    os.dup2(2, 1)          # user prints land on stderr: the CLI's stdout may be --json
    from fusebench.cell.worker import _exit_with_parent
    _exit_with_parent()        # a probe never outlives the CLI that waits for it
    request_path, answer_path = argv[1], argv[2]
    _NOTE["path"] = str(probe_note_path(Path(answer_path)))
    with open(request_path) as f:
        req = json.load(f)
    try:
        out = answer(req)
    except BaseException as e:   # the user's code failed: the one line the CLI prints
        out = {"error": " ".join(_failure(e).split())}
    tmp = Path(answer_path + ".tmp")
    tmp.write_text(json.dumps(out, default=str))
    os.replace(tmp, answer_path)            # the CLI reads a whole answer or none
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)   # no teardown: threads or atexit hooks the user code left cannot hang us


if __name__ == "__main__":
    sys.exit(main(sys.argv))
