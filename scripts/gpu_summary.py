"""Summary of a scripts/gpu_check.sh run: every results document under a folder -> one JSON of
the GPU targets (issues 15 and 16), each `met` / `missed` (or `no data`) with its number, and
the fused mode's ratios on efficientnet_b3 (throughput against eager and compile, activation
bytes against eager), printed as lines.

    python scripts/gpu_summary.py OUT_DIR [--out OUT_DIR/summary.json] [--seconds S]

Reads any fusebench results files (CPU ones too: the GPU figures are then `no data`)."""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fusebench.results.document import load_records  # noqa: E402
from fusebench.spec import Record  # noqa: E402

LN2D_SHAPE = (32, 96, 56, 56)
PCT_TARGET = 85.0           # graph-replayed fwd+bwd, % of copy bandwidth
DEVICE_SECONDS = 450.0      # the whole check: gpu_check.sh's BUDGET (300 s before issue 15's steps)


def records_under(folder: Path) -> list[Record]:
    out: list[Record] = []
    for p in sorted(folder.rglob("*.json")):
        if p.name == "summary.json" or p.name.startswith("env"):
            continue
        try:
            out += load_records(p)[1]
        except Exception as e:   # a half-written or foreign file: say so, keep going
            print(f"skipped {p}: {type(e).__name__}: {e}", file=sys.stderr)
    return out


def _kernel_rows(recs: list[Record]) -> list[dict[str, Any]]:
    rows = []
    for r in recs:
        if r.spec.kernel is None:
            continue
        k, x = r.spec.kernel, r.extra
        rows.append({"family": k.family, "impl": k.impl, "mode": r.spec.mode,
                     "device": r.spec.device, "channels_last": r.spec.channels_last,
                     "dtype": r.spec.dtype,
                     "shape": list(k.shape), "direction": k.direction, "status": r.status,
                     "step_ms": r.step_ms.median if r.step_ms else None,
                     "device_ms": x.get("device_ms"), "device_source": x.get("device_time_source"),
                     "pct_of_copy": x.get("pct_of_copy"),
                     "pct_of_copy_device": x.get("pct_of_copy_device"),
                     "max_err": x.get("max_err"),
                     "reason": r.error.message if r.error else None,
                     "launch_bound": any(e.category == "launch_bound" for e in r.events),
                     "energy_per_step_j": x.get("energy_per_sample_j")})
    return rows


def _model_rows(recs: list[Record]) -> list[dict[str, Any]]:
    rows = []
    for r in recs:
        if r.spec.model is None:
            continue
        x = r.extra
        rows.append({"model": r.spec.model.name, "mode": r.spec.variant(),
                     "status": r.status, "batch": r.spec.model.batch_size,
                     "amp": r.spec.model.amp, "amp_dtype": r.spec.model.amp_dtype,
                     "channels_last": r.spec.channels_last,
                     "device": r.spec.device, "throughput": r.throughput,
                     "step_ms": r.step_ms.median if r.step_ms else None,
                     "activation_bytes": r.activation_bytes,
                     "peak_mem_bytes": r.peak_mem_bytes,
                     "correct": r.correctness.passed if r.correctness else None,
                     "events": [f"{e.category}: {e.message}" for e in r.events
                                if e.category in ("fusion", "kernel_fallback", "unfused")],
                     "energy_per_sample_j": x.get("energy_per_sample_j"),
                     "sm_clock_mhz_mean": x.get("sm_clock_mhz_mean"),
                     "throttle_reasons": x.get("throttle_reasons"),
                     "reason": r.error.message if r.error else None})
    return rows


@dataclass(frozen=True)
class Target:
    name: str
    want: str
    value: Callable[[dict], float | None]   # from the summary's rows
    ok: Callable[[float], bool]


def _ln2d_pct(dtype: str) -> Callable[[dict], float | None]:
    def value(s: dict) -> float | None:
        # graph-replayed: the eager cell's device time is its step replayed as a CUDA graph
        vals = [r["pct_of_copy_device"] for r in s["kernels"]
                if r["impl"] == "triton" and r["dtype"] == dtype and r["status"] == "ok"
                and r["direction"] == "fwdbwd" and tuple(r["shape"]) == LN2D_SHAPE
                and r["device_source"] == "graph_replay" and r["pct_of_copy_device"] is not None]
        return max(vals) if vals else None
    return value


def _modes_ok(s: dict) -> float | None:
    rows = [r for r in s["models"] if r["model"] == "efficientnet_b3"]
    if not rows or all(r["device"] == "cpu" for r in rows):
        return None
    return float(sum(r["status"] != "ok" for r in rows))


def _b3(s: dict, mode: str, key: str) -> float | None:
    """The median of `key` over efficientnet_b3's ok GPU records of `mode` (one per worker)."""
    vals = [r[key] for r in s["models"] if r["model"] == "efficientnet_b3"
            and r["mode"] == mode and r["status"] == "ok" and r["device"] != "cpu" and r[key]]
    return statistics.median(vals) if vals else None


def _throughput(s: dict, mode: str) -> float | None:
    return _b3(s, mode, "throughput")


def _triton_not_ok(s: dict) -> float | None:
    """Triton kernel cells on the GPU that did not pass (mismatch, error, unavailable)."""
    rows = [r for r in s["kernels"] if r["impl"] == "triton" and r["device"] != "cpu"]
    return float(sum(r["status"] != "ok" for r in rows)) if rows else None


def fused_ratios(s: dict) -> list[dict[str, Any]]:
    """Every fused variant of efficientnet_b3 against eager and compile: throughput ratios and
    activation bytes over eager's (None where a side has no ok record)."""
    fused = sorted({r["mode"] for r in s["models"] if r["model"] == "efficientnet_b3"
                    and r["mode"].startswith("fused") and r["device"] != "cpu"})
    eager_act = _b3(s, "eager", "activation_bytes")
    return [{"mode": m,
             "over_eager": _ratio(_throughput(s, m), _throughput(s, "eager")),
             "over_compile": _ratio(_throughput(s, m), _throughput(s, "compile")),
             "activation_bytes": _b3(s, m, "activation_bytes"),
             "activation_over_eager": _ratio(_b3(s, m, "activation_bytes"), eager_act),
             "step_ms": _b3(s, m, "step_ms")} for m in fused]


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _energy_fields(s: dict) -> float | None:
    rows = [r for r in s["models"] if r["status"] == "ok" and r["device"] != "cpu"]
    return float(sum(r["energy_per_sample_j"] is not None for r in rows)) if rows else None


TARGETS = (
    Target("ln2d_fwdbwd_fp32_pct_of_copy", f">= {PCT_TARGET:g}", _ln2d_pct("float32"),
           lambda v: v >= PCT_TARGET),
    Target("ln2d_fwdbwd_bf16_pct_of_copy", f">= {PCT_TARGET:g}", _ln2d_pct("bfloat16"),
           lambda v: v >= PCT_TARGET),
    Target("effnet_b3_modes_not_ok", "== 0 (every mode ran, cudagraphs included)", _modes_ok,
           lambda v: v == 0),
    Target("effnet_b3_fused_over_compile", ">= 1.0 (fused throughput / compile's)",
           lambda s: _ratio(_throughput(s, "fused"), _throughput(s, "compile")),
           lambda v: v >= 1.0),
    Target("triton_kernel_cells_not_ok", "== 0 (every Triton kernel, fwd + grads vs float64)",
           _triton_not_ok, lambda v: v == 0),
    Target("effnet_b3_fused_over_eager", ">= 1.0 (fused throughput / eager's)",
           lambda s: _ratio(_throughput(s, "fused"), _throughput(s, "eager")),
           lambda v: v >= 1.0),
    Target("effnet_b3_fused_activation_over_eager", "<= 0.70 (fused activation bytes / eager's)",
           lambda s: _ratio(_b3(s, "fused", "activation_bytes"),
                            _b3(s, "eager", "activation_bytes")),
           lambda v: v <= 0.70),
    Target("effnet_b3_cudagraphs_over_eager", ">= 1.0 (cudagraphs throughput / eager's)",
           lambda s: _ratio(_throughput(s, "cudagraphs"), _throughput(s, "eager")),
           lambda v: v >= 1.0),
    Target("cells_with_energy", ">= 1 (NVML energy per sample in GPU records)", _energy_fields,
           lambda v: v >= 1),
    Target("check_seconds", f"<= {DEVICE_SECONDS:g}", lambda s: s.get("seconds"),
           lambda v: v <= DEVICE_SECONDS),
)


def summarize(records: list[Record], seconds: float | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {"kernels": _kernel_rows(records), "models": _model_rows(records),
                         "seconds": seconds}
    targets = []
    for t in TARGETS:
        v = t.value(s)
        ok = v is not None and not (isinstance(v, float) and math.isnan(v)) and t.ok(v)
        targets.append({"name": t.name, "want": t.want, "value": v,
                        "verdict": "no data" if v is None else ("met" if ok else "missed")})
    s["targets"] = targets
    s["fused"] = fused_ratios(s)
    s["launch_bound"] = [f"{r['impl']}/{r['mode']}/{r['dtype']}" for r in s["kernels"]
                         if r["launch_bound"]]
    return s


def lines(summary: dict[str, Any]) -> list[str]:
    out = []
    for t in summary["targets"]:
        v = t["value"]
        shown = "—" if v is None else f"{v:.3g}"
        out.append(f"{t['verdict']:>8}  {t['name']} = {shown}  (want {t['want']})")
    num = (lambda v: "—" if v is None else f"{v:.4g}")   # noqa: E731
    for f in summary.get("fused", []):
        act = f["activation_bytes"]
        out.append(f"  efficientnet_b3 {f['mode']}: {num(f['over_eager'])}x eager, "
                   f"{num(f['over_compile'])}x compile, step {num(f['step_ms'])} ms, "
                   f"activations {num(act / 1e6 if act else None)} MB = "
                   f"{num(f['activation_over_eager'])}x eager's")
    for r in summary["models"]:
        out.append(f"  model {r['model']} {r['mode']:<28} {r['status']:<11} "
                   f"step {num(r['step_ms'])} ms  {num(r['throughput'])}/s"
                   f"{'  ' + r['reason'] if r['reason'] else ''}")
    for r in summary["kernels"]:
        if r["status"] != "ok" and r["impl"] == "triton" and r["device"] != "cpu":
            out.append(f"  NOT OK kernel {r['family']} triton {r['dtype']} "
                       f"{'NHWC' if r['channels_last'] else 'NCHW'}: {r['status']} "
                       f"{r['reason'] or ''}")
    for r in summary["kernels"]:
        out.append(f"  kernel {r['family']} {r['impl']:<14} {r['mode']:<11} {r['dtype']:<9} "
                   f"{'NHWC' if r['channels_last'] else 'NCHW'} {r['status']:<11} "
                   f"step {num(r['step_ms'])} ms ({num(r['pct_of_copy'])}% of copy)  "
                   f"device {num(r['device_ms'])} ms ({num(r['pct_of_copy_device'])}% of copy,"
                   f" {r['device_source'] or 'not measured'})"
                   f"{'  LAUNCH-BOUND' if r['launch_bound'] else ''}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--seconds", type=float, default=None, help="the check's wall seconds")
    a = ap.parse_args(argv)
    if not a.folder.is_dir():
        print(f"error: {a.folder} is not a folder", file=sys.stderr)
        return 2
    summary = summarize(records_under(a.folder), a.seconds)
    out = a.out or a.folder / "summary.json"
    out.write_text(json.dumps(summary, indent=1, default=str))
    print("\n".join(lines(summary)))
    print(f"summary: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
