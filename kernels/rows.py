"""Row layouts the C kernels accept without a copy (they import torch, nothing else)."""

from __future__ import annotations

import torch

__all__ = ["as_rows"]


def as_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(x or a contiguous copy, row stride)`` such that element ``(..., d)`` of x lies at
    ``data_ptr + (flat row index) · stride + d``: the last dim contiguous and the rows
    evenly spaced, as in a slice of a wider last dim (``torch.split`` of a linear layer's
    output).  Anything else is copied to a contiguous tensor (row stride = last dim)."""
    if x.dim() >= 2 and x.stride(-1) == 1:
        ld = x.stride(-2)
        want = ld
        for i in range(x.dim() - 2, -1, -1):
            if x.shape[i] > 1 and x.stride(i) != want:
                break
            want *= x.shape[i]
        else:
            if ld >= x.shape[-1]:
                return x, ld
    x = x.contiguous()
    return x, x.shape[-1]
