"""The short causal depthwise convolution + SiLU of the LM stacks' mixers, fused, with its
hand-written backward (:mod:`.conv`; the C loops in ``short_conv.c``)."""

from .conv import causal_conv_silu, causal_conv_silu_ref, compiled_kernel_status, last_window

__all__ = ["causal_conv_silu", "causal_conv_silu_ref", "compiled_kernel_status", "last_window"]
