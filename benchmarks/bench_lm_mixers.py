"""LM mixers on the CPU as ratios to Mamba-2: one layer (forward + backward) and whole LM
training steps (:func:`dynlab.lm.train.engine.train_lm`: forward, loss, backward, clipping, AdamW).

Sizes are the length-generalization study's quick preset (``studies/length_generalization.py``):
width 64, 2 layers (each mixer's anchor block: Mamba without an MLP, GLA with one), 4 heads × 32 channels, state 64 (Mamba-1: 128 channels × N = 64; GLA: keys
64, values 32), chunk 32, batch 16, T = 32, one thread, zero initial states.

Every variant runs in this one process, interleaved: each round times every variant once, and
a row's ratio is the median over the rounds of (its time / Mamba-2's time in the same round),
with the interquartile range of those per-round ratios.  Times are the process's CPU time
(``time.process_time``), which the other jobs of a shared box disturb far less than wall
time; the median wall-time ratio is printed too.

Variants:

- ``mamba1`` is ``Mamba1Mixer``'s default: the fused selective scan on its compiled C kernel
  (the line "C kernel" says whether it was available); ``mamba1, torch loop`` the same scan
  with ``DYNLAB_C_KERNELS=0``; ``impl=ref`` the step-by-step reference under autograd.
- ``gla, trained-strength gates``: the gate rows of the projection scaled by 80, so that in
  the LM on Shakespeare the largest |Σ g| over a batch's 32 steps has median ≈ 30 (max ≈ 33),
  as in a quick-preset GLA model after its 1500 training steps (median 28, max 60; a fresh
  model: ≈ 1.4).  Strong gates can split the chunked form's chunks (kernels/gla.py).

Step rows train on the Shakespeare corpus (the study's default source); they also print
training tokens per CPU second on one core. Two step rows are baselines:

- ``mamba2, F.conv1d convolution``: the short convolution as ``F.conv1d`` (PyTorch's
  depthwise convolution) instead of dynlab's K shifted multiply-adds
  (:func:`dynlab.lm.models.mixers.causal_conv`);
- ``floor: no mixer``: the same LM with every mixer replaced by a no-op (embedding, norms,
  head, loss, backward, clipping and AdamW remain): what a step costs without any mixer,
  so ``mamba2 − floor`` is what the mixer costs.

    python benchmarks/bench_lm_mixers.py [--rounds 30] [--steps 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from dynlab.bench import write_bench_json
from dynlab.kernels import selective_scan as ss
from dynlab.lm.models import mixers as lm_mixers
from dynlab.lm.data.corpus import load_corpus
from dynlab.lm.train.interventions import ZeroInit
from dynlab.lm.models.mixers import MIXERS
from dynlab.lm.models.model import RecurrentLM
from dynlab.lm.spec import ANCHOR_MLP_RATIO, LMModelSpec
from dynlab.lm.train.engine import train_lm
from dynlab.studies.length_generalization_presets import PRESETS

QUICK = PRESETS["quick"]
BATCH, SEQ_LEN = QUICK["train"]["batch_size"], QUICK["train"]["seq_len"]
GATE_SCALE = 80.0  # trained-strength GLA gates (see the module docstring)


def mixer_kwargs(mixer: str, **extra: object) -> dict:
    """The quick preset's keyword arguments for ``MIXERS[mixer]``, plus ``extra``."""
    return {**LMModelSpec(mixer=mixer, **QUICK["model"]).mixer_kwargs(), **extra}


def strengthen_gates(module: torch.nn.Module) -> None:
    """Scale the forget-gate rows of every GLA projection in ``module`` by ``GATE_SCALE``."""
    with torch.no_grad():
        for m in module.modules():
            if type(m).__name__ == "GLAMixer":
                hk = m.n_heads * m.key_dim
                m.qkvg_proj.weight[2 * hk:3 * hk] *= GATE_SCALE


def conv1d_causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       window: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`dynlab.lm.models.mixers.causal_conv` through ``F.conv1d`` in the ``[B, C, T]`` layout (the baseline)."""
    b, t, c = x.shape
    k = weight.shape[-1]
    xt = x.transpose(1, 2)
    full = torch.cat([xt.new_zeros(b, c, k - 1) if window is None else window.to(xt.dtype), xt], dim=-1)
    return F.silu(F.conv1d(full, weight, bias, groups=c)).transpose(1, 2), full[:, :, full.shape[-1] - (k - 1):]


class _NoMixer(torch.nn.Module):
    """Stands in for ``mixer`` in the floor row: output 0, state and window passed through."""

    def __init__(self, mixer: torch.nn.Module) -> None:
        super().__init__()
        self.shapes = mixer.state_shape(), mixer.conv_shape()

    def state_shape(self) -> tuple[int, int, int]:
        return self.shapes[0]

    def conv_shape(self) -> tuple[int, int] | None:
        return self.shapes[1]

    def forward(self, x: torch.Tensor, state: torch.Tensor | None, window: torch.Tensor | None = None):
        return x * 0.0, state, window


class Variant:
    """One timed thing: ``run()`` does the work; ``c_kernel`` False sets ``DYNLAB_C_KERNELS=0``."""

    def __init__(self, kind: str, name: str, run: Callable[[], None], c_kernel: bool = True) -> None:
        self.kind, self.name, self.run, self.c_kernel = kind, name, run, c_kernel
        self.cpu: list[float] = []
        self.wall: list[float] = []

    def time_once(self) -> None:
        if self.c_kernel:
            os.environ.pop(ss.C_KERNELS_ENV, None)
        else:
            os.environ[ss.C_KERNELS_ENV] = "0"
        try:
            w0, c0 = time.perf_counter(), time.process_time()
            self.run()
            self.cpu.append(time.process_time() - c0)
            self.wall.append(time.perf_counter() - w0)
        finally:
            os.environ.pop(ss.C_KERNELS_ENV, None)


def layer_variant(name: str, mixer: str, c_kernel: bool = True, strong: bool = False, **extra: object) -> Variant:
    gen = torch.Generator().manual_seed(0)
    layer = MIXERS[mixer](QUICK["model"]["d_model"], **mixer_kwargs(mixer, **extra))
    with torch.no_grad():
        for p in layer.parameters():  # the LM's initialisation: N(0, 0.02²) matrices, then the SSM parameters
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    layer.reset_ssm_parameters(gen)
    if strong:
        strengthen_gates(layer)
    x = torch.randn(BATCH, SEQ_LEN, QUICK["model"]["d_model"], generator=gen)
    w = torch.randn(BATCH, SEQ_LEN, QUICK["model"]["d_model"], generator=gen)

    def run() -> None:
        y = layer(x)[0]
        (y * w).sum().backward()

    return Variant("layer", name, run, c_kernel)


def step_variant(name: str, mixer: str, data: torch.Tensor, steps: int, c_kernel: bool = True,
                 strong: bool = False, conv1d: bool = False, floor: bool = False) -> Variant:
    model_spec = QUICK["model"]
    model = RecurrentLM(mixer, d_model=model_spec["d_model"], n_layers=model_spec["n_layers"],
                        mlp_ratio=ANCHOR_MLP_RATIO[mixer], generator=torch.Generator().manual_seed(0),
                        **mixer_kwargs(mixer))
    if strong:
        strengthen_gates(model)
    if floor:
        for block in model.blocks:
            block.mixer = _NoMixer(block.mixer)

    def run() -> None:
        fast = lm_mixers.causal_conv
        if conv1d:
            lm_mixers.causal_conv = conv1d_causal_conv
        try:
            res = train_lm(model, data, ZeroInit(), steps=steps, batch_size=BATCH, seq_len=SEQ_LEN,
                           lr=QUICK["train"]["lr"], threads=1)
        finally:
            lm_mixers.causal_conv = fast
        assert res.status == "ok", res.reason

    return Variant("step", name, run, c_kernel)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds (default 30)")
    parser.add_argument("--steps", type=int, default=5, help="training steps per timed step-row call (default 5)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = load_corpus("shakespeare").train
    steps = args.steps
    variants = [
        layer_variant("mamba2 (chunked SSD)", "mamba2"),
        layer_variant("mamba1 (default: fused scan, C kernel)", "mamba1"),
        layer_variant("mamba1, fused scan, torch loop", "mamba1", c_kernel=False),
        layer_variant("mamba1 impl=ref", "mamba1", impl="ref"),
        layer_variant("gla (chunked, default)", "gla"),
        layer_variant("gla, trained-strength gates", "gla", strong=True),
        layer_variant("gla impl=ref", "gla", impl="ref"),
        step_variant("mamba2", "mamba2", data, steps),
        step_variant("mamba2, F.conv1d convolution", "mamba2", data, steps, conv1d=True),
        step_variant("floor: no mixer", "mamba2", data, steps, floor=True),
        step_variant("mamba1 (default)", "mamba1", data, steps),
        step_variant("mamba1, torch loop", "mamba1", data, steps, c_kernel=False),
        step_variant("gla (default)", "gla", data, steps),
        step_variant("gla, trained-strength gates", "gla", data, steps, strong=True),
    ]
    for v in variants:  # warm-up (and the C kernel's one-time build) outside the timings
        v.time_once()
        v.cpu.clear()
        v.wall.clear()
    for _ in range(args.rounds):
        for v in variants:
            v.time_once()
    print(f"C kernel: {ss.compiled_kernel_status()}")
    print(f"{args.rounds} rounds; step rows: {args.steps} training steps per call, times per step")
    print(f"{'':6s} {'variant':42s} {'CPU ms':>8s} {'× mamba2':>9s} {'IQR':>11s} {'wall ×':>7s} {'tok/s/core':>10s}")
    rows = []
    for kind in ("layer", "step"):
        group = [v for v in variants if v.kind == kind]
        ref = group[0]
        per = args.steps if kind == "step" else 1
        for v in group:
            ratios = sorted(a / b for a, b in zip(v.cpu, ref.cpu))
            wall = statistics.median(a / b for a, b in zip(v.wall, ref.wall))
            q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
            ms = statistics.median(v.cpu) / per * 1e3
            tps = BATCH * SEQ_LEN / (ms / 1e3) if kind == "step" else None
            rows.append(dict(kind=kind, variant=v.name, cpu_ms=ms, ratio=statistics.median(ratios),
                             ratio_q1=q1, ratio_q3=q3, wall_ratio=wall, tokens_per_cpu_s=tps))
            print(f"{kind:6s} {v.name:42s} {ms:8.1f} {statistics.median(ratios):9.2f} {q1:5.2f}–{q3:<5.2f} {wall:7.2f}"
                  + (f" {tps:10.0f}" if tps else ""))
    if args.json:
        write_bench_json({"c_kernel": ss.compiled_kernel_status(), "rounds": args.rounds, "steps": args.steps,
                          "rows": rows}, args.json)


if __name__ == "__main__":
    main()
