"""What the coordinator (run/) and the worker processes (cell/) agree on, with no code of either
side: the modules each process starts with (the worker, a rank, the probe), the phase and state
lines on a worker's stdout and the names of the files the ranks of a distributed cell write. A
leaf: it imports nothing from fusebench."""
from __future__ import annotations

from pathlib import Path

WORKER_MODULE = "fusebench.cell.worker"        # python -m WORKER_MODULE SPEC.json OUT.json
RANK_MODULE = "fusebench.cell.rank_cell"       # torchrun ... -m RANK_MODULE SPEC.json OUT.json
PHASE_PREFIX = "@@fusebench-phase "            # a worker's stdout line: PHASE_PREFIX + phase
STATE_PREFIX = "@@fusebench-state "            # + a JSON object: steps done/total, a step's
                                               # ms and ETA, or {"note": {facts}} (img_size)
PROBE_MODULE = "fusebench.cell.probe"          # python -m PROBE_MODULE REQUEST.json ANSWER.json


def probe_note_path(answer_path: Path) -> Path:
    """ANSWER.json.loading: what the probe is loading right now, so the CLI can name the file
    that hung or ended the probe without answering."""
    return Path(answer_path).with_name(Path(answer_path).name + ".loading")


def rank_path(out_path: Path, rank: int, suffix: str = ".json") -> Path:
    """OUT.rankR.json (the rank's record) or OUT.rankR.pid (its pid, for kill_ranks)."""
    return Path(out_path).with_name(f"{Path(out_path).stem}.rank{rank}{suffix}")
