"""Paper B: recurrent language models, their initial-state interventions, long-context tasks;
the twin of :mod:`dynlab.tracking`, in the same rooms:

- :mod:`~dynlab.lm.spec` — the run specs (model, data, training, evaluation, post-training);
- :mod:`~dynlab.lm.data` — the corpus, tokenizers, token files, loaders and the tasks;
- :mod:`~dynlab.lm.models` — the mixers, the language model, its carried state;
- :mod:`~dynlab.lm.train` — the training engine, the interventions, several processes,
  stacks of LMs, the memory check, post-training;
- :mod:`~dynlab.lm.evaluate` — streamed evaluation: PPL(t), Effective Remembrance;
- :mod:`~dynlab.lm.analysis` — the LM as a recurrence (Jacobians, fixed points), its
  contraction, paper A's state geometry on the task models;
- :mod:`~dynlab.lm.run` — one run on text, one run on a task;
- :mod:`~dynlab.lm.results` and :mod:`~dynlab.lm.dataset` — a run's stored result and the
  study dataset;
- :mod:`~dynlab.lm.hub` — checkpoints in, Hugging Face folders out (``transformers`` imported
  on use, so it stays optional).

The public names below are imported on first use (as in :mod:`dynlab`), so that a module
such as :mod:`dynlab.lm.models.mixers` loads without the corpus, the evaluation and the
analysis behind them (scipy.stats, xarray, pandas; tests/house/test_lazy_imports.py).  This
package never imports :mod:`dynlab.tracking`, nor the reverse (tests/house/test_layering.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dynlab._lazy import lazy_exports

if TYPE_CHECKING:  # what _EXPORTS names, for type checkers and benchmarks/import_graph.py
    from dynlab.lm.data.corpus import Corpus, decode, encode, load_corpus
    from dynlab.lm.evaluate import (
        StreamResult, next_token_probs, stream_eval, truncated_context_probs, validation_windows,
    )
    from dynlab.lm.train.interventions import (
        INTERVENTIONS, TBTT, FittedNoise, Intervention, RandomNoise, StatePassing, ZeroInit, make_intervention,
    )
    from dynlab.lm.data.loaders import Batch, RandomWindowLoader, SequentialChunkLoader
    from dynlab.lm.models.mixers import MIXERS, GLAMixer, Mamba1Mixer, Mamba2Mixer
    from dynlab.lm.models.model import VOCAB_SIZE, RecurrentLM
    from dynlab.lm.data.babi import BABI_KINDS, BabiTask
    from dynlab.lm.data.task_text import TaskBatch
    from dynlab.lm.data.tasks import CopyingTask, PasskeyTask, make_task
    from dynlab.lm.train.engine import TrainResult, fit, resolve_device, train_lm

#: Public name -> the module that defines it, imported when the name is first read.
_EXPORTS = {name: module for module, names in {
    "dynlab.lm.data.corpus": ("Corpus", "decode", "encode", "load_corpus"),
    "dynlab.lm.evaluate": ("StreamResult", "next_token_probs", "stream_eval", "truncated_context_probs",
                           "validation_windows"),
    "dynlab.lm.train.interventions": ("INTERVENTIONS", "TBTT", "FittedNoise", "Intervention", "RandomNoise", "StatePassing",
                                "ZeroInit", "make_intervention"),
    "dynlab.lm.data.loaders": ("Batch", "RandomWindowLoader", "SequentialChunkLoader"),
    "dynlab.lm.models.mixers": ("MIXERS", "GLAMixer", "Mamba1Mixer", "Mamba2Mixer"),
    "dynlab.lm.models.model": ("VOCAB_SIZE", "RecurrentLM"),
    "dynlab.lm.data.babi": ("BABI_KINDS", "BabiTask"),
    "dynlab.lm.data.task_text": ("TaskBatch",),
    "dynlab.lm.data.tasks": ("CopyingTask", "PasskeyTask", "make_task"),
    "dynlab.lm.train.engine": ("TrainResult", "fit", "resolve_device", "train_lm"),
}.items() for name in names}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
