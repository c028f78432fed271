"""A language-model run's result.json as the LM runs write it: what
tests/lm/test_dataset_layout.py and tests/results/test_curves.py share."""

from __future__ import annotations

import numpy as np


def lm_result(n: int = 40, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ends = list(range(8, n + 1, 8))
    return {"ppl": rng.uniform(2, 9, n).tolist(), "ppl_binned_t": ends, "ppl_binned": rng.uniform(2, 9, len(ends)).tolist(),
            "verdict": {"passed": False, "p_star": 3.0, "t_star": 8, "worst_violation": 1.0, "worst_t": 16, "max_t": n},
            "effrem_t": [0, 20, 39], "effrem": {d: rng.uniform(0, 1, 3).tolist() for d in ("tv", "js", "cos")},
            "state_t": [1, 4, 16, 40], **{k: rng.uniform(0, 1, (2, 3, 4)).tolist()
                                         for k in ("state_mean", "state_std", "state_norm")}}

