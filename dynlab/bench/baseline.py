"""The user's baseline: what a user would otherwise write.  ``torch.nn.RNN`` (tanh) for
tanh-rnn; every other architecture a per-step loop over the cell's transition
(``Cell.scan``) under autograd, with the tracker's embedding and readout
(:func:`time_baseline` times its training steps)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dynlab.bench.machine import StepClock, seconds_per_step, sync
from dynlab.tracking.groups import get_group
from dynlab.tracking.models import Tracker
from dynlab.tracking.models.cell_base import Cell
from dynlab.tracking.spec import RunSpec
from dynlab.tracking.task import WordProblem
from dynlab.tracking.train.engine import build_tracker

__all__ = ["time_baseline"]


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


def time_baseline(spec: RunSpec, device: torch.device, warmup: int) -> tuple[str, float, int]:
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
    clock = StepClock()
    length = spec.train.curriculum.max_length
    for _ in range(spec.train.steps):
        tokens, labels = task.sample(gen, spec.train.batch_size, length)
        tokens, labels = tokens.to(device), labels.to(device)
        loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.train.clip)
        opt.step()
        sync(device)
        clock.update(0)
    sec, n = seconds_per_step(clock, warmup)
    return name, sec, n
