"""Training-throughput benchmark (``dynlab bench train``).

For one setting (architecture, hidden width H, batch B, length T) it measures, in one
process, full training steps (forward, cross-entropy at every position, backward,
gradient clipping, AdamW) of:

- ``baseline`` — what a user would otherwise write: ``torch.nn.RNN`` (tanh) for
  tanh-rnn; every other architecture (no ``torch.nn`` module computes them) a
  straightforward per-step loop over the cell's transition (``Cell.scan``, the generic
  loop) under autograd, with the tracker's embedding and readout;
- ``dynlab`` — :func:`dynlab.tracking.train.train_tracker`, one model;
- ``ensemble-N`` — :func:`dynlab.tracking.train.ensemble.train_ensemble` with N members;
- ``floor`` — what the machine allows, measured in the same run: for dense cells FLOPs per
  token over the GEMM rate (``floor_kind`` ``gemm``); for diagonal cells (the Mamba family),
  whose training is bound by memory traffic, bytes per token over the memory bandwidth
  (``floor_kind`` ``bandwidth``).

Definitions (numbers the report prints):

- throughput (model-tokens/s) = models · B · T · (timed steps) / (wall time of those
  steps): every model's tokens count, so an ensemble of N whose step takes as long as one
  model's has N× the throughput of that model.  It is the throughput the floor bounds:
  the machine's GEMM rate is shared by all the models it trains, so one model and any
  ensemble are held to the same floor.  The first
  ``warmup`` steps are not timed;
- GEMM rate (FLOP/s) = 2·B·H·H / time of one ``[B, H] @ [H, H]`` product (the dense
  recurrence's GEMM shape): per thread count, the median of 3 timings at the start and
  one just before every measured method (a shared machine changes speed during a run), best
  thread count;
- every method runs at each thread count tried and is reported at its fastest;
- FLOPs per token: dense RNNs 6·(m·S² + S·C) — the recurrence and readout products,
  forward (1×) and backward (2×), as in the issue's floor, with m = 2 state matrices
  for state-gated-rnn (A and the gate's U) and 1 otherwise (input projections are
  excluded: dynlab gathers them from a per-token table); diagonal affine cells
  6·(2·S + H·C) (the diagonal recurrence and the per-channel readout are counted as
  matrix-vector work, which overstates what a GEMM rate can do for them);
- memory bandwidth (bytes/s) = 3 · 4 · 2²³ / time of one ``z = x + y`` over float32
  vectors of 2²³ entries (32 MiB each, larger than the caches: two streams read, one
  written), sampled like the GEMM rate (median per thread count, best thread count);
- bytes per token (diagonal cells): 11 streams of S float32 state entries, 44·S bytes
  (S = state size; complex states count their real and imaginary parts).  Forward: the
  scan reads a_t and b_t and writes h_t, the readout reads h_t (4); backward: the readout
  reads h_t and writes ∂L/∂h_t, the reverse scan reads ∂L/∂h_t, a_t and h_{t−1} and writes
  ∂L/∂a_t and ∂L/∂b_t (7).  Parameters, optimizer state and the [T, H]-sized inputs are
  left out, so the floor is optimistic (a fused kernel that never stores a_t and b_t
  could beat it);
- floor (tokens/s) = GEMM rate / FLOPs per token (``gemm``) or bandwidth / bytes per token
  (``bandwidth``);
- ``speedup_vs_baseline`` = best dynlab throughput (one model or an ensemble) / baseline
  throughput (one model);
- ``fraction_of_floor`` = throughput / floor, on every row, and for the best dynlab row at
  the top level;
- ``ensemble_vs_solo_per_model`` = best ensemble's model-tokens/s / one model's
  model-tokens/s, i.e. the time to train each model solo over its time inside the
  ensemble (``null`` without ensembles; below 1 the ensemble is slower per model).

The JSON is strict: numbers that do not exist (the floor row's seconds per step) are
``null``, never ``NaN``.

One module per job: :mod:`~dynlab.bench.trackers` (the measurement driver:
:func:`bench_train`, the methods it times, the paired ensemble statistics),
:mod:`~dynlab.bench.machine` (the GEMM rate, the memory bandwidth, the step clock),
:mod:`~dynlab.bench.floor` (the floor's cost models), :mod:`~dynlab.bench.baseline` (the
user's baseline models), :mod:`~dynlab.bench.sizes` (the size checks) and
:mod:`~dynlab.bench.payload` (the JSON file and its writing); every public name is
importable from ``dynlab.bench``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dynlab._lazy import lazy_exports

if TYPE_CHECKING:  # what _EXPORTS names, for type checkers and benchmarks/import_graph.py
    from dynlab.bench.floor import DENSE, bytes_per_token, floor_kind, flops_per_token
    from dynlab.bench.machine import gemm_rate, memory_bandwidth
    from dynlab.bench.payload import strict_json, train_payload, write_bench_json, write_json
    from dynlab.bench.sizes import MAX_REPEATS, check_bench_sizes
    from dynlab.bench.trackers import BenchRow, bench_train, paired_ensembles
    from dynlab.outputs import check_json_path

#: Public name -> the module that defines it, imported when the name is first read (as in
#: :mod:`dynlab`), so that :mod:`~dynlab.bench.payload` loads without torch.
_EXPORTS = {
    "DENSE": "dynlab.bench.floor",
    "MAX_REPEATS": "dynlab.bench.sizes",
    "BenchRow": "dynlab.bench.trackers",
    "bench_train": "dynlab.bench.trackers",
    "bytes_per_token": "dynlab.bench.floor",
    "check_bench_sizes": "dynlab.bench.sizes",
    "check_json_path": "dynlab.outputs",
    "floor_kind": "dynlab.bench.floor",
    "flops_per_token": "dynlab.bench.floor",
    "gemm_rate": "dynlab.bench.machine",
    "memory_bandwidth": "dynlab.bench.machine",
    "paired_ensembles": "dynlab.bench.trackers",
    "strict_json": "dynlab.bench.payload",
    "train_payload": "dynlab.bench.payload",
    "write_bench_json": "dynlab.bench.payload",
    "write_json": "dynlab.bench.payload",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
