"""Gated linear attention (GLA).

``chunked``: the pure-torch reference (``*_ref``) and the chunked torch path, ``triton``: the Triton kernel (imported on use by :mod:`dynlab.kernels.dispatch`).
"""

from .chunked import gla_chunked, gla_ref

__all__ = ["gla_chunked", "gla_ref"]
