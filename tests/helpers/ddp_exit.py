"""Join a two-process gloo group with :func:`dynlab.lm.train.distributed.init_world`, all-reduce once
and exit normally; a check registered before joining (so run after every later exit hook)
prints whether the group was left before the interpreter's finalisation: used by
``tests/lm/test_distributed.py``."""

from __future__ import annotations

import atexit

import torch
import torch.distributed as dist

from dynlab.lm.train.distributed import init_world


def _report() -> None:
    print(f"joined at exit: {dist.is_initialized()}", flush=True)


if __name__ == "__main__":
    atexit.register(_report)  # atexit runs last-registered first: this runs after init_world's hook
    world = init_world("cpu")
    x = torch.ones(3) * (world.rank + 1)
    dist.all_reduce(x)
    print(f"rank {world.rank} sum {x.tolist()}", flush=True)
