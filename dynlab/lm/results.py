"""The stored results of paper B's runs: what a language-model run's and a task run's
``result.json`` hold, as typed :class:`~dynlab.runner.protocol.RunResult` models (the studies read
them back with :meth:`dynlab.runner.protocol.Study.load_result`).  Torch-free."""

from __future__ import annotations

from typing import Any, ClassVar

from dynlab.runner.protocol import EVALUATED_STATUSES, RunResult

__all__ = ["LMResult", "TaskResult"]


def _lacking(record: Any, keys: tuple[str, ...], where: str = "") -> list[str]:
    """The ``keys`` that the JSON object ``record`` does not hold (None counts as absent), as ``where<key>``."""
    if not isinstance(record, dict):
        return [where.rstrip(".") or "result"]
    return [f"{where}{k}" for k in keys if record.get(k) is None]


def _run_and_arms_lacking(result: RunResult, fields: tuple[str, ...], arm_fields: tuple[str, ...]) -> list[str]:
    """The ``fields`` an evaluated run's result lacks, and the ``arm_fields`` each of its
    evaluated post-training arms (``result.post``) lacks."""
    out = _lacking(result.model_dump(), fields)
    for arm, record in (getattr(result, "post", None) or {}).items():
        if not isinstance(record, dict) or record.get("status") in EVALUATED_STATUSES:
            out += _lacking(record, arm_fields, f"post.{arm}.")
    return out


class LMResult(RunResult):
    """An LM run's ``result.json`` (:func:`dynlab.lm.run.text.train_and_evaluate`); the
    evaluation fields are absent for a diverged run.

    ``ppl`` at positions t = 1 … eval length; ``ppl_binned`` at the bin ends
    ``ppl_binned_t``; ``verdict``: the length-generalization verdict (passed, p_star,
    t_star, worst_violation, worst_t, max_t; stored as ``lg_*``); ``effrem``: effective
    remembrance per distance (tv, js, cos) at the starts ``effrem_t``; ``state_mean``,
    ``state_std``, ``state_norm`` as [layer][head][position] at the positions ``state_t``.
    ``train_loss``: mean over the last 5 % of the steps (nat/token). ``n_params``: the
    model's parameters. ``checkpoints``: per training budget of ``eval.checkpoints``, its
    ``budget``, ``step``, ``tokens`` and the same evaluation fields. ``post``: per
    post-training arm, its training summary and evaluation. ``ensemble_size``: runs
    trained together in its stack (``train.engine = "stack"``; absent for ``loop``).
    """

    ppl: list[float] | None = None
    ppl_binned_t: list[int] | None = None
    ppl_binned: list[float] | None = None
    verdict: dict[str, float | int | bool | None] | None = None
    effrem_t: list[int] | None = None
    effrem: dict[str, list[float]] | None = None
    state_t: list[int] | None = None
    state_mean: list[list[list[float]]] | None = None
    state_std: list[list[list[float]]] | None = None
    state_norm: list[list[list[float]]] | None = None
    n_params: int | None = None
    checkpoints: list[dict[str, Any]] | None = None
    post: dict[str, dict[str, Any]] | None = None
    ensemble_size: int | None = None

    #: What an evaluated model's result holds (:func:`dynlab.lm.run.text.evaluate_lm`'s keys): the
    #: run's, each evaluated post-training arm's and each checkpoint's (with its budget, step, tokens).
    EVAL_FIELDS: ClassVar[tuple[str, ...]] = ("ppl", "ppl_binned_t", "ppl_binned", "verdict", "effrem_t", "effrem",
                                              "state_t", "state_mean", "state_std", "state_norm")

    def missing_fields(self) -> list[str]:
        """The fields this result lacks that the study's dataset is made of (empty for a
        complete one; a run that was not evaluated needs none): a ``result.json`` that lacks
        any is damage of its run (:func:`dynlab.runner.loop.result_check`)."""
        if not self.evaluated:
            return []
        out = _run_and_arms_lacking(self, self.EVAL_FIELDS, self.EVAL_FIELDS)
        for i, record in enumerate(self.checkpoints or ()):
            out += _lacking(record, ("budget", "step", "tokens", *self.EVAL_FIELDS), f"checkpoints.{i}.")
        return out


class TaskResult(RunResult):
    """A task run's ``result.json`` (:func:`dynlab.lm.run.task.train_and_evaluate_task`);
    the evaluation fields are absent for a diverged run.

    ``accuracy``, ``token_accuracy``, ``exact_match``: fractions in [0, 1] per test length
    in ``lengths`` (× ``depths`` for passkey, × ``kinds`` for babi); see the module
    docstring.  ``train_loss``: mean masked cross-entropy over the last 5 % of the steps.
    ``in_range_accuracy``: the mean accuracy inside the training lengths that decides the
    status.  ``post``: per post-training arm, its ``status``, ``reason``, ``train_steps``,
    ``train_loss``, ``train_time`` and accuracies (absent without post-training).
    ``warm_start``: the warm start's training summary and its in-range accuracy on its own
    task (absent without one).  ``train_attempts``: how many freshly drawn models training
    took under ``train.attempts`` (1: the first learned), ``attempts`` one record per attempt
    (:func:`dynlab.lm.run.task.train_attempts`); both absent when ``train.attempts`` is 1.
    """

    lengths: list[int] | None = None
    depths: list[float] | None = None
    kinds: list[str] | None = None
    accuracy: list[float] | list[list[float]] | None = None
    token_accuracy: list[float] | list[list[float]] | None = None
    exact_match: list[float] | list[list[float]] | None = None
    in_range_accuracy: float | None = None
    post: dict[str, dict[str, Any]] | None = None
    warm_start: dict[str, Any] | None = None
    train_attempts: int | None = None
    attempts: list[dict[str, Any]] | None = None

    #: What an evaluated model's result holds that the study's dataset is made of
    #: (:func:`dynlab.lm.run.task.evaluate_task`'s test grid and accuracies); a post-training
    #: arm holds its accuracies (:data:`ARM_FIELDS`) on the run's grid.
    EVAL_FIELDS: ClassVar[tuple[str, ...]] = ("lengths", "accuracy", "token_accuracy", "exact_match")
    ARM_FIELDS: ClassVar[tuple[str, ...]] = ("accuracy", "token_accuracy", "exact_match")

    def missing_fields(self) -> list[str]:
        """:meth:`LMResult.missing_fields` of a task run."""
        return _run_and_arms_lacking(self, self.EVAL_FIELDS, self.ARM_FIELDS) if self.evaluated else []
