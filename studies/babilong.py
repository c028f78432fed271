"""Study ``babilong`` (paper B; docs/length-generalization.md): bAbI-style questions with the facts scattered in long filler.

dynlab generates its own bAbI-style stories (kinds qa1 single, qa2 two and qa3 three
supporting facts, qa6 yes/no, qa7 counting; see :mod:`dynlab.lm.tasks`) and scatters the
facts in Shakespeare filler (or ``--source``), BABILong-style. Byte-level recurrent LMs
train on a uniform mixture of the kinds at short lengths (loss only on the answer) and are
tested from the zero state at longer ones. Dataset: ``accuracy(run, length, kind)`` =
fraction of answers predicted exactly (teacher forcing); selections: see
:mod:`dynlab.studies.long_context`. Chance levels: 1/6 for a room (qa1–qa3), 1/2 for
yes/no (qa6), and the share of the most common count for qa7.

A learned model (qa1 exact match ≥ 0.9 at the training length) is post-trained with each
intervention against a compute-matched zero-state control (paper B's protocol, see
:mod:`dynlab.studies.long_context`).

Presets:
- ``quick`` — tiny Mamba-2 (2 layers, width 64, 4 heads × 16 channels, N = 32, short
  convolution of width 4), warm-started on copying as the passkey study, 3 facts (so kinds qa1, qa2,
  qa6, qa7: qa3 needs 4), samples
  of 160–200 tokens, batch 16, one CPU thread, trained until learned (qa1, checked every
  250 steps on training-text samples) up to 3000 steps; post-training 300 steps per arm
  (zero, state passing, fitted noise); tested at 200, 400, 800 tokens on 32 samples per
  kind; seeds 0, 1, 2.
- ``paper`` — 4 layers, width 256, 8 heads × 32, N = 64, samples of 512–1024 tokens,
  20 000 steps, post-training 1000 steps; tested at 1K–16K tokens; a GPU box.
"""

from __future__ import annotations

from dynlab.studies.long_context import make_task_study

__all__ = ["PRESETS", "STUDY"]

PRESETS = {
    "quick": {
        "mixers": ("mamba2",),
        "seeds": (0, 1, 2),
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "head_dim": 16, "d_state": 32, "chunk_size": 32},
        "task": {"train_min": 160, "train_max": 200, "eval_lengths": (200, 400, 800), "n_facts": 3,
                 "babi_kinds": ("qa1", "qa2", "qa6", "qa7")},
        "train": {"steps": 3000, "until_learned": True, "check_every": 250, "batch_size": 16, "lr": 3e-3, "threads": 1},
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
        "task": {"train_min": 512, "train_max": 1024, "eval_lengths": (1024, 2048, 4096, 8192, 16384), "n_facts": 4},
        "train": {"steps": 20_000, "batch_size": 32, "lr": 1e-3},
        "eval": {"n_samples": 128, "chunk_len": 1024},
        "intervention": {},
        "post": {"steps": 1000, "lr": 3e-4},
    },
}

STUDY = make_task_study(
    "babilong", "babi",
    "bAbI-style questions (qa1, qa2, qa3, qa6, qa7) in long Shakespeare filler: LMs trained short from the zero "
    "state, post-trained with state passing / fitted noise vs a zero-state control; accuracy vs length per kind.",
    PRESETS, ("state-passing", "fitted-noise"),
)
