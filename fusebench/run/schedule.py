"""In which order the worker processes of a run's cells are started (--repeat N).

Sequential: every process of cell 1, then of cell 2, ... Interleaved (the default): round k
starts process k of every cell, so all cells are measured across the same span of time. On a
shared VM the machine's own speed drifts by tens of percent over minutes (docs/measurement.md,
"Why the processes of one cell disagree"): measured one after the other, two cells differ by
that drift, which no statistic of their own processes can see; interleaved, the drift hits
both alike (Abedi & Brecht's "randomized multiple interleaved trials" for cloud machines).
Each round starts one cell later (a rotation, a Latin square when rounds = cells), so no cell
always runs first, e.g. right after another cell's cold compile.
"""
from __future__ import annotations

from collections.abc import Iterator


def rounds(n_cells: int, repeat: int, interleave: bool = True) -> Iterator[list[int]]:
    """Batches of cell indices, one entry per process to start; a cell's record is complete
    once the batch holding its last process ends."""
    if not interleave or repeat == 1 or n_cells == 1:
        for i in range(n_cells):
            yield [i] * repeat
        return
    for k in range(repeat):
        yield [(k + j) % n_cells for j in range(n_cells)]
