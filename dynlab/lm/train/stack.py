"""E language models of one layout as one stack: their parameters in one buffer and one
forward over all of them, what :func:`dynlab.lm.train.ensemble.fit_ensemble` trains.

- **Parameters** of all members live in one flat buffer ``[E, P]`` (P: one model's
  parameter count); each parameter is a view of it, ``[E, *shape]``. Gradients land in
  one ``[E, P]`` tensor, so the gradient clipping (per member, global norm) and AdamW
  are a dozen elementwise ops over the stack.
- **Activations** carry the member first, ``[E, B, T, ...]``; every linear layer is one
  batched GEMM over the members. The scans fold the members into their heads (Mamba-2,
  GLA: ``[B, T, E·H, ...]``), which is exact since heads never mix; Mamba-1's scan, whose
  B and C are shared across channels, runs once per member.

Each member's logits and final states are what :class:`~dynlab.lm.models.model.RecurrentLM` gives
for it alone, to the order of floating-point reductions.  The forward is written top to
bottom, one function per layer kind, and is tested against
:class:`~dynlab.lm.models.model.RecurrentLM` for every mixer.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dynlab.errors import DynlabInputError
from dynlab.kernels import dispatch
from dynlab.kernels.cross_entropy import head_nll
from dynlab.kernels.gated_norm import gated_rms_norm
from dynlab.kernels.gla.chunked import gla_ref
from dynlab.kernels.gla.recurrent import gla_recurrent
from dynlab.kernels.selective_scan.chunked import selective_scan_grouped, selective_scan_ref
from dynlab.kernels.short_conv import causal_conv_silu, last_window
from dynlab.kernels.ssd.chunked import ssd_ref
from dynlab.kernels.ssd.grouped import ssd_grouped
from dynlab.kernels.ssd.mixer_inner import mamba2_inner, mamba2_inner_applies
from dynlab.lm.models.mixers import GLAMixer, Mamba1Mixer, Mamba2Mixer
from dynlab.lm.models.model import RecurrentLM

__all__ = ["LMStack", "StackLayout"]


@dataclass(frozen=True)
class StackLayout:
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
        keep = {k: v for k, v in vars(mixer).items()  # nn.Module's train/eval flag is a mode, not a setting
                if not k.startswith("_") and k != "training" and isinstance(v, (int, float, str, bool, type(None)))}
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
        self.layout = StackLayout(first.mixer_name, first.d_model, first.n_layers, first.blocks[0].has_mlp,
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
               masks: torch.Tensor | None, need_finals: bool = True
               ) -> tuple[torch.Tensor, list[torch.Tensor | None], list[torch.Tensor | None]]:
        """tokens ``[E, B, L + 1]`` -> (each member's mean next-token loss ``[E]``, final
        states, final windows): :meth:`forward` on the inputs, scored on the targets.
        ``need_finals=False``: nobody reads the final states, and a layer may return None
        for its state where skipping it saves work (the single-chunk SSD)."""
        p = self.params()
        h, finals, new_windows = self._hidden(p, tokens[:, :, :-1], states, windows, need_finals)
        return _member_losses(h, p["head.weight"], tokens[:, :, 1:], masks), finals, new_windows

    def forward(self, tokens: torch.Tensor, states: list[torch.Tensor] | None = None,
                windows: list[torch.Tensor | None] | None = None
                ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor | None]]:
        """tokens ``[E, B, T]``; states per layer ``[E, B, H, P, N]`` (None: zeros); windows
        per layer ``[E, B, C, K − 1]`` or None (zeros).

        Returns ``(logits [E, B, T, 256], final states per layer, final windows per layer)``:
        for each member what :meth:`RecurrentLM.forward` returns for that member alone.
        """
        p = self.params()
        h, finals, new_windows = self._hidden(p, tokens, states, windows)
        return _linear(h, p["head.weight"]), finals, new_windows

    def _hidden(self, p: dict[str, torch.Tensor], tokens: torch.Tensor, states: list[torch.Tensor] | None,
                windows: list[torch.Tensor | None] | None, need_finals: bool = True
                ) -> tuple[torch.Tensor, list[torch.Tensor | None], list[torch.Tensor | None]]:
        """:meth:`forward` up to the head, on the parameter views ``p``: ``(the final norm's
        output [E, B, T, D], final states, final windows)``."""
        lay = self.layout
        e = self.n_members
        vocab = p["embedding.weight"].shape[1]  # [E, V, D]
        flat_ids = tokens + (torch.arange(e, device=tokens.device) * vocab)[:, None, None]
        x = p["embedding.weight"].reshape(e * vocab, lay.d_model)[flat_ids]  # [E, B, T, D]
        mixer = _noop if self.noop_mixer else _MIXER_FORWARD[lay.mixer]
        finals, new_windows = [], []
        for i, block in enumerate(self.blocks):
            pre = f"blocks.{i}."
            h = _rms(x, p[pre + "mixer_norm.weight"], block.mixer_norm.eps)
            y, state, window = mixer(block.mixer, p, pre + "mixer.", h, None if states is None else states[i],
                                     None if windows is None else windows[i], need_finals)
            x = x + y
            if lay.has_mlp:
                h = _rms(x, p[pre + "mlp_norm.weight"], block.mlp_norm.eps)
                x = x + _linear(F.gelu(_linear(h, p[pre + "mlp_in.weight"])), p[pre + "mlp_out.weight"])
            finals.append(state)
            new_windows.append(window)
        return _rms(x, p["final_norm.weight"], self.final_eps), finals, new_windows


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
    """:func:`dynlab.lm.models.mixers.causal_conv` per member: x ``[E, B, T, C]``, weight ``[E, C, 1, K]``,
    bias ``[E, C]``, window ``[E, B, C, K − 1]`` -> (silu(conv) ``[E, B, T, C]``, new window);
    one fused op with a hand-written backward (:mod:`kernels.short_conv`), or on CUDA
    causal-conv1d's kernel over the E·C channels (:func:`kernels.dispatch.conv_backend`)."""
    e, b, t, c = x.shape
    k = weight.shape[-1]
    if dispatch.conv_backend(x.device, x.dtype, k, e * c) == "causal_conv1d":  # CUDA: members become channels
        win = None if window is None else window.movedim(0, 1).reshape(b, e * c, k - 1)
        bias_f = None if bias is None else bias.reshape(e * c)
        y, new = dispatch.causal_conv1d_silu(x.movedim(0, 2).reshape(b, t, e * c), weight.reshape(e * c, 1, k), bias_f,
                                             win)
        return y.reshape(b, t, e, c).movedim(2, 0), new.reshape(b, e, c, k - 1).movedim(1, 0)
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


def _mamba2(m: Mamba2Mixer, p: dict[str, torch.Tensor], pre: str, x: torch.Tensor, state, window,
            need_final: bool = True):
    """:meth:`Mamba2Mixer.forward` per member: on the CPU one grouped SSD scan over the E·B
    sequences (:func:`kernels.ssd.grouped.ssd_grouped`; without ``need_final`` its final
    state may be None), elsewhere one scan over E·H heads.  Training from zero states on
    windows of one chunk with no final state read, the CPU runs everything between the two
    projections as one op (:func:`kernels.ssd.mixer_inner.mamba2_inner`), and the final
    state and window are None."""
    e, b, t, _ = x.shape
    h, hp, n = m.state_shape()
    zxbcdt = _linear(x, p[pre + "in_proj.weight"])
    if (m.impl == "dispatch" and state is None and window is None and not need_final and m.conv1d is not None
            and t <= m.chunk_size and mamba2_inner_applies(zxbcdt, p[pre + "conv1d.weight"])):
        # training from zero states on windows of one chunk: the layer between its projections as one op
        y = mamba2_inner(zxbcdt, p[pre + "conv1d.weight"][:, :, 0, :].transpose(1, 2), p[pre + "conv1d.bias"],
                         p[pre + "dt_bias"], p[pre + "A_log"], p[pre + "D"], p[pre + "norm.weight"], m.norm.eps,
                         h, hp, n)
        return _linear(y, p[pre + "out_proj.weight"]), None, None
    z, xbc, dt = torch.split(zxbcdt, [m.d_inner, m.d_inner + 2 * n, h], dim=-1)
    xbc, window = _short_conv(m, p, pre, xbc, window)
    xs, B, C = torch.split(xbc, [m.d_inner, n, n], dim=-1)
    xs = xs.reshape(e, b, t, h, hp)  # [E, B, T, H, P]
    dt = F.softplus(dt + p[pre + "dt_bias"][:, None, None, :])  # [E, B, T, H]
    A = -torch.exp(p[pre + "A_log"])  # [E, H]
    if m.impl == "dispatch" and x.device.type == "cpu":  # B, C shared by the heads: one product per sequence
        init = None if state is None else state.to(x.dtype).reshape(e * b, h, hp, n)
        y, final = ssd_grouped(xs.reshape(e * b, t, h, hp), dt.reshape(e * b, t, h),
                               A[:, None, :].expand(e, b, h).reshape(e * b, h), B.reshape(e * b, t, n),
                               C.reshape(e * b, t, n), init, chunk_size=m.chunk_size, need_final=need_final)
        y, final = y.view(e, b, t, h, hp), None if final is None else final.view(e, b, h, hp, n)
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


def _mamba1(m: Mamba1Mixer, p: dict[str, torch.Tensor], pre: str, x: torch.Tensor, state, window, need_final=True):
    """:meth:`Mamba1Mixer.forward` per member (B and C are shared by a member's channels,
    so the selective scan is one per member: on the torch backend all members' scans are one
    call, :func:`kernels.selective_scan.selective_scan_grouped`; elsewhere member by member)."""
    e, b, t, _ = x.shape
    xs, z = _linear(x, p[pre + "in_proj.weight"]).chunk(2, dim=-1)
    xs, window = _short_conv(m, p, pre, xs, window)
    dt_raw, B, C = torch.split(_linear(xs, p[pre + "x_proj.weight"]), [m.dt_rank, m.d_state, m.d_state], dim=-1)
    delta = F.softplus(_linear(dt_raw, p[pre + "dt_proj.weight"], p[pre + "dt_proj.bias"]))  # [E, B, T, D_inner]
    A = -torch.exp(p[pre + "A_log"])  # [E, D_inner, N]
    if m.impl == "dispatch" and dispatch.choose_backend("selective_scan", x.device, x.dtype,
                                                         dispatch.needs_grad(xs, delta)) == "torch":
        init = None if state is None else state.to(x.dtype).reshape(e, b, m.d_inner, m.d_state)
        y_scan, final = selective_scan_grouped(xs, delta, A, B, C, init)
        finals = final.view(e, b, *m.state_shape())
    else:
        ys, per_member = [], []
        for i in range(e):
            init = None if state is None else state[i].to(x.dtype).reshape(b, m.d_inner, m.d_state)
            if m.impl == "dispatch":
                y_i, s_i = dispatch.selective_scan(xs[i], delta[i], A[i], B[i], C[i], init, True,
                                                   chunk_size=m.chunk_size)
            else:
                y_i, s_i = selective_scan_ref(xs[i], delta[i], A[i], B[i], C[i], init, True)
            ys.append(y_i)
            per_member.append(s_i.view(b, *m.state_shape()))
        y_scan, finals = torch.stack(ys), torch.stack(per_member)
    y = (y_scan + p[pre + "D"][:, None, None, :] * xs) * F.silu(z)
    if m.norm is not None:
        y = _rms(y, p[pre + "norm.weight"], m.norm.eps)
    return _linear(y, p[pre + "out_proj.weight"]), finals, window


def _gla(m: GLAMixer, p: dict[str, torch.Tensor], pre: str, x: torch.Tensor, state, window, need_final=True):
    """:meth:`GLAMixer.forward` per member (one GLA over E·H heads: on the torch backend the C
    recurrence, :func:`kernels.gla.recurrent.gla_recurrent`, else the backend's chunked form)."""
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
    if m.impl == "dispatch" and dispatch.choose_backend("gla", x.device, x.dtype, dispatch.needs_grad(q, gk)) == "torch":
        # the C recurrence over the E·B sequences, reading q, k, v in place (no fold of members into heads)
        init = None if state is None else state.to(x.dtype).reshape(e * b, h, dk, dv)
        y, final = gla_recurrent(*(a.reshape(e * b, t, h, -1) for a in (q, k, v, gk)), None, init, True,
                                 chunk_size=m.chunk_size)
        y, final = y.reshape(e, b, t, h * dv), final.reshape(e, b, h, dk, dv)
    else:
        init = _fold_state(state, x.dtype)
        if m.impl == "dispatch":
            y, final = dispatch.gla(_fold(q), _fold(k), _fold(v), _fold(gk), None, init, True, chunk_size=m.chunk_size)
        else:
            y, final = gla_ref(_fold(q), _fold(k), _fold(v), _fold(gk), None, init, True)
        y, final = _unfold(y, e).reshape(e, b, t, h * dv), _unfold_state(final, e)
    y = gated_rms_norm(y, o, p[pre + "norm.weight"], m.norm.eps)
    return _linear(y, p[pre + "out_proj.weight"]), final, window


def _noop(m, p, pre: str, x: torch.Tensor, state, window, need_final=True):
    """A mixer that outputs zeros and passes its state through (the benchmark's no-op mixer)."""
    return torch.zeros_like(x), state, window


_MIXER_FORWARD: dict[str, Callable] = {"mamba2": _mamba2, "mamba1": _mamba1, "gla": _gla}


def _member_losses(h: torch.Tensor, head: torch.Tensor, targets: torch.Tensor, masks: torch.Tensor | None) -> torch.Tensor:
    """Mean next-token cross-entropy per member of the head ``[E, V, D]`` on the final
    norm's output ``h [E, B, L, D]``: targets ``[E, B, L]``, masks ``[E, B, L]`` or None ->
    ``[E]`` (``fit``'s ``_masked_mean`` for each member).  The head and the loss are one op
    (:func:`kernels.cross_entropy.head_nll`: the ``[E, B·L, V]`` logits are never held whole)."""
    e, b, t, d = h.shape
    nll = head_nll(h.reshape(e, b * t, d), head, targets.reshape(e, b * t))  # [E, B·L]
    if masks is None:
        return nll.mean(dim=1)
    m = masks.reshape(e, -1).to(nll.dtype)
    return (nll * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
