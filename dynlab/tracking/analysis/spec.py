"""The error-control analysis of one trained tracker (docs/error-control.md), as one xarray Dataset.

:func:`dynlab.tracking.analysis.pipeline.analyze_tracker` runs, on fresh sequences of the tracker's word problem:

1. **geometry** over time of the tracked layer's states (streamed in chunks, memory flat
   in length): ``q, R, M, R_par, R_perp (t)``, ``T_cross``, ``failure_mode`` and the
   Corollary-1 fit (:func:`dynlab.analysis.geometry.geometry_over_time`).  Also
   ``q_par = R_par / M``, its crossing ``T_cross_par`` and ``failure_mode_par`` (same
   rules as ``failure_mode``): a nearest-centroid decision
   depends only on the component of h in U, so scatter in U⊥ (where state-dependent
   trackers park their error) cannot cause a misread; q_par is the decoder-relevant
   ratio, q = R/M the paper's;
   **Decoder-aligned readability** (:mod:`dynlab.analysis.readability`), each a ``t``
   variable with its crossing time ``T_cross_<name>`` (τ = 0.5, the same persistence
   rule) and ``failure_mode_<name>``; the ``representation`` attribute says what each
   reads:

   - ``q_pair`` — worst-pair projected ratio, nearest-centroid decoder, on the tracked
     layer's **state**;
   - ``q_pair_out`` — the same on the **readout features** (the input of the final linear
     readout layer: the state for the dense RNN cells, C_t·h_t (+ D x̃_t) for the Mamba
     family), the representation the decoder actually reads;
   - ``q_dec`` — the **trained decoder**'s ratio on the readout features: spread along each
     decision-boundary normal over twice the centroid's distance to that boundary;
   - ``q_pair_ref``, ``q_dec_ref`` — the same with the separations held at ``t_ref``;
   - ``probe_accuracy`` — a logistic-regression probe fitted on states at ``t_ref`` and
     applied at every step; ``T_probe`` is the first persistent step t ≥ t_ref with probe
     accuracy below ``probe_threshold`` (0.9, the accuracy threshold of mp).  Steps before
     t_ref are not searched: there the states of a short prefix can sit elsewhere than at
     t_ref (a probe fitted at 60 read 29 % at t = 5 on a token-gated tracker that was exact
     to 180), which says nothing about extrapolation;
   - ``T_forecast_<name>`` for ``q_pair``, ``q_pair_out`` and ``q_dec`` — Corollary 1 used as
     a forecast: the ratio fitted by a straight line on the steps of the second half of the
     training length, [⌈t_ref/2⌉, t_ref], and extrapolated to τ; a horizon predicted
     without reading any sequence longer than the training length.  It equals the
     observed crossing when that lies inside the training length; NaN (never, censored)
     when the fitted slope is ≤ 0 or the forecast lies beyond the evaluated horizon.

   The number of analysed sequences is raised to ``min_per_class`` per class of the group
   (A5: 960, S5: 1920) so that the spreads are not biased by thin classes;
   ``min_class_count`` records the smallest class at each step and ``thin_classes`` the
   steps where a present class had fewer than 4 samples.

2. **return map on U** (Theorem 1): Jacobians of state-preserving words at the class
   centroids of step ``t_ref`` (default: the training length), restricted to U(t_ref);
   every eigenvalue is kept (dim ``k``) plus the summary ``return_map_eig_max``, the
   median over words and centroids of the largest |eigenvalue|
   (:func:`dynlab.analysis.jacobian.return_map_on_U`), and ``return_map_dist_identity``,
   the median of the spectral norm ‖P_U·DF_w·P_U − I‖ (an eigenvalue of modulus 1 cannot
   tell the identity from a rotation; this can).  The words are checked to multiply to the
   identity before they are used;
3. **perturbation recovery** along U and U⊥ injected at ``t_ref``
   (:func:`dynlab.analysis.perturbation.perturbation_response`);
4. **finite-time Lyapunov exponents** along trajectories (QR method);
5. for two-class groups (C2), the **signed error along U** that shows neutral
   oscillation (:func:`dynlab.analysis.margin.binary_signed_error`);
6. **fixed points of the return maps** per symbolic state
   (:func:`dynlab.tracking.analysis.fixed_points.per_state.tracker_fixed_points`): for each generator a the
   word a^{ord(a)} and ``fp_random_words`` random state-preserving words of
   ``word_length`` tokens, solved from ``fp_starts`` states of each class after t_ref
   tokens (fresh sequences from their own generator, seed ``seed + 2``), with the
   residual, the number of distinct fixed points, the fixed set's dimension, ρ⊥ and ρ∥ per
   token on U(t_ref) and U⊥, stability and the spectra (``fp_*`` variables, dim ``state``);
   for the first ``fp_max_states`` (24) states only (NaN beyond: A5, S5).  From the same
   words, Corollary 1's drift along U at the class centroids of t_ref, ``fp_drift`` (η̄),
   and the crossing of q∥ it predicts, ``T_cross_fp`` (:mod:`dynlab.tracking.analysis.fixed_points.drift`).

Where the logits are a linear map of the tracked state (dense RNN cells), the trained
readout's own threshold ``tau_readout(t)`` = (smallest centroid-to-boundary distance)/M
and the crossing of q over it, ``T_cross_readout``, are reported too.

Crossing rules: a ratio that is NaN (fewer than two classes present) counts as below τ;
merged classes (zero separation, a collapsed tracker) give +inf, so a collapsed tracker
has failed, never 'robust'.

A tracker whose states overflow (an unstable affine map run to length 1000) has failed:
from the first non-finite step on, q is +inf (``blowup_t`` records that step).

All of it is float64.  The variables are per run; the study stacks runs along ``run``.

This module holds its settings (:class:`AnalysisSpec`) and the streams of fresh sequences
it reads (:func:`stream_states`, :func:`stream_representations`); :mod:`dynlab.tracking.analysis.pipeline`
the analysis itself, one function per step.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from pydantic import Field

from dynlab.spec import Spec
from dynlab.tracking.task import WordProblem
from dynlab.tracking.models.streams import tracker_states

__all__ = ["AnalysisSpec", "stream_representations", "stream_states"]


class AnalysisSpec(Spec):
    """Settings of :func:`dynlab.tracking.analysis.pipeline.analyze_tracker` (not part of the run id: analyses can be redone).

    ``horizon`` None means the longest evaluated length; ``t_ref`` None means the
    training length (the curriculum's ``max_length``).
    """

    n_samples: int = Field(512, ge=8)
    horizon: int | None = Field(None, ge=2)
    chunk: int = Field(200, ge=1)
    tau: float = Field(0.5, gt=0)
    persist: int = Field(3, ge=1)
    rank_tol: float = Field(1e-6, gt=0)
    t_ref: int | None = Field(None, ge=1)
    n_words: int = Field(4, ge=1)
    word_length: int = Field(6, ge=1)
    perturb_eps: float = Field(0.25, gt=0)
    perturb_steps: int = Field(100, ge=2)
    perturb_samples: int = Field(256, ge=8)
    lyap_k: int = Field(4, ge=1)
    lyap_steps: int = Field(100, ge=1)
    lyap_samples: int = Field(16, ge=1)
    min_per_class: int = Field(16, ge=2)
    max_samples: int = Field(4096, ge=8)
    probe_threshold: float = Field(0.9, gt=0, le=1)
    horizon_samples: int = Field(1024, ge=8)
    horizon_threshold: float = Field(0.9, gt=0, lt=1)
    fp_starts: int = Field(8, ge=1)
    fp_random_words: int = Field(1, ge=0)
    fp_tol: float = Field(1e-8, gt=0)
    fp_max_states: int = Field(24, ge=1)
    seed: int = 20_000

    def samples_for(self, n_classes: int) -> int:
        """Sequences analysed for a group with ``n_classes`` states: ``n_samples``, raised to
        ``min_per_class`` per class, at most ``max_samples`` (or ``n_samples`` if larger)."""
        return max(self.n_samples, min(self.min_per_class * n_classes, self.max_samples))


def stream_states(
    model: torch.nn.Module,
    task: WordProblem,
    n_samples: int,
    horizon: int,
    chunk: int,
    generator: torch.Generator,
    layer: int = -1,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(states [N, Tc, S_layer], labels [N, Tc])`` chunks of fresh sequences
    (:func:`stream_representations` without the readout features).

    The recurrent state is carried between chunks, so only one chunk is in memory.
    """
    for h, _, y in stream_representations(model, task, n_samples, horizon, chunk, generator, layer):
        yield h, y


def stream_representations(
    model: torch.nn.Module,
    task: WordProblem,
    n_samples: int,
    horizon: int,
    chunk: int,
    generator: torch.Generator,
    layer: int = -1,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Yield ``(states [N, Tc, S_layer], features [N, Tc, F], labels [N, Tc])`` chunks.

    ``features`` is what the final linear readout layer reads
    (:meth:`dynlab.tracking.models.Tracker.readout_features`).  The state is carried between chunks.
    Each chunk is :func:`dynlab.tracking.models.streams.tracker_states` (for the Mamba family on the
    CPU a compiled loop, much faster than the module's forward; ``docs/performance.md``).
    """
    sl = model.layer_slice(layer)
    device = next(model.parameters()).device
    state = model.init_state(n_samples)
    label = torch.zeros(n_samples, dtype=torch.long)
    t0 = 0
    with torch.no_grad():
        while t0 < horizon:
            tc = min(chunk, horizon - t0)
            tokens, labels = task.sample(generator, n_samples, tc, start=label)
            label = labels[:, -1]
            states, feats, state = tracker_states(model, tokens.to(device), state)
            yield states[..., sl].double().cpu().numpy(), feats.double().cpu().numpy(), labels.numpy()
            t0 += tc
