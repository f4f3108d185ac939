"""Which of fusebench's declared dependencies (pyproject.toml [project].dependencies, plus any
extras named) this Python lacks or has too old, one `name>=version` line each; exit 1 if any.

    python scripts/missing_deps.py [--extra kernels] [--pin]

gpu_check.sh runs it first: a lent GPU machine has its own image and no package index, and
sets PYTHONPATH instead of `pip install`, so nothing else would notice a missing package until
a worker's record could not be read (pydantic, 2026-12-04, which cost that session its model
figures). --pin prints the installed version of each missing one *here* (`name==x.y`), the
form scripts/gpu_wheels.sh downloads for the device's Python."""
from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:          # Python 3.10
    import tomli as tomllib           # type: ignore[no-redef]

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def requirements(extras: list[str]) -> list[Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    names = list(project["dependencies"])
    for e in extras:
        names += project["optional-dependencies"][e]
    return [Requirement(n) for n in names]


def missing(reqs: list[Requirement]) -> list[tuple[Requirement, str | None]]:
    """(requirement, installed version or None) for each one this Python does not satisfy."""
    out = []
    for r in reqs:
        try:
            have = metadata.version(r.name)
        except metadata.PackageNotFoundError:
            out.append((r, None))
            continue
        if r.specifier and not r.specifier.contains(have, prereleases=True):
            out.append((r, have))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extra", action="append", default=[], help="an optional-dependency group")
    ap.add_argument("--pin", action="store_true",
                    help="print name==version as installed here (for scripts/gpu_wheels.sh)")
    a = ap.parse_args(argv)
    try:
        reqs = requirements(a.extra)
    except KeyError as e:
        print(f"error: no optional-dependency group {e} in {PYPROJECT}", file=sys.stderr)
        return 2
    if a.pin:    # what this machine has: the versions to carry to the device
        for r in reqs:
            try:
                print(f"{r.name}=={metadata.version(r.name)}")
            except metadata.PackageNotFoundError:
                print(f"# {r.name}: not installed here either", file=sys.stderr)
        return 0
    gone = missing(reqs)
    for r, have in gone:
        print(f"{r}  ({'not installed' if have is None else f'installed: {have}'})")
    return 1 if gone else 0


if __name__ == "__main__":
    sys.exit(main())
