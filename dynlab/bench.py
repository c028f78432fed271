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
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import nn

from dynlab.spec import MAX_BATCH, MAX_ENSEMBLE, MAX_LENGTH, MAX_STEPS, MAX_WIDTH, check_limit
from dynlab.tracking.spec import CurriculumSpec, ModelSpec, RunSpec, TaskSpec, TrainSpec
from dynlab.errors import DynlabInputError, format_validation_error
from dynlab.names import CELLS
from dynlab.outputs import check_json_path
from dynlab.tracking.groups import get_group
from dynlab.tracking.models import Tracker, get_cell
from dynlab.tracking.models.cells import Cell
from dynlab.tracking.task import WordProblem
from dynlab.runtime import NullProgress, resolve_device
from dynlab.tracking.train.engine import build_tracker, runs_generic_loop
from dynlab.tracking.train.ensemble import train_ensemble, train_tracker

__all__ = [
    "BenchRow",
    "MAX_REPEATS",
    "bench_train",
    "check_bench_sizes",
    "check_json_path",
    "bytes_per_token",
    "floor_kind",
    "gemm_rate",
    "memory_bandwidth",
    "strict_json",
    "write_bench_json",
    "train_payload",
    "write_json",
]

#: Most rounds over the methods (``--repeats``).
MAX_REPEATS = 100

_DENSE = tuple(c.name for c in CELLS if c.dense)
_LIVE_COPIES = 8  # [N, B, T, S] tensors alive at the peak of a training step under autograd (estimate)
_LIVE_COPIES_FUSED = 2  # the fused kernels: one state buffer (plus [N, B, T, H]-sized readout buffers)


@dataclass
class BenchRow:
    """One measured configuration: ``tokens_per_s`` is model-tokens per second (summed
    over the ``models`` trained together; see the module docstring)."""

    setting: str
    method: str
    models: int
    tokens_per_s: float
    seconds_per_step: float
    steps: int
    threads: int = 0
    floor_kind: str = ""
    fraction_of_floor: float | None = None


@dataclass
class _StepClock(NullProgress):
    """Progress sink that records the time of every training-step update."""

    times: list[float] = field(default_factory=list)

    def update(self, task: int, advance: int = 1, **fields: Any) -> None:
        self.times.append(time.perf_counter())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_rate(batch: int, size: int, device: torch.device, repeats: int = 50) -> float:
    """FLOP/s of ``[batch, size] @ [size, size]`` (median of 5 timings of ``repeats`` products)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(batch, size, generator=gen).to(device)
    w = torch.randn(size, size, generator=gen).to(device)
    out = torch.empty(batch, size, device=device)
    for _ in range(5):
        torch.mm(a, w, out=out)
    times = []
    for _ in range(5):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, w, out=out)
        _sync(device)
        times.append((time.perf_counter() - t0) / repeats)
    return 2.0 * batch * size * size / sorted(times)[len(times) // 2]


def memory_bandwidth(device: torch.device, numel: int = 1 << 23, repeats: int = 5) -> float:
    """Bytes/s of ``z = x + y`` over float32 vectors of ``numel`` entries (median of 5 timings)."""
    x = torch.ones(numel, device=device)
    y = torch.ones(numel, device=device)
    z = torch.empty(numel, device=device)
    torch.add(x, y, out=z)
    times = []
    for _ in range(5):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            torch.add(x, y, out=z)
        _sync(device)
        times.append((time.perf_counter() - t0) / repeats)
    return 3.0 * 4 * numel / sorted(times)[len(times) // 2]


def floor_kind(arch: str) -> str:
    """``"gemm"`` for dense cells (bound by matrix products), ``"bandwidth"`` for diagonal ones."""
    return "gemm" if arch in _DENSE else "bandwidth"


def bytes_per_token(arch: str, hidden: int, d_state: int) -> float:
    """Floor bytes per token of a diagonal cell: 11 float32 streams of the state (module docstring)."""
    model = Tracker(arch, 2, 2, hidden=hidden, d_state=d_state)
    return 11.0 * 4 * model.state_size


def flops_per_token(arch: str, hidden: int, n_classes: int, d_state: int) -> float:
    """Floor FLOPs per token (see the module docstring)."""
    model = Tracker(arch, n_classes, n_classes, hidden=hidden, d_state=d_state)
    s = model.state_size
    if arch in _DENSE:
        mats = 2 if arch == "state-gated-rnn" else 1
        return 6.0 * (mats * s * s + hidden * n_classes)
    return 6.0 * (2 * s + hidden * n_classes)


def _spec(arch: str, hidden: int, batch: int, length: int, steps: int, seed: int, group: str) -> RunSpec:
    cur = CurriculumSpec(min_length=length, max_length=length)
    return RunSpec(
        task=TaskSpec(group=group),
        model=ModelSpec(arch=arch, hidden=hidden),
        train=TrainSpec(steps=steps, batch_size=batch, curriculum=cur),
        seed=seed,
    )


def _timed(clock: _StepClock, warmup: int) -> tuple[float, int]:
    t = clock.times
    n = len(t) - warmup
    if n < 1:
        raise ValueError(f"need more steps than warmup={warmup}, got {len(t)}")
    return (t[-1] - t[warmup - 1]) / n if warmup > 0 else (t[-1] - t[0]) / max(1, len(t) - 1), n


class _TorchRNN(nn.Module):
    """Embedding → ``torch.nn.RNN`` (tanh) → Linear: the user's baseline for tanh-rnn."""

    def __init__(self, n_tokens: int, n_classes: int, hidden: int):
        super().__init__()
        self.embed = nn.Embedding(n_tokens, hidden)
        self.rnn = nn.RNN(hidden, hidden, nonlinearity="tanh", batch_first=True)
        self.readout = nn.Linear(hidden, n_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.readout(self.rnn(self.embed(tokens))[0])


class _LoopTracker(nn.Module):
    """A dynlab tracker run with the generic per-step loop (``Cell.scan``) everywhere."""

    def __init__(self, model: Tracker):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        u = self.model.embed(tokens)
        for cell in self.model.cells:
            p = cell.precompute(u)
            h0 = cell.init_state(tokens.shape[0], u.device, u.dtype)
            u = cell.readout(Cell.scan(cell, h0, p), p)
        return self.model.readout(u)


def _baseline(spec: RunSpec, device: torch.device, warmup: int) -> tuple[str, float, int]:
    """Seconds per training step of the user's baseline (name, seconds, timed steps)."""
    task = WordProblem(get_group(spec.task.group))
    if spec.model.arch == "tanh-rnn":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            model: nn.Module = _TorchRNN(task.n_tokens, task.n_classes, spec.model.hidden)
        name = "torch.nn.RNN"
    else:
        model = _LoopTracker(build_tracker(spec.model, task.n_tokens, task.n_classes, spec.seed))
        name = "per-step loop"
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.train.lr)
    gen = torch.Generator().manual_seed(spec.seed)
    clock = _StepClock()
    length = spec.train.curriculum.max_length
    for _ in range(spec.train.steps):
        tokens, labels = task.sample(gen, spec.train.batch_size, length)
        tokens, labels = tokens.to(device), labels.to(device)
        loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.train.clip)
        opt.step()
        _sync(device)
        clock.update(0)
    sec, n = _timed(clock, warmup)
    return name, sec, n


class _MachineSpeed:
    """Samples of the machine's speed per CPU thread count: the GEMM rate of the dense
    recurrence's shape, and (diagonal cells, ``kind == "bandwidth"``) the memory bandwidth."""

    def __init__(self, batch: int, hidden: int, device: torch.device, kind: str, tries: list[int]):
        self.batch, self.hidden, self.device, self.kind = batch, hidden, device, kind
        self.gemm: dict[int, list[float]] = {t: [] for t in tries}
        self.bandwidth: dict[int, list[float]] = {t: [] for t in tries}

    def sample(self, t: int) -> None:
        """One sample at ``t`` threads (the caller has set the thread count)."""
        self.gemm[t].append(gemm_rate(self.batch, self.hidden, self.device))
        if self.kind == "bandwidth":
            self.bandwidth[t].append(memory_bandwidth(self.device))

    def medians(self) -> tuple[dict[int, float], dict[int, float]]:
        """``(GEMM rate, bandwidth)`` per thread count: the median of the samples (bandwidth
        only where sampled)."""
        rates = {t: sorted(v)[len(v) // 2] for t, v in self.gemm.items()}
        return rates, {t: sorted(v)[len(v) // 2] for t, v in self.bandwidth.items() if v}


#: A method to time: (name, models trained together, ``run(threads) -> (seconds per step, timed steps)``).
_Method = tuple[str, int, Callable[[int], tuple[float, int]]]


def _dynlab_run(specs: list[RunSpec], device: torch.device, warmup: int, compiled: bool = False):
    """``run(threads)`` training ``specs`` with dynlab (one model, or an ensemble)."""

    def run(t: int) -> tuple[float, int]:
        clock = _StepClock()
        if len(specs) == 1:
            train_tracker(specs[0], device, clock, threads=t, compile=compiled)
        else:
            train_ensemble(specs, device, clock, threads=t)
        return _timed(clock, warmup)

    return run


def _methods(setting: tuple, ensembles: tuple[int, ...], device: torch.device, warmup: int,
             max_memory_gb: float, compile: bool) -> tuple[list[_Method], list[dict[str, str]], list[str]]:
    """The methods :func:`bench_train` times for ``setting`` (``(arch, hidden, batch, length,
    steps, group)``), the ones it skips (with why), and the list the baseline appends its
    name to each time it runs."""
    arch, hidden, batch, length, steps, group = setting
    spec = _spec(arch, hidden, batch, length, steps, 0, group)
    names: list[str] = []
    skipped: list[dict[str, str]] = []

    def base_run(t: int) -> tuple[float, int]:
        name, sec, n = _baseline(spec, device, warmup)
        names.append(name)
        return sec, n

    methods: list[_Method] = [("baseline", 1, base_run), ("dynlab", 1, _dynlab_run([spec], device, warmup))]
    probe = Tracker(arch, 2, 2, hidden=hidden)  # structure only: state size, training path
    if compile and not runs_generic_loop(probe):
        reason = f"{arch} trains through a fused kernel or scan, which torch.compile does not change"
        skipped.append({"method": "dynlab + torch.compile", "reason": reason})
    elif compile:
        methods.append(("dynlab + torch.compile", 1, _dynlab_run([spec], device, warmup, compiled=True)))
    copies = _LIVE_COPIES_FUSED if probe.fused_kind() else _LIVE_COPIES
    for size in ensembles:
        need_gb = size * batch * length * probe.state_size * 4 * copies / 2**30
        if need_gb > max_memory_gb:
            skipped.append({"method": f"dynlab ensemble-{size}", "reason": f"needs ~{need_gb:.1f} GB > {max_memory_gb} GB"})
            continue
        specs = [_spec(arch, hidden, batch, length, steps, s, group) for s in range(size)]
        methods.append((f"dynlab ensemble-{size}", size, _dynlab_run(specs, device, warmup)))
    return methods, skipped, names


def _measure(methods: list[_Method], repeats: int, tries: list[int],
             machine: _MachineSpeed) -> tuple[dict[str, tuple[float, int, int]], dict[str, list[float]]]:
    """Time every method ``repeats`` rounds, every other round in reverse order (so no method
    always runs after the same one), each at every thread count in ``tries`` with a machine
    sample just before it.  Returns the fastest ``(seconds per step, timed steps, threads)``
    per method, and per method its seconds per step and model, round by round."""
    best: dict[str, tuple[float, int, int]] = {}
    per_round: dict[str, list[float]] = {}
    for r in range(repeats):
        for name, size, run in (methods if r % 2 == 0 else methods[::-1]):
            out = []
            for t in tries:
                torch.set_num_threads(t)
                machine.sample(t)  # the box's speed now, next to this timing
                sec, n = run(t)
                out.append((sec, n, t))
            got = min(out)
            best[name] = min(best.get(name, (float("inf"), 0, 0)), got)
            per_round.setdefault(name, []).append(got[0] / size)
    return best, per_round


def _floor_row(arch: str, hidden: int, kind: str, fpt: float, rates: dict[int, float],
               bandwidths: dict[int, float]) -> tuple[float, int, float | None, str]:
    """``(floor tokens/s, the thread count it is taken at, bytes per token or None, row name)``:
    the best GEMM rate over ``fpt`` FLOPs per token (``kind == "gemm"``), or the best
    bandwidth over :func:`bytes_per_token`."""
    if kind == "gemm":
        best_threads = max(rates, key=rates.get)
        return rates[best_threads] / fpt, best_threads, None, "floor (GEMM rate / FLOPs per token)"
    best_threads = max(bandwidths, key=bandwidths.get)
    bpt = bytes_per_token(arch, hidden, 4)
    return bandwidths[best_threads] / bpt, best_threads, bpt, "floor (bandwidth / bytes per token)"


def bench_train(
    arch: str = "tanh-rnn",
    hidden: int = 128,
    batch: int = 256,
    length: int = 60,
    ensembles: tuple[int, ...] = (16, 64),
    steps: int = 4,
    warmup: int = 1,
    threads: tuple[int, ...] | None = None,
    device: str = "auto",
    group: str = "S3",
    max_memory_gb: float = 6.0,
    compile: bool = False,
    repeats: int = 1,
    json_out: str | Path | None = None,
) -> dict[str, Any]:
    """Measure one setting; return a JSON-able dict (rows, rates, speedup, fraction).

    Every size is checked before anything runs (:func:`check_bench_sizes`: the limits of
    :mod:`dynlab.spec`), and so is ``json_out``, the file the caller will write the
    results to (:func:`check_json_path`; not written here): a bad one is a one-line
    :class:`~dynlab.errors.DynlabInputError`.

    ``threads``: CPU thread counts to try (default: 1 and the current count); every
    method is measured at each and reported at its fastest (on a shared, oversubscribed
    machine a second thread can make small-GEMM code many times slower).  Ensembles whose
    activations would need more than ``max_memory_gb`` (estimated as N·B·T·S·4 bytes ×
    8 live copies under autograd, × 2 for the fused kernels) are skipped and listed under ``skipped``.  ``compile``: also time one
    model trained with ``compile=True`` (:func:`dynlab.tracking.train.train_tracker`; the first,
    compiling step is the untimed warm-up; it counts towards the best dynlab row).  ``repeats``:
    rounds over all the methods, every other round in reverse order, each method reported
    at its fastest round (a burst of load on a shared machine then spoils one round, not the
    comparison); ``ensemble_large_vs_small`` pairs the two ensemble sizes round by round.
    """
    check_bench_sizes(arch, hidden, batch, length, ensembles, steps, warmup, repeats)
    if json_out is not None:
        check_json_path(json_out)
    dev = resolve_device(device)
    old_threads = torch.get_num_threads()
    tries = sorted(set(threads or (1, old_threads))) if dev.type == "cpu" else [old_threads]
    kind = floor_kind(arch)
    machine = _MachineSpeed(batch, hidden, dev, kind, tries)
    setting = f"{arch} H={hidden} B={batch} T={length}"
    try:
        for _ in range(3):  # interleaved, so a burst of load on the shared box hits every count
            for t in tries:
                torch.set_num_threads(t)
                machine.sample(t)
        methods, skipped, names = _methods((arch, hidden, batch, length, steps, group), ensembles, dev, warmup,
                                           max_memory_gb, compile)
        best, per_round = _measure(methods, repeats, tries, machine)
    finally:
        torch.set_num_threads(old_threads)
    rows = []
    for name, size, _ in methods:
        sec, n, t = best[name]
        label = f"baseline ({names[0]})" if name == "baseline" else name
        rows.append(BenchRow(setting, label, size, size * batch * length / sec, sec, n, t))
    rates, bandwidths = machine.medians()
    fpt = flops_per_token(arch, hidden, get_group(group).order, 4)
    floor, best_threads, bpt, floor_name = _floor_row(arch, hidden, kind, fpt, rates, bandwidths)
    rows.append(BenchRow(setting, floor_name, 1, floor, float("nan"), 0, best_threads))
    for r in rows:
        r.floor_kind, r.fraction_of_floor = kind, r.tokens_per_s / floor
    base = rows[0].tokens_per_s
    top = max(r.tokens_per_s for r in rows if r.method.startswith("dynlab"))
    return {
        "setting": setting, "arch": arch, "hidden": hidden, "batch": batch, "length": length,
        "device": str(dev), "threads": best_threads,
        "gemm_rate_flops": {str(t): r for t, r in rates.items()},
        "floor_kind": kind, "flops_per_token": fpt,
        "memory_bandwidth_bytes": {str(t): b for t, b in bandwidths.items()} or None,
        "bytes_per_token": bpt, "floor_tokens_per_s": floor,
        "rows": [asdict(r) for r in rows], "skipped": skipped,
        "baseline_tokens_per_s": base, "best_dynlab_tokens_per_s": top,
        "speedup_vs_baseline": top / base, "fraction_of_floor": top / floor,
        "ensemble_vs_solo_per_model": _ensemble_vs_solo(rows),
        "ensemble_large_vs_small": _paired_ensembles(per_round),
    }


def check_bench_sizes(
    arch: str,
    hidden: int,
    batch: int,
    length: int,
    ensembles: tuple[int, ...] = (),
    steps: int = 4,
    warmup: int = 1,
    repeats: int = 1,
) -> None:
    """Refuse sizes outside the stated limits (one line naming the option and the allowed
    range): ``hidden`` ≤ :data:`~dynlab.spec.MAX_WIDTH`, ``batch`` ≤
    :data:`~dynlab.spec.MAX_BATCH`, ``length`` ≤ :data:`~dynlab.spec.MAX_LENGTH`, each
    ensemble size ≤ :data:`~dynlab.spec.MAX_ENSEMBLE`, ``warmup`` < ``steps`` ≤
    :data:`~dynlab.spec.MAX_STEPS`, ``repeats`` ≤ :data:`MAX_REPEATS`, and the states of
    one batch within :data:`~dynlab.spec.MAX_STATE_BYTES` (as :class:`~dynlab.tracking.spec.RunSpec`
    estimates them)."""
    get_cell(arch)
    check_limit("hidden (--hidden)", hidden, MAX_WIDTH)
    check_limit("batch (--batch)", batch, MAX_BATCH)
    check_limit("length (--length)", length, MAX_LENGTH)
    check_limit("steps (--steps)", steps, MAX_STEPS)
    check_limit("repeats (--repeats)", repeats, MAX_REPEATS)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup < steps:
        raise DynlabInputError(f"warmup={warmup!r}; allowed: an integer from 0 to steps - 1 = {steps - 1}")
    for n in ensembles:
        check_limit("ensemble size (--ensembles)", n, MAX_ENSEMBLE)
    try:  # the run spec of the benchmark states the training-state limit (RunSpec)
        _spec(arch, hidden, batch, length, steps, 0, "S3")
    except ValidationError as exc:
        raise DynlabInputError(f"bench train: {format_validation_error(exc)}") from None


def _paired_ensembles(per_round: dict[str, list[float]]) -> dict[str, Any] | None:
    """The largest ensemble against the smallest, per model, round by round: in each round
    the ratio of seconds per step and model (small / large: above 1 the large ensemble
    trains each model faster), with its median, minimum and maximum over the rounds.  Both
    ran in the same round, so a slow spell of a shared machine hits the two alike.  None with
    fewer than two ensemble sizes."""
    sizes = sorted(int(k.rsplit("-", 1)[1]) for k in per_round if k.startswith("dynlab ensemble-"))
    if len(sizes) < 2:
        return None
    small, large = per_round[f"dynlab ensemble-{sizes[0]}"], per_round[f"dynlab ensemble-{sizes[-1]}"]
    ratios = sorted(a / b for a, b in zip(small, large))
    return {"small": sizes[0], "large": sizes[-1], "rounds": len(ratios), "median": statistics.median(ratios),
            "min": ratios[0], "max": ratios[-1]}


def _ensemble_vs_solo(rows: list[BenchRow]) -> float | None:
    """Best ensemble's model-tokens/s over one model's (None without ensembles); below 1 the
    ensemble trains each model more slowly than solo training would."""
    solo = next(r.tokens_per_s for r in rows if r.method == "dynlab")
    ens = [r.tokens_per_s for r in rows if r.method.startswith("dynlab ensemble-")]
    return max(ens) / solo if ens else None


def train_payload(results: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`bench_train` results as one benchmark file holds them: ``{"results": [...]}``
    plus the first setting's summary at the top level, and this machine under ``machine``
    (:func:`dynlab.results.provenance.machine_record`).  ``dynlab bench train`` prints it with
    :func:`dynlab.report.bench_markdown` (the tables ``dynlab report FILE.json`` prints)."""
    from dynlab.results.provenance import machine_record

    payload: dict[str, Any] = {"machine": machine_record(), "results": results}
    if results:
        payload["speedup_vs_baseline"] = results[0]["speedup_vs_baseline"]
        payload["fraction_of_floor"] = results[0]["fraction_of_floor"]
    return payload


def write_json(results: list[dict[str, Any]], path: str | Path) -> Path:
    """Write :func:`bench_train` results (:func:`train_payload`) with :func:`write_bench_json`."""
    return write_bench_json(train_payload(results), path)


def write_bench_json(payload: dict[str, Any], path: str | Path) -> Path:
    """Write one benchmark's results to ``path`` atomically as strict JSON
    (:func:`strict_json`), with the machine it ran on under ``machine``
    (:func:`dynlab.results.provenance.machine_record`: CPU model, cores, torch version,
    date).  Every benchmark JSON file dynlab and ``benchmarks/`` write goes through here;
    a path :func:`check_json_path` refuses is refused."""
    from dynlab.results.files import write_text_atomic
    from dynlab.results.provenance import machine_record

    path = check_json_path(path)
    data = {"machine": machine_record(), **payload}
    return write_text_atomic(path, json.dumps(strict_json(data), indent=1, allow_nan=False) + "\n")


def strict_json(obj: Any) -> Any:
    """A copy of ``obj`` with every non-finite float (NaN, ±inf) replaced by None (JSON ``null``)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj
