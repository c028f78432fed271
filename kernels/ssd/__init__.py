"""Mamba-2's state-space duality (SSD) scan.

``chunked``: the pure-torch reference (``*_ref``) and the chunked torch path, ``triton``: the Triton kernel (imported on use by :mod:`dynlab.kernels.dispatch`).
"""

from .chunked import ssd_chunked, ssd_ref

__all__ = ["ssd_chunked", "ssd_ref"]
