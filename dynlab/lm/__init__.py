"""Recurrent language models for paper B: training with initial-state interventions, long-context tasks.

Post-training from checkpoints lives in :mod:`dynlab.lm.posttrain`, the Hugging Face
wrapper in :mod:`dynlab.lm.hf` (imported on use, so ``transformers`` stays optional).
"""

from __future__ import annotations

from dynlab.lm.corpus import Corpus, decode, encode, load_corpus
from dynlab.lm.evaluate import StreamResult, next_token_probs, stream_eval, truncated_context_probs, validation_windows
from dynlab.lm.interventions import (
    INTERVENTIONS, TBTT, FittedNoise, Intervention, RandomNoise, StatePassing, ZeroInit, make_intervention,
)
from dynlab.lm.loaders import Batch, RandomWindowLoader, SequentialChunkLoader
from dynlab.lm.mixers import MIXERS, GLAMixer, Mamba1Mixer, Mamba2Mixer
from dynlab.lm.model import VOCAB_SIZE, RecurrentLM
from dynlab.lm.tasks import BABI_KINDS, BabiTask, CopyingTask, PasskeyTask, TaskBatch, make_task
from dynlab.lm.train import TrainResult, fit, resolve_device, train_lm

__all__ = [
    "Corpus", "decode", "encode", "load_corpus",
    "StreamResult", "next_token_probs", "stream_eval", "truncated_context_probs", "validation_windows",
    "INTERVENTIONS", "TBTT", "FittedNoise", "Intervention", "RandomNoise", "StatePassing", "ZeroInit",
    "make_intervention",
    "Batch", "RandomWindowLoader", "SequentialChunkLoader",
    "MIXERS", "GLAMixer", "Mamba1Mixer", "Mamba2Mixer",
    "VOCAB_SIZE", "RecurrentLM",
    "BABI_KINDS", "BabiTask", "CopyingTask", "PasskeyTask", "TaskBatch", "make_task",
    "TrainResult", "fit", "resolve_device", "train_lm",
]
