"""dynlab works without triton: the Triton modules import, say so, and dispatch picks torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


@pytest.mark.slow
def test_triton_absent_package_still_trains_on_the_torch_path(tmp_path):
    code = textwrap.dedent(
        """
        import sys
        sys.modules["triton"] = None  # any `import triton` now raises ImportError
        import torch
        from dynlab.kernels import dispatch
        from dynlab.kernels.gla import triton as triton_gla
        from dynlab.kernels.scan import triton as triton_scan
        from dynlab.kernels.ssd import triton as triton_ssd
        assert not (dispatch.HAS_TRITON or triton_scan.HAS_TRITON or triton_ssd.HAS_TRITON or triton_gla.HAS_TRITON)
        assert dispatch.choose_backend("linear_scan", "cuda") == "torch"
        try:
            triton_scan.linear_scan_triton(torch.ones(1, 2, 3), torch.ones(1, 2, 3), torch.ones(1, 3))
        except RuntimeError as e:
            assert "triton" in str(e)
        else:
            raise AssertionError("expected a RuntimeError without triton")
        from dynlab.tracking.models import Tracker
        m = Tracker("mamba", 3, 3, hidden=4)
        m(torch.zeros(2, 5, dtype=torch.long)).logits.sum().backward()
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")
