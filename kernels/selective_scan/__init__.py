"""Mamba-1's selective scan (C loops on the CPU: ``selective_scan.c``).

``chunked``: the pure-torch reference (``*_ref``), the fast path and the grouped form of
the LM stacks.
"""

from .chunked import (C_KERNELS_ENV, SAVE_DECAYS_MAX_BYTES, compiled_kernel_status, selective_scan_fused,
                      selective_scan_grouped, selective_scan_ref)

__all__ = ["C_KERNELS_ENV", "SAVE_DECAYS_MAX_BYTES", "compiled_kernel_status", "selective_scan_fused",
           "selective_scan_grouped", "selective_scan_ref"]
