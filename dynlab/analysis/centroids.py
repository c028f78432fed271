"""Class centroids, pair distances and the separation M: the one implementation every analyzer uses.

For the states ``h [N, Tc, F]`` of one time chunk (float64) with integer labels
``y [N, Tc]`` in ``0..G-1`` (:mod:`dynlab.analysis.geometry` has the definitions):

- :func:`class_stats`: per step the class counts, the class centroids c_g(t) (zero rows
  for classes absent at t) and the one-hot labels, as batched matrix products
  (:func:`class_sums`);
- :func:`centre`: the centroids minus cbar(t), the mean of the centroids of the classes
  *present* at t (zero rows for absent classes);
- :func:`pair_distances`: ||c_g - c_g'|| from the centred centroids
  (sqrt(|d_g|² + |d_g'|² - 2 d_g·d_g'), clipped at 0): centring first keeps the rounding
  of the Gram form small when the centroids sit far from the origin; NaN for a pair with an
  absent class;
- :func:`separation`: M(t) = min over pairs of distinct present classes (NaN when fewer
  than two classes are present);
- :func:`class_centroids`: the centroids ``[G, S]`` of states at one step (NaN rows for
  absent classes) with the counts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["as_numpy", "centre", "check_labels", "class_centroids", "class_stats", "class_sums", "pair_distances",
           "separation"]


def as_numpy(x: Any, dtype: Any = np.float64) -> np.ndarray:
    """Array-like (numpy, torch, list) -> numpy array of ``dtype`` (no torch import needed)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


def check_labels(y: np.ndarray, n_classes: int) -> None:
    """Refuse labels outside ``0..n_classes-1``, naming the range found and the one allowed."""
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        raise ValueError(
            f"labels range [{y.min()}, {y.max()}]; allowed: integers in [0, {n_classes - 1}]"
        )


def class_sums(onehot: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``[Tc, G, K]`` sums of ``x [N, Tc, K]`` over the samples of each class
    (``onehot [N, Tc, G]``): one batched matrix product per chunk.  A non-finite entry (an
    exploding tracker) adds to its own class only (in the product, 0·inf = NaN would reach
    every class of its step)."""
    if np.isfinite(x).all():
        return np.matmul(onehot.transpose(1, 2, 0), x.transpose(1, 0, 2))
    y = onehot.argmax(-1)  # [N, Tc]
    out = np.zeros((x.shape[1], onehot.shape[-1], x.shape[-1]))
    np.add.at(out, (np.broadcast_to(np.arange(x.shape[1]), y.shape), y), x)
    return out


def class_stats(h: np.ndarray, y: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Counts ``[Tc, G]``, centroids ``[Tc, G, F]`` (zero rows when absent) and the one-hot
    labels ``[N, Tc, G]`` of ``h [N, Tc, F]`` with labels ``y [N, Tc]``."""
    onehot = (y[..., None] == np.arange(n_classes)).astype(np.float64)  # [N, Tc, G]
    counts = onehot.sum(0)  # [Tc, G]
    cent = class_sums(onehot, h) / np.maximum(counts, 1.0)[..., None]  # [Tc, G, F]
    return counts, cent, onehot


def centre(centroids: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(d [..., G, F], cbar [..., F])``: the centroids minus the mean ``cbar`` of the
    present ones (``present [..., G]``); zero rows for absent classes."""
    c0 = np.where(present[..., None], centroids, 0.0)
    n_present = np.maximum(present.sum(-1), 1)  # [...]
    cbar = c0.sum(-2) / n_present[..., None]  # [..., F]
    return np.where(present[..., None], c0 - cbar[..., None, :], 0.0), cbar


def pair_distances(centroids: np.ndarray, present: np.ndarray | None = None) -> np.ndarray:
    """Pairwise centroid distances ``[..., G, G]`` from ``centroids [..., G, F]``, centred on
    the mean of the present classes (``present [..., G]``; default: the rows without NaN);
    NaN for a pair with an absent class, 0 on the diagonal of a present one."""
    if present is None:
        present = ~np.isnan(centroids).any(-1)
    d, _ = centre(centroids, present)
    sq = (d**2).sum(-1)  # [..., G]
    gram = np.matmul(d, np.swapaxes(d, -1, -2))  # [..., G, G]
    dist = np.sqrt(np.maximum(sq[..., :, None] + sq[..., None, :] - 2.0 * gram, 0.0))
    g = dist.shape[-1]
    dist[..., np.arange(g), np.arange(g)] = 0.0  # the Gram form leaves sqrt(rounding) there
    both = present[..., :, None] & present[..., None, :]
    return np.where(both, dist, np.nan)


def separation(dist: np.ndarray, present: np.ndarray) -> np.ndarray:
    """M = the smallest distance ``dist [..., G, G]`` (:func:`pair_distances`) between two
    distinct present classes (``present [..., G]``) -> ``[...]``; NaN with fewer than two."""
    g = dist.shape[-1]
    pair = present[..., :, None] & present[..., None, :] & ~np.eye(g, dtype=bool)
    big_m = np.where(pair, dist, np.inf).min(axis=(-2, -1))
    return np.where(np.isfinite(big_m), big_m, np.nan)


def class_centroids(
    states: Any, labels: Any, n_classes: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Class means of states at one step.

    Args:
        states: ``[N, S]`` states at one step.
        labels: ``[N]`` integer class of each state, in ``0..n_classes-1``.
        n_classes: number of classes G (default ``labels.max() + 1``).

    Returns:
        centroids ``[G, S]`` (float64; rows of absent classes are NaN) and counts ``[G]``.
    """
    h = as_numpy(states)
    y = as_numpy(labels, np.int64)
    if h.ndim != 2 or y.shape != h.shape[:1]:
        raise ValueError(f"states must be [N, S] and labels [N]; got {h.shape} and {y.shape}")
    g = int(y.max()) + 1 if n_classes is None else int(n_classes)
    check_labels(y, g)
    counts, cent, _ = class_stats(h[:, None, :], y[:, None], g)  # [1, G], [1, G, S]
    centroids = np.where(counts[0, :, None] > 0, cent[0], np.nan)  # [G, S]; NaN rows for absent classes
    return centroids, counts[0].astype(np.int64)
