"""Forward + backward time of one LM mixer layer on the CPU, as a ratio to Mamba-2.

Sizes are the length-generalization study's quick preset: batch 16, T = 32, width 64,
4 heads × 32 channels, state 64 (Mamba-1: 128 channels × N = 64; GLA: keys 64, values 32),
chunk 32, one thread.  Each row is the best of 5 repetitions, all in one process.

    python benchmarks/bench_lm_mixers.py
"""

from __future__ import annotations

import time

import torch

from dynlab.lm.mixers import GLAMixer, Mamba1Mixer, Mamba2Mixer


def seconds(mixer: torch.nn.Module, x: torch.Tensor, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        y, _ = mixer(x)
        y.sum().backward()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(16, 32, 64)
    mixers = {
        "mamba2 (chunked SSD)": Mamba2Mixer(64, n_heads=4, head_dim=32, d_state=64, chunk_size=32),
        "mamba1 impl=sequential (default)": Mamba1Mixer(64, d_inner=128, d_state=64, n_heads=4, chunk_size=32),
        "mamba1 impl=chunked (fused scan)": Mamba1Mixer(64, d_inner=128, d_state=64, n_heads=4, chunk_size=32, impl="chunked"),
        "gla impl=chunked, chunk 32 (default)": GLAMixer(64, n_heads=4, key_dim=64, value_dim=32, chunk_size=32),
        "gla impl=chunked, chunk 8": GLAMixer(64, n_heads=4, key_dim=64, value_dim=32, chunk_size=8),
        "gla impl=sequential": GLAMixer(64, n_heads=4, key_dim=64, value_dim=32, impl="sequential"),
    }
    times = {name: seconds(m, x) for name, m in mixers.items()}
    ref = times["mamba2 (chunked SSD)"]
    for name, sec in times.items():
        print(f"{name:40s} {sec * 1e3:8.1f} ms  {sec / ref:5.2f}× mamba2")


if __name__ == "__main__":
    main()
