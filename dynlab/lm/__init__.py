"""Recurrent language models for paper B: training with initial-state interventions, long-context tasks.

Post-training from checkpoints lives in :mod:`dynlab.lm.posttrain`, the Hugging Face
wrapper in :mod:`dynlab.lm.hf` (imported on use, so ``transformers`` stays optional).

The public names below are imported on first use (as in :mod:`dynlab`), so that a module
such as :mod:`dynlab.lm.mixers` or :mod:`dynlab.lm.model` loads without the corpus, the
evaluation and the analysis behind them (scipy.stats, xarray, pandas;
tests/house/test_lazy_imports.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dynlab._lazy import lazy_exports

if TYPE_CHECKING:  # what _EXPORTS names, for type checkers and benchmarks/import_graph.py
    from dynlab.lm.corpus import Corpus, decode, encode, load_corpus
    from dynlab.lm.evaluate import (
        StreamResult, next_token_probs, stream_eval, truncated_context_probs, validation_windows,
    )
    from dynlab.lm.interventions import (
        INTERVENTIONS, TBTT, FittedNoise, Intervention, RandomNoise, StatePassing, ZeroInit, make_intervention,
    )
    from dynlab.lm.loaders import Batch, RandomWindowLoader, SequentialChunkLoader
    from dynlab.lm.mixers import MIXERS, GLAMixer, Mamba1Mixer, Mamba2Mixer
    from dynlab.lm.model import VOCAB_SIZE, RecurrentLM
    from dynlab.lm.tasks import BABI_KINDS, BabiTask, CopyingTask, PasskeyTask, TaskBatch, make_task
    from dynlab.lm.train import TrainResult, fit, resolve_device, train_lm

#: Public name -> the module that defines it, imported when the name is first read.
_EXPORTS = {name: module for module, names in {
    "dynlab.lm.corpus": ("Corpus", "decode", "encode", "load_corpus"),
    "dynlab.lm.evaluate": ("StreamResult", "next_token_probs", "stream_eval", "truncated_context_probs",
                           "validation_windows"),
    "dynlab.lm.interventions": ("INTERVENTIONS", "TBTT", "FittedNoise", "Intervention", "RandomNoise", "StatePassing",
                                "ZeroInit", "make_intervention"),
    "dynlab.lm.loaders": ("Batch", "RandomWindowLoader", "SequentialChunkLoader"),
    "dynlab.lm.mixers": ("MIXERS", "GLAMixer", "Mamba1Mixer", "Mamba2Mixer"),
    "dynlab.lm.model": ("VOCAB_SIZE", "RecurrentLM"),
    "dynlab.lm.tasks": ("BABI_KINDS", "BabiTask", "CopyingTask", "PasskeyTask", "TaskBatch", "make_task"),
    "dynlab.lm.train": ("TrainResult", "fit", "resolve_device", "train_lm"),
}.items() for name in names}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
