"""What an LM's training step and its evaluation allocate, estimated from the spec before
anything is built, and the check that refuses what would not fit.

Every tensor is counted, in float32 (4 bytes) unless said: the parameters with their
gradients and AdamW moments; the activations a training step keeps for its backward pass
(embedding, norms, projections, short convolutions, gates, MLP, logits and the loss); and,
per mixer, its recurrent states and the intermediates of its chunked scan, read from the
torch forms of :mod:`dynlab.kernels` (the CPU's, and the heaviest of the forms a model
may run):

- Mamba-2 (:func:`kernels.ssd.chunked.ssd_chunked`): a state ``[B, H, P, N]`` per chunk
  boundary, kept for the backward pass; the B and C projections expanded over the heads,
  ``[B, T, H, N]``, which the chunk's products copy (scores, the initial state's read-out,
  the carried state) and the backward pass sums back; the ``[B, Q, Q, H]`` decay and
  score blocks of every chunk; the chunk outputs ``[B, T, H, P]``;
- Mamba-1 (:func:`kernels.selective_scan.chunked.selective_scan_fused`): the states of
  every step, ``[B, T, D_inner, N]``, which its torch loop keeps for the backward pass
  (the compiled C loop keeps at most 64 MiB of decays: less);
- GLA (:func:`kernels.gla.chunked.gla_chunked`): three ``[B, H, K, V]`` tensors per chunk
  (the state, its read-out, the carried sum) and the ``[B, H, Q, K]`` factored keys and
  queries and ``[B, H, Q, Q]`` scores of every chunk (chunks of ``chunk_size``: strong
  gates end a chunk early, which a trained model's rarely do, docs of ``gla_chunked``).

A stack (``train.engine = "stack"``, :mod:`dynlab.lm.train.stack`) holds its E members' parameters
and activations at once: E times one member's.  An evaluation (no gradients: one layer's
intermediates at a time) holds the weights, every layer's state of its windows (and their
copies for the state statistics, in float64), one chunk's logits and their float64 losses.

The coefficients (how many tensors of each size) are upper bounds of what the torch forms
keep and make: ``tests/lm/test_memory_estimate.py`` holds the estimate against the
measured peak of a training step and of an evaluation, in a child process, for each mixer
and a stack: at least the peak, at most :data:`WITHIN` times it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dynlab.errors import DynlabInputError
from dynlab.spec import MAX_LM_MEMORY_BYTES

__all__ = ["WITHIN", "MemoryEstimate", "check_eval_memory", "check_train_memory", "eval_bytes", "train_step_bytes"]

#: The factor within which the estimate bounds the measured peak from above (tested).
WITHIN = 4.0

_F32 = 4


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of a step by kind: ``parameters`` (weights, gradients, AdamW moments),
    ``activations`` (kept for the backward pass, or one layer's at a time), ``states``
    (the SSM states and the scan's intermediates) and ``total``."""

    parameters: int
    activations: int
    states: int

    @property
    def total(self) -> int:
        return self.parameters + self.activations + self.states

    def said(self) -> str:
        """``93.1 GiB (SSM states and scan intermediates 90.0 GiB, activations 3.0 GiB, parameters 0.1 GiB)``."""
        return (f"{_gib(self.total)} (SSM states and scan intermediates {_gib(self.states)}, activations "
                f"{_gib(self.activations)}, parameters {_gib(self.parameters)})")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _widths(model: Any) -> dict[str, int]:
    """The mixer's widths of ``model`` (an :class:`~dynlab.lm.spec.LMModelSpec`): ``proj``
    (the input projection's outputs), ``conv`` (convolved channels), ``inner`` (the gated
    output), ``keys`` (per-position key or B/C entries) and ``state`` (one sequence's state)."""
    h, p, n = model.n_heads, model.head_dim, model.d_state
    inner = h * p
    if model.mixer == "mamba2":
        return {"proj": 2 * inner + 2 * n + h, "conv": inner + 2 * n, "inner": inner, "keys": 2 * n, "state": inner * n}
    if model.mixer == "mamba1":
        dt_rank = -(-model.d_model // 16)
        return {"proj": 2 * inner + dt_rank + 2 * n, "conv": inner, "inner": inner, "keys": 2 * n, "state": inner * n}
    hk = h * n
    return {"proj": 3 * hk + 2 * inner, "conv": 2 * hk + inner, "inner": inner + hk, "keys": 3 * hk, "state": hk * p}


def _scan_elements(model: Any, batch: int, length: int) -> int:
    """Elements a training step's scan keeps and makes in one layer (module docstring)."""
    b, t, h, p, n = batch, length, model.n_heads, model.head_dim, model.d_state
    q = max(1, min(model.chunk_size, t))
    chunks = math.ceil(t / q)
    if model.mixer == "mamba2":
        return (5 * b * t * h * n  # B and C expanded over the heads: copied by the products, summed back
                + (chunks + 3) * b * h * p * n  # a state per chunk boundary, and the update's
                + 3 * b * t * q * h  # decay and score blocks
                + 6 * b * t * h * p)  # chunk outputs
    if model.mixer == "mamba1":
        return 3 * b * t * h * p * n // 2 + 4 * b * h * p * n  # every step's state (torch loop), the carried ones
    return (3 * chunks + 4) * b * h * n * p + 6 * b * t * h * n + 2 * b * t * q * h + 4 * b * t * h * p


def _layer_elements(model: Any, batch: int, length: int) -> int:
    """Activations one block keeps for its backward pass, the scan aside."""
    w = _widths(model)
    d = model.d_model
    mlp = (1 + 3 * model.mlp_ratio) * d if model.mlp_ratio else 0
    conv = 3 * w["conv"] if model.conv_kernel else w["conv"]
    return batch * length * (4 * d + mlp + 2 * w["proj"] + conv + 6 * w["inner"] + 2 * w["keys"])


def train_step_bytes(model: Any, batch: int, length: int, members: int = 1) -> MemoryEstimate:
    """Bytes of one training step of ``model`` (an :class:`~dynlab.lm.spec.LMModelSpec`) on
    ``batch`` sequences of ``length`` tokens, for ``members`` models trained at once (a
    stack): the parameters (16 bytes each: weight, gradient, two AdamW moments, and the
    optimiser's temporaries, 4 more), every block's activations with the logits and the
    loss (``[B, T, vocab]``, four of them), and every layer's scan (module docstring).
    Gradient accumulation reads its micro-batches one after another: ``batch`` is one."""
    e, b, t = members, batch, length
    params = 20 * model.parameter_bound()
    acts = model.n_layers * _layer_elements(model, b, t) + b * t * (4 * model.vocab_size + 6 * model.d_model)
    scan = model.n_layers * _scan_elements(model, b, t)
    return MemoryEstimate(e * params, e * _F32 * acts, e * _F32 * scan)


def _eval_scan_elements(model: Any, samples: int, chunk: int) -> int:
    """Elements one layer's scan makes for one piece of an evaluation (no gradients: a
    chunk's intermediates at a time, the piece's outputs, the states it holds)."""
    s, t, h, p, n = samples, chunk, model.n_heads, model.head_dim, model.d_state
    q = max(1, min(model.chunk_size, t))
    if model.mixer == "mamba2":
        return 4 * s * q * h * n + 4 * s * h * p * n + 6 * s * q * q * h + 4 * s * t * h * p
    if model.mixer == "mamba1":
        return 2 * s * t * h * p * n + 4 * s * h * p * n  # the torch loop's states of every step of the piece
    return 6 * s * h * n * p + 8 * s * t * h * n + 4 * s * q * q * h + 4 * s * t * h * p


def eval_bytes(model: Any, samples: int, chunk: int, nll_slice: int = 256) -> MemoryEstimate:
    """Bytes of an evaluation of ``model`` streaming ``samples`` windows in pieces of
    ``chunk`` tokens without gradients (:func:`dynlab.lm.evaluate.stream_eval`): the
    weights; every layer's state of every window, held, updated and copied for the state
    statistics (float32 and float64 copies); one layer's activations and scan for one
    piece (no autograd: what one op at a time needs); the piece's logits and their
    float64 losses in slices of ``nll_slice`` positions."""
    s, q = samples, chunk
    w = _widths(model)
    held = model.n_layers * s * w["state"] * (3 * _F32 + 3 * 8)
    one_layer = s * q * (4 * model.d_model + 2 * w["proj"] + 2 * w["conv"] + 3 * w["inner"] + w["keys"])
    if model.mlp_ratio:
        one_layer += 2 * s * q * model.mlp_ratio * model.d_model
    logits = s * q * model.vocab_size * _F32 + 2 * s * min(q, nll_slice) * model.vocab_size * 8
    return MemoryEstimate(4 * model.parameter_bound(), _F32 * one_layer + logits,
                          held + _F32 * _eval_scan_elements(model, s, q))


def _layout(model: Any) -> str:
    return (f"model.mixer {model.mixer}, model.n_layers {model.n_layers} × model.n_heads {model.n_heads} × "
            f"model.head_dim {model.head_dim} × model.d_state {model.d_state}")


def check_train_memory(model: Any, batch: int, length: int, members: int = 1, batch_name: str = "train.batch_size",
                       length_name: str = "train.seq_len", limit: int = MAX_LM_MEMORY_BYTES) -> MemoryEstimate:
    """The estimate of :func:`train_step_bytes` when at most ``limit``
    (:data:`~dynlab.spec.MAX_LM_MEMORY_BYTES`); else one line
    of bad input naming the options (``batch_name``, ``length_name``, the model's sizes,
    the members of a stack) and the estimate."""
    need = train_step_bytes(model, batch, length, members)
    if need.total > limit:
        stack = f" × {members} runs trained at once (train.engine 'stack')" if members > 1 else ""
        raise DynlabInputError(
            f"a training step of {batch_name} {batch} × {length_name} {length} tokens with {_layout(model)}{stack} "
            f"needs about {need.said()}; allowed: at most {limit / 2**30:g} GiB (a smaller {batch_name}, {length_name}, "
            f"n_heads, head_dim, d_state or n_layers{', or fewer runs in a stack' if members > 1 else ''})")
    return need


def check_eval_memory(model: Any, samples: int, chunk: int, samples_name: str = "eval.n_samples",
                      chunk_name: str = "eval.chunk_len", limit: int = MAX_LM_MEMORY_BYTES) -> MemoryEstimate:
    """The estimate of :func:`eval_bytes` when at most ``limit``; else one line of bad input
    naming the options and the estimate (as :func:`check_train_memory`)."""
    need = eval_bytes(model, samples, chunk)
    if need.total > limit:
        raise DynlabInputError(
            f"an evaluation of {samples_name} {samples} windows in pieces of {chunk_name} {chunk} tokens with "
            f"{_layout(model)} needs about {need.said()}; allowed: at most {limit / 2**30:g} GiB (a smaller {samples_name}, "
            f"{chunk_name}, n_heads, head_dim, d_state or n_layers)")
    return need
