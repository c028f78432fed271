"""The per-token cross-entropy of the LM stacks' loss, fused (:mod:`.loss`; the C loops in ``cross_entropy.c``)."""

from .loss import compiled_kernel_status, token_nll, token_nll_ref

__all__ = ["compiled_kernel_status", "token_nll", "token_nll_ref"]
