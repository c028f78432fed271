"""Study ``nonlinearity`` (paper A, ablation): which state nonlinearity φ controls errors?

One cell, the token-gated RNN h_t = φ(σ(W_g x̃_t + b_g) ⊙ (A h_{t-1}) + B x̃_t + b), is
trained with φ in tanh, ReLU, pairwise max/min, GroupSort (blocks of 4), LayerNorm and
the spherical projection h ↦ √S·h/‖h‖ (:mod:`dynlab.tracking.models.nonlinearity`), on C6 and S3
(``--groups`` selects others).  Why this cell: its gate depends on the token only, so with
φ = identity it is affine and φ is the *only* source of state dependence (the ablation
isolates φ); and its transition depends on the input, so every φ can express the group.
The plain dense RNN ``tanh-rnn`` (input-independent A) cannot serve: with a normalising φ
its logits are, up to a positive scale, a sum of per-token terms, which cannot express a
non-abelian product, and measured at the quick size LayerNorm and the sphere never passed
length 2 on C6 or S3 with it.  The state-gated cell's gate σ(U h + W x) depends on h
whatever φ is, which would blur the LayerNorm/sphere arm.  ``--models`` may still pick
another registered cell for a second ablation.

Everything else is the group-tracking study's, reused by import, not copied: presets
(``quick``, ``paper``: widths, steps, evaluation to length 1000), training, evaluation,
the per-run analyses and the dataset layout (coordinate ``nonlinearity`` on ``run``).
Paper A's finding to reproduce: pointwise/pairwise φ (tanh, ReLU, max/min, GroupSort)
track robustly, LayerNorm and the sphere fail like affine trackers.

Outputs: the study dataset, :func:`table` (Markdown: mp median/range and failure-mode
counts per φ and group) and the figure panels of :mod:`dynlab.figures` (``mp by
nonlinearity``, accuracy heatmaps with one row per φ, failure modes, q(t), return-map
eigenvalues); ``dynlab figures`` writes them with ``mp_table.md``.
"""

from __future__ import annotations

import xarray as xr

from dynlab.tracking.spec import RunSpec
from dynlab.errors import DynlabInputError
from dynlab.names import ABLATION_NONLINEARITIES as NONLINEARITIES  # the φ of the ablation
from dynlab.tracking.figures.ablation import mp_failure_table
from dynlab.tracking.models import available_cells
from dynlab.studies import group_tracking as gt
from dynlab.runner.protocol import Study, StudyOptions

__all__ = ["DEFAULT_CELL", "DEFAULT_GROUPS", "NONLINEARITIES", "STUDY", "NonlinearityOptions", "make_specs", "table"]

DEFAULT_GROUPS = ("C6", "S3")
DEFAULT_CELL = "token-gated-rnn"


def _select_cells(models: tuple[str, ...] | None) -> tuple[str, ...]:
    if models is None or models == ("all",):
        return (DEFAULT_CELL,)
    allowed = available_cells()
    for m in models:
        if m not in allowed:
            raise DynlabInputError(f"unknown model {m!r}; allowed: all (= {DEFAULT_CELL}), {', '.join(allowed)}")
    return tuple(dict.fromkeys(models))


class NonlinearityOptions(gt.TrackingOptions):
    """group-tracking's options (``groups``, ``model``, ``train``, ``eval``, ``analysis``) and
    ``nonlinearities``: the φ to train (default: all of :data:`NONLINEARITIES`)."""

    nonlinearities: tuple[str, ...] | None = None


def _select_phis(phis: tuple[str, ...] | None) -> tuple[str, ...]:
    phis = NONLINEARITIES if phis is None else phis
    bad = [p for p in phis if p not in NONLINEARITIES]
    if bad or not phis:
        raise DynlabInputError(f"unknown nonlinearity {bad[0] if bad else '(none)'!r}; allowed: {', '.join(NONLINEARITIES)}")
    return tuple(dict.fromkeys(phis))


def make_specs(options: StudyOptions) -> list[RunSpec]:
    """One spec per (φ, group, cell, seed): group-tracking's specs with ``nonlinearity`` set.

    ``options.extra['nonlinearities']`` restricts φ (default: all six of :data:`NONLINEARITIES`);
    the other ``extra`` keys (``model``, ``train``, ``eval``) override the preset as in
    group-tracking.
    """
    parsed = NonlinearityOptions.parse(options, "nonlinearity")
    phis = _select_phis(parsed.nonlinearities)
    extra = {k: v for k, v in options.extra.items() if k != "nonlinearities"}
    cells = _select_cells(options.models)
    specs: list[RunSpec] = []
    for phi in phis:
        model_kw = {**parsed.model, "nonlinearity": phi}
        sub = StudyOptions(
            preset=options.preset,
            models=cells,
            seeds=options.seeds,
            extra={**extra, "groups": parsed.groups or DEFAULT_GROUPS, "model": model_kw},
        )
        specs.extend(gt.make_specs(sub))
    return specs


def table(ds: xr.Dataset) -> str:
    """Markdown table of mp (median, range) and failure-mode counts per φ and group."""
    return mp_failure_table(ds, by="nonlinearity")


STUDY = Study(
    name="nonlinearity",
    presets=tuple(p for p in gt.STUDY.presets if p != "groups"),  # groups: group-tracking's own group list
    make_specs=make_specs,
    run_one=gt.STUDY.run_one,
    assemble=gt.STUDY.assemble,
    analyze_one=gt.STUDY.analyze_one,
    stacking=gt.STUDY.stacking,
    spec_type=RunSpec,
    result_type=gt.STUDY.result_type,
    options_type=NonlinearityOptions,
    prepare_options=gt.STUDY.prepare_options,
    check_analyses=gt.STUDY.check_analyses,
    panels=lambda ds: _panels(ds),
)


def _panels(ds: xr.Dataset) -> dict:
    """The study's figures and ``mp_table`` (:func:`dynlab.tracking.figures.sets.nonlinearity_panels`)."""
    from dynlab.tracking.figures.sets import nonlinearity_panels

    return nonlinearity_panels(ds)
