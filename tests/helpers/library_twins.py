"""CPU twins of the field's CUDA kernels, with the libraries' own signatures and layout checks.

The kernels dynlab dispatches to on CUDA (fla's ``chunk_gla``, causal-conv1d's
``causal_conv1d_fn``) cannot run here; their twins take the same arguments, enforce the
layout and dtype rules the real kernels check (``TORCH_CHECK`` in causal-conv1d's
``causal_conv1d.cpp``), and compute the result independently of dynlab:

- ``chunk_gla`` through fla-core's own pure-torch ``naive_recurrent_gla`` (the file
  ``fla/ops/gla/naive.py`` of the installed fla-core, loaded on its own: importing the
  ``fla`` package needs a GPU driver);
- ``causal_conv1d_fn`` through ``F.conv1d`` on the ``[B, D, T]`` layout.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest
import torch
import torch.nn.functional as F


def fla_naive_recurrent_gla():
    """fla-core's ``naive_recurrent_gla`` (skips the test when fla-core is not installed)."""
    try:
        dist = importlib.metadata.distribution("fla-core")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("fla-core is not installed")
    path = dist.locate_file("fla/ops/gla/naive.py")
    spec = importlib.util.spec_from_file_location("_fla_gla_naive", str(path))
    if spec is None or spec.loader is None:
        pytest.skip("fla-core installed without fla/ops/gla/naive.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.naive_recurrent_gla


def chunk_gla_twin():
    """``fla.ops.gla.chunk_gla``'s signature on fla's naive recurrence (its scale is fixed at
    K^-1/2, so another scale is folded into q)."""
    naive = fla_naive_recurrent_gla()

    def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, state_v_first=False,
                  cu_seqlens=None, cu_seqlens_cpu=None):
        assert not state_v_first and cu_seqlens is None
        assert initial_state is None or initial_state.dtype == torch.float32, "fla keeps its states in float32"
        for name, t in (("q", q), ("k", k), ("v", v), ("g", g)):
            assert t.is_contiguous(), f"{name} must be contiguous"
        if scale is not None:
            q = q * (scale * q.shape[-1] ** 0.5)
        return naive(q, k, v, g, initial_state=initial_state, output_final_state=output_final_state)

    return chunk_gla


def causal_conv1d_fn_twin(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                          final_states_out=None, activation=None):
    """``causal_conv1d.causal_conv1d_fn``: x ``[B, D, T]``, weight ``[D, W]``, bias ``[D]``,
    initial_states ``[B, D, W − 1]`` -> out ``[B, D, T]`` (and final states ``[B, D, W − 1]``),
    with the checks the CUDA kernel makes."""
    b, d, t = x.shape
    w = weight.shape[1]
    assert 2 <= w <= 4, "causal_conv1d takes widths 2 to 4"
    assert weight.shape == (d, w) and weight.dtype in (x.dtype, torch.float32), "weight [D, W], the input's dtype or fp32"
    assert bias is None or (bias.shape == (d,) and bias.dtype == weight.dtype), "bias in the weight's dtype"
    channel_last = x.stride(1) == 1 and x.stride(2) > 1
    if initial_states is not None or return_final_states:
        assert channel_last, "initial and final states need the channel-last layout"
        assert x.stride(2) % 8 == 0 and x.stride(0) % 8 == 0
    if initial_states is not None:
        assert initial_states.shape == (b, d, w - 1) and initial_states.dtype == x.dtype
        assert initial_states.stride(1) == 1, "initial_states.stride(1) == 1"
    past = x.new_zeros(b, d, w - 1) if initial_states is None else initial_states
    full = torch.cat([past, x], dim=2)
    out = F.conv1d(full.to(weight.dtype), weight[:, None, :], bias, groups=d)  # accumulated in the weights' dtype
    if activation in ("silu", "swish"):
        out = F.silu(out)
    return (out.to(x.dtype), full[:, :, t:]) if return_final_states else out.to(x.dtype)
