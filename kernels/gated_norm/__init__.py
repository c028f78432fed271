"""The gated RMSNorm of the LM stacks' Mamba-2 and GLA mixers, fused, with its hand-written
backward (:mod:`.norm`; the C loops in ``gated_norm.c``)."""

from .norm import compiled_kernel_status, gated_rms_norm, gated_rms_norm_ref

__all__ = ["compiled_kernel_status", "gated_rms_norm", "gated_rms_norm_ref"]
