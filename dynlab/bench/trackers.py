"""The measurement driver of ``dynlab bench train``: the methods timed for one setting (the
user's baseline, dynlab's one model and ensembles), timed round by round at every thread
count next to samples of the machine's speed (:func:`bench_train`), and the paired
ensemble statistics (:func:`paired_ensembles`).  Definitions: :mod:`dynlab.bench`."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from dynlab.bench.baseline import time_baseline
from dynlab.bench.floor import floor_kind, floor_row, flops_per_token
from dynlab.bench.machine import MachineSpeed, StepClock, seconds_per_step
from dynlab.bench.sizes import bench_spec, check_bench_sizes
from dynlab.outputs import check_json_path
from dynlab.runtime import resolve_device
from dynlab.tracking.groups import get_group
from dynlab.tracking.models import Tracker
from dynlab.tracking.spec import RunSpec
from dynlab.tracking.train.engine import runs_generic_loop
from dynlab.tracking.train.ensemble import train_ensemble, train_tracker

__all__ = ["BenchRow", "bench_train", "paired_ensembles"]

_LIVE_COPIES = 8  # [N, B, T, S] tensors alive at the peak of a training step under autograd (estimate)
_LIVE_COPIES_FUSED = 2  # the fused kernels: one state buffer (plus [N, B, T, H]-sized readout buffers)


@dataclass
class BenchRow:
    """One measured configuration: ``tokens_per_s`` is model-tokens per second (summed
    over the ``models`` trained together; see :mod:`dynlab.bench`)."""

    setting: str
    method: str
    models: int
    tokens_per_s: float
    seconds_per_step: float
    steps: int
    threads: int = 0
    floor_kind: str = ""
    fraction_of_floor: float | None = None


#: A method to time: (name, models trained together, ``run(threads) -> (seconds per step, timed steps)``).
_Method = tuple[str, int, Callable[[int], tuple[float, int]]]


def _dynlab_run(specs: list[RunSpec], device: torch.device, warmup: int, compiled: bool = False):
    """``run(threads)`` training ``specs`` with dynlab (one model, or an ensemble)."""

    def run(t: int) -> tuple[float, int]:
        clock = StepClock()
        if len(specs) == 1:
            train_tracker(specs[0], device, clock, threads=t, compile=compiled)
        else:
            train_ensemble(specs, device, clock, threads=t)
        return seconds_per_step(clock, warmup)

    return run


def _methods(setting: tuple, ensembles: tuple[int, ...], device: torch.device, warmup: int,
             max_memory_gb: float, compile: bool) -> tuple[list[_Method], list[dict[str, str]], list[str]]:
    """The methods :func:`bench_train` times for ``setting`` (``(arch, hidden, batch, length,
    steps, group)``), the ones it skips (with why), and the list the baseline appends its
    name to each time it runs."""
    arch, hidden, batch, length, steps, group = setting
    spec = bench_spec(arch, hidden, batch, length, steps, 0, group)
    names: list[str] = []
    skipped: list[dict[str, str]] = []

    def base_run(t: int) -> tuple[float, int]:
        name, sec, n = time_baseline(spec, device, warmup)
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
        specs = [bench_spec(arch, hidden, batch, length, steps, s, group) for s in range(size)]
        methods.append((f"dynlab ensemble-{size}", size, _dynlab_run(specs, device, warmup)))
    return methods, skipped, names


def _measure(methods: list[_Method], repeats: int, tries: list[int],
             machine: MachineSpeed) -> tuple[dict[str, tuple[float, int, int]], dict[str, list[float]]]:
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
    machine = MachineSpeed(batch, hidden, dev, kind, tries)
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
    floor, best_threads, bpt, floor_name = floor_row(arch, hidden, kind, fpt, rates, bandwidths)
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
        "ensemble_large_vs_small": paired_ensembles(per_round),
    }


def paired_ensembles(per_round: dict[str, list[float]]) -> dict[str, Any] | None:
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
