"""The fused tracker losses: embedding, recurrence and readout cross-entropy in one pass.

``common``: what the three share (buffers, the readout, the reference loop);
``dense``, ``gated``, ``diagonal``: one per transition kind, each with its ``*_ref``;
``diagonal.c``: the diagonal kind's CPU loops (built by :mod:`dynlab.kernels.compiled`).
"""

from .common import BUFFERS, PHIS, check_shapes, fused_call, readout_ce, readout_ce_grad, table_grad, token_rows, tracker_loss_ref
from .dense import dense_tracker_loss, dense_tracker_loss_ref
from .gated import gated_tracker_loss, gated_tracker_loss_ref
from .diagonal import StreamOutput, compiled_loops_apply, diagonal_tracker_logits, diagonal_tracker_loss, diagonal_tracker_loss_ref, diagonal_tracker_stream, member_groups

__all__ = ["BUFFERS", "PHIS", "StreamOutput", "check_shapes", "compiled_loops_apply", "dense_tracker_loss", "dense_tracker_loss_ref", "diagonal_tracker_logits", "diagonal_tracker_loss", "diagonal_tracker_loss_ref", "diagonal_tracker_stream", "fused_call", "gated_tracker_loss", "gated_tracker_loss_ref", "member_groups", "readout_ce", "readout_ce_grad", "table_grad", "token_rows", "tracker_loss_ref"]
