"""Finite groups given by permutation generators.

A :class:`Group` is the closure of a set of permutations of ``{0, …, n-1}``.  Its
elements are indexed ``0 … order-1`` with the identity at index 0 and the rest in
lexicographic order of their image tuples, so the indexing is reproducible.

Multiplication convention (used everywhere in dynlab): ``a · b`` is the composition
"apply ``b`` first, then ``a``", i.e. ``(a · b)(i) = a(b(i))``.  The Cayley table is
``table[a, b] = index(a · b)``.

Named constructors: :func:`cyclic` (C_n), :func:`dihedral` (D_n, order 2n),
:func:`symmetric` (S_n), :func:`alternating` (A_n), :func:`direct_product`, and
:func:`get_group` which parses names such as ``"C6"``, ``"S3"``, ``"A5"``, ``"D4"``,
``"C2xS3"``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from dynlab.errors import DynlabInputError

__all__ = [
    "Group",
    "alternating",
    "cyclic",
    "dihedral",
    "direct_product",
    "from_generators",
    "get_group",
    "GROUP_NAME_HELP",
    "MAX_DEGREE",
    "MAX_ORDER",
    "group_name",
    "group_order",
    "symmetric",
]

Perm = tuple[int, ...]

#: Largest group order dynlab builds: the order of S7.  Each element is a token and a
#: class, and the Cayley table holds order² entries (203 MB of int64 at 5040); the order
#: is computed from the name and checked before anything is built.
MAX_ORDER = 5040

#: Largest number of points a group's permutations act on (C_n, D_n, S_n, A_n act on n
#: points, a product on the sum): the elements are kept as image tuples, order × degree
#: entries (at most 2.6 M here; C5040 would need 25 M, ~1 GB of Python objects).
MAX_DEGREE = 512

GROUP_NAME_HELP = (
    "C<n> (cyclic), D<n> (dihedral, order 2n), S<n> (symmetric), A<n> (alternating), "
    f"and direct products joined by 'x' (e.g. C2xS3); n ≥ 1 (D, A: n ≥ 3; S, A: n ≤ 7); "
    f"order ≤ {MAX_ORDER}, points acted on ≤ {MAX_DEGREE}"
)


def _compose(a: Perm, b: Perm) -> Perm:
    """``a · b``: apply ``b`` first, then ``a``."""
    return tuple(a[i] for i in b)


@dataclass(frozen=True)
class Group:
    """A finite permutation group with a fixed element indexing (identity = 0).

    Attributes:
        name: short name, e.g. ``"S3"``.
        degree: number of points the permutations act on.
        elements: image tuples; ``elements[i][p]`` is where element ``i`` sends ``p``.
        table: Cayley table ``[order, order]``, ``table[a, b] = index(a · b)``.
        inverse: ``[order]``, ``inverse[a]`` is the index of a⁻¹.
        generators: the permutations the group was generated from (not compared).
    """

    name: str
    degree: int
    elements: tuple[Perm, ...]
    table: np.ndarray = field(repr=False)
    inverse: np.ndarray = field(repr=False)
    generators: tuple[Perm, ...] = field(default=(), repr=False, compare=False)

    @property
    def order(self) -> int:
        """Number of elements |G|."""
        return len(self.elements)

    @property
    def identity(self) -> int:
        """Index of the identity element (always 0)."""
        return 0

    def mul(self, a: int, b: int) -> int:
        """Index of ``a · b`` (apply b, then a)."""
        return int(self.table[a, b])

    def product(self, word: Sequence[int]) -> int:
        """Running-product convention of the word problem: ``x_T · … · x_2 · x_1``."""
        g = self.identity
        for x in word:
            g = int(self.table[x, g])
        return g

    def is_abelian(self) -> bool:
        return bool(np.array_equal(self.table, self.table.T))

    def element_order(self, a: int) -> int:
        """Smallest k ≥ 1 with a^k = e."""
        g, k = a, 1
        while g != self.identity:
            g, k = int(self.table[a, g]), k + 1
        return k

    def __hash__(self) -> int:
        return hash((self.name, self.elements))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Group) and self.elements == other.elements and self.name == other.name


def from_generators(name: str, degree: int, generators: Sequence[Sequence[int]]) -> Group:
    """Close a set of permutations of ``range(degree)`` under composition.

    Raises:
        ValueError: a generator is not a permutation of ``range(degree)``, or the group
            has more than 5040 elements (dynlab keeps one-hot tokens per element).
    """
    if not 1 <= degree <= MAX_DEGREE:
        raise ValueError(f"group {name} acts on {degree} points; allowed: 1 ≤ degree ≤ {MAX_DEGREE}")
    ident: Perm = tuple(range(degree))
    gens: list[Perm] = []
    for g in generators:
        p = tuple(int(i) for i in g)
        if sorted(p) != list(ident):
            raise ValueError(f"generator {list(g)} is not a permutation of 0..{degree - 1}")
        gens.append(p)
    # Breadth-first closure.  left[g][h] = g·h for every element h and generator g, and
    # parent[e] = (g, h) with e = g·h, h found earlier: enough to fill the Cayley table
    # row by row below without composing all order² pairs.
    seen = {ident}
    frontier = [ident]
    left: list[dict[Perm, Perm]] = [{} for _ in gens]
    parent: dict[Perm, tuple[int, Perm]] = {}  # in order of discovery: parents come first
    while frontier:
        nxt = []
        for h in frontier:
            for k, g in enumerate(gens):
                e = _compose(g, h)
                left[k][h] = e
                if e not in seen:
                    seen.add(e)
                    parent[e] = (k, h)
                    nxt.append(e)
                    if len(seen) > MAX_ORDER:
                        raise ValueError(f"group {name} has more than {MAX_ORDER} elements; allowed: order ≤ {MAX_ORDER}")
        frontier = nxt
    rest = sorted(seen - {ident})
    elements = (ident, *rest)
    index = {e: i for i, e in enumerate(elements)}
    n = len(elements)
    # L[k, b] = index(g_k · b): left multiplication by each generator, as index maps
    lmul = np.array([[index[left[k][b]] for b in elements] for k in range(len(gens))], dtype=np.int64).reshape(-1, n)
    # Row of e = g·h: (g·h)·b = g·(h·b), so table[e] = L_g[table[h]] (rows in BFS order).
    table = np.empty((n, n), dtype=np.int64)
    table[0] = np.arange(n)
    for e in parent:  # discovery order: the row of h is filled before the row of g·h
        k, h = parent[e]
        table[index[e]] = lmul[k][table[index[h]]]
    inverse = np.argmax(table == 0, axis=1).astype(np.int64)
    table.setflags(write=False)
    inverse.setflags(write=False)
    return Group(name=name, degree=degree, elements=elements, table=table, inverse=inverse, generators=tuple(gens))


def _cycle(n: int, k: int | None = None) -> Perm:
    k = n if k is None else k
    return tuple(((i + 1) % k) if i < k else i for i in range(n))


def _swap(n: int, i: int, j: int) -> Perm:
    p = list(range(n))
    p[i], p[j] = p[j], p[i]
    return tuple(p)


def cyclic(n: int) -> Group:
    """C_n: rotations of n points (order n)."""
    if n < 1:
        raise ValueError(f"cyclic group needs n ≥ 1, got {n}")
    return from_generators(f"C{n}", n, [_cycle(n)])


def dihedral(n: int) -> Group:
    """D_n: symmetries of the regular n-gon (order 2n, n ≥ 3)."""
    if n < 3:
        raise ValueError(f"dihedral group needs n ≥ 3, got {n}")
    reflection = tuple((-i) % n for i in range(n))
    return from_generators(f"D{n}", n, [_cycle(n), reflection])


def symmetric(n: int) -> Group:
    """S_n: all permutations of n points (order n!)."""
    if not 1 <= n <= 7:
        raise ValueError(f"symmetric group needs 1 ≤ n ≤ 7, got {n}")
    if n == 1:
        return from_generators("S1", 1, [(0,)])
    return from_generators(f"S{n}", n, [_cycle(n), _swap(n, 0, 1)])


def alternating(n: int) -> Group:
    """A_n: even permutations of n points (order n!/2, n ≥ 3), generated by 3-cycles."""
    if not 3 <= n <= 7:
        raise ValueError(f"alternating group needs 3 ≤ n ≤ 7, got {n}")
    gens = []
    for k in range(2, n):
        p = list(range(n))
        p[0], p[1], p[k] = 1, k, 0  # the 3-cycle (0 1 k)
        gens.append(tuple(p))
    return from_generators(f"A{n}", n, gens)


def direct_product(g: Group, h: Group) -> Group:
    """G × H acting on the disjoint union of their points."""
    n, m = g.degree, h.degree
    gens: list[Perm] = []
    for a in g.generators or g.elements[1:] or g.elements:
        gens.append(tuple(a) + tuple(range(n, n + m)))
    for b in h.generators or h.elements[1:] or h.elements:
        gens.append(tuple(range(n)) + tuple(n + i for i in b))
    return from_generators(f"{g.name}x{h.name}", n + m, gens)


_FACTOR = re.compile(r"^([CDSA])(\d+)$")


def _factors(name: str) -> list[tuple[str, int]]:
    """``[(kind, n), …]`` of a group name, checked against the order limit (:data:`MAX_ORDER`)
    before anything is built; raises ``ValueError`` naming the limit."""
    factors = []
    for part in str(name).strip().upper().split("X"):
        m = _FACTOR.match(part)
        if m is None:
            raise DynlabInputError(f"unknown group {name!r}; allowed: {GROUP_NAME_HELP}")
        digits = m.group(2).lstrip("0") or "0"
        n = int(digits) if len(digits) <= 18 else 10**18  # a longer number is over every limit anyway
        factors.append((m.group(1), n))
    order = 1
    for kind, n in factors:
        order *= _factor_order(kind, n)
        if order > MAX_ORDER:
            raise DynlabInputError(f"group {name!r} is too large: its order exceeds {MAX_ORDER}; allowed: order ≤ {MAX_ORDER} (S7)")
    degree = sum(n for _, n in factors)
    if degree > MAX_DEGREE:
        raise DynlabInputError(
            f"group {name!r} is too large: it acts on {degree} points; allowed: at most {MAX_DEGREE} points "
            f"(C_n, D_n, S_n, A_n act on n, a product on the sum)"
        )
    return factors


def group_order(name: str) -> int:
    """Order of the group called ``name``, from the name alone (nothing is built); raises
    ``ValueError`` for an unknown name or an order above :data:`MAX_ORDER`."""
    order = 1
    for kind, n in _factors(name):
        order *= _factor_order(kind, n)
    return order


def _factor_order(kind: str, n: int) -> int:
    """Order of C_n, D_n, S_n or A_n; n! is only computed for n ≤ 7 (beyond, any value over
    :data:`MAX_ORDER` will do)."""
    if kind == "C":
        return n
    if kind == "D":
        return 2 * n
    if n > 7:
        return MAX_ORDER + 1  # S8 and A8 are already too large
    return math.factorial(n) if kind == "S" else max(1, math.factorial(n) // 2)


#: The n each named family takes (the constructors' own bounds; S_n and A_n above 7 are
#: over :data:`MAX_ORDER` and refused before this applies).
_FACTOR_N = {"C": (1, "n ≥ 1"), "D": (3, "n ≥ 3"), "S": (1, "1 ≤ n ≤ 7"), "A": (3, "3 ≤ n ≤ 7")}
_FAMILY = {"C": "cyclic", "D": "dihedral", "S": "symmetric", "A": "alternating"}


def group_name(name: str) -> str:
    """The canonical spelling of group ``name`` (``c2xs3`` -> ``C2xS3``, ``C06`` -> ``C6``),
    as :func:`get_group` names the group, from the name alone: nothing is built, so an
    unknown name, one too large (:data:`MAX_ORDER`, :data:`MAX_DEGREE`) or one whose n the
    family does not take (``D2``, ``A1``) is refused at once, one line naming the allowed
    names."""
    parts = []
    for kind, n in _factors(name):
        low, need = _FACTOR_N[kind]
        if n < low:
            raise DynlabInputError(f"unknown group {name!r} ({_FAMILY[kind]} group needs {need}, got {n}); "
                                   f"allowed: {GROUP_NAME_HELP}")
        parts.append(f"{kind}{n}")
    return "x".join(parts)


@lru_cache(maxsize=64)
def get_group(name: str) -> Group:
    """Parse a group name: ``C6``, ``S3``, ``A5``, ``D4``, ``C2xS3`` (case-insensitive).

    The order is checked against :data:`MAX_ORDER` from the name before the group is built.
    """
    groups = []
    for kind, n in _factors(name):
        ctor = {"C": cyclic, "D": dihedral, "S": symmetric, "A": alternating}[kind]
        try:
            groups.append(ctor(n))
        except ValueError as exc:
            raise DynlabInputError(f"unknown group {name!r} ({exc}); allowed: {GROUP_NAME_HELP}") from None
    out = groups[0]
    for g in groups[1:]:
        out = direct_product(out, g)
    return out
