"""``dynlab models``: the registered architectures with their declared and measured family."""

from __future__ import annotations


def model_table() -> list[str]:
    """A line per registered cell (name, declared family, measured family) under a header."""
    from dynlab.tracking.models import Tracker, available_cells, measure_family

    lines = [f"{'name':18s} {'declared':16s} {'measured':16s}"]
    for name in available_cells():
        cell = Tracker(name, 4, 4, hidden=8).cells[0]
        lines.append(f"{name:18s} {cell.declared_family:16s} {measure_family(cell):16s}")
    return lines
