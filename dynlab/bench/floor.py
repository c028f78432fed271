"""The floor's cost models: which resource bounds a cell's training (:func:`floor_kind`),
FLOPs per token (:func:`flops_per_token`), bytes per token (:func:`bytes_per_token`), and
the floor row made from them and the machine's speed (:func:`floor_row`).  Definitions:
:mod:`dynlab.bench`."""

from __future__ import annotations

from dynlab.names import CELLS
from dynlab.tracking.models import Tracker

__all__ = ["DENSE", "bytes_per_token", "floor_kind", "floor_row", "flops_per_token"]

#: The dense cells (:data:`dynlab.names.CELLS`): their floor is the GEMM rate's.
DENSE = tuple(c.name for c in CELLS if c.dense)


def floor_kind(arch: str) -> str:
    """``"gemm"`` for dense cells (bound by matrix products), ``"bandwidth"`` for diagonal ones."""
    return "gemm" if arch in DENSE else "bandwidth"


def bytes_per_token(arch: str, hidden: int, d_state: int) -> float:
    """Floor bytes per token of a diagonal cell: 11 float32 streams of the state (:mod:`dynlab.bench`)."""
    model = Tracker(arch, 2, 2, hidden=hidden, d_state=d_state)
    return 11.0 * 4 * model.state_size


def flops_per_token(arch: str, hidden: int, n_classes: int, d_state: int) -> float:
    """Floor FLOPs per token (see :mod:`dynlab.bench`)."""
    model = Tracker(arch, n_classes, n_classes, hidden=hidden, d_state=d_state)
    s = model.state_size
    if arch in DENSE:
        mats = 2 if arch == "state-gated-rnn" else 1
        return 6.0 * (mats * s * s + hidden * n_classes)
    return 6.0 * (2 * s + hidden * n_classes)


def floor_row(arch: str, hidden: int, kind: str, fpt: float, rates: dict[int, float],
              bandwidths: dict[int, float]) -> tuple[float, int, float | None, str]:
    """``(floor tokens/s, the thread count it is taken at, bytes per token or None, row name)``:
    the best GEMM rate over ``fpt`` FLOPs per token (``kind == "gemm"``), or the best
    bandwidth over :func:`bytes_per_token`."""
    if kind == "gemm":
        best_threads = max(rates, key=rates.get)
        return rates[best_threads] / fpt, best_threads, None, "floor (GEMM rate / FLOPs per token)"
    best_threads = max(bandwidths, key=bandwidths.get)
    bpt = bytes_per_token(arch, hidden, 4)
    return bandwidths[best_threads] / bpt, best_threads, bpt, "floor (bandwidth / bytes per token)"
