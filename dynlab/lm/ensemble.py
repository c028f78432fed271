"""Train E language models of one layout in one pass: the LM ensemble engine.

A small LM (10^4-10^5 parameters) spends most of a training step in fixed per-op
overhead, not in arithmetic: one model at a time, it reaches a few percent of the
machine's GEMM rate (``docs/performance.md``). :func:`fit_ensemble` trains E models of
one layout (seeds of one spec, or the intervention arms of one base) as one stack, so
every op of a step works on E models' data at once:

- **Parameters** of all members live in one flat buffer ``[E, P]`` (P: one model's
  parameter count); each parameter is a view of it, ``[E, *shape]``. Gradients land in
  one ``[E, P]`` tensor, so the gradient clipping (per member, global norm) and AdamW
  are a dozen elementwise ops over the stack.
- **Activations** carry the member first, ``[E, B, T, ...]``; every linear layer is one
  batched GEMM over the members. The scans fold the members into their heads (Mamba-2,
  GLA: ``[B, T, E·H, ...]``), which is exact since heads never mix; Mamba-1's scan, whose
  B and C are shared across channels, runs once per member.
- **No host sync per step**: losses are written into a ``[steps, E]`` tensor and read
  every ``sync_every`` steps; a member whose loss or gradient becomes non-finite is
  frozen on the spot (its update is masked to zero) and reported as diverged at that
  step with the same reason as the one-model loop, while the others train on.
- **Resuming**: with ``resume=path`` the training state (parameters, AdamW moments,
  divergence flags, losses, every member's generator and intervention state) is saved
  there atomically every few minutes of wall time; a later call with the same path
  continues from it, and ends bit for bit where the run never stopped would have.
- **Own streams**: each member keeps its own batch source, intervention and
  ``torch.Generator`` (the ones :func:`dynlab.lm.train.fit` would get for that model), so
  adding or removing a member never changes another's batches or noise.

Each member computes what :func:`dynlab.lm.train.fit` computes for it alone: the same
batches, initial states, loss, per-member clipping, AdamW (betas 0.9/0.95, eps 1e-8,
weight decay on matrices only), schedule and divergence rule. Only the order of
floating-point reductions differs (batched GEMMs instead of per-model ones), so in
float64 a member equals its solo run to ~1e-12 after a few steps, and in float32 to the
rounding that chaotic training then amplifies (``tests/test_lm_ensemble.py`` states the
tolerances). The forward below is written top to bottom, one function per layer kind,
and is tested against :class:`~dynlab.lm.model.RecurrentLM` for every mixer.
"""

from __future__ import annotations

import io
import json
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from dynlab.errors import DynlabInputError
from dynlab.kernels import dispatch
from dynlab.kernels.cross_entropy import token_nll
from dynlab.kernels.gated_norm import gated_rms_norm
from dynlab.kernels.gla.chunked import gla_ref
from dynlab.kernels.selective_scan.chunked import selective_scan_ref
from dynlab.kernels.short_conv import causal_conv_silu, last_window
from dynlab.kernels.ssd.chunked import ssd_ref
from dynlab.kernels.ssd.grouped import ssd_grouped
from dynlab.lm.interventions import Intervention
from dynlab.lm.mixers import GLAMixer, Mamba1Mixer, Mamba2Mixer
from dynlab.lm.model import VOCAB_SIZE, RecurrentLM
from dynlab.lm.states import CarriedStates, conv_windows
from dynlab.lm.train import ADAM_BETAS, ADAM_EPS, LR_FLOOR
from dynlab.results.files import write_bytes_atomic
from dynlab.runtime import resolve_device, train_threads
from dynlab.training import TrainResult, cosine_lr

__all__ = ["LMStack", "fit_ensemble"]

#: torch's ``clip_grad_norm_`` adds this to the norm before dividing.
_CLIP_EPS = 1e-6

Batch = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]


@dataclass(frozen=True)
class _Layout:
    """What every member shares: the mixer and its sizes (read from the first model)."""

    mixer: str
    d_model: int
    n_layers: int
    has_mlp: bool
    state_shapes: tuple[tuple[int, int, int], ...]
    conv_shapes: tuple[tuple[int, int] | None, ...]


def _signature(model: RecurrentLM) -> tuple:
    """Everything that must agree for two models to share a stack: parameter names and
    shapes, and the mixers' non-parameter settings (chunk sizes, eps, gates, impl)."""
    shapes = tuple((n, tuple(p.shape), p.dtype) for n, p in model.named_parameters())
    settings = []
    for block in model.blocks:
        mixer = block.mixer
        keep = {k: v for k, v in vars(mixer).items() if not k.startswith("_") and isinstance(v, (int, float, str, bool, type(None)))}
        norms = [m.eps for m in block.modules() if isinstance(m, torch.nn.RMSNorm)]
        settings.append((type(mixer).__name__, tuple(sorted(keep.items())), tuple(norms)))
    return shapes, tuple(settings), model.final_norm.eps


class LMStack:
    """E models of one layout as one stack of parameters (see the module docstring).

    ``flat [E, P]`` holds every member's parameters in the order of
    ``models[0].named_parameters()``; ``params[name]`` is the ``[E, *shape]`` view of one
    parameter. :meth:`forward` runs all members at once; :meth:`write_back` copies member
    ``e``'s parameters into ``models[e]``.
    """

    def __init__(self, models: Sequence[RecurrentLM], device: torch.device | str = "cpu",
                 noop_mixer: bool = False, compile: bool = False) -> None:  # noqa: A002 - torch's word
        if not models:
            raise DynlabInputError("an ensemble needs at least one model")
        sig = _signature(models[0])
        for i, m in enumerate(models[1:], 1):
            if _signature(m) != sig:
                raise DynlabInputError(f"model {i} of the ensemble differs in layout from model 0: "
                                       "an ensemble stacks models of one spec (same mixer, sizes and settings)")
        first = models[0]
        self.models = list(models)
        self.names = [n for n, _ in first.named_parameters()]
        self.shapes = [tuple(p.shape) for _, p in first.named_parameters()]
        self.sizes = [math.prod(s) for s in self.shapes]
        self.n_members = len(models)
        self.layout = _Layout(first.mixer_name, first.d_model, first.n_layers, first.blocks[0].has_mlp,
                              tuple(first.state_shapes()), tuple(first.conv_shapes()))
        self.blocks = list(first.blocks)  # settings only (eps, sizes); their parameters are not used
        self.final_eps = first.final_norm.eps
        #: benchmark only (``dynlab bench lm``): every mixer outputs zeros, so a step costs
        #: everything but the mixers (embedding, norms, MLPs, head, loss, optimiser)
        self.noop_mixer = noop_mixer
        #: the step's forward and loss (:meth:`losses`), through ``torch.compile`` with
        #: ``compile=True`` (the first steps pay for the compilation, about a minute on a small CPU)
        self.step_losses = _quiet_compiled(torch.compile(self.losses)) if compile else self.losses
        with torch.no_grad():
            rows = [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in models]
            self.flat = torch.stack(rows).to(device).requires_grad_(True)  # [E, P]
        #: 1 where the one-model loop decays the parameter (matrices: dim >= 2), per entry of a row.
        self.decay_mask = torch.cat([torch.full((n,), 1.0 if len(s) >= 2 else 0.0, dtype=self.flat.dtype)
                                     for n, s in zip(self.sizes, self.shapes)]).to(device)

    def params(self) -> dict[str, torch.Tensor]:
        """``[E, *shape]`` views of ``flat``, by parameter name (a split: its backward is one cat)."""
        e = self.n_members
        return {n: chunk.view(e, *s) for n, s, chunk in zip(self.names, self.shapes, self.flat.split(self.sizes, dim=1))}

    @torch.no_grad()
    def write_back(self) -> None:
        """Copy each member's parameters from the stack into its model."""
        for e, model in enumerate(self.models):
            for p, chunk in zip(model.parameters(), self.flat[e].split(self.sizes)):
                p.copy_(chunk.view_as(p).to(p.device))

    def losses(self, tokens: torch.Tensor, states: list[torch.Tensor], windows: list[torch.Tensor | None],
               masks: torch.Tensor | None) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor | None]]:
        """tokens ``[E, B, L + 1]`` -> (each member's mean next-token loss ``[E]``, final
        states, final windows): :meth:`forward` on the inputs, scored on the targets."""
        logits, finals, new_windows = self.forward(tokens[:, :, :-1], states, windows)
        return _member_losses(logits, tokens[:, :, 1:], masks), finals, new_windows

    def forward(self, tokens: torch.Tensor, states: list[torch.Tensor] | None = None,
                windows: list[torch.Tensor | None] | None = None
                ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor | None]]:
        """tokens ``[E, B, T]``; states per layer ``[E, B, H, P, N]`` (None: zeros); windows
        per layer ``[E, B, C, K − 1]`` or None (zeros).

        Returns ``(logits [E, B, T, 256], final states per layer, final windows per layer)``:
        for each member what :meth:`RecurrentLM.forward` returns for that member alone.
        """
        p = self.params()
        lay = self.layout
        e = self.n_members
        flat_ids = tokens + (torch.arange(e, device=tokens.device) * VOCAB_SIZE)[:, None, None]
        x = p["embedding.weight"].reshape(e * VOCAB_SIZE, lay.d_model)[flat_ids]  # [E, B, T, D]
        mixer = _noop if self.noop_mixer else _MIXER_FORWARD[lay.mixer]
        finals, new_windows = [], []
        for i, block in enumerate(self.blocks):
            pre = f"blocks.{i}."
            h = _rms(x, p[pre + "mixer_norm.weight"], block.mixer_norm.eps)
            y, state, window = mixer(block.mixer, p, pre + "mixer.", h,
                                     None if states is None else states[i], None if windows is None else windows[i])
            x = x + y
            if lay.has_mlp:
                h = _rms(x, p[pre + "mlp_norm.weight"], block.mlp_norm.eps)
                x = x + _linear(F.gelu(_linear(h, p[pre + "mlp_in.weight"])), p[pre + "mlp_out.weight"])
            finals.append(state)
            new_windows.append(window)
        logits = _linear(_rms(x, p["final_norm.weight"], self.final_eps), p["head.weight"])
        return logits, finals, new_windows


def _quiet_compiled(fn: Callable) -> Callable:
    """``fn`` (a torch.compile'd function) without the UserWarnings dynamo's tracing raises
    (that it traces through the kernel table's ``lru_cache``, which is constant while a
    stack trains, and that it reads ``.grad`` of non-leaf tensors while it inspects them)."""

    def call(*args):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return fn(*args)

    return call


# ---------------------------------------------------------------------------------------
# the stacked layers: each takes [E, ...] parameters and [E, B, T, ...] activations


def _linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [E, B, T, I] @ w[e].T`` per member (w ``[E, O, I]``, bias ``[E, O]``) -> ``[E, B, T, O]``: one batched GEMM."""
    e, b, t, i = x.shape
    y = torch.bmm(x.reshape(e, b * t, i), w.transpose(1, 2))
    if bias is not None:
        y = y + bias[:, None, :]
    return y.view(e, b, t, w.shape[1])


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float | None) -> torch.Tensor:
    """RMSNorm over the last dim with a per-member weight ``[E, D]`` (``nn.RMSNorm``'s formula)."""
    return F.rms_norm(x, (x.shape[-1],), None, eps) * weight[:, None, None, :]


def _conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
          window: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`dynlab.lm.mixers.causal_conv` per member: x ``[E, B, T, C]``, weight ``[E, C, 1, K]``,
    bias ``[E, C]``, window ``[E, B, C, K − 1]`` -> (silu(conv) ``[E, B, T, C]``, new window);
    one fused op with a hand-written backward (:mod:`kernels.short_conv`)."""
    past = None if window is None else window.to(x.dtype).transpose(2, 3)
    y = causal_conv_silu(x, weight[:, :, 0, :].transpose(1, 2), bias, past)
    return y, last_window(x, past, weight.shape[-1]).transpose(2, 3)


def _short_conv(m, p: dict[str, torch.Tensor], pre: str, x: torch.Tensor,
                window: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A Mamba mixer's ``_ShortConv._conv`` per member: :func:`_conv` with its weights, or SiLU alone without a convolution."""
    if m.conv1d is None:
        return F.silu(x), None
    return _conv(x, p[pre + "conv1d.weight"], p[pre + "conv1d.bias"], window)


def _fold(x: torch.Tensor) -> torch.Tensor:
    """``[E, B, T, H, ...]`` -> ``[B, T, E·H, ...]``: members become heads of one scan."""
    e, b, t, h = x.shape[:4]
    return x.movedim(0, 2).reshape(b, t, e * h, *x.shape[4:])


def _unfold(y: torch.Tensor, e: int) -> torch.Tensor:
    """Inverse of :func:`_fold`: ``[B, T, E·H, ...]`` -> ``[E, B, T, H, ...]``."""
    b, t, eh = y.shape[:3]
    return y.reshape(b, t, e, eh // e, *y.shape[3:]).movedim(2, 0)


def _fold_state(s: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``[E, B, H, P, N]`` -> ``[B, E·H, P, N]`` (None stays None)."""
    if s is None:
        return None
    e, b, h = s.shape[:3]
    return s.to(dtype).movedim(0, 1).reshape(b, e * h, *s.shape[3:])


def _unfold_state(s: torch.Tensor, e: int) -> torch.Tensor:
    b, eh = s.shape[:2]
    return s.reshape(b, e, eh // e, *s.shape[2:]).movedim(1, 0)


def _mamba2(m: Mamba2Mixer, p: dict[str, torch.Tensor], pre: str, x: torch.Tensor, state, window):
    """:meth:`Mamba2Mixer.forward` per member: on the CPU one grouped SSD scan over the E·B
    sequences (:func:`kernels.ssd.grouped.ssd_grouped`), elsewhere one scan over E·H heads."""
    e, b, t, _ = x.shape
    h, hp, n = m.state_shape()
    z, xbc, dt = torch.split(_linear(x, p[pre + "in_proj.weight"]), [m.d_inner, m.d_inner + 2 * n, h], dim=-1)
    xbc, window = _short_conv(m, p, pre, xbc, window)
    xs, B, C = torch.split(xbc, [m.d_inner, n, n], dim=-1)
    xs = xs.reshape(e, b, t, h, hp)  # [E, B, T, H, P]
    dt = F.softplus(dt + p[pre + "dt_bias"][:, None, None, :])  # [E, B, T, H]
    A = -torch.exp(p[pre + "A_log"])  # [E, H]
    if m.impl == "dispatch" and x.device.type == "cpu":  # B, C shared by the heads: one product per sequence
        init = None if state is None else state.to(x.dtype).reshape(e * b, h, hp, n)
        y, final = ssd_grouped(xs.reshape(e * b, t, h, hp), dt.reshape(e * b, t, h),
                               A[:, None, :].expand(e, b, h).reshape(e * b, h), B.reshape(e * b, t, n),
                               C.reshape(e * b, t, n), init, chunk_size=m.chunk_size)
        y, final = y.view(e, b, t, h, hp), final.view(e, b, h, hp, n)
    else:  # members become heads of one scan (the CUDA kernels, or the reference)
        B = B[:, :, :, None, :].expand(e, b, t, h, n)
        C = C[:, :, :, None, :].expand(e, b, t, h, n)
        init = _fold_state(state, x.dtype)
        scan = (lambda *a: dispatch.ssd(*a, True, chunk_size=m.chunk_size)) if m.impl == "dispatch" else (
            lambda *a: ssd_ref(*a, True))
        y, final = scan(_fold(xs), _fold(dt), A.reshape(e * h), _fold(B), _fold(C), init)
        y, final = _unfold(y, e), _unfold_state(final, e)
    y = gated_rms_norm(y.reshape(e, b, t, m.d_inner), z, p[pre + "norm.weight"], m.norm.eps,  # norm(y + D·x, z)
                       xs.reshape(e, b, t, m.d_inner), p[pre + "D"].repeat_interleave(hp, dim=1))
    return _linear(y, p[pre + "out_proj.weight"]), final, window


def _mamba1(m: Mamba1Mixer, p: dict[str, torch.Tensor], pre: str, x: torch.Tensor, state, window):
    """:meth:`Mamba1Mixer.forward` per member (B and C are shared by a member's channels,
    so the selective scan runs once per member)."""
    e, b, t, _ = x.shape
    xs, z = _linear(x, p[pre + "in_proj.weight"]).chunk(2, dim=-1)
    xs, window = _short_conv(m, p, pre, xs, window)
    dt_raw, B, C = torch.split(_linear(xs, p[pre + "x_proj.weight"]), [m.dt_rank, m.d_state, m.d_state], dim=-1)
    delta = F.softplus(_linear(dt_raw, p[pre + "dt_proj.weight"], p[pre + "dt_proj.bias"]))  # [E, B, T, D_inner]
    A = -torch.exp(p[pre + "A_log"])  # [E, D_inner, N]
    ys, finals = [], []
    for i in range(e):
        init = None if state is None else state[i].to(x.dtype).reshape(b, m.d_inner, m.d_state)
        if m.impl == "dispatch":
            y_i, s_i = dispatch.selective_scan(xs[i], delta[i], A[i], B[i], C[i], init, True, chunk_size=m.chunk_size)
        else:
            y_i, s_i = selective_scan_ref(xs[i], delta[i], A[i], B[i], C[i], init, True)
        ys.append(y_i)
        finals.append(s_i.view(b, *m.state_shape()))
    y = (torch.stack(ys) + p[pre + "D"][:, None, None, :] * xs) * F.silu(z)
    if m.norm is not None:
        y = _rms(y, p[pre + "norm.weight"], m.norm.eps)
    return _linear(y, p[pre + "out_proj.weight"]), torch.stack(finals), window


def _gla(m: GLAMixer, p: dict[str, torch.Tensor], pre: str, x: torch.Tensor, state, window):
    """:meth:`GLAMixer.forward` per member (one chunked GLA over E·H heads)."""
    e, b, t, _ = x.shape
    h, dk, dv = m.state_shape()
    q, k, g, v, o = torch.split(_linear(x, p[pre + "qkvg_proj.weight"]), [h * dk, h * dk, h * dk, h * dv, h * dv], dim=-1)
    if m.conv1d is not None:
        qkv, window = _conv(torch.cat([q, k, v], dim=-1), p[pre + "conv1d.weight"], None, window)
        q, k, v = torch.split(qkv, [h * dk, h * dk, h * dv], dim=-1)
    else:
        window = None
    q, k, g = (a.reshape(e, b, t, h, dk) for a in (q, k, g))
    v = v.reshape(e, b, t, h, dv)
    gk = F.logsigmoid(g) / m.gate_normalizer
    init = _fold_state(state, x.dtype)
    if m.impl == "dispatch":
        y, final = dispatch.gla(_fold(q), _fold(k), _fold(v), _fold(gk), None, init, True, chunk_size=m.chunk_size)
    else:
        y, final = gla_ref(_fold(q), _fold(k), _fold(v), _fold(gk), None, init, True)
    y = _unfold(y, e).reshape(e, b, t, h * dv)
    y = gated_rms_norm(y, o, p[pre + "norm.weight"], m.norm.eps)
    return _linear(y, p[pre + "out_proj.weight"]), _unfold_state(final, e), window


def _noop(m, p, pre: str, x: torch.Tensor, state, window):
    """A mixer that outputs zeros and passes its state through (the benchmark's no-op mixer)."""
    return torch.zeros_like(x), state, window


_MIXER_FORWARD: dict[str, Callable] = {"mamba2": _mamba2, "mamba1": _mamba1, "gla": _gla}


# ---------------------------------------------------------------------------------------
# the loop


def _stack_initial_states(inits: list[list[torch.Tensor]], layout: _Layout, device: torch.device
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
    """Train ``models`` (one layout) together, each as :func:`dynlab.lm.train.fit` alone:
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
    length = done = 0
    if resume is not None and resume.exists():
        done, extra = _load_state(resume, stack, opt, losses, interventions, generators)
        if on_resume is not None:
            on_resume(done, extra)
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
                            save_extra() if save_extra is not None else {})
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
    loss, finals, new_windows = stack.step_losses(tokens, states, windows, masks)  # loss [E]
    stack.flat.grad = None
    loss.sum().backward()
    opt.step(loss.detach(), step, lr)
    losses[step] = loss.detach()
    for i, iv in enumerate(interventions):
        iv.observe(_member_states(finals, new_windows, i))
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


def _save_state(path: Path, done: int, stack: LMStack, opt: _StackAdamW, losses: torch.Tensor,
                interventions: Sequence[Intervention], generators: Sequence[torch.Generator], extra: dict) -> None:
    """Write the training state after ``done`` steps to ``path`` atomically (:func:`fit_ensemble`'s ``resume``)."""
    state = {
        "done": done, "flat": stack.flat.detach().cpu(), "m1": opt.m1.cpu(), "m2": opt.m2.cpu(),
        "alive": opt.alive.cpu(), "death_step": opt.death_step.cpu(), "death_why": opt.death_why.cpu(),
        "losses": losses[:done].cpu(), "generators": [g.get_state() for g in generators],
        "interventions": [{k: _pack_states(getattr(iv, k)) for k in _INTERVENTION_FIELDS if hasattr(iv, k)}
                          for iv in interventions],
        "extra": json.dumps(extra),
    }
    buf = io.BytesIO()
    torch.save(state, buf)
    write_bytes_atomic(path, buf.getbuffer())


def _load_state(path: Path, stack: LMStack, opt: _StackAdamW, losses: torch.Tensor,
                interventions: Sequence[Intervention], generators: Sequence[torch.Generator]) -> tuple[int, dict]:
    """Restore a state :func:`_save_state` wrote; returns ``(steps done, extra)``. A file that
    does not load or does not fit this stack is a one-line DynlabInputError naming it."""
    try:
        state = torch.load(path, weights_only=True)
        if tuple(state["flat"].shape) != tuple(stack.flat.shape) or len(state["generators"]) != len(generators):
            raise ValueError(f"it holds {tuple(state['flat'].shape)} parameters, this stack {tuple(stack.flat.shape)}")
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one clear error
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
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
                 generators: Sequence[torch.Generator], layout: _Layout, batch_size: int, dev: torch.device):
    """One step's inputs: each member's batch and initial states, drawn in the order of the
    one-model loop (batch, then the intervention's draws from the same generator), stacked:
    ``(tokens [E, B, L + 1], masks [E, B, L] or None, states per layer, windows per layer)``."""
    batches = [nb() for nb in next_batches]
    tokens = torch.stack([bt[0] for bt in batches]).to(dev)
    length = tokens.shape[2] - 1
    masks = None
    if any(bt[1] is not None for bt in batches):
        masks = torch.stack([torch.ones(tokens.shape[1], length, dtype=torch.bool) if bt[1] is None else bt[1]
                             for bt in batches]).to(dev)
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
        coef = torch.clamp(self.grad_clip / (norm + _CLIP_EPS), max=1.0)[:, None]
        g = torch.where(self.alive[:, None], grad * coef, 0.0)
        _adamw_step(self.flat, g, self.m1, self.m2, self.alive[:, None].to(self.flat.dtype), lr, self.decay, step + 1,
                    *ADAM_BETAS)


def _member_losses(logits: torch.Tensor, targets: torch.Tensor, masks: torch.Tensor | None) -> torch.Tensor:
    """Mean next-token cross-entropy per member: logits ``[E, B, L, V]``, targets ``[E, B, L]``,
    masks ``[E, B, L]`` or None -> ``[E]`` (``fit``'s ``_masked_mean`` for each member)."""
    e = logits.shape[0]
    nll = token_nll(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).view(e, -1)  # F.cross_entropy, fused
    if masks is None:
        return nll.mean(dim=1)
    m = masks.reshape(e, -1).to(nll.dtype)
    return (nll * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)


@torch.no_grad()
def _adamw_step(p: torch.Tensor, g: torch.Tensor, m1: torch.Tensor, m2: torch.Tensor, alive: torch.Tensor,
                lr: float, decay: torch.Tensor, step: int, b1: float, b2: float) -> None:
    """torch's AdamW update (decoupled weight decay, bias-corrected moments) on the whole
    ``[E, P]`` stack; members with ``alive = 0`` keep their parameters exactly."""
    m1.lerp_(g, 1 - b1)
    m2.mul_(b2).addcmul_(g, g, value=1 - b2)
    bc1 = 1 - b1 ** step
    bc2_sqrt = math.sqrt(1 - b2 ** step)
    denom = (m2.sqrt() / bc2_sqrt).add_(ADAM_EPS)
    p.mul_(1 - lr * decay * alive)  # decay [P] x alive [E, 1]: dead members are multiplied by 1
    p.addcdiv_(m1 * alive, denom, value=-lr / bc1)
