"""Study ``passkey`` (paper B; docs/length-generalization.md): retrieve a 5-digit key hidden at a depth of filler text.

Byte-level recurrent LMs learn passkey retrieval (loss only on the key) from the zero
state on short samples of Shakespeare filler (the plays shipped with dynlab, or ``--source``) with
the needle at a uniform random depth; a learned model is post-trained with each
intervention against a compute-matched zero-state control (paper B's protocol, see
:mod:`dynlab.studies.long_context`); every model is tested from the zero state at longer
samples and fixed depths. The contrast of paper B: fitted-noise initial states vs none
extend retrieval beyond the training length (paper B uses fitted noise rather than state
passing here: the final state right after an answer is a poor initial state for the next
sample; dynlab runs both). Dataset: ``accuracy(run, length, depth)`` = fraction of
samples whose 5 key digits are all predicted exactly (teacher forcing).

Presets:
- ``smoke`` — checks an installation in seconds: one layer of width 16, one seed, 100
  training steps and 20 post-training steps per arm on small samples; every model
  counts as learned (``eval.learned_at = 0``) so that the post-training arms run too. Its
  accuracies say nothing about the task.
- ``quick`` — tiny Mamba-2 (2 layers, width 64, 4 heads × 16 channels, N = 32, short
  convolution of width 4), warm-started: the model first learns copying (strings of 1–16
  letters, 4000 steps of batch 32, as the copying study) — the small-scale stand-in for
  the pretrained LMs of paper B; from scratch, retrieval stayed on the key-digit prior for
  4000 steps in some seeds — then trains on passkey samples of 112–160 tokens from the
  zero state (batch 16, lr 3e-3, one CPU thread) until learned (checked every 250 steps on
  training-text samples), at most 1500 steps; post-training 300 steps at lr 1e-3 per arm
  (zero, fitted noise, state passing); tested at 128–2560 tokens (16× the longest
  training sample) × depths 0, 0.25, 0.5, 0.75, 1 on 32 samples each; seeds 0, 1, 2.
- ``paper`` — 4 layers, width 256, 8 heads × 32, N = 64, samples of 256–1024 tokens,
  20 000 steps, post-training 1000 steps; tested at 256–16 384 tokens; a GPU box.
"""

from __future__ import annotations

from dynlab.studies.long_context import make_task_study

__all__ = ["PRESETS", "STUDY"]

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)

PRESETS = {
    "smoke": {
        "mixers": ("mamba2",),
        "seeds": (0,),
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 8, "d_state": 16, "chunk_size": 16},
        "task": {"train_min": 112, "train_max": 128, "eval_lengths": (128, 256), "depths": (0.0, 1.0)},
        "train": {"steps": 100, "batch_size": 8, "lr": 3e-3, "threads": 1},
        "eval": {"n_samples": 4, "chunk_len": 64, "learned_at": 0.0},
        "intervention": {},
        "post": {"steps": 20, "lr": 1e-3},
    },
    "quick": {
        "mixers": ("mamba2",),
        "seeds": (0, 1, 2),
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "head_dim": 16, "d_state": 32, "chunk_size": 32},
        "task": {"train_min": 112, "train_max": 160, "eval_lengths": (128, 256, 512, 1024, 2560), "depths": DEPTHS},
        "train": {"steps": 1500, "until_learned": True, "confirm": True, "check_every": 250, "batch_size": 16, "lr": 3e-3,
                  "threads": 1},
        "eval": {"n_samples": 32, "chunk_len": 256},
        "intervention": {},
        "post": {"steps": 300, "lr": 1e-3},
        "warm_start": {"task": {"kind": "copying", "train_min": 1, "train_max": 16, "eval_lengths": (8, 16)},
                       "train": {"steps": 4000, "batch_size": 32, "lr": 3e-3, "threads": 1}},
    },
    "paper": {
        "mixers": ("mamba2",),
        "seeds": (0, 1, 2),
        "model": {"d_model": 256, "n_layers": 4, "n_heads": 8, "head_dim": 32, "d_state": 64, "chunk_size": 64},
        "task": {"train_min": 256, "train_max": 1024, "eval_lengths": (256, 1024, 2048, 4096, 8192, 16384),
                 "depths": DEPTHS},
        "train": {"steps": 20_000, "batch_size": 32, "lr": 1e-3},
        "eval": {"n_samples": 128, "chunk_len": 1024},
        "intervention": {},
        "post": {"steps": 1000, "lr": 3e-4},
    },
}

STUDY = make_task_study(
    "passkey", "passkey",
    PRESETS, ("fitted-noise", "state-passing"),
)
