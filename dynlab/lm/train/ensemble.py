"""Train E language models of one layout in one pass: the LM ensemble engine.

A small LM (10^4-10^5 parameters) spends most of a training step in fixed per-op
overhead, not in arithmetic: one model at a time, it reaches a few percent of the
machine's GEMM rate (``docs/performance.md``). :func:`fit_ensemble` trains E models of
one layout (seeds of one spec, or the intervention arms of one base) as one stack, so
every op of a step works on E models' data at once:

- **Parameters** and **activations** of all members are stacked (:class:`dynlab.lm.train.stack.LMStack`):
  one flat ``[E, P]`` buffer, one batched GEMM per linear layer over the members.
- **No host sync per step**: losses are written into a ``[steps, E]`` tensor and read
  every ``sync_every`` steps; a member whose loss or gradient becomes non-finite is
  frozen on the spot (its update is masked to zero) and reported as diverged at that
  step with the same reason as the one-model loop, while the others train on.
- **Resuming**: with ``resume=path`` the training state (parameters, AdamW moments,
  divergence flags, losses, every member's generator and intervention state) is saved
  there atomically every few minutes of wall time; a later call with the same path
  continues from it, and ends bit for bit where the run never stopped would have. The
  state names its run (settings, interventions, a hash of the starting weights): a call
  that differs in any of them is refused and the file kept.
- **Own streams**: each member keeps its own batch source, intervention and
  ``torch.Generator`` (the ones :func:`dynlab.lm.train.engine.fit` would get for that model), so
  adding or removing a member never changes another's batches or noise.

Each member computes what :func:`dynlab.lm.train.engine.fit` computes for it alone: the same
batches, initial states, loss, per-member clipping, AdamW (betas 0.9/0.95, eps 1e-8,
weight decay on matrices only), schedule and divergence rule. Only the order of
floating-point reductions differs (batched GEMMs instead of per-model ones), so in
float64 a member equals its solo run to ~1e-12 after a few steps, and in float32 to the
rounding that chaotic training then amplifies (``tests/lm/test_ensemble.py`` states the
tolerances). The stack's forward is in :mod:`dynlab.lm.train.stack`.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from dynlab.errors import DynlabInputError
from dynlab.kernels.adamw import adamw_step_
from dynlab.lm.train.interventions import Intervention
from dynlab.lm.models.model import RecurrentLM
from dynlab.lm.train.stack import LMStack, StackLayout
from dynlab.lm.models.states import CarriedStates, conv_windows
from dynlab.lm.train.engine import ADAM_BETAS, ADAM_EPS, LR_FLOOR
from dynlab.outputs import VANISHED_RETRIES
from dynlab.results.files import write_bytes_atomic
from dynlab.runtime import resolve_device, train_threads
from dynlab.training import TrainResult, cosine_lr

__all__ = ["fit_ensemble"]

#: torch's ``clip_grad_norm_`` adds this to the norm before dividing.
_CLIP_EPS = 1e-6

Batch = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]


# ---------------------------------------------------------------------------------------
# the loop


def _stack_initial_states(inits: list[list[torch.Tensor]], layout: StackLayout, device: torch.device
                          ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """Members' per-layer initial states (lists or CarriedStates) -> per layer
    ``[E, B, H, P, N]`` and ``[E, B, C, K − 1]`` (None where no member carries a window)."""
    states = [torch.stack([init[i] for init in inits]).to(device) for i in range(layout.n_layers)]
    windows: list[torch.Tensor | None] = []
    member_windows = [conv_windows(init, layout.n_layers) for init in inits]
    for i in range(layout.n_layers):
        ws = [w[i] for w in member_windows]
        if all(w is None for w in ws) or layout.conv_shapes[i] is None:
            windows.append(None)
            continue
        c, k1 = layout.conv_shapes[i]
        b = states[i].shape[1]
        windows.append(torch.stack([torch.zeros(b, c, k1) if w is None else w.float().cpu() for w in ws]).to(device))
    return states, windows


def _member_states(finals: list[torch.Tensor], windows: list[torch.Tensor | None], e: int) -> CarriedStates:
    """Member ``e``'s detached final states as the one-model loop hands them to its intervention."""
    return CarriedStates([f[e].detach() for f in finals], [None if w is None else w[e].detach() for w in windows])


def fit_ensemble(
    models: Sequence[RecurrentLM],
    next_batches: Sequence[Callable[[], Batch]],
    interventions: Sequence[Intervention],
    generators: Sequence[torch.Generator],
    *,
    steps: int,
    batch_size: int,
    lr: float = 3e-3,
    weight_decay: float = 0.1,
    grad_clip: float = 1.0,
    warmup_frac: float = 0.05,
    device: str = "auto",
    threads: int | None = None,
    sync_every: int = 50,
    progress: Callable[[int, list[float]], None] | None = None,
    checkpoints: Sequence[int] = (),
    on_checkpoint: Callable[[int, list[bool]], None] | None = None,
    noop_mixer: bool = False,
    compile: bool = False,  # noqa: A002 - torch's word
    resume: Path | None = None,
    save_every_s: float = 300.0,
    save_extra: Callable[[], dict] | None = None,
    on_resume: Callable[[int, dict], None] | None = None,
) -> list[TrainResult]:
    """Train ``models`` (one layout) together, each as :func:`dynlab.lm.train.engine.fit` alone:
    member ``e`` reads its batches from ``next_batches[e]()`` (``(tokens [B, L + 1], mask
    [B, L] or None, fresh [B])``, all members with the same B and L), its initial states
    from ``interventions[e]`` with ``generators[e]``. The loss, AdamW, clipping (global
    norm per member), schedule and divergence rule are those of ``fit``.

    Args:
        sync_every: steps between reads of the losses (and calls of ``progress``).
        progress: optional ``(completed steps, latest loss per member)`` callback.
        checkpoints: step counts after which the weights are copied into ``models`` and
            ``on_checkpoint(steps done, alive per member)`` is called (mid-training evaluation).
        noop_mixer, compile: :class:`LMStack`'s (a benchmark's no-op mixers; ``torch.compile``).
        resume, save_every_s, save_extra, on_resume: the training state's file (module
            docstring, "Resuming"): restored when it exists, saved every ``save_every_s``
            seconds, removed at the end; ``save_extra()`` adds a JSON-able dict to a save,
            ``on_resume(steps done, that dict)`` is called after a restore.

    Returns one :class:`~dynlab.training.TrainResult` per member, its ``model`` trained in
    place (a diverged member keeps the weights before its failing step). ``seconds`` is the
    wall time of the whole stack.
    """
    e = _check_members(models, next_batches, interventions, generators)
    dev = resolve_device(device)
    stack = LMStack(models, dev, noop_mixer=noop_mixer, compile=compile)
    opt = _StackAdamW(stack, weight_decay, grad_clip)
    warmup = max(1, int(round(warmup_frac * steps)))
    losses = torch.full((steps, e), math.nan, dtype=torch.float64, device=dev)
    length = 0
    run, done = _restore(resume, stack, opt, losses, interventions, generators, on_resume,
                         dict(steps=steps, batch_size=batch_size, lr=lr, weight_decay=weight_decay, grad_clip=grad_clip,
                              warmup_frac=warmup_frac))
    start = last_save = time.perf_counter()
    with train_threads(dev, threads=threads):
        for step in range(done, steps):
            length = _train_step(stack, opt, next_batches, interventions, generators, batch_size, dev, step, losses,
                                 lr * cosine_lr(1.0, step, steps, warmup, floor=LR_FLOOR))
            done = step + 1
            if done in checkpoints and on_checkpoint is not None:
                stack.write_back()
                on_checkpoint(done, opt.alive.tolist())
            if done % sync_every == 0 or done == steps:
                if progress is not None:
                    progress(done, losses[step].tolist())
                if not bool(opt.alive.any()):
                    break
            if resume is not None and done < steps and time.perf_counter() - last_save >= save_every_s:
                _save_state(resume, done, stack, opt, losses, interventions, generators,
                            save_extra() if save_extra is not None else {}, run)
                last_save = time.perf_counter()
    seconds = time.perf_counter() - start
    if resume is not None:
        resume.unlink(missing_ok=True)
    stack.write_back()
    return _member_results(models, opt, losses[:done].cpu(), length, seconds)


def _check_members(models, next_batches, interventions, generators) -> int:
    """The number of members; a one-line error unless every model has its batches, intervention and generator."""
    e = len(models)
    if not (len(next_batches) == len(interventions) == len(generators) == e):
        raise DynlabInputError(f"need one batch source, intervention and generator per model: {e} models, "
                               f"{len(next_batches)} batch sources, {len(interventions)} interventions, "
                               f"{len(generators)} generators")
    return e


def _train_step(stack: LMStack, opt: _StackAdamW, next_batches, interventions, generators, batch_size: int,
                dev: torch.device, step: int, losses: torch.Tensor, lr: float) -> int:
    """One optimiser step of every member (loss into ``losses[step]``); returns the batch length L."""
    tokens, masks, states, windows = _next_inputs(next_batches, interventions, generators, stack.layout, batch_size, dev)
    observed = [i for i, iv in enumerate(interventions) if type(iv).observe is not Intervention.observe]
    loss, finals, new_windows = stack.step_losses(tokens, states, windows, masks, bool(observed))  # loss [E]
    stack.flat.grad = None
    loss.sum().backward()
    opt.step(loss.detach(), step, lr)
    losses[step] = loss.detach()
    for i in observed:  # the others' observe is the base class's, which reads nothing
        interventions[i].observe(_member_states(finals, new_windows, i))
    return tokens.shape[2] - 1


#: What a member's intervention carries between steps (saved with the training state).
_INTERVENTION_FIELDS = ("mean", "var", "previous")


def _pack_states(value):
    """An intervention field as plain lists/tensors (CarriedStates as ``{"ssm", "conv"}``)."""
    if isinstance(value, CarriedStates):
        return {"ssm": list(value), "conv": list(value.conv)}
    return value


def _unpack_states(value):
    if isinstance(value, dict) and set(value) == {"ssm", "conv"}:
        return CarriedStates(value["ssm"], value["conv"])
    return value


def _restore(resume: Path | None, stack: LMStack, opt: _StackAdamW, losses: torch.Tensor,
             interventions: Sequence[Intervention], generators: Sequence[torch.Generator],
             on_resume: Callable[[int, dict], None] | None, settings: dict) -> tuple[dict | None, int]:
    """``(the run's identity to save with its states, steps done)``: the state in ``resume``
    restored when it exists (then ``on_resume(steps done, its extra)``); ``(None, 0)`` without a file."""
    if resume is None:
        return None, 0
    run = _run_identity(stack, interventions, **settings)
    if not resume.exists():
        return run, 0
    done, extra = _load_state(resume, stack, opt, losses, interventions, generators, run)
    if on_resume is not None:
        on_resume(done, extra)
    return run, done


def _run_identity(stack: LMStack, interventions: Sequence[Intervention], **settings) -> dict:
    """What a training state belongs to (saved with it, compared on resume): the training
    settings that shape the run (steps, and with them the schedule; batch size; AdamW's),
    each member's intervention, and a hash of the members' starting parameters (so another
    seed's or another stack's models never resume from this state)."""
    start = hashlib.sha256(stack.flat.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]
    return {**settings, "interventions": [type(iv).__name__ for iv in interventions], "start_params": start}


def _save_state(path: Path, done: int, stack: LMStack, opt: _StackAdamW, losses: torch.Tensor,
                interventions: Sequence[Intervention], generators: Sequence[torch.Generator], extra: dict,
                run: dict | None = None) -> None:
    """Write the training state after ``done`` steps to ``path`` atomically (:func:`fit_ensemble`'s
    ``resume``), with ``run`` (:func:`_run_identity`) to check it against on resume."""
    state = {
        "run": json.dumps(run),
        "done": done, "flat": stack.flat.detach().cpu(), "m1": opt.m1.cpu(), "m2": opt.m2.cpu(),
        "alive": opt.alive.cpu(), "death_step": opt.death_step.cpu(), "death_why": opt.death_why.cpu(),
        "losses": losses[:done].cpu(), "generators": [g.get_state() for g in generators],
        "interventions": [{k: _pack_states(getattr(iv, k)) for k in _INTERVENTION_FIELDS if hasattr(iv, k)}
                          for iv in interventions],
        "extra": json.dumps(extra),
    }
    buf = io.BytesIO()
    torch.save(state, buf)
    for attempt in range(VANISHED_RETRIES):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(path, buf.getbuffer())
            return
        except FileNotFoundError:  # the study's shared resume/ folder, removed (empty) by a stack that finished
            if attempt == VANISHED_RETRIES - 1:  # in another worker between this stack's saves: made again
                raise


def _load_state(path: Path, stack: LMStack, opt: _StackAdamW, losses: torch.Tensor,
                interventions: Sequence[Intervention], generators: Sequence[torch.Generator],
                run: dict | None = None) -> tuple[int, dict]:
    """Restore a state :func:`_save_state` wrote; returns ``(steps done, extra)``. A file that
    does not load, does not fit this stack, or was saved by another run (``run``, compared
    with the file's: other settings, interventions or starting parameters) is a one-line
    DynlabInputError naming it and what differs."""
    try:
        state = torch.load(path, weights_only=True)
        if tuple(state["flat"].shape) != tuple(stack.flat.shape) or len(state["generators"]) != len(generators):
            raise ValueError(f"it holds {tuple(state['flat'].shape)} parameters, this stack {tuple(stack.flat.shape)}")
        saved = json.loads(state.get("run", "null"))
        if saved is not None and run is not None and saved != run:
            diff = [f"{k} {saved.get(k)!r} there, {run.get(k)!r} here" for k in run if saved.get(k) != run.get(k)]
            raise ValueError("it was saved by another run: " + "; ".join(diff)[:200])
        if not 0 <= int(state["done"]) <= losses.shape[0]:
            raise ValueError(f"it has {int(state['done'])} steps done, this run {losses.shape[0]} in all")
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one clear error
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        raise DynlabInputError(f"cannot resume from {path}: not a training state of this stack ({first}); "
                               "delete it to train from step 0") from None
    dev = stack.flat.device
    with torch.no_grad():
        stack.flat.copy_(state["flat"].to(dev))
    opt.m1.copy_(state["m1"].to(dev))
    opt.m2.copy_(state["m2"].to(dev))
    opt.alive, opt.death_step, opt.death_why = (state[k].to(dev) for k in ("alive", "death_step", "death_why"))
    done = int(state["done"])
    losses[:done] = state["losses"].to(dev)
    for g, gs in zip(generators, state["generators"]):
        g.set_state(gs)
    for iv, fields in zip(interventions, state["interventions"]):
        for k, v in fields.items():
            setattr(iv, k, _unpack_states(v))
    return done, json.loads(state["extra"])


def _member_results(models: Sequence[RecurrentLM], opt: _StackAdamW, losses: torch.Tensor, length: int,
                    seconds: float) -> list[TrainResult]:
    """One TrainResult per member from the loss table ``[done steps, E]``: a diverged member
    keeps the losses of the steps before its failing one, as the one-model loop reports it."""
    died, why = opt.death_step.tolist(), opt.death_why.tolist()
    results = []
    for i, model in enumerate(models):
        model.eval()
        n = len(losses) if died[i] < 0 else died[i]
        res = TrainResult(model=model, losses=losses[:n, i].tolist(), lengths=[length] * n, seconds=seconds)
        if died[i] >= 0:
            res.diverge("loss" if why[i] == 1 else "gradient", died[i], length)
        results.append(res)
    return results


def _next_inputs(next_batches: Sequence[Callable[[], Batch]], interventions: Sequence[Intervention],
                 generators: Sequence[torch.Generator], layout: StackLayout, batch_size: int, dev: torch.device):
    """One step's inputs: each member's batch and initial states, drawn in the order of the
    one-model loop (batch, then the intervention's draws from the same generator), stacked:
    ``(tokens [E, B, L + 1], masks [E, B, L] or None, states per layer, windows per layer)``;
    a layer's states and windows are None when every member's are the zeros of
    :meth:`Intervention.initial_states` (the zero intervention)."""
    batches = [nb() for nb in next_batches]
    shapes = [tuple(bt[0].shape) for bt in batches]
    if len(set(shapes)) > 1:
        raise DynlabInputError(f"the members' batches differ in shape (tokens [B, L + 1]: {shapes}); a stack "
                               "trains every member on batches of one B and L")
    tokens = torch.stack([bt[0] for bt in batches]).to(dev)
    length = tokens.shape[2] - 1
    masks = None
    if any(bt[1] is not None for bt in batches):
        masks = torch.stack([torch.ones(tokens.shape[1], length, dtype=torch.bool) if bt[1] is None else bt[1]
                             for bt in batches]).to(dev)
    if all(type(iv).initial_states is Intervention.initial_states for iv in interventions):
        # every member starts from the base class's zeros (it draws nothing): None says so to the
        # layers, which then skip the state's read-out instead of scanning a stack of zeros
        return tokens, masks, [None] * layout.n_layers, [None] * layout.n_layers
    inits = [iv.initial_states(batch_size, list(layout.state_shapes), bt[2], g)
             for iv, bt, g in zip(interventions, batches, generators)]
    states, windows = _stack_initial_states(inits, layout, dev)
    return tokens, masks, states, windows


class _StackAdamW:
    """Per-member gradient clipping and AdamW over the ``[E, P]`` stack, with the
    divergence rule of the one-model loop kept on the device (no host sync).

    ``alive [E]``: members still training; ``death_step`` (-1: alive) and ``death_why``
    (1: non-finite loss, 2: non-finite gradient) say where and why a member stopped.
    """

    def __init__(self, stack: LMStack, weight_decay: float, grad_clip: float) -> None:
        flat = stack.flat
        e = stack.n_members
        self.flat, self.grad_clip = flat, grad_clip
        self.m1, self.m2 = torch.zeros_like(flat), torch.zeros_like(flat)
        self.decay = stack.decay_mask * weight_decay  # [P]
        self.alive = torch.ones(e, dtype=torch.bool, device=flat.device)
        self.death_step = torch.full((e,), -1, dtype=torch.long, device=flat.device)
        self.death_why = torch.zeros(e, dtype=torch.long, device=flat.device)

    @torch.no_grad()
    def step(self, loss: torch.Tensor, step: int, lr: float) -> None:
        """Clip each member's gradient to global norm ``grad_clip`` and apply AdamW at ``lr``;
        a member whose ``loss`` or gradient is non-finite is frozen before this update."""
        grad = self.flat.grad
        norm = torch.linalg.vector_norm(grad, dim=1)  # [E]: each member's global gradient norm
        loss_ok = torch.isfinite(loss)
        ok = loss_ok & torch.isfinite(norm)
        newly = self.alive & ~ok
        self.death_step = torch.where(newly, step, self.death_step)
        self.death_why = torch.where(newly, torch.where(loss_ok, 2, 1), self.death_why)
        self.alive = self.alive & ok
        coef = torch.clamp(self.grad_clip / (norm + _CLIP_EPS), max=1.0)
        # clipping and AdamW in one pass over the stack (the torch ops where no C loop applies)
        adamw_step_(self.flat, grad, self.m1, self.m2, coef, self.alive, lr, self.decay, step + 1, ADAM_BETAS, ADAM_EPS)
