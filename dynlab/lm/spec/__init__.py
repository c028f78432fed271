"""Paper B's run specs (subclasses of :class:`dynlab.spec.Spec`), one path for the whole
vocabulary (``from dynlab.lm.spec import LMRunSpec``):

- :mod:`~dynlab.lm.spec.parts` — the parts both run specs are built from: the text
  (:class:`LMDataSpec`), the model (:class:`LMModelSpec`), the initial-state intervention
  (:class:`InterventionSpec`) and the presets' anchor layouts;
- :mod:`~dynlab.lm.spec.text` — one run on text (:class:`LMRunSpec`: training, evaluation,
  post-training arms, a pretrained start), the twin of :mod:`dynlab.lm.run.text`;
- :mod:`~dynlab.lm.spec.task` — one run on a long-context task (:class:`LMTaskRunSpec`), the
  twin of :mod:`dynlab.lm.run.task`.

The hash of a run spec is its run id.  Names are imported on first use, as in :mod:`dynlab.lm`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dynlab._lazy import lazy_exports

if TYPE_CHECKING:  # what _EXPORTS names, for type checkers and benchmarks/import_graph.py
    from dynlab.lm.spec.parts import (
        ANCHOR_MLP_RATIO, BUDGET_LM_LAYOUT, CHINCHILLA_TOKENS_PER_PARAM, DistanceName, InterventionName,
        InterventionSpec, LEGACY_MODEL_FIELDS, LMDataSpec, LMModelSpec, MixerName, Precision, QUICK_LM_LAYOUT,
        anchor_model_fields, check_tokenizer_fits, vocab_from_tokenizer,
    )
    from dynlab.lm.spec.text import (
        LMEvalSpec, LMInitSpec, LMPostSpec, LMRunSpec, LMTrainSpec, check_eval_size,
    )
    from dynlab.lm.spec.task import (
        BabiKind, LMTaskRunSpec, LMTaskSpec, TaskEvalSpec, TaskInterventionName, TaskKind, TaskPostSpec,
        TaskTrainSpec, WarmStartSpec, check_task_lengths,
    )

_EXPORTS = {
    "ANCHOR_MLP_RATIO": "dynlab.lm.spec.parts",
    "BUDGET_LM_LAYOUT": "dynlab.lm.spec.parts",
    "CHINCHILLA_TOKENS_PER_PARAM": "dynlab.lm.spec.parts",
    "DistanceName": "dynlab.lm.spec.parts",
    "InterventionName": "dynlab.lm.spec.parts",
    "InterventionSpec": "dynlab.lm.spec.parts",
    "LEGACY_MODEL_FIELDS": "dynlab.lm.spec.parts",
    "LMDataSpec": "dynlab.lm.spec.parts",
    "LMModelSpec": "dynlab.lm.spec.parts",
    "MixerName": "dynlab.lm.spec.parts",
    "Precision": "dynlab.lm.spec.parts",
    "QUICK_LM_LAYOUT": "dynlab.lm.spec.parts",
    "anchor_model_fields": "dynlab.lm.spec.parts",
    "check_tokenizer_fits": "dynlab.lm.spec.parts",
    "vocab_from_tokenizer": "dynlab.lm.spec.parts",
    "LMEvalSpec": "dynlab.lm.spec.text",
    "LMInitSpec": "dynlab.lm.spec.text",
    "LMPostSpec": "dynlab.lm.spec.text",
    "LMRunSpec": "dynlab.lm.spec.text",
    "LMTrainSpec": "dynlab.lm.spec.text",
    "check_eval_size": "dynlab.lm.spec.text",
    "BabiKind": "dynlab.lm.spec.task",
    "LMTaskRunSpec": "dynlab.lm.spec.task",
    "LMTaskSpec": "dynlab.lm.spec.task",
    "TaskEvalSpec": "dynlab.lm.spec.task",
    "TaskInterventionName": "dynlab.lm.spec.task",
    "TaskKind": "dynlab.lm.spec.task",
    "TaskPostSpec": "dynlab.lm.spec.task",
    "TaskTrainSpec": "dynlab.lm.spec.task",
    "WarmStartSpec": "dynlab.lm.spec.task",
    "check_task_lengths": "dynlab.lm.spec.task",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
