"""Which groups each built-in tracker can track at every length, by its transition's theory (paper A)."""

from __future__ import annotations

from dynlab import names

__all__ = ["THEORY", "theory_learns"]


#: The groups each built-in tracker can track at every length, by its transition's theory
#: (paper A; :attr:`dynlab.names.CellEntry.theory`).
THEORY: dict[str, str] = dict(names.THEORY)


def theory_learns(arch: str, group: str) -> bool | None:
    """Whether :data:`THEORY` says ``arch`` can track ``group`` (a name :func:`dynlab.tracking.groups.get_group`
    parses) at every length; None for an architecture it does not cover (a user's cell)."""
    from dynlab.tracking.groups import get_group

    kind = THEORY.get(arch)
    if kind is None:
        return None
    g = get_group(group)
    if kind == "none":
        return g.order == 1
    if kind == "elementary abelian 2-groups":
        return g.is_abelian() and all(g.element_order(a) <= 2 for a in range(g.order))
    if kind == "abelian groups":
        return g.is_abelian()
    return True
