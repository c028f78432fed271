"""The dataset vocabulary: names, long names, units and provenance shared by every study.

Every variable dynlab writes gets ``long_name`` and ``units`` from :data:`VARIABLES`, so
plots label themselves; :func:`provenance_attrs` records the dynlab version, the git sha
of the source (where available), the study, its preset and the JSON of every run spec.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

import xarray as xr

import dynlab
from dynlab.config import Spec

__all__ = ["VARIABLES", "annotate", "git_sha", "open_dataset", "provenance_attrs", "register_variables", "write_dataset"]

#: name -> (long_name, units, description)
VARIABLES: dict[str, tuple[str, str, str]] = {
    # coordinates on `run`
    "arch": ("architecture", "", "registered cell name"),
    "family": ("family", "", "declared family: affine | state-dependent"),
    "family_measured": ("measured family", "", "family measured by the Jacobian probe"),
    "group": ("group", "", "finite group of the word problem"),
    "seed": ("seed", "", "training seed"),
    "hidden": ("hidden size", "units", "cell width"),
    "layers": ("layers", "", "number of stacked cells"),
    "nonlinearity": ("nonlinearity φ", "", "state nonlinearity"),
    "run_id": ("run id", "", "hash of the full run spec"),
    "length": ("sequence length", "tokens", "evaluated length L"),
    "t": ("position t", "tokens", "1-based position in the sequence (tokens read)"),
    # index coordinates
    "run": ("run index", "", "0-based position of the run in the study (run_id names it)"),
    "k": ("eigenvalue index", "", "index over the return-map eigenvalues of all words and centroids"),
    "k_lyap": ("Lyapunov exponent index", "", "0 = the largest finite-time Lyapunov exponent, then decreasing"),
    # group tracking
    "accuracy": ("final-step accuracy", "1", "fraction of length-L sequences read out correctly at step L"),
    "accuracy_all": ("all-steps accuracy", "1", "fraction of correct readouts over positions 1..L"),
    "mp": (
        "max-pass length (dense)",
        "tokens",
        "largest L with the accuracy pooled over ±window·L lengths ≥ threshold at every l ≤ L (every length 1..max)",
    ),
    "mp_censored": ("max-pass length censored", "", "True when every length up to the horizon passed (mp = horizon)"),
    "mp_grid": ("max-pass length on the evaluation grid", "tokens", "largest grid L with accuracy ≥ threshold at every grid l ≤ L"),
    "mp_grid_censored": ("grid max-pass length censored", "", "True when every grid length passed"),
    "accuracy_dense": ("final-step accuracy at every length", "1", "fraction of sequences read out correctly at step L, L = 1..max"),
    "length_dense": ("sequence length", "tokens", "every length 1..max evaluated length"),
    "status": ("run status", "", "ok | not-learned (curriculum below the training length) | diverged"),
    "reason": ("failure reason", "", "why a run failed (empty when ok)"),
    "curriculum_length": ("curriculum length reached", "tokens", "training length at the last step"),
    "train_loss": ("final training loss", "nats/token", "cross-entropy of the last training batch"),
    "train_steps": ("training steps run", "steps", "optimizer steps taken"),
    "train_time": ("training wall time", "s", "wall-clock seconds of training (machine-dependent)"),
    # error-control analysis (dynlab.analysis.tracking)
    "q_par": ("decoder-relevant ratio q∥ = R∥/M", "1", "scatter along U over the minimum centroid separation"),
    "T_cross_par": ("first persistent crossing of q∥ ≥ τ", "step", "NaN = never crossed (censored)"),
    "crossed_par": ("q∥ crossed the threshold", "1", ""),
    "q_pair": ("worst-pair projected ratio (nearest-centroid decoder), state", "1", "pooled spread along the pair direction / pair distance; τ = 0.5"),
    "q_pair_out": ("worst-pair projected ratio, readout features", "1", "q_pair on the input of the final linear readout"),
    "q_dec": ("trained-decoder ratio, readout features", "1", "spread along a boundary normal / (2 · centroid-to-boundary distance), worst pair; τ = 0.5"),
    "q_pair_ref": ("q_pair with separations at the training length", "1", "pair spreads at t over pair distances at t_ref"),
    "q_dec_ref": ("q_dec with margins at the training length", "1", "boundary spreads at t over 2 · margins at t_ref"),
    "probe_accuracy": ("linear-probe accuracy", "1", "logistic regression fitted on states at t_ref, applied at t"),
    "dec_margin": ("smallest centroid-to-boundary distance of the readout", "feature units", "min over pairs of m_ag"),
    "min_class_count": ("smallest class count", "sequences", "fewest analysed sequences in a present class at t"),
    "thin_classes": ("steps with a class of < 4 sequences", "steps", "0 = every class well sampled"),
    "return_map_dist_identity": ("‖P_U DF_w P_U − I‖ (spectral)", "1", "median over words and centroids; 0 = identity on U"),
    "T_cross_pair": ("first persistent crossing of q_pair ≥ τ", "step", "NaN = never crossed (censored)"),
    "T_cross_pair_out": ("first persistent crossing of q_pair_out ≥ τ", "step", "NaN = never crossed (censored)"),
    "T_cross_dec": ("first persistent crossing of q_dec ≥ τ", "step", "NaN = never crossed (censored)"),
    "T_cross_pair_ref": ("first persistent crossing of q_pair_ref ≥ τ", "step", "NaN = never crossed (censored)"),
    "T_cross_dec_ref": ("first persistent crossing of q_dec_ref ≥ τ", "step", "NaN = never crossed (censored)"),
    "T_probe": ("first persistent step t ≥ t_ref with probe accuracy < 0.9", "step", "NaN = never (censored)"),
    "T_forecast_pair": ("forecast crossing of q_pair from the training length", "step", "linear fit on [t_ref/2, t_ref]; NaN = never"),
    "T_forecast_pair_out": ("forecast crossing of q_pair_out from the training length", "step", "linear fit on [t_ref/2, t_ref]; NaN = never"),
    "T_forecast_dec": ("forecast crossing of q_dec from the training length", "step", "linear fit on [t_ref/2, t_ref]; NaN = never"),
    "T_cross_par_pred": ("crossing of q_par predicted by Corollary 1", "step", "linear fit of R_par against τ·M"),
    "crossed_pair": ("q_pair crossed the threshold", "1", ""),
    "failure_mode_pair": ("failure mode from q_pair (saturation|climb|robust)", "1", "same rules as failure_mode"),
    "crossed_pair_out": ("q_pair_out crossed the threshold", "1", ""),
    "failure_mode_pair_out": ("failure mode from q_pair_out (saturation|climb|robust)", "1", "same rules as failure_mode"),
    "crossed_dec": ("q_dec crossed the threshold", "1", ""),
    "failure_mode_dec": ("failure mode from q_dec (saturation|climb|robust)", "1", "same rules as failure_mode"),
    "crossed_pair_ref": ("q_pair_ref crossed the threshold", "1", ""),
    "failure_mode_pair_ref": ("failure mode from q_pair_ref (saturation|climb|robust)", "1", "same rules as failure_mode"),
    "crossed_dec_ref": ("q_dec_ref crossed the threshold", "1", ""),
    "failure_mode_dec_ref": ("failure mode from q_dec_ref (saturation|climb|robust)", "1", "same rules as failure_mode"),
    "variant": ("crossing-time variant", "", "which readability ratio defines T_cross"),
    "censoring": ("censoring rule", "", "replace: censored T_cross = own horizon; drop: leave out"),
    "variant_description": ("crossing-time variant, described", "", ""),
    "T_cross_readout": ("first persistent crossing of q ≥ τ_readout", "step", "τ from the trained readout's margin; NaN = never"),
    "blowup_t": ("first step with non-finite states", "step", "NaN = the states stayed finite"),
    "failure_mode_par": ("failure mode from q∥ (saturation|climb|robust)", "1", "same rules as failure_mode, on q∥"),
    "return_map_eig_real": ("return-map eigenvalue on U, real part", "1", "eigenvalues of Bᵀ DF_w B over words and centroids"),
    "return_map_eig_imag": ("return-map eigenvalue on U, imaginary part", "1", "eigenvalues of Bᵀ DF_w B over words and centroids"),
    "return_map_eig_max": ("largest |return-map eigenvalue| on U", "1", "median over words and centroids of the largest |λ|"),
    "k_U_ref": ("dim U at t_ref", "1", "rank of the symbolic subspace at the reference step"),
    "perturb_delta_norm": ("perturbation size ‖h_pert − h_clean‖", "state units", "RMS over sequences"),
    "perturb_dist_excess": ("extra distance to the correct centroid", "state units", "perturbed minus clean"),
    "perturb_q_pert": ("q of perturbed states", "1", "R/M of the perturbed population"),
    "recovery_rate": ("perturbation recovery rate", "1/step", "log-slope of the perturbation size; negative = contraction"),
    "lyapunov": ("finite-time Lyapunov exponent", "1/step", "QR method along fresh trajectories"),
    "sign_flip_frac": ("sign flips of the error along U", "1", "C2 only: fraction of steps where the signed error changes sign"),
    "e_U_absmax_rel": ("largest |error along U| / (M/2)", "1", "C2 only: below 1 = inside the binary margin"),
    "group_order": ("group order |G|", "elements", ""),
    "half_margin_rel": ("relative half-margin (M/2)/centroid radius", "1", "median over t; shrinks with group order"),
    "q_max": ("max over t of q", "1", ""),
    "t_pert": ("time step (perturbation)", "steps", "steps from the injection step on"),
    "direction": ("perturbation direction", "", "U (symbolic subspace) or U_perp"),
}


def register_variables(entries: dict[str, tuple[str, str, str]]) -> None:
    """Add (name -> (long_name, units, description)) entries to the vocabulary."""
    VARIABLES.update(entries)


def annotate(ds: xr.Dataset) -> xr.Dataset:
    """Fill ``long_name``/``units``/``description`` of known variables and coords (in place)."""
    for name in list(ds.data_vars) + list(ds.coords):
        if name in VARIABLES:
            long_name, units, desc = VARIABLES[name]
            attrs = ds[name].attrs
            attrs.setdefault("long_name", long_name)
            attrs.setdefault("units", units)
            attrs.setdefault("description", desc)
    return ds


def git_sha() -> str:
    """Commit of the dynlab source tree, or '' when not in a git checkout."""
    src = Path(dynlab.__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def provenance_attrs(study: str, preset: str, specs: Iterable[Spec]) -> dict[str, str]:
    return {
        "dynlab_version": dynlab.__version__,
        "git_sha": git_sha(),
        "study": study,
        "preset": preset,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "specs_json": json.dumps([json.loads(s.canonical_json()) for s in specs]),
    }


def write_dataset(ds: xr.Dataset, path: str | Path) -> Path:
    """Write ``ds`` as netCDF (h5netcdf) atomically: a temp file, then ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        ds.to_netcdf(tmp, engine="h5netcdf")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def open_dataset(path: str | Path) -> xr.Dataset:
    """Load a dataset written by :func:`write_dataset` fully into memory (file closed)."""
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        return ds.load()
