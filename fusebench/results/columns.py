"""A results file's rows as columns (one list of values per column), for the CSV export.

frame.file_rows builds one flat dict per record (frame._record_row): ~20 dict operations per
record, seconds for 100,000 records. Records of one run share their layout (the same keys at
every level), so here the records are grouped by layout, each layout is flattened once into
a *getter* per column (a key path into the record, a constant, or a function), and each
column is read for a whole group at C speed (chained operator.itemgetter maps). The columns,
their order and their values are those of file_rows: tests/test_columns.py compares the two.

Only for documents schema.parse_exact accepted (known keys, right types); file_columns falls
back to the rows for any other.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple

from fusebench.results.bulk import paused_gc


class Const(NamedTuple):
    """A column with one value on every row of a table."""
    value: Any


class FileColumns(NamedTuple):
    """One file's columns: name -> a list of n values (row order) or a Const."""
    n: int
    columns: dict[str, list[Any] | Const]
    names: list[str]              # the rows' columns, in first-seen order
    head: tuple[str, ...]         # constant columns put first (file, created)
    env: tuple[str, ...]          # constant env columns put last


# --- a layout's getters -------------------------------------------------------------------------
# a getter: a tuple of keys (the value at that path), a Const, or a function of the record
Getter = tuple | Const | Callable[[dict[str, Any]], Any]


def _flat_getters(d: dict[str, Any], path: tuple, prefix: str, out: dict[str, Getter]) -> None:
    """frame._flatten, as getters: a non-empty dict is descended, anything else is a value."""
    for k, v in d.items():
        if isinstance(v, dict) and v:
            _flat_getters(v, path + (k,), f"{prefix}{k}.", out)
        else:
            out[f"{prefix}{k}"] = path + (k,)


def _or(d: dict[str, Any], path: tuple, key: str, default: Any) -> Getter:
    return path + (key,) if key in d else Const(default)


def _world_size(r: dict[str, Any]) -> int:
    from fusebench.results.frame import _DEFAULTS
    d = r["spec"]["dist"]
    return d["nproc"] * d.get("nnodes", _DEFAULTS["dist"]["nnodes"])


def _n_events(r: dict[str, Any]) -> int:
    return sum(int(e.get("count", 1)) for e in r.get("events") or () if isinstance(e, dict))


def _identity_getters(s: dict[str, Any]) -> dict[str, Getter]:
    """frame._identity_exact, as getters."""
    from fusebench.results.frame import _DEFAULTS
    m, k, d = s.get("model"), s.get("kernel"), s.get("dist")
    dm, dk, dd, ds = (_DEFAULTS[x] for x in ("model", "kernel", "dist", "spec"))
    sp = ("spec",)
    g: dict[str, Getter] = {"model": sp + ("model", "name")} if m else \
        {"family": sp + ("kernel", "family")}
    g["mode"] = sp + ("mode",)
    if m:
        mp = sp + ("model",)
        g.update(bench=_or(m, mp, "bench", dm["bench"]),
                 batch_size=_or(m, mp, "batch_size", dm["batch_size"]),
                 img_size=_or(m, mp, "img_size", dm["img_size"]))
    else:
        kp = sp + ("kernel",)
        g.update(impl=kp + ("impl",), shape=kp + ("shape",),
                 direction=_or(k, kp, "direction", dk["direction"]))
    g.update(channels_last=_or(s, sp, "channels_last", ds["channels_last"]),
             dtype=_or(s, sp, "dtype", ds["dtype"]), device=_or(s, sp, "device", ds["device"]))
    if d:
        dp = sp + ("dist",)
        g.update(dist=dp + ("strategy",) if "strategy" in d else _or(d, dp, "kind", None),
                 nproc=dp + ("nproc",), nnodes=_or(d, dp, "nnodes", dd["nnodes"]),
                 node_rank=_or(d, dp, "node_rank", dd["node_rank"]), world_size=_world_size)
    return g


def layout_getters(rec: dict[str, Any]) -> dict[str, Getter]:
    """frame._record_row(rec, exact=True), as one getter per column, for every record of
    rec's layout (_layout)."""
    g = _identity_getters(rec["spec"])
    rest = {k: v for k, v in rec.items() if k not in ("events", "spec", "extra")}
    _flat_getters(rest, (), "", g)
    if rec.get("extra"):
        _flat_getters(rec["extra"], ("extra",), "", g)
    g["spec"] = ("spec",)
    for k in ("step_ms", "correctness", "error"):
        if rec.get(k) is None:
            g.pop(k, None)
    g["events"] = ("events",) if rec.get("events") is not None else Const([])
    g["n_events"] = _n_events if rec.get("events") else Const(0)
    return g


def _shape(v: Any) -> Any:
    """The nested key layout of a dict (what _flat_getters descends into)."""
    return tuple((k, _shape(x) if isinstance(x, dict) and x else None) for k, x in v.items())


def _layout(r: dict[str, Any]) -> tuple:
    """What layout_getters depends on: every key path a getter reads, and which optional
    parts are present (records of one layout share every getter)."""
    s, st, c, e, ev, x = (r["spec"], r.get("step_ms"), r.get("correctness"), r.get("error"),
                          r.get("events"), r.get("extra"))
    m, k, d = s.get("model"), s.get("kernel"), s.get("dist")
    # None and {} read alike for the spec's parts and extra; not for the measured sub-objects
    return (tuple(r), tuple(s), tuple(m or ()), tuple(k or ()), tuple(d or ()),
            st is None, tuple(st or ()), c is None, tuple(c or ()), e is None, tuple(e or ()),
            ev is None, not ev, _shape(x) if x else None)


def _group_values(getters: dict[str, Getter], group: list[dict[str, Any]]
                  ) -> dict[str, Sequence[Any]]:
    """Each column's values over a group of records of one layout. The key paths are read a
    parent object at a time (one itemgetter of all its keys): each record's dicts are visited
    once, not once per column."""
    by_parent: dict[tuple, list[str]] = {}
    out: dict[str, Sequence[Any]] = {}
    for c, g in getters.items():
        if isinstance(g, Const):
            out[c] = [g.value] * len(group)
        elif callable(g):
            out[c] = list(map(g, group))
        else:
            by_parent.setdefault(g[:-1], []).append(c)
    for parent, cols in by_parent.items():
        objs: Any = group
        for k in parent:
            objs = map(itemgetter(k), objs)
        keys = [getters[c][-1] for c in cols]   # type: ignore[index]
        if len(keys) == 1:
            out[cols[0]] = list(map(itemgetter(keys[0]), objs))
        else:
            out.update(zip(cols, zip(*map(itemgetter(*keys), objs))))
    return out


def record_columns(records: list[dict[str, Any]]
                   ) -> tuple[list[str], dict[str, Sequence[Any]]]:
    """The rows' columns (first-seen order) and each one's values in row order (None where a
    row lacks the column), from the record dicts of an exact document."""
    layouts = list(map(_layout, records))
    groups: dict[tuple, list[int]] = {}
    if layouts and layouts.count(layouts[0]) == len(layouts):    # one run: one layout
        groups[layouts[0]] = list(range(len(layouts)))
    for i, layout in enumerate(layouts if not groups else ()):
        groups.setdefault(layout, []).append(i)
    getters = [layout_getters(records[idx[0]]) for idx in groups.values()]
    names = list(dict.fromkeys(c for g in getters for c in g))
    if len(groups) == 1:
        return names, _group_values(getters[0], records)
    order = [i for idx in groups.values() for i in idx]
    where = [0] * len(records)          # row i sits at where[i] of the groups' concatenation
    for pos, i in enumerate(order):
        where[i] = pos
    values = [_group_values(g, [records[i] for i in idx])
              for g, idx in zip(getters, groups.values())]
    cols = {}
    for c in names:
        joined = [v for vs, idx in zip(values, groups.values())
                  for v in (vs[c] if c in vs else [None] * len(idx))]
        cols[c] = list(map(joined.__getitem__, where))
    return names, cols


def file_columns(p: Path) -> FileColumns:
    """frame.file_rows(p) as columns."""
    with paused_gc():
        return _file_columns(p)


def _file_columns(p: Path) -> FileColumns:
    from fusebench.results.document import load_exact
    from fusebench.results.frame import _env_columns, file_rows
    doc = load_exact(p)
    if doc is None:      # any other layout or version: through the rows (which word errors)
        rows, names, head, env = file_rows(p)
        cols: dict[str, list[Any] | Const] = {c: [r.get(c) for r in rows] for c in names}
        n = len(rows)
    else:
        records = doc.pop("records")
        n = len(records)
        names, values = record_columns(records)
        del records
        cols = dict(values)
        head = {"file": str(p), "created": doc.get("created")}
        env = {k: v for k, v in _env_columns(doc.get("env") or {}).items() if k not in cols}
    for k, v in (*head.items(), *env.items()):
        cols[k] = Const(v)
    return FileColumns(n, cols, names, tuple(head), tuple(env))
