"""The per-token cross-entropy of the LM stacks' loss, fused (:mod:`.loss`; the C loops in
``cross_entropy.c``), and the LM head fused with it (:mod:`.head`: the logits never held whole)."""

from .head import head_nll, head_nll_ref
from .loss import compiled_kernel_status, probs_grad_, probs_nll_, token_nll, token_nll_ref

__all__ = ["compiled_kernel_status", "head_nll", "head_nll_ref", "probs_grad_", "probs_nll_", "token_nll",
           "token_nll_ref"]
