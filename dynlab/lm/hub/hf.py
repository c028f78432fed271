"""Hugging Face ``transformers`` Mamba / Mamba-2 causal LMs behind dynlab's recurrent-LM interface.

:class:`HFRecurrentLM` wraps a ``Mamba2ForCausalLM`` or ``MambaForCausalLM`` so that the
training loop (:func:`dynlab.lm.train.engine.fit`, hence every initial-state intervention), the
streamed evaluation (PPL(t), Definition 3.2, EffRem, state statistics) and the task
scorers use it exactly like a :class:`~dynlab.lm.models.model.RecurrentLM`:
``forward(tokens [B, T], states) -> (logits [B, T, V], final states)`` with one
``[B, H, P, N]`` SSM state per layer.

How the initial state gets in (measured on transformers 5.x; the tests pin each fact):

- **Mamba-2**: through the model's own cache. A ``DynamicCache`` is filled with the
  initial SSM state and the convolution state of every layer and passed as ``cache=``;
  the chunked prefill then starts from ``initial_states``. Passing the old keyword
  ``past_key_values=`` instead is silently dropped by ``Mamba2ForCausalLM.forward`` (the
  state restarts at zero) — dynlab never uses it.
- **Mamba-1**: the HF prefill (``seq_len > 1``) ignores a carried SSM state (its scan
  always starts from zero; only single-token decoding reads the cache). dynlab therefore
  runs the Mamba-1 mixer itself on the HF layer's own weights (in_proj, causal conv1d,
  x_proj, dt_proj, A_log, D, out_proj) with :func:`dynlab.kernels.selective_scan.chunked.selective_scan_ref`,
  which takes an initial state; embeddings, norms, residuals and the LM head are HF's.
  The tests check it equal to HF's own forward from the zero state and to HF's
  token-by-token decoding from a carried cache.

The convolution window (the last ``conv_kernel`` inputs of each layer's causal conv) is
also carried between chunks: ``forward`` returns a :class:`CarriedStates` list whose
``conv`` attribute holds it. States given as a plain list (initial states of an
intervention) start with a zero convolution window — the interventions act on the SSM
state only. Mamba-1's ``[B, D_inner, N]`` state is one head: ``[B, 1, D_inner, N]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dynlab.errors import DynlabInputError
from dynlab.lm.models.states import CarriedStates

__all__ = ["CarriedStates", "HFRecurrentLM", "HF_MODEL_TYPES", "is_hf_checkpoint", "load_hf_checkpoint",
           "require_transformers"]

HF_MODEL_TYPES = ("mamba2", "mamba")


def require_transformers(purpose: str = "loading a Hugging Face checkpoint"):
    """The ``transformers`` module, or a one-line :class:`DynlabInputError` saying that ``purpose`` needs it."""
    try:
        import transformers
    except ImportError as err:
        raise DynlabInputError(f"{purpose} needs the package 'transformers' (pip install transformers)") from err
    return transformers


def is_hf_checkpoint(path: str | Path) -> bool:
    """True when ``path`` is a folder with a ``config.json`` whose ``model_type`` is mamba2 or mamba."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    try:
        return json.loads(cfg.read_text()).get("model_type") in HF_MODEL_TYPES
    except (OSError, ValueError, AttributeError):  # ValueError: not JSON or not UTF-8
        return False


def load_hf_checkpoint(path: str | Path) -> HFRecurrentLM:
    """``Mamba2ForCausalLM`` / ``MambaForCausalLM`` ``.from_pretrained(path)`` (local files
    only, in float32 whatever dtype the checkpoint stores), wrapped."""
    tf = require_transformers()
    model_type = json.loads((Path(path) / "config.json").read_text()).get("model_type")
    cls = {"mamba2": tf.Mamba2ForCausalLM, "mamba": tf.MambaForCausalLM}[model_type]
    tf.utils.logging.disable_progress_bar()  # a refusal is one line, with no loading bar before it
    verbosity = tf.utils.logging.get_verbosity()
    tf.utils.logging.set_verbosity_error()  # nor a load report table (the error says what it found)
    try:
        # float32 whatever the checkpoint stores: training keeps float32 weights (a bfloat16
        # weight loses an update below 1/256 of itself), and evaluation computes in float32
        model = cls.from_pretrained(str(path), local_files_only=True, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001 — torch, safetensors and transformers each raise their own types
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if "mismatched_sizes" in str(exc):
            why = "the sizes of its weights differ from those its config.json gives"
        raise DynlabInputError(f"checkpoint {str(path)!r} is not a loadable {cls.__name__} ({why}); allowed: a "
                               "Hugging Face Mamba/Mamba2 folder (config.json + weights) that from_pretrained loads") from None
    finally:
        tf.utils.logging.set_verbosity(verbosity)
    return HFRecurrentLM(model)


class HFRecurrentLM(nn.Module):
    """A transformers Mamba-2 / Mamba causal LM with dynlab's ``forward(tokens, states)`` interface."""

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        model_type = getattr(hf_model.config, "model_type", None)
        if model_type not in HF_MODEL_TYPES:
            raise DynlabInputError(f"model_type {model_type!r} is not supported; allowed: {', '.join(HF_MODEL_TYPES)}")
        self.hf = hf_model
        self.model_type = model_type
        self.mixer_name = f"hf-{model_type}"

    @property
    def vocab_size(self) -> int:
        return int(self.hf.config.vocab_size)

    def _layers(self) -> list[nn.Module]:
        return list(self.hf.backbone.layers)

    def state_shapes(self) -> list[tuple[int, int, int]]:
        """``(H, P, N)`` per layer."""
        c = self.hf.config
        if self.model_type == "mamba2":
            return [(c.num_heads, c.head_dim, c.state_size)] * c.num_hidden_layers
        return [(1, c.intermediate_size, c.state_size)] * c.num_hidden_layers

    def zero_states(self, batch_size: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        return [torch.zeros(batch_size, *s, device=device, dtype=dtype) for s in self.state_shapes()]

    def _conv_zeros(self, batch_size: int, device: torch.device) -> list[torch.Tensor]:
        out = []
        for layer in self._layers():
            m = layer.mixer
            width = m.conv_kernel_size if self.model_type == "mamba2" else m.conv_kernel_size - 1
            channels = m.conv_dim if self.model_type == "mamba2" else m.intermediate_size
            out.append(torch.zeros(batch_size, channels, width, device=device))
        return out

    def forward(self, tokens: torch.Tensor, states: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, CarriedStates]:
        """tokens ``[B, T]``, states per layer ``[B, H, P, N]`` (None: zeros) -> (logits ``[B, T, V]``, final states)."""
        b = tokens.shape[0]
        dev = tokens.device
        ssm = list(states) if states is not None else self.zero_states(b, dev)
        conv = states.conv if isinstance(states, CarriedStates) else self._conv_zeros(b, dev)
        if self.model_type == "mamba2":
            return self._forward_mamba2(tokens, ssm, conv)
        return self._forward_mamba1(tokens, ssm, conv)

    def _forward_mamba2(self, tokens: torch.Tensor, ssm: list[torch.Tensor], conv: list[torch.Tensor]) -> tuple[torch.Tensor, CarriedStates]:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.hf.config)
        for i, layer in enumerate(self._layers()):
            cache.update_conv_state(conv[i].clone(), i, conv_kernel_size=layer.mixer.conv_kernel_size)
            cache.update_recurrent_state(ssm[i].to(torch.float32).clone(), i)
        out = self.hf(input_ids=tokens, cache=cache, use_cache=True)
        n = len(self._layers())
        finals = [cache.get_recurrent_state(i).clone() for i in range(n)]  # [B, H, P, N]
        convs = [cache.get_conv_state(i).clone() for i in range(n)]
        return out.logits, CarriedStates(finals, convs)

    def _forward_mamba1(self, tokens: torch.Tensor, ssm: list[torch.Tensor], conv: list[torch.Tensor]) -> tuple[torch.Tensor, CarriedStates]:
        from dynlab.kernels.selective_scan.chunked import selective_scan_ref

        backbone = self.hf.backbone
        hidden = backbone.embeddings(tokens)  # [B, T, D]
        finals, convs = [], []
        for i, layer in enumerate(self._layers()):
            residual = hidden.to(torch.float32) if layer.residual_in_fp32 else hidden
            x = layer.norm(hidden.to(dtype=layer.norm.weight.dtype))
            m = layer.mixer
            xs, gate = m.in_proj(x).transpose(1, 2).chunk(2, dim=1)  # [B, D_inner, T] each
            window = torch.cat([conv[i].to(xs.dtype), xs], dim=-1)  # [B, D_inner, K - 1 + T]
            xc = F.silu(F.conv1d(window, m.conv1d.weight, m.conv1d.bias, groups=m.intermediate_size))  # [B, D_inner, T]
            convs.append(window[:, :, window.shape[-1] - (m.conv_kernel_size - 1):].detach().clone())
            u = xc.transpose(1, 2)  # [B, T, D_inner]
            dt, Bm, Cm = torch.split(m.x_proj(u), [m.time_step_rank, m.ssm_state_size, m.ssm_state_size], dim=-1)
            delta = F.softplus(F.linear(dt, m.dt_proj.weight, m.dt_proj.bias))  # [B, T, D_inner]
            A = -torch.exp(m.A_log.float())  # [D_inner, N]
            init = ssm[i].reshape(tokens.shape[0], m.intermediate_size, m.ssm_state_size).float()
            y, h = selective_scan_ref(u.float(), delta.float(), A, Bm.float(), Cm.float(), init, True)
            y = (y + u * m.D.float()) * F.silu(gate.transpose(1, 2))  # [B, T, D_inner]
            hidden = residual + m.out_proj(y.to(x.dtype))
            finals.append(h.view(tokens.shape[0], 1, m.intermediate_size, m.ssm_state_size))
        hidden = backbone.norm_f(hidden)
        logits = self.hf.lm_head(hidden.to(self.hf.lm_head.weight.dtype)).float()
        return logits, CarriedStates(finals, convs)

    def extra_repr(self) -> str:
        return f"model_type={self.model_type}"


def hf_config_summary(model: HFRecurrentLM) -> dict[str, Any]:
    """JSON-able summary of the wrapped model's config (provenance of a post-training run)."""
    c = model.hf.config
    keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "state_size", "num_heads", "head_dim",
            "intermediate_size", "expand", "conv_kernel")
    return {k: getattr(c, k) for k in keys if hasattr(c, k)}
