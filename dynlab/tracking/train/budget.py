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

Groups larger than order 12 need more.  With width and steps scaled alone, tanh-rnn
on S4 (order 24, width 128, 4800 steps) stopped at length 22 in seeds 0–4 (27–33 at width
256), and at 10–12 in the pilot seeds 10–11; on A5 (order 60, width 256, 12 000 steps) at
length 4.  Two things stop it, seen in the curriculum length over steps (pilot seeds 10,
11; S4 unless said):

- the short-length plateau again: length 3–4 for ~4000 of the 4800 steps.  Twice the width
  (256) ended it by step ~1500, a batch of 512 by ~2000; lr 1.5e-3 / 1e-3 (lr scaled
  down with width) made it longer (length 4–5 at the cap), lr 6e-3 / 1e-2 too (4–6),
  slower growth (0.1), clip 0.25 and a cosine over the cap (``schedule="cosine"``: 4)
  did not help;
- a collapse at length 22–27: a cell that had passed 0.95 at length 22 lost its
  solution at 27 (state-gated-rnn, lr 3e-3: loss 0.6 → 2.6 within 150 steps, length 27
  for the remaining 2300 steps; tanh-rnn at width 256: the same at 27, at 12 000 steps of
  width 128: at 22).  Scaling the rate as 10 / L above length 10
  (:attr:`dynlab.tracking.spec.TrainSpec.lr_length`) removed it: state-gated-rnn reached 60 at
  step 2501, tanh-rnn with batch 512 climbed to 41 without collapsing.

Together (width 256, batch 512, ``lr_length = 10``) tanh-rnn and state-gated-rnn learned S4
in both pilot seeds: tanh-rnn reached length 60 at steps 1096 and 1555 (69 s and 111 s on
one CPU thread), state-gated-rnn at 596 and 466 (126 s, 132 s).  A5 was not piloted: one
run at its budget (width 512, batch 512) takes 14 minutes on one thread when it uses the
cap.  On seeds 0–4 (``docs/results-paper-a.md``) this rule learns S4 in 4/5 (tanh-rnn;
seed 0 collapsed at length 51) and 5/5 (state-gated-rnn); A5 is not established
(tanh-rnn seed 0: length 12 at the cap, collapsing at 10–12).

Rule (:func:`group_budget`), for a group of order n > :data:`BASE_ORDER` (6, the
largest default group S3) and a base budget of width w, steps s, batch b:

- width: ``w · m``, m the smallest power of two with m² ≥ n / 6 (order 7 … 24: 2w;
  25 … 96: 4w), so the dense cells' per-step cost grows about as n; doubled for n >
  :data:`LARGE_ORDER` (12): order 13 … 24: 4w, 25 … 96: 8w;
- steps: a cap of ``ceil(s · 2n / 6)`` (A4: 4s, S4: 8s, A5: 20s);
- ``tail_steps = s // 2``: training stops that many steps after the curriculum first
  reaches its training length (:class:`dynlab.tracking.spec.TrainSpec`), the cosine decay running
  over them.  A cell that learns the group fast stops early; only a run whose curriculum
  never completes (an affine cell on a group it cannot represent, at short lengths) uses
  the whole cap;
- for n > 12 only: batch ``4b`` and ``lr_length =`` :data:`LR_LENGTH` (10).

Groups of order ≤ 6 keep the base budget unchanged (the same spec fields, hence the same
run ids as before the rule existed); orders 7–12 keep the specs (and run ids) of the
first rule.
"""

from __future__ import annotations

import math
from typing import Any

from dynlab.errors import DynlabInputError
from dynlab.tracking.groups import group_order

__all__ = ["BASE_ORDER", "LARGE_ORDER", "LR_LENGTH", "group_budget", "width_factor"]

#: Largest group order whose runs keep the base budget (S3 and C6: the default groups).
BASE_ORDER = 6

#: Largest group order of the first scaling alone (A4, C12, D6, C2xS3); larger groups
#: (S4, A5, …) also get twice the width, four times the batch and :data:`LR_LENGTH`.
LARGE_ORDER = 12

#: ``TrainSpec.lr_length`` of groups larger than :data:`LARGE_ORDER`: the learning rate
#: falls as 10 / L once the curriculum length L exceeds 10.
LR_LENGTH = 10


def width_factor(order: int) -> int:
    """The smallest power of two m with m² ≥ order / :data:`BASE_ORDER` (1 up to order 6)."""
    if isinstance(order, bool) or not isinstance(order, int) or order < 1:
        raise DynlabInputError(f"group order={order!r}; allowed: an integer ≥ 1")
    m = 1
    while m * m * BASE_ORDER < order:
        m *= 2
    return m


def group_budget(group: str, model: dict[str, Any], train: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(model, train)``: the spec fields of a preset (:class:`~dynlab.tracking.spec.ModelSpec`
    fields with ``hidden``, :class:`~dynlab.tracking.spec.TrainSpec` fields with ``steps``) scaled
    for ``group`` by the rule of this module; the same dicts for order ≤ :data:`BASE_ORDER`.

    Raises :class:`~dynlab.errors.DynlabInputError` (one line) for an unknown group name or
    when ``hidden`` or ``steps`` is missing or not a positive integer.
    """
    order = group_order(group)
    hidden, steps = _positive_int("model", model, "hidden"), _positive_int("train", train, "steps")
    if order <= BASE_ORDER:
        return model, train
    large = order > LARGE_ORDER
    scaled_model = {**model, "hidden": hidden * width_factor(order) * (2 if large else 1)}
    scaled_train = {**train, "steps": math.ceil(steps * 2 * order / BASE_ORDER), "tail_steps": max(1, steps // 2)}
    if large:
        scaled_train.update(batch_size=4 * _positive_int("train", train, "batch_size"), lr_length=LR_LENGTH)
    return scaled_model, scaled_train


def _positive_int(what: str, fields: dict[str, Any], key: str) -> int:
    """``fields[key]``, refused in one line unless it is a positive integer."""
    value = fields.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DynlabInputError(f"group budget: {what}.{key}={value!r}; allowed: a positive integer")
    return value
