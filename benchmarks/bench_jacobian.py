"""Time batched (vmap) step Jacobians against a per-sample loop and print the speed ratio.

Usage: python benchmarks/bench_jacobian.py [--batch 256] [--hidden 64] [--repeats 3] [--device cpu]
Both paths use the same float64 tanh-RNN cell (model protocol) and are checked to agree.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from dynlab.analysis.jacobian import analysis_copy, step_jacobians


class TanhCell(nn.Module):
    """h' = tanh(A h + emb[x]); readout = first 4 coordinates."""

    def __init__(self, hidden: int, vocab: int = 6):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.A = nn.Parameter(torch.randn(hidden, hidden, generator=gen) / hidden**0.5)
        self.emb = nn.Parameter(torch.randn(vocab, hidden, generator=gen))
        self.state_size, self.n_classes = hidden, vocab

    def layer_slice(self, layer: int) -> slice:
        return slice(0, self.state_size)

    def init_state(self, batch: int) -> torch.Tensor:
        return torch.zeros(batch, self.state_size, dtype=self.A.dtype, device=self.A.device)

    def step(self, state: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(state @ self.A.T + self.emb[tokens])
        return h[:, : self.n_classes], h


def loop_jacobians(model: nn.Module, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Reference: one ``torch.autograd.functional.jacobian`` call per sample."""
    m = analysis_copy(model)
    out = []
    for b in range(states.shape[0]):
        out.append(torch.autograd.functional.jacobian(lambda h: m.step(h[None], tokens[b : b + 1])[1][0], states[b]))
    return torch.stack(out)  # [B, S, S]


def _time(fn, repeats: int, device: torch.device) -> tuple[float, torch.Tensor]:
    best, out = float("inf"), None
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    model = TanhCell(args.hidden).to(device)
    gen = torch.Generator().manual_seed(1)
    states = torch.randn(args.batch, args.hidden, generator=gen, dtype=torch.float64).to(device)
    tokens = torch.randint(0, 6, (args.batch,), generator=gen).to(device)
    t_vmap, j_vmap = _time(lambda: step_jacobians(model, states, tokens), args.repeats, device)
    t_loop, j_loop = _time(lambda: loop_jacobians(model, states, tokens), args.repeats, device)
    err = float((j_vmap - j_loop).abs().max())
    print(f"device={device} batch={args.batch} hidden={args.hidden} float64, best of {args.repeats}")
    print(f"vmap  : {t_vmap * 1e3:9.2f} ms")
    print(f"loop  : {t_loop * 1e3:9.2f} ms")
    print(f"ratio loop/vmap = {t_loop / t_vmap:.1f}x   max |difference| = {err:.2e}")


if __name__ == "__main__":
    main()
