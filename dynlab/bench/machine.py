"""What the machine does, measured in the benchmark's own run: the GEMM rate and the memory
bandwidth (per CPU thread count, :class:`MachineSpeed`), and the clock of training steps
(:class:`StepClock`, :func:`seconds_per_step`).  Definitions: :mod:`dynlab.bench`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import torch

from dynlab.runtime import NullProgress

__all__ = ["MachineSpeed", "StepClock", "gemm_rate", "median_seconds", "memory_bandwidth", "seconds_per_step", "sync"]


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing on a CPU."""
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
    return 2.0 * batch * size * size / median_seconds(lambda: torch.mm(a, w, out=out), repeats, device)


def memory_bandwidth(device: torch.device, numel: int = 1 << 23, repeats: int = 5) -> float:
    """Bytes/s of ``z = x + y`` over float32 vectors of ``numel`` entries (median of 5 timings)."""
    x = torch.ones(numel, device=device)
    y = torch.ones(numel, device=device)
    z = torch.empty(numel, device=device)
    torch.add(x, y, out=z)
    return 3.0 * 4 * numel / median_seconds(lambda: torch.add(x, y, out=z), repeats, device)


def median_seconds(op: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Seconds per call of ``op``: the median of 5 timings of ``repeats`` calls, the device synced around each."""
    times = []
    for _ in range(5):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            op()
        sync(device)
        times.append((time.perf_counter() - t0) / repeats)
    return sorted(times)[len(times) // 2]


class MachineSpeed:
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


@dataclass
class StepClock(NullProgress):
    """Progress sink that records the time of every training-step update."""

    times: list[float] = field(default_factory=list)

    def update(self, task: int, advance: int = 1, **fields: Any) -> None:
        self.times.append(time.perf_counter())


def seconds_per_step(clock: StepClock, warmup: int) -> tuple[float, int]:
    """``(seconds per step, timed steps)`` of the steps ``clock`` recorded after the first ``warmup``."""
    t = clock.times
    n = len(t) - warmup
    if n < 1:
        raise ValueError(f"need more steps than warmup={warmup}, got {len(t)}")
    return (t[-1] - t[warmup - 1]) / n if warmup > 0 else (t[-1] - t[0]) / max(1, len(t) - 1), n
