"""A small recurrent language model: embedding, blocks of norm + mixer + MLP, head.

Ids come from the run's tokenizer (:mod:`dynlab.lm.data.tokenizer`): UTF-8 bytes by default
(``vocab_size`` 256), or a subword vocabulary.

The recurrent state is a list with one ``[B, H, P, N]`` SSM state per layer (see
:mod:`dynlab.lm.models.mixers`); ``forward`` takes the initial states and returns the final
states as a :class:`~dynlab.lm.models.states.CarriedStates`, which also carries each layer's
convolution window, so a long text can be processed in chunks with the whole state
carried across (a plain list of SSM states starts with zero windows).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dynlab.errors import DynlabInputError
from dynlab.lm.models.mixers import MIXERS
from dynlab.lm.models.states import CarriedStates, conv_windows

__all__ = ["VOCAB_SIZE", "Block", "CarriedStates", "RecurrentLM", "States"]

VOCAB_SIZE = 256  # the byte tokenizer's ids: the default vocabulary
States = list[torch.Tensor]


class Block(nn.Module):
    """Pre-norm residual block: ``x + mixer(norm(x))`` then ``x + MLP(norm(x))`` (GELU MLP).

    ``mlp_ratio = 0``: no MLP, the block of mamba-ssm's and HF's Mamba LMs.
    """

    def __init__(self, mixer: nn.Module, d_model: int, mlp_ratio: int, norm_eps: float | None = 1e-5) -> None:
        super().__init__()
        self.mixer_norm = nn.RMSNorm(d_model, eps=norm_eps)
        self.mixer = mixer
        if mlp_ratio:
            self.mlp_norm = nn.RMSNorm(d_model, eps=norm_eps)
            self.mlp_in = nn.Linear(d_model, mlp_ratio * d_model, bias=False)
            self.mlp_out = nn.Linear(mlp_ratio * d_model, d_model, bias=False)
        self.has_mlp = bool(mlp_ratio)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None,
                window: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x ``[B, T, D]``, state ``[B, H, P, N]``, convolution window -> (x ``[B, T, D]``, final state, final window)."""
        y, state, window = self.mixer(self.mixer_norm(x), state, window)
        x = x + y
        if self.has_mlp:
            x = x + self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(x))))
        return x, state, window


class RecurrentLM(nn.Module):
    """An LM over a recurrent mixer.

    Args:
        mixer: ``"mamba2"``, ``"mamba1"`` or ``"gla"``.
        vocab_size: rows of the embedding and the head (256: bytes).
        d_model: width; n_layers: blocks; mlp_ratio: MLP expansion (0: no MLP).
        norm_eps: epsilon of every RMSNorm (None: the dtype's machine epsilon).
        generator: seeds every parameter explicitly (no global RNG state is used for them).
        **mixer_kwargs: passed to the mixer class (e.g. ``n_heads``, ``d_state``, ``impl``).
    """

    def __init__(self, mixer: str = "mamba2", d_model: int = 64, n_layers: int = 2, mlp_ratio: int = 2,
                 generator: torch.Generator | None = None, norm_eps: float | None = 1e-5, vocab_size: int = VOCAB_SIZE,
                 **mixer_kwargs: Any) -> None:
        super().__init__()
        if mixer not in MIXERS:
            raise DynlabInputError(f"mixer must be one of {sorted(MIXERS)}, got {mixer!r}")
        self.mixer_name, self.d_model, self.n_layers, self.vocab_size = mixer, d_model, n_layers, vocab_size
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(
            Block(MIXERS[mixer](d_model, norm_eps=norm_eps, **mixer_kwargs), d_model, mlp_ratio, norm_eps)
            for _ in range(n_layers)
        )
        self.final_norm = nn.RMSNorm(d_model, eps=norm_eps)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.reset_parameters(generator if generator is not None else torch.Generator().manual_seed(0))

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator) -> None:
        """Initialise every parameter from ``generator``.

        Linear and embedding weights ~ N(0, 0.02²), output projections of each block scaled
        by 1/√(2·n_layers) (GPT-2), biases 0, norm weights 1, then each mixer's own
        recurrence parameters (:meth:`reset_ssm_parameters`).
        """
        for name, param in self.named_parameters():
            if name.endswith("bias"):
                param.zero_()
            elif "norm" in name:
                param.fill_(1.0)
            elif "conv1d" in name:
                continue  # drawn by the mixer (reset_ssm_parameters)
            else:
                std = 0.02 / math.sqrt(2 * self.n_layers) if name.endswith(("out_proj.weight", "mlp_out.weight")) else 0.02
                param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float64) * std)
        for block in self.blocks:
            block.mixer.reset_ssm_parameters(generator)

    def state_shapes(self) -> list[tuple[int, int, int]]:
        """``(H, P, N)`` per layer."""
        return [block.mixer.state_shape() for block in self.blocks]

    def zero_states(self, batch_size: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> States:
        """One zero ``[B, H, P, N]`` state per layer."""
        return [torch.zeros(batch_size, *shape, device=device, dtype=dtype) for shape in self.state_shapes()]

    def conv_shapes(self) -> list[tuple[int, int] | None]:
        """``(C, K − 1)`` of each layer's convolution window (None: no convolution)."""
        return [block.mixer.conv_shape() for block in self.blocks]

    def forward(self, tokens: torch.Tensor, states: States | None = None) -> tuple[torch.Tensor, CarriedStates]:
        """tokens ``[B, T]`` (int64 ids), states (per layer ``[B, H, P, N]``, a
        :class:`CarriedStates` with windows, or None: zeros).

        Returns ``(logits [B, T, vocab_size], final CarriedStates)``.
        """
        x = self.embedding(tokens)  # [B, T, D]
        windows = conv_windows(states, self.n_layers)
        finals, new_windows = [], []
        for i, block in enumerate(self.blocks):
            x, state, window = block(x, None if states is None else states[i], windows[i])
            finals.append(state)
            new_windows.append(window)
        return self.head(self.final_norm(x)), CarriedStates(finals, new_windows)
