"""Train a tiny LM with :func:`dynlab.lm.train.engine.train_lm`, alone or as one rank of ``torchrun``,
and save (rank 0) its final parameters and losses: used by ``tests/lm/test_distributed.py``.

    python ddp_train.py OUT BATCH INTERVENTION [RESUME [CRASH_AT [SEED]]]
    torchrun --nproc_per_node 2 ddp_train.py OUT BATCH INTERVENTION [RESUME [CRASH_AT [SEED]]]

Float64, a byte stream with structure, 8 steps of 2 micro-batches (accum 2). CRASH_AT: the
process ends with exit code 3 when the loss of that step is read back (a kill mid-run); 8: after the
last step, before the outputs are saved.
The training state is removed once the outputs are saved. At exit, after the group is left, each
process prints how many of gloo's threads still run (0: nothing is left to the interpreter's teardown)."""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

import torch

from ddp_exit import gloo_threads  # this folder is on sys.path: the script's own
from dynlab.lm.train.distributed import current_world, init_world, remove_train_state
from dynlab.lm.train.interventions import make_intervention
from dynlab.lm.models.model import RecurrentLM
from dynlab.lm.train.engine import train_lm


def main() -> None:
    out, batch, arm = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    resume = Path(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] != "-" else None
    crash_at = int(sys.argv[5]) if len(sys.argv) > 5 else -1
    seed = int(sys.argv[6]) if len(sys.argv) > 6 else 5
    atexit.register(lambda: print(f"gloo threads at exit: {gloo_threads()}", flush=True))  # runs after init_world's
    init_world("cpu")
    torch.manual_seed(0)
    model = RecurrentLM("mamba2", d_model=16, n_layers=2, n_heads=2, head_dim=8, d_state=8, chunk_size=8,
                        generator=torch.Generator().manual_seed(1)).double()
    g = torch.Generator().manual_seed(2)
    base = torch.tensor(list(b"to be or not to be, that is the question. "), dtype=torch.long)
    data = base.repeat(200)
    data[torch.rand(len(data), generator=g) < 0.05] = 7

    calls = []

    def progress(step: int, loss: float) -> None:
        calls.append(step)
        if step == crash_at:
            os._exit(3)

    res = train_lm(model, data, make_intervention(arm), steps=8, batch_size=batch, seq_len=12, lr=3e-3, seed=seed,
                   device="cpu", threads=1, accum=2, progress=progress, resume=resume, save_every=2)
    if crash_at == 8:  # after training, before the outputs are saved
        os._exit(3)
    world = current_world()
    if world is None or world.main:
        torch.save({"params": {k: v.detach().clone() for k, v in model.state_dict().items()},
                    "losses": torch.tensor(res.losses), "status": res.status, "steps_run": len(calls),
                    "world": 1 if world is None else world.size}, out)
        if resume is not None:
            remove_train_state(resume)


if __name__ == "__main__":
    main()
