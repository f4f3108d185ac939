"""Short display forms of names and the table title built from what every row shares.
A leaf module: the table renderers import it, it imports none of them."""
from __future__ import annotations


def display_name(name: str) -> str:
    """'path/to/file.py:make' -> 'make': a table cell has no room for the path."""
    path, sep, fn = name.rpartition(":")
    return fn if sep and path.endswith(".py") else name


def shared_title(title: str, fields: dict[str, list[str]]) -> tuple[str, set[str]]:
    """The title plus every field that has one value in all rows (>1 row); those fields.
    A field that is "-" in every row (no value anywhere) is left out of the title too."""
    same = {k for k, v in fields.items() if len(v) > 1 and len(set(v)) == 1}
    parts = [fields[k][0] for k in fields if k in same and fields[k][0] != "-"]
    return (" · ".join([title, *parts]) if parts else title), same
