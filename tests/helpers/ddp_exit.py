"""Join a two-process gloo group with :func:`dynlab.lm.train.distributed.init_world`, take one
DistributedDataParallel step (DDP imports ``torch._dynamo`` lazily) and exit normally; a check
registered before joining (so run after every later exit hook) prints whether the group was
left, and how many of gloo's native threads still run, before the interpreter's finalisation:
used by ``tests/lm/test_distributed.py``."""

from __future__ import annotations

import atexit
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from dynlab.lm.train.distributed import init_world


def gloo_threads() -> int:
    """Native threads of this process whose name gloo gives them (``gloo_*``, ``pt_gloo_*``)."""
    names = [p.read_text().strip() for p in Path("/proc/self/task").glob("*/comm")]
    return sum(n.startswith(("gloo", "pt_gloo")) for n in names)


def _report() -> None:
    print(f"joined at exit: {dist.is_initialized()}", flush=True)
    print(f"gloo threads at exit: {gloo_threads()}", flush=True)


if __name__ == "__main__":
    atexit.register(_report)  # atexit runs last-registered first: this runs after init_world's hook
    world = init_world("cpu")
    print(f"gloo threads while joined: {gloo_threads()}", flush=True)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(3, 1))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 3) * (world.rank + 1)).sum().backward()
    opt.step()
    x = torch.ones(3) * (world.rank + 1)
    dist.all_reduce(x)
    print(f"rank {world.rank} sum {x.tolist()}", flush=True)
    del model, opt
