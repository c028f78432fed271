"""AdamW with per-member clipping over the LM stacks' flat ``[E, P]`` parameters, in one
pass (:mod:`.step`; the C loop in ``adamw.c``)."""

from .step import adamw_step_, adamw_step_ref, compiled_kernel_status

__all__ = ["adamw_step_", "adamw_step_ref", "compiled_kernel_status"]
