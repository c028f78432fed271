"""Interop: dynlab's GLA equals fla-core's ``naive_recurrent_gla`` (skipped when fla-core is absent).

fla-core's package ``__init__`` needs a working triton driver; its naive reference is plain
torch, so the file ``fla/ops/gla/naive.py`` is loaded on its own (CPU-only machines work).
"""

from __future__ import annotations

import pytest
import torch
from helpers.library_twins import fla_naive_recurrent_gla as _naive_recurrent_gla

from dynlab.kernels.gla.chunked import gla_chunked, gla_ref


@pytest.mark.parametrize("impl", [gla_ref, gla_chunked], ids=["ref", "chunked"])
def test_gla_with_initial_state_matches_fla_naive(impl):
    naive = _naive_recurrent_gla()
    g = torch.Generator().manual_seed(0)
    b, t, h, k, v = 2, 19, 3, 8, 5
    q, kk = torch.randn(b, t, h, k, generator=g), torch.randn(b, t, h, k, generator=g)
    vv = torch.randn(b, t, h, v, generator=g)
    gk = torch.nn.functional.logsigmoid(torch.randn(b, t, h, k, generator=g) + 2)
    h0 = torch.randn(b, h, k, v, generator=g)
    o_ref, s_ref = naive(q, kk, vv, gk, initial_state=h0, output_final_state=True)
    o, s = impl(q, kk, vv, gk, initial_state=h0, return_final_state=True)
    torch.testing.assert_close(o, o_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-5)
