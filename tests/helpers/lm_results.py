"""A language-model run's result.json as the LM runs write it, and the dataset layout of
earlier versions (every curve on one shared ``t``), written out by hand: what
tests/lm/test_dataset_layout.py and tests/results/test_layout.py share."""

from __future__ import annotations

import numpy as np
import xarray as xr


def lm_result(n: int = 40, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ends = list(range(8, n + 1, 8))
    return {"ppl": rng.uniform(2, 9, n).tolist(), "ppl_binned_t": ends, "ppl_binned": rng.uniform(2, 9, len(ends)).tolist(),
            "verdict": {"passed": False, "p_star": 3.0, "t_star": 8, "worst_violation": 1.0, "worst_t": 16, "max_t": n},
            "effrem_t": [0, 20, 39], "effrem": {d: rng.uniform(0, 1, 3).tolist() for d in ("tv", "js", "cos")},
            "state_t": [1, 4, 16, 40], **{k: rng.uniform(0, 1, (2, 3, 4)).tolist()
                                         for k in ("state_mean", "state_std", "state_norm")}}


def shared_t(result: dict) -> xr.Dataset:
    """The layout datasets had before: every curve on t = 0 … n, NaN off its own grid (written out here)."""
    n = len(result["ppl"])

    def on_t(values, at):
        values = np.asarray(values, dtype=float)
        out = np.full(values.shape[:-1] + (n + 1,), np.nan)
        out[..., np.asarray(at)] = values
        return out

    data = {"ppl": ("t", on_t(result["ppl"], range(1, n + 1))),
            "ppl_binned": ("t", on_t(result["ppl_binned"], result["ppl_binned_t"]))}
    for d, name in (("tv", "effrem"), ("js", "effrem_js"), ("cos", "effrem_cos")):
        data[name] = ("t", on_t(result["effrem"][d], result["effrem_t"]))
    for name in ("state_mean", "state_std", "state_norm"):
        data[name] = (("layer", "head", "t"), on_t(result[name], result["state_t"]))
    return xr.Dataset(data, coords={"t": np.arange(n + 1), "layer": [0, 1], "head": [0, 1, 2]})
