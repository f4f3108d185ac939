"""Distributed cells, coordinator side: validate the settings, refuse a mode x wrapper pair the
mode declares unsupported, launch torchrun, collect the rank files into one aggregated record.

`launch_command` starts `python -m torch.distributed.run ... -m fusebench.cell.rank_cell SPEC OUT`;
every rank (cell/rank_cell.py) writes OUT with a `.rankR` suffix and its pid file (names in
protocol.py); `collect` turns the rank files into one Record with `world_size`, global samples/s
and per-rank step medians.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from pathlib import Path

from fusebench.errors import UsageError
from fusebench.modes.options import DIST_STRATEGIES
from fusebench.protocol import RANK_MODULE
from fusebench.spec import CellSpec, Correctness, DistPart, ErrorInfo, Event, Record

LOOPBACK = "127.0.0.1"   # single-node rendezvous never leaves the machine
NONOK_ORDER = ("crashed", "oom", "timeout", "error", "mismatch", "unavailable")

# The dist part of a CellSpec (strategy, nproc, nnodes, node_rank, rdzv_endpoint; world_size).
DistSettings = DistPart


def validate(dist: str | None, nproc: int | None, nnodes: int = 1, node_rank: int = 0,
             rdzv_endpoint: str | None = None) -> DistSettings | None:
    """CLI values -> settings, or None for a single-process run. Bad values are a UsageError."""
    multi_node = nnodes != 1 or node_rank != 0 or rdzv_endpoint is not None
    if dist is None:
        if nproc not in (None, 1) or multi_node:
            raise UsageError("--nproc/--nnodes/--node-rank/--rdzv-endpoint need --dist "
                             f"({'|'.join(DIST_STRATEGIES)})")
        return None
    if dist not in DIST_STRATEGIES:
        raise UsageError(f"--dist must be one of {', '.join(DIST_STRATEGIES)}, got '{dist}'")
    if nproc is None or nproc < 1:
        raise UsageError(f"--dist {dist} needs --nproc N (processes per node), N >= 1")
    if nnodes < 1:
        raise UsageError(f"--nnodes must be >= 1, got {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise UsageError(f"--node-rank must be in [0, {nnodes - 1}], got {node_rank}")
    if nproc * nnodes < 2:
        raise UsageError(f"--dist {dist} needs a world of >= 2 processes (--nproc > 1 or "
                         "--nnodes > 1)")
    if nnodes > 1 and rdzv_endpoint is None:
        raise UsageError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (node 0's address)")
    if rdzv_endpoint is not None:
        host, sep, port = rdzv_endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"--rdzv-endpoint must be HOST:PORT, got '{rdzv_endpoint}'")
    return DistSettings(dist, nproc, nnodes, node_rank, rdzv_endpoint)


def supports(mode: str, strategy: str) -> tuple[bool, str]:
    """Whether `mode` runs under wrapper `strategy`, as the mode declares (Mode.dist_unsupported).
    Checked once, by the coordinator (precheck), never again in the ranks."""
    from fusebench.modes import MODES, list_modes
    list_modes()                  # loads the built-in modes
    if mode not in MODES:         # a plugin mode not loaded in this process: let it try
        return True, ""
    return MODES[mode].supports_dist(strategy)


def precheck(spec: CellSpec) -> Record | None:
    """An `unavailable` record for a mode x wrapper pair known not to work (no launch needed)."""
    d = spec.dist
    ok, reason = supports(spec.mode, d.strategy) if d else (True, "")
    if ok:
        return None
    return Record(spec, "unavailable", error=ErrorInfo("Unavailable", reason))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def launch_command(d: DistSettings, spec_path: Path, out_path: Path) -> list[str]:
    """torchrun with the current interpreter; static rendezvous so --node-rank is honoured."""
    endpoint = d.rdzv_endpoint or f"{LOOPBACK}:{free_port()}"
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={d.nproc}",
            f"--nnodes={d.nnodes}", f"--node-rank={d.node_rank}", f"--rdzv-endpoint={endpoint}",
            "--max-restarts=0", "-m", RANK_MODULE, str(spec_path), str(out_path)]


def launch_env(d: DistSettings, env: dict[str, str]) -> dict[str, str]:
    env = dict(env)
    if d.nnodes == 1:
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")      # single node: loopback only
    # torchrun would set 1 thread per rank; split the cores instead (unless the user chose)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // d.nproc)))
    return env


def kill_ranks(out_path: Path) -> None:
    """Kill every rank's process group (torchrun starts each rank in its own session, so the
    runner's kill of torchrun's group does not reach them)."""
    for pid_file in Path(out_path).parent.glob(f"{Path(out_path).stem}.rank*.pid"):
        with contextlib.suppress(ValueError, OSError):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)


def collect(spec: CellSpec, out_path: Path) -> Record | None:
    """One record from the rank files this node has; None when no rank wrote one."""
    d = spec.dist
    recs = {}
    for path in Path(out_path).parent.glob(f"{Path(out_path).stem}.rank*.json"):
        with contextlib.suppress(ValueError, OSError):
            rank = int(path.stem.rsplit(".rank", 1)[1])
            recs[rank] = Record.from_dict(json.loads(path.read_text()))
    return aggregate(spec, d, recs) if recs else None


def aggregate(spec: CellSpec, d: DistSettings, recs: dict[int, Record]) -> Record:
    """Rank records -> one. ok only if every rank is ok; throughput = sum over ranks of batch /
    median; step_ms = the slowest rank's (a synchronous step waits for it); peak memory = max."""
    local = sorted(recs)
    expected = range(d.node_rank * d.nproc, (d.node_rank + 1) * d.nproc)
    missing = [r for r in expected if r not in recs]
    dist_extra = {"ranks_reported": local}      # the dist settings are in spec.dist
    bad = [recs[r] for r in local if recs[r].status != "ok"]
    if bad or missing:
        worst = min(bad, key=lambda r: NONOK_ORDER.index(r.status)) if bad else None
        if worst is None:
            worst = Record(spec, "crashed", error=ErrorInfo(
                "Crashed", f"rank(s) {missing} wrote no record (killed when another rank "
                           "failed, or crashed)"))
        status = worst.status
        by_msg: dict[str, list[int]] = {}      # ranks failing the same way: one line
        for r in local:
            if recs[r].status != "ok":
                text = recs[r].status + (f": {recs[r].error.message}" if recs[r].error else "")
                by_msg.setdefault(text, []).append(r)
        if missing:
            by_msg["no record"] = missing
        msg = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))} {text}"
                        for text, rs in by_msg.items())
        err = ErrorInfo(worst.error.type if worst.error else status, msg)
        return worst.replace(status=status, error=err, extra={**worst.extra, **dist_extra})

    first = recs[local[0]]
    ranks = first.extra.get("dist_ranks") or [
        {"rank": r, "batch_size": recs[r].spec.model.batch_size,
         "median_ms": recs[r].step_ms.median,
         "peak_mem_bytes": recs[r].peak_mem_bytes} for r in local]
    slowest = max(local, key=lambda r: recs[r].step_ms.median)
    throughput = sum(x["batch_size"] / (x["median_ms"] / 1e3) for x in ranks)
    peaks = [x["peak_mem_bytes"] for x in ranks if x["peak_mem_bytes"] is not None]
    extra = {k: v for k, v in first.extra.items() if k not in ("dist_ranks", "rank")}
    extra.update(dist_extra, rank_step_ms_median={str(x["rank"]): x["median_ms"] for x in ranks},
                 rank_peak_mem_bytes={str(x["rank"]): x["peak_mem_bytes"] for x in ranks},
                 global_batch_size=sum(x["batch_size"] for x in ranks),
                 ranks_measured=[x["rank"] for x in ranks])
    return first.replace(
        throughput=throughput, step_ms=recs[slowest].step_ms,
        peak_mem_bytes=max(peaks) if peaks else None, events=_merge_events(recs),
        correctness=_merge_correctness(recs), extra=extra,
        status="ok" if all(recs[r].status == "ok" for r in local) else recs[slowest].status)


def _merge_events(recs: dict[int, Record]) -> tuple[Event, ...]:
    """Ranks do the same work: an event is kept once, with the largest count any rank saw."""
    merged: dict[tuple[str, str, str], int] = {}
    for r in sorted(recs):
        for e in recs[r].events:
            key = (e.category, e.source, e.message)
            merged[key] = max(merged.get(key, 0), e.count)
    return tuple(Event(k, s, m, c) for (k, s, m), c in merged.items())


def _merge_correctness(recs: dict[int, Record]) -> Correctness | None:
    cs = {r: recs[r].correctness for r in sorted(recs) if recs[r].correctness}
    if not cs:
        return None

    def worst(attr):
        vals = [getattr(c, attr) for c in cs.values() if getattr(c, attr) is not None]
        return max(vals) if vals else None
    first = next(iter(cs.values()))
    return Correctness(passed=all(c.passed for c in cs.values()),
                       max_rel_err_out=worst("max_rel_err_out"),
                       max_rel_err_grad=worst("max_rel_err_grad"), checked_at=first.checked_at,
                       detail="; ".join(f"rank {r}: {c.detail}" for r, c in cs.items()))
