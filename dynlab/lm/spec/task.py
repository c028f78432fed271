"""The spec of one LM run on a long-context task (:class:`LMTaskRunSpec`): the task and its
lengths, training until learned, testing, post-training arms and a warm start.

The hash of an :class:`LMTaskRunSpec` is the run id.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator, model_validator

from dynlab.spec import MAX_STEPS, Batch, Length, Lengths, Samples, Seed, Spec, StepsOrZero
from dynlab.runtime import MAX_THREADS
from dynlab.lm.train.memory import check_eval_memory, check_train_memory
from dynlab.lm.data.tokenizer import TokenizerSpec
from dynlab.names import BABI_KINDS, TASK_INTERVENTION_NAMES, TBTT, TBTT_ON_TASKS
from dynlab.lm.spec.parts import (InterventionSpec, LMDataSpec, LMModelSpec, Precision, check_tokenizer_fits,
                                  vocab_from_tokenizer)

__all__ = [
    "BabiKind", "LMTaskRunSpec", "LMTaskSpec", "TaskEvalSpec", "TaskInterventionName", "TaskKind", "TaskPostSpec",
    "TaskTrainSpec", "WarmStartSpec", "check_task_lengths",
]


TaskKind = Literal["copying", "passkey", "babi"]
BabiKind = Literal[BABI_KINDS]


class LMTaskSpec(Spec):
    """A long-context task (see :mod:`dynlab.lm.data.tasks`) with its training and test lengths.

    Lengths are string lengths for ``copying`` and whole-sample token counts otherwise.
    Training draws one length uniformly in ``[train_min, train_max]`` per batch (and, for
    passkey, a uniform depth per sample); testing uses every ``eval_lengths`` (× every
    ``depths`` for passkey). ``babi_kinds``, ``n_facts``, ``babi_tokens`` and
    ``babi_questions`` apply to ``babi`` only (:class:`dynlab.lm.data.babi.BabiTask`):
    ``babi_tokens="words"`` makes each bAbI word one token (the filler stays bytes; lengths
    count tokens), ``babi_questions="all"`` makes each training sample ask every question
    its story answers (test samples ask one). Both are left out of the run id at their
    defaults (``"bytes"``, ``"one"``), so runs from before they existed keep their ids.
    """

    hash_omit_at_default: ClassVar[tuple[str, ...]] = ("babi_tokens", "babi_questions")

    kind: TaskKind = "copying"
    train_min: Length = 50
    train_max: Length = 100
    eval_lengths: Lengths = (50, 100, 150, 200, 300)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    babi_kinds: tuple[BabiKind, ...] = BABI_KINDS
    n_facts: int = Field(4, ge=1, le=64)
    babi_tokens: Literal["bytes", "words"] = "bytes"
    babi_questions: Literal["one", "all"] = "one"

    @field_validator("depths")
    @classmethod
    def _depths_in_unit_interval(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        for d in v:
            if not 0.0 <= d <= 1.0:
                raise ValueError(f"depth {d} is outside [0, 1]; allowed: fractions between 0 and 1")
        if not v:
            raise ValueError("depths must hold at least one value in [0, 1]")
        return v

    @model_validator(mode="after")
    def _lengths_fit(self) -> LMTaskSpec:
        if self.train_min > self.train_max:
            raise ValueError(f"train_min={self.train_min} exceeds train_max={self.train_max}")
        if not self.eval_lengths:
            raise ValueError("eval_lengths must hold at least one length")
        if self.kind == "copying":  # string lengths: bounded alike under every tokenizer
            check_task_lengths(self)
        else:  # the format (bAbI's kinds and facts) now; the room in tokens with the run's tokenizer
            from dynlab.lm.data.tasks import make_task

            make_task(self.kind, torch.zeros(1, dtype=torch.uint8), tuple(self.babi_kinds), self.n_facts,
                      self.babi_tokens, self.babi_questions)
        return self


def check_task_lengths(task: LMTaskSpec, tokenizer: TokenizerSpec | None = None, prefix: str = "") -> None:
    """Refuse a length of ``task`` its samples do not fit, in the tokens of ``tokenizer``
    (None or bytes: the byte formats): a task bounds its lengths below (room for the needle,
    facts and question) or above (sample size); said as the field's (``train_min: …``,
    ``eval_lengths: …``), so that a command names its option (``--lengths``)."""
    from dynlab.lm.data.tasks import make_task
    from dynlab.lm.data.tokenizer import make_tokenizer

    subword = tokenizer is not None and tokenizer.kind != "byte"
    generator = make_task(task.kind, torch.zeros(1, dtype=torch.uint8), tuple(task.babi_kinds), task.n_facts,
                          task.babi_tokens, task.babi_questions, make_tokenizer(tokenizer) if subword else None)
    how = "" if prefix else "; set the lengths with --lengths or --config [task] train_min, train_max"
    where = f" (in tokens of {tokenizer.label}{how})" if subword and tokenizer is not None else ""
    for name, lengths in (("train_min", (task.train_min,)), ("train_max", (task.train_max,)),
                          ("eval_lengths", task.eval_lengths)):
        for length in lengths:
            try:
                generator.check_length(length)
            except ValueError as exc:
                raise ValueError(f"{prefix}{name}: {exc}{where}") from None


class TaskTrainSpec(Spec):
    """AdamW with warm-up and cosine decay on task batches (loss on the scored targets only).

    ``until_learned``: training stops early once the model has learned — checked every
    ``check_every`` steps on ``check_samples`` fresh samples per in-range test cell drawn
    from the *training* text with their own generator (never the test samples), with the
    rule of :func:`dynlab.lm.run.task.in_range_accuracy` and ``eval.learned_at`` — and
    ``steps`` is the cap (the schedule is that of ``steps``).

    ``attempts`` (with ``until_learned``): a model that has not learned when its ``steps``
    run out (the same check, once more at the cap) is drawn afresh — new parameters from
    ``seed + k · ATTEMPT_SEED_OFFSET`` for attempt k = 1, 2, …, a fresh optimiser and
    schedule, the next batches of the run's stream — and trained again, up to ``attempts``
    models in all. Attempt 0 is the run without the rule (the same parameters and
    batches), so a model that learns at once is the same model with any ``attempts``. The
    run records ``train_attempts`` and each attempt's steps; its ``train_steps`` and
    ``train_time`` count every attempt. The run keeps the last model drawn, learned or not
    (an earlier one is not kept even if it came closer). A stated rule for tasks whose
    learning depends on the initialisation at small scale (:mod:`studies.babilong`); 1 (the
    default): one model. A warm start's training takes one model only.

    ``check_at``: the in-range accuracy the check needs to stop training (None: the
    ``eval.learned_at`` that decides the status). Set above ``learned_at`` so that a model
    stopped on a lucky check does not then test just below it.

    ``confirm`` (with ``until_learned``): a check that passes on its ``check_samples`` is
    confirmed on as many fresh training-text samples per in-range cell as the test draws
    (``eval.n_samples``, a generator of its own), and training stops only when both pass;
    and an attempt whose model stopped or ran to its cap as learned is tested in range
    (the test samples, the rule of the run's status) before it is kept: below
    ``learned_at`` it counts as a failed attempt, and the next one is drawn while
    ``attempts`` remain. So a run never ends ``not-learned`` while it had attempts left
    after a lucky check. Left out of the run id while False (the rule before it existed).
    """

    hash_omit_at_default: ClassVar[tuple[str, ...]] = ("attempts", "check_at", "confirm", "precision")

    steps: StepsOrZero = 600
    until_learned: bool = False
    attempts: int = Field(1, ge=1, le=16)
    check_every: int = Field(250, ge=1, le=MAX_STEPS)
    check_samples: Samples = 16
    check_at: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    confirm: bool = False
    precision: Precision = "fp32"
    batch_size: Batch = 16
    lr: float = Field(3e-3, gt=0.0, allow_inf_nan=False)
    weight_decay: float = Field(0.1, ge=0.0, allow_inf_nan=False)
    clip: float = Field(1.0, gt=0.0, allow_inf_nan=False)
    warmup_frac: float = Field(0.05, ge=0.0, le=1.0, allow_inf_nan=False)
    threads: int | None = Field(None, ge=1, le=MAX_THREADS, description="torch CPU threads while training and evaluating (None: RUN_THREADS = 1)")


class TaskEvalSpec(Spec):
    """Test: ``n_samples`` fresh samples per (length[, depth][, kind]) from the zero state, streamed in ``chunk_len`` pieces.

    ``learned_at``: the run is ``ok`` (learned) when its *in-range accuracy* — the mean
    headline accuracy over the test cells with length ≤ ``task.train_max`` (for babi, of
    the kinds in ``learn_kinds`` that are trained) — is at least this; otherwise it is
    ``not-learned`` and is kept out of every contrast.
    """

    n_samples: Samples = 64
    chunk_len: Length = 256
    learned_at: float = Field(0.9, ge=0.0, le=1.0, allow_inf_nan=False)
    learn_kinds: tuple[BabiKind, ...] = ("qa1",)


TaskInterventionName = Literal[TASK_INTERVENTION_NAMES]


class TaskPostSpec(Spec):
    """Paper B's protocol: post-training of the model trained on the task from the zero state.

    From the trained weights, every intervention in ``interventions`` trains ``steps``
    more steps (AdamW from a fresh optimiser, ``lr``, warm-up ``warmup_frac`` then cosine
    decay, the batch size and lengths of training). ``zero`` is the compute-matched
    control: the same steps with zero initial states. All arms see the same batches, drawn
    from a generator seeded with ``seed + POST_SEED_OFFSET``.
    """

    interventions: tuple[TaskInterventionName, ...] = ("zero", "fitted-noise", "state-passing")
    steps: int = Field(500, ge=1, le=10_000_000)
    lr: float = Field(1e-3, gt=0.0, le=10.0, allow_inf_nan=False)
    warmup_frac: float = Field(0.1, ge=0.0, le=1.0, allow_inf_nan=False)

    @field_validator("interventions")
    @classmethod
    def _with_control(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        v = tuple(dict.fromkeys(v))
        if "zero" not in v:
            raise ValueError("post-training interventions must include 'zero', the compute-matched control; "
                             f"got {list(v)}")
        return ("zero", *(x for x in v if x != "zero"))


class WarmStartSpec(Spec):
    """A stated warm start: before training on its task, the run's model (same model
    spec, seed and text) is trained on ``task`` with ``train`` from the zero state — the
    small-scale stand-in for the *pretrained* LMs that paper B post-trains. Nothing is
    loaded from elsewhere: the warm start is recomputed inside the run."""

    task: LMTaskSpec
    train: TaskTrainSpec


class LMTaskRunSpec(Spec):
    """Everything that determines one LM trained and tested on a long-context task.

    ``data`` is the filler text (passkey, babi; its training part for training samples,
    its validation part for test samples). Test samples come from a generator seeded with
    ``seed + 1_000_003``, training samples and noise from one seeded with ``seed``.
    """

    data: LMDataSpec = LMDataSpec()
    model: LMModelSpec = LMModelSpec()
    intervention: InterventionSpec = InterventionSpec()
    task: LMTaskSpec = LMTaskSpec()
    train: TaskTrainSpec = TaskTrainSpec()
    eval: TaskEvalSpec = TaskEvalSpec()
    post: TaskPostSpec | None = None
    warm_start: WarmStartSpec | None = None
    seed: Seed = 0

    @model_validator(mode="after")
    def _attempts_rule(self) -> LMTaskRunSpec:
        if self.train.attempts > 1 and not self.train.until_learned:
            raise ValueError(f"train.attempts {self.train.attempts} needs train.until_learned (an attempt ends "
                             "unlearned only under that check); allowed: attempts = 1, or until_learned = true")
        if self.train.confirm and not self.train.until_learned:
            raise ValueError("train.confirm needs train.until_learned (it confirms the stopping check); "
                             "allowed: confirm = false, or until_learned = true")
        if self.train.check_at is not None and not self.train.until_learned:
            raise ValueError(f"train.check_at {self.train.check_at} needs train.until_learned (it is the stopping "
                             "check's threshold); allowed: check_at unset, or until_learned = true")
        if self.warm_start is not None and self.warm_start.train.attempts > 1:
            raise ValueError(f"warm_start.train.attempts {self.warm_start.train.attempts} is not supported (a warm "
                             "start trains one model); allowed: 1")
        if self.train.attempts > 1 and self.warm_start is not None:
            raise ValueError(f"train.attempts {self.train.attempts} with a warm start is not supported (a new "
                             "attempt would discard the warm-started weights); allowed: attempts = 1 with warm_start")
        return self

    @model_validator(mode="after")
    def _in_range_cells(self) -> LMTaskRunSpec:
        if not any(length <= self.task.train_max for length in self.task.eval_lengths):
            raise ValueError(f"eval_lengths {list(self.task.eval_lengths)} hold no length <= train_max={self.task.train_max}; "
                             "allowed: at least one test length inside the training range (it decides whether the run learned)")
        return self

    @model_validator(mode="before")
    @classmethod
    def _vocab_of_tokenizer(cls, data: Any, info: ValidationInfo) -> Any:
        """A model whose ``vocab_size`` is not given reads every id of the data's tokenizer."""
        return vocab_from_tokenizer(data, bool(info.context and info.context.get("stored")))

    @model_validator(mode="after")
    def _task_through_tokenizer(self, info: ValidationInfo) -> LMTaskRunSpec:
        """The tokenizer fits the model, the task's lengths (and a warm start's) hold its
        samples in that tokenizer's tokens (:func:`check_task_lengths`), and its training and
        test fit in memory (:meth:`_check_memory`; not for a run's stored spec, checked when it
        was made: its tokenizer file may have moved since; the memory not for a checkpoint's
        model either, validation context ``checkpoint_model``: ``model`` does not describe it)."""
        check_tokenizer_fits(self.data, self.model)
        if info.context and info.context.get("stored"):
            return self
        check_task_lengths(self.task, self.data.tokenizer)
        if self.warm_start is not None:
            check_task_lengths(self.warm_start.task, self.data.tokenizer, "warm_start.task.")
        if not (info.context and info.context.get("checkpoint_model")):  # a checkpoint's model: not model's layout
            self._check_memory()
        return self

    def _check_memory(self) -> None:
        """A training step (of the task, and of a warm start's) and the test fit in memory
        (:mod:`dynlab.lm.train.memory`): the longest training sample in tokens (copying: the
        string twice and three marks), the test's samples in pieces of ``eval.chunk_len``."""
        for prefix, task, train in (("", self.task, self.train),
                                    *((("warm_start.", self.warm_start.task, self.warm_start.train),)
                                      if self.warm_start is not None else ())):
            tokens = 2 * task.train_max + 3 if task.kind == "copying" else task.train_max
            check_train_memory(self.model, train.batch_size, tokens, batch_name=f"{prefix}train.batch_size",
                               length_name=f"(the longest sample of {prefix}task.train_max {task.train_max})")
        longest = max(2 * n + 3 if self.task.kind == "copying" else n for n in self.task.eval_lengths)
        check_eval_memory(self.model, max(self.eval.n_samples, self.train.check_samples),
                          min(self.eval.chunk_len, longest), samples_name="eval.n_samples (or train.check_samples)")

    @field_validator("intervention")
    @classmethod
    def _no_tbtt(cls, v: InterventionSpec) -> InterventionSpec:
        if v.kind == TBTT:
            raise ValueError(TBTT_ON_TASKS)
        return v

    @property
    def run_id(self) -> str:
        return self.spec_hash()
