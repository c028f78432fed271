"""mamba-ssm's Triton SSD kernel itself, forward and its own backward, run on the CPU by
Triton's interpreter through dynlab's adapter (``dispatch._ssd_mamba``): outputs, final
states and every gradient (initial state included) equal dynlab's torch SSD.

Needs triton and mamba-ssm's source distribution (``DYNLAB_MAMBA_REF``; CI fetches it and
sets ``DYNLAB_REQUIRE_MAMBA_REF=1``, so there it cannot skip). fla-core's ``chunk_gla``
does not run under the interpreter (its kernels call ``.to`` on loop counters, plain ints
there), so its adapter is tested through fla's own reference (``test_library_backends.py``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HELPER = Path(__file__).parents[1] / "helpers" / "mamba_ssd_interpreted.py"


@pytest.mark.slow
def test_mamba_ssm_triton_ssd_forward_and_backward_equal_dynlab_through_the_adapter():
    root = os.environ.get("DYNLAB_MAMBA_REF")
    if not root or not (Path(root) / "mamba_ssm/ops/triton/ssd_combined.py").is_file():
        msg = "mamba-ssm sources not found (set DYNLAB_MAMBA_REF; see benchmarks/fetch_mamba_ref.sh)"
        if os.environ.get("DYNLAB_REQUIRE_MAMBA_REF") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("einops") is None:
        pytest.skip("triton and einops are needed (pip install 'dynlab[test]')")
    env = {**os.environ, "TRITON_INTERPRET": "1", "DYNLAB_MAMBA_REF": root}
    done = subprocess.run([sys.executable, str(HELPER)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(errors) == {"y", "final", "dx", "ddt", "dA", "dB", "dC", "dh0"}
    for name, (err, scale) in errors.items():
        assert scale > 0.1, f"{name}: the reference is all zeros"
        assert err <= 2e-4 * max(1.0, scale), f"{name}: mamba-ssm's kernel differs by {err} (scale {scale})"
