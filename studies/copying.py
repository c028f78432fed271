"""Study ``copying`` (paper B; docs/length-generalization.md): synthetic copying ``$<s>|<s>.`` at lengths beyond training.

Byte-level recurrent LMs learn to copy strings of 26 letters with the loss on the copied
half only, trained on short strings from the zero state, then post-trained with each
intervention against a compute-matched zero-state control (paper B's protocol, see
:mod:`dynlab.studies.long_context`), and tested from the zero state on longer strings.
The contrast of paper B: state passing (SP) vs the control at 3× the longest training
length (paper: per-character accuracy 0.27 → 0.47 for a 45M Mamba-2 trained on 50–100 and
tested at 300). ``accuracy(run, length)`` is the teacher-forced per-character accuracy and
``exact_match(run, length)`` the whole-string accuracy.

Presets:
- ``smoke`` — checks an installation in seconds: one layer of width 16, one seed, 300
  training steps and 20 post-training steps per arm on small samples; every model
  counts as learned (``eval.learned_at = 0``) so that the post-training arms run too. Its
  accuracies say nothing about the task.
- ``quick`` — tiny Mamba-2 (2 layers, width 64, 4 heads × 16 channels, N = 32, short
  convolution of width 4), strings of 1–16 letters (one uniform mixture of lengths, no
  curriculum), 4000 steps of batch 32 at lr 3e-3, one CPU thread; a learned model
  (in-range accuracy ≥ 0.9 at 8 and 16 letters) is post-trained 500 steps at lr 1e-3 per
  arm (zero, state passing, fitted noise); tested at 8–64 letters (48 = 3×) on 128 strings
  per length; seeds 0, 1, 2.
- ``paper`` — 4 layers, width 256, 8 heads × 32, N = 64, strings of 50–100, 20 000 steps
  of batch 64, post-training 1000 steps; tested at 50–400 (300 = 3×); a GPU box.
"""

from __future__ import annotations

from dynlab.studies.long_context import make_task_study

__all__ = ["PRESETS", "STUDY"]

PRESETS = {
    "smoke": {
        "mixers": ("mamba2",),
        "seeds": (0,),
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 8, "d_state": 16, "chunk_size": 16},
        "task": {"train_min": 1, "train_max": 8, "eval_lengths": (4, 8, 16)},
        "train": {"steps": 300, "batch_size": 8, "lr": 3e-3, "threads": 1},
        "eval": {"n_samples": 8, "chunk_len": 64, "learned_at": 0.0},
        "intervention": {},
        "post": {"steps": 20, "lr": 1e-3},
    },
    "quick": {
        "mixers": ("mamba2",),
        "seeds": (0, 1, 2),
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "head_dim": 16, "d_state": 32, "chunk_size": 32},
        "task": {"train_min": 1, "train_max": 16, "eval_lengths": (8, 16, 24, 32, 48, 64)},
        "train": {"steps": 4000, "batch_size": 32, "lr": 3e-3, "threads": 1},
        "eval": {"n_samples": 128, "chunk_len": 256},
        "intervention": {},
        "post": {"steps": 500, "lr": 1e-3},
    },
    "paper": {
        "mixers": ("mamba2",),
        "seeds": (0, 1, 2),
        "model": {"d_model": 256, "n_layers": 4, "n_heads": 8, "head_dim": 32, "d_state": 64, "chunk_size": 64},
        "task": {"train_min": 50, "train_max": 100, "eval_lengths": (50, 100, 150, 200, 300, 400)},
        "train": {"steps": 20_000, "batch_size": 64, "lr": 1e-3},
        "eval": {"n_samples": 256, "chunk_len": 512},
        "intervention": {},
        "post": {"steps": 1000, "lr": 3e-4},
    },
}

STUDY = make_task_study(
    "copying", "copying",
    PRESETS, ("state-passing", "fitted-noise"),
)
