"""Small study datasets the figure tests draw, their drawn values known (tests/figures)."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynlab.results.schema import annotate

ARCHS = [("mamba", "affine"), ("tanh-rnn", "state-dependent")]
GROUPS = [("S3", 6), ("C2", 2)]  # deliberately not in group order
SEEDS = (0, 1)
T = 50


def synthetic() -> xr.Dataset:
    """8 runs: 2 archs × 2 groups × 2 seeds, with every analysis variable the panels read.

    accuracy(run, L) = a_arch - 0.1·seed (so the seed mean is a_arch - 0.05); q(t) = t/(20·k) with
    k = run + 1 crosses 0.5 at t = 10·k (runs 5–7 never cross within T = 50); eigenvalues on
    circles of radius rho_family; perturbation
    size decays as exp(-rate·s); R_par = c·t·M, R_perp = 2c·t·M; fixed-point eigenvalues at
    angles 0 and π/2 on circles of radius 1 (affine) or 0.3, none (NaN) for the last run.
    """
    rows = [(a, f, g, o, s) for g, o in GROUPS for a, f in ARCHS for s in SEEDS]
    n = len(rows)
    lengths = np.array([10, 60, 200, 1000])
    t = np.arange(1, T + 1)
    acc = np.array([[(0.9 if a == "tanh-rnn" else 0.4) - 0.1 * s] * lengths.size for a, _, _, _, s in rows])
    k = np.arange(1, n + 1, dtype=float)  # run-specific q slope
    q = t[None, :] / (20 * k[:, None])
    tcross = np.where(10 * k <= T, 10 * k, np.nan)
    M = np.full((n, T), 2.0)
    c = np.linspace(0.001, 0.004, n)[:, None]
    rho = np.array([1.0 if f == "affine" else 0.5 for _, f, _, _, _ in rows])
    ang = np.linspace(0, np.pi, 3)
    steps = np.arange(60, 71)
    rate = np.array([0.0 if f == "affine" else 0.2 for _, f, _, _, _ in rows])
    delta = np.stack([np.exp(-rate[:, None] * (steps - 60)), np.exp(-2 * rate[:, None] * (steps - 60))], axis=1)
    fp_rho = np.where(rho == 1.0, 1.0, 0.3)[:, None, None] * np.ones((1, 2, 1))  # [run, state, 1]
    fp_rho[-1] = np.nan
    ds = xr.Dataset(
        {
            "accuracy": (("run", "length"), acc),
            "fp_eig_real": (("run", "state", "k_fp"), fp_rho * np.array([1.0, 0.0])),
            "fp_eig_imag": (("run", "state", "k_fp"), fp_rho * np.array([0.0, 1.0])),
            "mp": ("run", np.array([1000.0, 200, 60, 0, 1000, 1000, 10, 60])),
            "mp_censored": ("run", np.array([True, False, False, False, True, True, False, False])),
            "status": ("run", np.array(["ok"] * n)),
            "q": (("run", "t"), q),
            "R": (("run", "t"), q * M),
            "M": (("run", "t"), M),
            "R_par": (("run", "t"), c * t * M),
            "R_perp": (("run", "t"), 2 * c * t * M),
            "T_cross": ("run", tcross),
            "q_par": (("run", "t"), q / 2),
            "T_cross_par": ("run", np.where(20 * k <= T, 20 * k, np.nan)),
            "horizon": ("run", np.full(n, float(T))),
            "failure_mode": ("run", np.where(np.isfinite(tcross), np.where(tcross <= 3, "saturation", "climb"),
                                             "robust")),
            "failure_mode_par": ("run", np.where(20 * k <= T, "climb", "robust")),
            "q_dec": (("run", "t"), q / 2),
            "T_cross_dec": ("run", np.where(20 * k <= T, 20 * k, np.nan)),
            "T_horizon": ("run", 25 * k),
            "failure_mode_dec": ("run", np.where(20 * k <= T, "climb", "robust")),
            "return_map_eig_real": (("run", "k"), rho[:, None] * np.cos(ang)[None]),
            "return_map_eig_imag": (("run", "k"), rho[:, None] * np.sin(ang)[None]),
            "perturb_delta_norm": (("run", "direction", "t_pert"), delta),
            "half_margin_rel": ("run", np.array([0.5 if o == 6 else 1.0 for _, _, _, o, _ in rows])
                                + np.array([0.0, 0.02] * (n // 2))),
            "group_order": ("run", np.array([o for *_, o, _ in rows])),
            # correlation table: variant 'q' (replace) r = 0.87 [0.80, 0.92], ρ = 0.81 [0.70, 0.90], 8 runs
            **{f"corr_{k}": (("variant", "censoring"), np.array([[v, v - 0.1], [v - 0.2, v - 0.3]]))
               for k, v in (("r", 0.87), ("r_lo", 0.8), ("r_hi", 0.92), ("rho", 0.81), ("rho_lo", 0.7),
                            ("rho_hi", 0.9), ("n", n))},
        },
        coords={
            "run": np.arange(n),
            "length": lengths,
            "t": t,
            "t_pert": steps,
            "direction": ["U", "U_perp"],
            "arch": ("run", [a for a, *_ in rows]),
            "family": ("run", [f for _, f, *_ in rows]),
            "group": ("run", [g for _, _, g, _, _ in rows]),
            "seed": ("run", [s for *_, s in rows]),
            "nonlinearity": ("run", ["default"] * n),
            "variant": ["q", "q_dec"],
            "censoring": ["replace", "drop"],
        },
        attrs={"study": "group-tracking", "analysis_tau": 0.5, "analysis_t_ref": 60, "corr_default_variant": "q"},
    )
    annotate(ds)
    ds["q"].attrs.update(long_name="distinguishability ratio q = R/M", units="1")
    ds["T_cross"].attrs.update(long_name="first persistent crossing step", units="step")
    ds["half_margin_rel"].attrs.update(long_name="median (M/2) / centroid radius", units="1")
    return ds


N_FREE, N_STACK, HORIZON = 12, 29, 1000.0


def censored_dataset() -> xr.Dataset:
    """12 runs with T_cross and mp both finite and loosely related, then 29 runs that
    never crossed (T_cross NaN, censored at the horizon 1000) and passed every length
    (mp = 1000, censored): the stack at (1000, 1000) that makes r over all runs near 1."""
    rng = np.random.default_rng(3)
    tc_free = rng.uniform(20, 400, N_FREE)
    mp_free = np.clip(tc_free * rng.uniform(0.3, 3.0, N_FREE), 5, 900)
    n = N_FREE + N_STACK
    tc = np.concatenate([tc_free, np.full(N_STACK, np.nan)])
    mp = np.concatenate([mp_free, np.full(N_STACK, HORIZON)])
    ds = xr.Dataset(
        {"T_cross": ("run", tc), "mp": ("run", mp), "mp_censored": ("run", np.arange(n) >= N_FREE),
         "horizon": ("run", np.full(n, HORIZON)), "status": ("run", np.array(["ok"] * n)),
         "corr_r": (("variant", "censoring"), [[0.99, 0.5]]), "corr_r_lo": (("variant", "censoring"), [[0.98, 0.1]]),
         "corr_r_hi": (("variant", "censoring"), [[0.995, 0.8]]), "corr_rho": (("variant", "censoring"), [[0.9, 0.5]]),
         "corr_rho_lo": (("variant", "censoring"), [[0.8, 0.1]]), "corr_rho_hi": (("variant", "censoring"), [[0.95, 0.8]]),
         "corr_n": (("variant", "censoring"), [[n, N_FREE]])},
        coords={"run": np.arange(n), "length": [10, 100, 1000], "family": ("run", np.array(["affine"] * n)),
                "variant": ["q"], "censoring": ["replace", "drop"]},
        attrs={"corr_default_variant": "q"})
    return annotate(ds), tc_free, mp_free


LENGTHS = (16, 32, 64, 128, 256)
LINE = {1024: 32, 4096: 64, 16384: 10**6}  # the largest state rises everywhere: censored above


def forget_dataset() -> xr.Dataset:
    rows = [(s, t, seed) for s in LINE for t in LENGTHS for seed in (0, 1)]
    return xr.Dataset(
        {"far_in_ratio": ("run", [1.3 if t < LINE[s] else 1.01 for s, t, _ in rows]),
         "status": ("run", ["ok"] * len(rows)), "converged": ("run", [True] * len(rows)),
         "memory_horizon": ("run", [float(s) / 8 for s, _, _ in rows])},
        coords={"state_size": ("run", [r[0] for r in rows]), "train_length": ("run", [r[1] for r in rows]),
                "seed": ("run", [r[2] for r in rows])})
