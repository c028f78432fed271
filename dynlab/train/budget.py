"""The training budget of a tracker scaled by its group: wider, a larger step cap, and a stop
once the curriculum has completed.

Why: at the quick preset's budget (width 64, 600 steps of batch 128, lr 3e-3) the
state-dependent cells (tanh-rnn, state-gated-rnn) learn groups of order ≤ 8 (C2, C6, S3,
C2xC2, C4, D4) to the training length, but on A4 (order 12) their curriculum stays at
length 3–5 in every seed although they can represent it: the short-length plateau, where
a batch of 128 sequences of length 2–5 must teach the order² entries of the Cayley
table, lasts longer than 600 steps, and at width 64 even 3000 steps leave it at 15–51
(seeds 0–1).  Width 128 and 2400 steps learned A4 in both pilot seeds (the curriculum
completed at steps 1671 and 1893).  A larger learning rate (1e-2) stalled at 15–18, a
larger batch (512) barely moved the plateau, so the rule scales width and steps, not lr
or batch.

Rule (:func:`group_budget`), for a group of order n > :data:`BASE_ORDER` (6, the
largest default group S3) and a base budget of width w, steps s:

- width: ``w · m``, m the smallest power of two with m² ≥ n / 6 (order 7 … 24: 2w;
  25 … 96: 4w), so the dense cells' per-step cost grows about as n;
- steps: a cap of ``ceil(s · 2n / 6)`` (A4: 4s, S4: 8s, A5: 20s);
- ``tail_steps = s // 2``: training stops that many steps after the curriculum first
  reaches its training length (:class:`dynlab.config.TrainSpec`), the cosine decay running
  over them.  A cell that learns the group fast stops early; only a run whose curriculum
  never completes (an affine cell on a group it cannot represent, at short lengths) uses
  the whole cap.

Groups of order ≤ 6 keep the base budget unchanged (the same spec fields, hence the same
run ids as before the rule existed).
"""

from __future__ import annotations

import math
from typing import Any

from dynlab.errors import DynlabInputError
from dynlab.groups import group_order

__all__ = ["BASE_ORDER", "group_budget", "width_factor"]

#: Largest group order whose runs keep the base budget (S3 and C6: the default groups).
BASE_ORDER = 6


def width_factor(order: int) -> int:
    """The smallest power of two m with m² ≥ order / :data:`BASE_ORDER` (1 up to order 6)."""
    if isinstance(order, bool) or not isinstance(order, int) or order < 1:
        raise DynlabInputError(f"group order={order!r}; allowed: an integer ≥ 1")
    m = 1
    while m * m * BASE_ORDER < order:
        m *= 2
    return m


def group_budget(group: str, model: dict[str, Any], train: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(model, train)``: the spec fields of a preset (:class:`~dynlab.config.ModelSpec`
    fields with ``hidden``, :class:`~dynlab.config.TrainSpec` fields with ``steps``) scaled
    for ``group`` by the rule of this module; the same dicts for order ≤ :data:`BASE_ORDER`.

    Raises :class:`~dynlab.errors.DynlabInputError` (one line) for an unknown group name or
    when ``hidden`` or ``steps`` is missing or not a positive integer.
    """
    order = group_order(group)
    for what, fields, key in (("model", model, "hidden"), ("train", train, "steps")):
        value = fields.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DynlabInputError(f"group budget: {what}.{key}={value!r}; allowed: a positive integer")
    if order <= BASE_ORDER:
        return model, train
    steps = train["steps"]
    scaled_model = {**model, "hidden": model["hidden"] * width_factor(order)}
    scaled_train = {**train, "steps": math.ceil(steps * 2 * order / BASE_ORDER), "tail_steps": max(1, steps // 2)}
    return scaled_model, scaled_train
