"""One LM over several processes, and training that resumes from its last saved step.

**Several processes** (``torchrun``; :class:`World`). Launched as ::

    torchrun --nproc_per_node 8 --no-python dynlab lm post-train --checkpoint CKPT --source TOKENS \\
        --batch-size 8 --batch-tokens 524288 --precision bf16

every process (a *rank*) builds the same model from the same checkpoint and seed, and
:func:`dynlab.lm.train.engine.fit` trains it under ``DistributedDataParallel`` (NCCL on GPUs,
one GPU per rank, ``cuda:LOCAL_RANK``; gloo on CPUs):

- **Batches**: every rank draws the same *global* batch of ``batch_size × world``
  sequences from the seed's generator and computes its own rows
  ``[rank·B, (rank + 1)·B)`` (:func:`shard_rows`), so W ranks with B sequences each see
  exactly the windows one process with W·B sequences sees. A batch given in tokens
  (``--batch-tokens``, paper B's 0.5M) is reached by gradient accumulation:
  ``accum = batch_tokens / (B · L · W)`` (:func:`accum_for_tokens`, which must divide);
  the gradients of the first ``accum − 1`` micro-batches stay local (``no_sync``) and the
  last one's backward averages them over the ranks.
- **Equal to one process**: the loss of a rank is the mean over its rows, and DDP
  averages the gradients, so each update is the one process's with the whole batch up to
  the order of floating-point sums (tested with two gloo processes:
  ``tests/lm/test_distributed.py``). This holds for the zero state and TBTT (whose
  sequential lanes are the global batch's). Interventions that draw random numbers per row
  (random and fitted noise, state passing's resets) draw them on each rank from the rank's
  own generator (seeded from the seed and the rank), so those arms are statistically,
  not bitwise, the one-process run; fitted noise fits its statistics to each rank's rows.
- **Losses** are averaged over the ranks when they are read back (every ``sync_every``
  steps), so every rank sees the same losses and stops at the same step; only rank 0
  writes outputs.

**Resuming** (:class:`TrainState`): with ``resume=PATH`` :func:`~dynlab.lm.train.engine.fit`
saves the training state every ``save_every`` steps and after the last — weights, AdamW moments, schedule,
losses so far, the generators, the intervention's carried states and the batch source's
position — one file per rank (``PATH.rank<r>.step<s>``), then, once every rank has
written, rank 0 writes ``PATH`` naming that step (atomically), and the older step files
are removed. A run killed at any moment restarts from the step ``PATH`` names and ends
where the uninterrupted run ends (bit for bit in one process); the state of the last step
is kept until the caller, its outputs stored, removes it (:func:`remove_train_state`), so a
kill after training costs no step. A state saved with another number of ranks, or for
another run (settings, seed, intervention, starting weights, data), is refused in one line
by every rank together.
"""

from __future__ import annotations

import atexit
import hashlib
import io
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dynlab.errors import DynlabInputError

__all__ = ["TrainState", "World", "accum_for_tokens", "current_world", "env_world_size", "init_world", "leave_world",
           "mean_over_ranks", "remove_train_state", "shard_rows"]

NextBatch = Callable[[], tuple[torch.Tensor, "torch.Tensor | None", torch.Tensor]]


@dataclass(frozen=True)
class World:
    """This process's place among ``size`` processes training one model."""

    rank: int
    size: int
    local_rank: int

    @property
    def main(self) -> bool:
        """Rank 0: the process that writes outputs."""
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """The rank's own GPU (``cuda:LOCAL_RANK``) when training on CUDA, else ``device``."""
        return torch.device("cuda", self.local_rank) if device.type == "cuda" else device


def env_world_size(env: dict[str, str] | os._Environ = os.environ) -> int:
    """The number of processes ``torchrun`` started (``WORLD_SIZE``; 1 without it)."""
    try:
        return int(env.get("WORLD_SIZE") or "1")
    except ValueError:
        raise DynlabInputError(f"WORLD_SIZE={env.get('WORLD_SIZE')!r} is not a number of processes "
                               "(torchrun sets it)") from None


def init_world(device_type: str, env: dict[str, str] | os._Environ = os.environ) -> World | None:
    """Join the process group that ``torchrun`` describes in ``env`` (``WORLD_SIZE`` > 1;
    NCCL for CUDA, gloo otherwise) and return this process's :class:`World`; None for one
    process. Joining twice is harmless. The group is left (:func:`leave_world`) when the
    interpreter exits, before it tears down."""
    if env_world_size(env) <= 1:
        return None
    import torch.distributed as dist

    if not dist.is_initialized():
        # torch's compiler (torch._dynamo), imported after a group exists (DDP imports it lazily),
        # keeps references to that group, so destroy_process_group would leave its backend and
        # gloo's threads alive into the interpreter's teardown; imported first, it holds none.
        # torch.compiler.reset() is the public call that imports it; when it is loaded already
        # (before any group), nothing is reset: a caller's compiled code is kept
        if "torch._dynamo" not in sys.modules:
            torch.compiler.reset()

        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
        atexit.register(leave_world)
    world = current_world()
    if world is not None and device_type == "cuda":
        torch.cuda.set_device(world.local_rank)
    return world


def leave_world() -> None:
    """Destroy the process group, if one is joined (a no-op otherwise).

    :func:`init_world` registers it to run at exit: a gloo group left to the interpreter's
    finalisation can still hold work with Python references on its C++ threads, and the
    process then aborts (SIGABRT, "terminate called without an active exception") after
    its outputs are written, which ``torchrun`` reports as a failed run. Destroying the group
    stops gloo's threads only when nothing else holds it: :func:`init_world` imports torch's
    compiler before joining for that reason."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def current_world() -> World | None:
    """The :class:`World` of an initialised process group of more than one process, else None."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return None
    rank = dist.get_rank()
    return World(rank, dist.get_world_size(), int(os.environ.get("LOCAL_RANK", rank)))


def shard_rows(next_batch: NextBatch, world: World) -> NextBatch:
    """A batch source over ``next_batch``'s global batches: this rank's rows ``[rank·B, (rank + 1)·B)``."""

    def rows() -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        tokens, mask, fresh = next_batch()
        b = tokens.shape[0] // world.size
        part = slice(world.rank * b, (world.rank + 1) * b)
        return tokens[part], None if mask is None else mask[part], fresh[part]

    return rows


def accum_for_tokens(batch_tokens: int, batch_size: int, seq_len: int, world_size: int = 1) -> int:
    """Micro-batches per step so that a step sees ``batch_tokens`` tokens: ``batch_tokens /
    (batch_size · seq_len · world_size)``, which must be a whole number ≥ 1 (else a one-line
    error naming the options and the numbers)."""
    per = batch_size * seq_len * world_size
    if batch_tokens < per or batch_tokens % per:
        raise DynlabInputError(
            f"--batch-tokens {batch_tokens} is not a whole multiple of --batch-size {batch_size} × --seq-len {seq_len}"
            f" × {world_size} process(es) = {per} tokens; allowed: {per}, {2 * per}, {4 * per}, ...")
    return batch_tokens // per


def mean_over_ranks(x: torch.Tensor, world: World | None) -> torch.Tensor:
    """``x`` averaged over the ranks (itself for one process); float tensors only."""
    if world is None:
        return x
    import torch.distributed as dist

    x = x.clone()
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x / world.size


def all_ranks(flag: torch.Tensor, world: World | None) -> torch.Tensor:
    """``flag`` (booleans) true on every rank."""
    if world is None:
        return flag
    import torch.distributed as dist

    x = flag.to(torch.int32)
    dist.all_reduce(x, op=dist.ReduceOp.MIN)
    return x.bool()


def barrier(world: World | None) -> None:
    if world is not None:
        import torch.distributed as dist

        dist.barrier()


def rank_generator(seed: int, world: World | None, device: torch.device) -> torch.Generator:
    """The intervention's noise generator of a rank: seeded from ``seed`` and the rank."""
    mixed = int.from_bytes(hashlib.sha256(f"{seed}/{world.rank if world else 0}".encode()).digest()[:7], "big")
    return torch.Generator(device=device).manual_seed(mixed)


#: What an intervention carries between steps (saved with the training state).
_INTERVENTION_FIELDS = ("mean", "var", "previous")


@dataclass
class TrainState:
    """The parts of :func:`dynlab.lm.train.engine.fit` a resume restores (module docstring, "Resuming")."""

    path: Path
    world: World | None
    model: nn.Module
    opt: torch.optim.Optimizer
    sched: Any
    generators: list[torch.Generator]
    intervention: Any
    source: Any  # the batch source's owner, with state_dict()/load_state_dict(), or None
    run: dict

    @property
    def rank(self) -> int:
        return self.world.rank if self.world else 0

    def _file(self, step: int) -> Path:
        return self.path.with_name(f"{self.path.name}.rank{self.rank}.step{step}")

    def save(self, done: int, losses: list[float], lengths: list[int]) -> None:
        """Write this rank's state after ``done`` steps, then (rank 0, once all have) the pointer."""
        from dynlab.results.files import write_bytes_atomic, write_text_atomic  # xarray: only when saving

        state = {
            "done": done, "losses": losses, "lengths": lengths,
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "opt": self.opt.state_dict(), "sched": self.sched.state_dict(),
            "generators": [g.get_state().cpu() for g in self.generators],
            "intervention": {k: _pack(getattr(self.intervention, k)) for k in _INTERVENTION_FIELDS
                             if hasattr(self.intervention, k)},
            "source": self.source.state_dict() if self.source is not None else {},
        }
        buf = io.BytesIO()
        torch.save(state, buf)
        write_bytes_atomic(self._file(done), buf.getbuffer())
        barrier(self.world)
        if self.rank == 0:
            pointer = {"step": done, "world": self.world.size if self.world else 1, "run": self.run}
            write_text_atomic(self.path, json.dumps(pointer, sort_keys=True))
        barrier(self.world)
        for old in self.path.parent.glob(f"{self.path.name}.rank{self.rank}.step*"):
            if old != self._file(done):
                old.unlink(missing_ok=True)

    def restore(self) -> tuple[int, list[float], list[int]]:
        """``(steps done, their losses, their lengths)`` from the saved state; ``(0, [], [])``
        without one. Every rank reads its own file, then the ranks agree (one collective)
        on the step they continue from, or all refuse together."""
        done, why = self._read()
        agreed = torch.tensor([done, -done, 0 if why is None else 1], dtype=torch.int64)
        if self.world is not None:
            import torch.distributed as dist

            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        if why is None and agreed[2] > 0:
            why = "another process could not read its part of it"
        elif why is None and int(agreed[0]) != -int(agreed[1]):
            why = "the processes found different steps in it (is PATH on a file system every process sees?)"
        if why is not None:
            raise DynlabInputError(f"cannot resume from {self.path}: {why}; delete it (and its "
                                   f"{self.path.name}.rank* files) to train from step 0")
        if done == 0:
            return 0, [], []
        state = self._loaded
        for g, s in zip(self.generators, state["generators"]):
            g.set_state(s)
        for k, v in state["intervention"].items():
            setattr(self.intervention, k, _unpack(v, self.generators[-1].device))
        if self.source is not None:
            self.source.load_state_dict(state["source"])
        return done, list(state["losses"]), list(state["lengths"])

    def _read(self) -> tuple[int, str | None]:
        """This rank's saved state loaded into the model and optimiser: (steps done, None),
        (0, None) without a state, or (0, why it cannot be used)."""
        if not self.path.exists():
            return 0, None
        try:
            pointer = json.loads(self.path.read_text())
            size = self.world.size if self.world else 1
            if pointer["world"] != size:
                raise ValueError(f"it was saved by {pointer['world']} process(es), this run has {size}")
            if pointer["run"] != self.run:
                diff = [k for k in self.run if pointer["run"].get(k) != self.run[k]]
                raise ValueError(f"it was saved by another run (differs in {', '.join(diff)})")
            state = torch.load(self._file(int(pointer["step"])), weights_only=True)
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["opt"])
            self.sched.load_state_dict(state["sched"])
        except Exception as exc:  # noqa: BLE001 - any unreadable state is one clear error
            return 0, (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        self._loaded = state
        return int(state["done"]), None


def remove_train_state(path: Path) -> None:
    """Remove a training state :func:`dynlab.lm.train.engine.fit` saved at ``path`` (every rank's
    files and the pointer): once the run's outputs are stored, its state is not needed."""
    path = Path(path)
    for part in path.parent.glob(f"{path.name}.rank*.step*"):
        part.unlink(missing_ok=True)
    path.unlink(missing_ok=True)


def run_identity(model: nn.Module, generator: torch.Generator, intervention: Any, **settings: Any) -> dict:
    """What a training state belongs to: the settings that shape the run, the seed, the
    intervention and its parameters, and a hash of the starting weights."""
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    params = {k: v for k, v in vars(intervention).items() if isinstance(v, (int, float, str, bool))}
    return {**settings, "seed": generator.initial_seed(), "intervention": type(intervention).__name__,
            "intervention_params": params, "start_params": h.hexdigest()[:16]}


def _pack(value: Any) -> Any:
    """An intervention field as plain tensors on the CPU (carried states as ``{"ssm", "conv"}``)."""
    from dynlab.lm.models.states import CarriedStates

    if isinstance(value, CarriedStates):
        return {"ssm": [s.cpu() for s in value], "conv": [None if c is None else c.cpu() for c in value.conv]}
    if isinstance(value, list):
        return [v.cpu() if isinstance(v, torch.Tensor) else v for v in value]
    return value


def _unpack(value: Any, device: torch.device) -> Any:
    from dynlab.lm.models.states import CarriedStates

    if isinstance(value, dict) and set(value) == {"ssm", "conv"}:
        return CarriedStates([s.to(device) for s in value["ssm"]],
                             [None if c is None else c.to(device) for c in value["conv"]])
    if isinstance(value, list):
        return [v.to(device) if isinstance(v, torch.Tensor) else v for v in value]
    return value
