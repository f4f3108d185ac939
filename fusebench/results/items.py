"""What `compare` reads of one record, as one small tuple: its cell, variant, labels, status,
the metric's value and samples, and why its timing is noisy (if it is).

Two ways to get there, one comparison (results/compare.py) behind both:
  from_record(record, metric)   any Record (older schema versions, several files, tests);
  from_dicts(dicts, metric)     the record dicts of a document schema.parse_exact accepted,
                                read directly: no Record, CellSpec or StepStats per record
                                (100,000 records: seconds saved). What that reading cannot vouch
                                for (a --repeat record's process groups) goes through a Record.
tests/test_items.py checks that both give the same Item for every kind of record and metric.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, MutableSequence, Sequence
from typing import Any, NamedTuple

from fusebench.dtypes import DTYPES
from fusebench.measure.noise import noisy_fraction
from fusebench.spec import CellSpec, Record, _freeze


class Item(NamedTuple):
    key: tuple                        # CellSpec.cell_key()
    variant: str                      # CellSpec.variant()
    subject: str                      # model name or kernel family
    config: str                       # CellSpec.config_label()
    status: str
    value: float | None               # metric.value (ok or not: _row decides what shows)
    iqr: float | None                 # step_ms.iqr
    samples: Sequence[float] | None   # metric.samples: step times behind the value, or None
    groups: list[Sequence[float]]     # step samples of each worker process ([] without samples)
    noise: str | None                 # noise_of(record): why its timing cannot be trusted
    span: tuple[float, float] | None = None   # --repeat: first and last process start (unix s)
    settings: tuple = ()              # run settings outside the cell key: settings_of()


def settings_of(threads: int | None, cpu_model: bool, extra: Any) -> tuple:
    """((name, value), ...) of the run-only settings that change a step's time: the threads
    asked for, and a CPU model cell's heap policy as its worker applied it (extra.heap; a CPU
    model record without it predates heap policies: glibc trimming, as `--heap trim`)."""
    if not cpu_model:
        return (("threads", threads),)
    heap = extra.get("heap") if isinstance(extra, dict) else None
    return ("threads", threads), ("heap", heap or "unrecorded (glibc trimming)")


class _Spread(NamedTuple):            # what measure.noise.noisy_fraction reads of a StepStats
    median: float
    iqr: float


def noise(step: Any, contention: Any, events: Iterable[tuple[str, str]]) -> str | None:
    """Why a timing cannot be trusted, or None: a wide IQR (step: .median/.iqr), or a busy
    machine (the record's contention fields, or a contention event: (category, message))."""
    frac = noisy_fraction(step) if step is not None else None
    if frac is not None:
        return f"IQR/median {frac:.0%}"
    return busy(contention, events)


def busy(contention: Any, events: Iterable[tuple[str, str]]) -> str | None:
    """Why a record was timed on a busy machine (its contention fields or event), or None."""
    why = _busy(contention) if contention is not None else None
    if why:
        return why
    message = next((m for c, m in events if c == "contention"), None)
    return f"machine busy ({message})" if message is not None else None


def _busy(fields: Any) -> str | None:
    from fusebench.measure import contention
    try:
        if not isinstance(fields, dict) or not contention.is_contended(fields):
            return None
        gpu = "; others on the GPU" if contention.gpu_shared(fields.get("gpu_processes")) else ""
        return (f"machine busy: other processes {contention.share(fields)} of "
                f"{fields.get('worker_cores', '?')} core(s), steal "
                f"{contention.share(fields, 'steal_frac')}"
                + gpu)
    except (KeyError, TypeError, ValueError):   # another version's fields: no verdict
        return None


def from_record(r: Record, metric) -> Item:
    st, spec = r.step_ms, r.spec
    samples = metric.samples(r)
    groups = st.process_groups() if st and st.samples else []
    why = noise(st, r.extra.get("contention"), ((e.category, e.message) for e in r.events))
    return Item(spec.cell_key(), spec.variant(), spec.subject, spec.config_label(), r.status,
                metric.value(r), st.iqr if st else None, samples, groups, why,
                _span(r.extra.get("processes")),
                settings_of(spec.threads, spec.device == "cpu" and spec.model is not None,
                            r.extra))


def _span(processes: Any) -> tuple[float, float] | None:
    """When a record's worker processes started (run/repeat.ProcessSeries), if it says."""
    if not isinstance(processes, list):
        return None
    t = [p.get("started") for p in processes if isinstance(p, dict)]
    t = [x for x in t if isinstance(x, (int, float)) and not isinstance(x, bool)]
    return (min(t), max(t)) if len(t) > 1 else None


# --- the dict reading: CellSpec's keys and labels, from a checked spec dict ---------------------
def _defaults() -> dict[str, dict[str, Any]]:
    import dataclasses
    from fusebench.spec import PARTS
    return {name: {f.name: f.default for f in dataclasses.fields(cls)
                   if f.default is not dataclasses.MISSING}
            for name, cls in (("spec", CellSpec), *PARTS.items())}


_D = _defaults()
_DS, _DM, _DK = _D["spec"], _D["model"], _D["kernel"]


def _options(opts: dict[str, Any] | None) -> str:
    return ("[" + ",".join(f"{k}={v}" for k, v in sorted(opts.items())) + "]") if opts else ""


@functools.lru_cache(maxsize=1024)
def _tail(cl: bool, dtype: str, amp: bool, amp_dtype: str | None, device: str) -> list[str]:
    """The config label's layout, dtype, amp and device words: a few distinct ones per file,
    each built once (not per record of 100,000)."""
    parts = ["NHWC"] if cl else []
    parts.append(dtype.replace("float", "fp").replace("bfp16", "bf16"))
    if amp:
        parts.append(f"amp-{DTYPES[amp_dtype].short}" if amp_dtype in DTYPES else "amp")
    parts.append(device)
    return parts


def _identity(s: dict[str, Any]) -> tuple[tuple, str, str, str, int]:
    """(cell_key, variant, subject, config_label, samples per step) of a spec dict."""
    m, k, dist = s.get("model"), s.get("kernel"), s.get("dist")
    mode, cl = s["mode"], s.get("channels_last", _DS["channels_last"])
    dtype, device = s.get("dtype", _DS["dtype"]), s.get("device", _DS["device"])
    if m:
        name, bench = m["name"], m.get("bench", _DM["bench"])
        bs, img = m.get("batch_size", _DM["batch_size"]), m.get("img_size", _DM["img_size"])
        amp, amp_dtype, kw = m.get("amp", False), m.get("amp_dtype"), m.get("kwargs")
        what = ("model", name, bench, bs, img, amp, _freeze(kw) if kw else ()) + (
            (amp_dtype,) if amp_dtype else ())
        parts = [bench, f"b{bs}", str(img)] if img else [bench, f"b{bs}"]
        subject, variant, per_step = name, mode, bs
    else:
        amp = amp_dtype = kw = None
        shape, direction = tuple(k["shape"]), k.get("direction", _DK["direction"])
        what = ("kernel", k["family"], shape, direction)
        parts = [direction, "x".join(str(x) for x in shape)] + ([mode] if mode != "eager"
                                                               else [])
        subject, variant, per_step = k["family"], k["impl"], shape[0]
    key = (what, cl, dtype, device) + ((("mode", mode),) if not m else ())
    parts += _tail(cl, dtype, bool(m and amp), amp_dtype, device)
    if dist:
        ws = dist["nproc"] * dist.get("nnodes", 1)
        key += (("dist", dist["strategy"] if "strategy" in dist else dist["kind"], ws),)
        parts.append(f"ws{ws}")
    if kw:
        parts.append(",".join(f"{a}={b}" for a, b in sorted(kw.items())))
    opts = s.get("mode_options")
    return key, variant + _options(opts) if opts else variant, subject, " ".join(parts), \
        per_step


def _events(d: dict[str, Any]) -> Iterable[tuple[str, str]]:
    return ((e["category"] if "category" in e else e["kind"], e["message"])
            for e in d.get("events") or ())


def from_dict(d: dict[str, Any], metric) -> Item:
    """from_record(Record.from_dict(d)) for a record dict of an exact document."""
    st = d.get("step_ms")
    if st and len(st.get("process_sizes") or ()) > 1:      # --repeat: the Record splits it
        from fusebench.results.document import record_exact
        return from_record(record_exact(d), metric)
    key, variant, subject, config, per_step = _identity(d["spec"])
    samples = (st.get("samples") or None) if st else None
    why = noise(_Spread(st["median"], st["iqr"]) if st else None,
                (d.get("extra") or {}).get("contention"), _events(d) if d.get("events") else ())
    return Item(key, variant, subject, config, d["status"], metric.from_dict(d, per_step),
                st["iqr"] if st else None, samples if metric.timed else None,
                [samples] if samples else [], why,
                settings=_settings(d["spec"], d.get("extra")))


def _settings(spec: dict[str, Any], extra: Any) -> tuple:
    return settings_of(spec.get("threads"),
                       spec.get("device", _DS["device"]) == "cpu" and bool(spec.get("model")),
                       extra)


def from_dicts(dicts: MutableSequence[Any], metric,
               convert: Callable[[dict[str, Any], Any], Item] = from_dict) -> list[Item]:
    """from_dict of every record; each dict is dropped as it is read (one copy in memory)."""
    out = []
    for i, d in enumerate(dicts):
        out.append(convert(d, metric))
        dicts[i] = None
    return out
