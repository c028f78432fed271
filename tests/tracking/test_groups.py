"""Finite groups: axioms, orders against known values, conventions, errors."""

import itertools
import math

import numpy as np
import pytest

from dynlab.tracking.groups import alternating, cyclic, dihedral, direct_product, from_generators, get_group, symmetric

KNOWN_ORDERS = {"C2": 2, "C6": 6, "S3": 6, "A4": 12, "S4": 24, "D4": 8, "A5": 60, "S5": 120, "C2xS3": 12, "C2xC3": 6}


@pytest.mark.parametrize("name,order", sorted(KNOWN_ORDERS.items()))
def test_order_matches_known_value(name, order):
    assert get_group(name).order == order


@pytest.mark.parametrize("name", ["C2", "C6", "S3", "A4", "D4", "S4", "C2xS3"])
def test_group_axioms(name):
    g = get_group(name)
    tab = g.table
    n = g.order
    e = g.identity
    # closure and Latin square: every row and column is a permutation of the elements
    assert all(sorted(row) == list(range(n)) for row in tab.tolist())
    assert all(sorted(col) == list(range(n)) for col in tab.T.tolist())
    assert np.all(tab[e] == np.arange(n)) and np.all(tab[:, e] == np.arange(n))
    assert np.all(tab[np.arange(n), g.inverse] == e) and np.all(tab[g.inverse, np.arange(n)] == e)
    for a, b, c in itertools.product(range(n), repeat=3):
        assert tab[tab[a, b], c] == tab[a, tab[b, c]]


def test_multiplication_is_composition_apply_right_first():
    g = symmetric(3)
    for i, a in enumerate(g.elements):
        for j, b in enumerate(g.elements):
            composed = tuple(a[b[p]] for p in range(3))  # (a·b)(p) = a(b(p))
            assert g.elements[g.table[i, j]] == composed


def test_abelian_flags():
    assert cyclic(6).is_abelian() and direct_product(cyclic(2), cyclic(3)).is_abelian()
    assert not symmetric(3).is_abelian() and not dihedral(4).is_abelian() and not alternating(4).is_abelian()


def test_element_orders_of_s3():
    g = symmetric(3)
    orders = sorted(g.element_order(a) for a in range(g.order))
    assert orders == [1, 2, 2, 2, 3, 3]


def test_alternating_is_even_permutations():
    for n in (3, 4, 5):
        g = alternating(n)
        assert g.order == math.factorial(n) // 2
        for p in g.elements:
            inversions = sum(1 for i in range(n) for j in range(i + 1, n) if p[i] > p[j])
            assert inversions % 2 == 0


def test_c2xc3_is_isomorphic_to_c6_by_element_orders():
    a = sorted(get_group("C2xC3").element_order(x) for x in range(6))
    b = sorted(get_group("C6").element_order(x) for x in range(6))
    assert a == b


@pytest.mark.parametrize("bad", ["Q8", "S0", "S9", "D2", "A2", "", "C", "C2xZ"])
def test_unknown_group_names_are_refused_with_allowed_values(bad):
    with pytest.raises(ValueError, match="allowed"):
        get_group(bad)


def test_non_permutation_generator_is_refused():
    with pytest.raises(ValueError, match="not a permutation"):
        from_generators("bad", 3, [(0, 0, 1)])
