"""``make_results.py --slim``: a study's dataset cut to the variables the tables read, stored
under benchmarks/results/datasets/ (a whole study dataset holds every curve of every run)."""

from __future__ import annotations

from pathlib import Path

import xarray as xr

from dynlab.results.schema import open_dataset

from results_tables.common import DATA

def slim(study_dataset: Path, label: str) -> Path:
    """Copy the variables the tables read (run record, mp, correlations, the crossing times
    and forecasts they correlate, to recompute them, and the per-state fixed-point summaries
    with the recovery rates and failure modes, and the variables the figures draw: accuracy,
    perturbation sizes, margins, fixed-point and return-map eigenvalues (stored as float32), and the q(t), R(t)
    and M(t) curves) of a group-tracking
    ``dataset.nc`` to ``DATA/<label>.nc`` (a whole sweep dataset holds every curve of every run)."""
    from dynlab.analysis.correlation import CROSSING_VARIANTS, FORECAST_VARIANTS
    from dynlab.results.schema import write_dataset

    ds = open_dataset(study_dataset)
    if ds.attrs.get("study") == "length-generalization":
        return write_dataset(_slim_lm(ds), DATA / f"{label}.nc")
    crossings = {var for var, _ in (*CROSSING_VARIANTS.values(), *FORECAST_VARIANTS.values())}
    fixed_points = ("fp_residual", "fp_count", "fp_dim", "fp_rho_perp", "fp_rho_par", "fp_stable", "recovery_rate",
                    "failure_mode_dec", "fp_drift", "T_cross_fp")  # the fixed-point section's variables, where the study has them
    panels = ("perturb_delta_norm", "half_margin_rel", "fp_eig_real", "fp_eig_imag", "accuracy",  # what the figures draw
              "q", "q_dec", "R_par", "R_perp", "M", "return_map_eig_real", "return_map_eig_imag")
    keep = [v for v in ds.data_vars
            if v in ("mp", "mp_censored", "status", "horizon") or v in crossings or v.startswith(("corr_", "failure_mode"))
            or v in fixed_points or v in panels]
    out = ds[keep]
    for name in out.data_vars:  # the eigenvalue arrays are mostly NaN padding: zlib keeps the file small
        if out[name].dtype.kind == "f":
            kept = {k: v for k, v in out[name].encoding.items() if k in ("dtype", "_FillValue")}
            if name.endswith(("_eig_real", "_eig_imag")):  # drawn, never tabled: float32 is a figure's precision
                kept["dtype"] = "float32"
            out[name].encoding = {**kept, "zlib": True, "complevel": 4}
    return write_dataset(out, DATA / f"{label}.nc")


def _slim_lm(ds: xr.Dataset) -> xr.Dataset:
    """A length-generalization dataset without its per-position curves (PPL(t), EffRem, state
    statistics): the run record, the PPL ranges and ratios, the verdicts, ``ppl_binned`` on
    its bin ends ``t_bin`` and the training-loss curves."""
    drop = [v for v in ds.data_vars if v == "ppl" or v.startswith(("state_", "effrem"))]
    return ds.drop_vars(drop).drop_dims([d for d in ("t", "t_effrem", "t_state") if d in ds.dims], errors="ignore")
