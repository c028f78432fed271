"""The Study protocol: what a study module in ``studies/`` provides to the runner.

A study is a plain list of run specs plus a few functions:

- ``make_specs(options) -> list[Spec]`` — validated specs for a preset and the user's
  selections; must raise :class:`~dynlab.errors.DynlabInputError` (one line, naming allowed values) on bad input
  *before* anything is written.  ``options.extra`` is read through the study's
  ``options_type`` (:meth:`Study.parse_options`): an unknown key is an error.
- ``run_one(spec, device, progress) -> RunOutcome`` — train and evaluate one spec.
- ``stacking`` (optional, a :class:`Stacking`) — how several specs train together as one
  stack (an ensemble): ``key(spec)`` says which specs may share a work item (same key =
  same architecture and shapes), at most ``max_size`` of them, and
  ``run(specs, device, progress) -> list[RunOutcome]`` trains them.  A study with
  ``resumable = True`` gets ``resume_dir=...`` in both ``run_one`` and ``stacking.run``:
  the study folder's ``resume/``, where long runs keep their training state so that a run
  cut off continues from its last saved state, not from step 0.
- ``analyze_one(spec, store, device, progress, extra) -> xr.Dataset`` (optional) —
  analyses of a finished run (``extra``: the study's parsed options, e.g. the analysis
  preset), stored beside it as ``analysis.nc`` and recomputable by ``dynlab analyze``.
- ``assemble(specs, store, options) -> xr.Dataset`` — the study dataset (dim ``run``);
  the generic joining of the runs' datasets lives in :mod:`dynlab.results.assemble`.

Typed contracts: a run's result is a :class:`RunResult` (the study's subclass,
``result_type``), stored as ``result.json``; a study's options beyond the common
selections are a :class:`StudyExtra` subclass (``options_type``, ``extra="forbid"``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from dynlab.spec import Spec
from dynlab.errors import DynlabInputError, validation_errors

if TYPE_CHECKING:  # the protocol's types only: importing this module loads neither torch nor xarray
    import torch
    import xarray as xr

    from dynlab.results.store import RunStore
    from dynlab.runtime import NullProgress


__all__ = [
    "EVALUATED_STATUSES",
    "RunOutcome",
    "RunResult",
    "Stacking",
    "Study",
    "StudyExtra",
    "StudyOptions",
    "collapse_repeats",
    "override_field",
    "parse_result",
    "read_result",
    "select_names",
]

#: Run statuses whose runs have weights, are evaluated and get the per-run analyses:
#: ``ok`` (learned) and ``not-learned`` (training ended below the training length).
#: ``diverged`` runs have neither.
EVALUATED_STATUSES = ("ok", "not-learned")

E = TypeVar("E", bound="StudyExtra")
R = TypeVar("R", bound="RunResult")
T = TypeVar("T", bound=Hashable)


def collapse_repeats(values: Sequence[T], key: Callable[[T], Hashable] | None = None) -> tuple[tuple[T, ...], dict[T, int]]:
    """``values`` with repeats dropped (the first of each kept, in order) and, for every
    kept value that was given more than once, how many times it was given.  Two values
    are repeats when ``key`` (default: the value itself) maps them to the same thing."""
    kept: dict[Hashable, T] = {}
    counts: dict[Hashable, int] = {}
    for v in values:
        k = v if key is None else key(v)
        kept.setdefault(k, v)
        counts[k] = counts.get(k, 0) + 1
    return tuple(kept.values()), {kept[k]: n for k, n in counts.items() if n > 1}


@dataclass(frozen=True)
class StudyOptions:
    """The user's selections for one study invocation (None = the preset's default): the
    selections every study has (``preset``, ``models``, ``seeds``) and, in ``extra``, the
    study's own options (its own selections too), checked by its ``options_type``
    (:meth:`Study.parse_options`); the keys each study accepts are listed in its module.
    """

    preset: str = "quick"
    models: tuple[str, ...] | None = None
    seeds: tuple[int, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Selections as tuples with repeats collapsed, so that each run is made once:
        models and seeds by value (a study may read names further, before it makes its
        specs: :attr:`Study.prepare_options`)."""
        if self.models is not None:
            object.__setattr__(self, "models", collapse_repeats(tuple(self.models))[0])
        if self.seeds is not None:
            object.__setattr__(self, "seeds", collapse_repeats(tuple(self.seeds))[0])


class StudyExtra(BaseModel):
    """Base of a study's typed options (``StudyOptions.extra``): no key is accepted unless
    the subclass declares it.  Validators may read the preset from the validation context
    (``info.context["preset"]``) to fill preset-dependent defaults explicitly."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The option of the study command that sets each field, for messages that name it
    #: (a field not listed is named ``option 'field'``).
    option_words: ClassVar[Mapping[str, str]] = {}
    #: Fields that manifests written by earlier versions recorded beside ``extra``, at their
    #: top level (:func:`dynlab.manifest.manifest_options` reads them back into ``extra``).
    manifest_top_level: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def parse(cls: type[E], options: StudyOptions, study: str) -> E:
        """``options.extra`` as this model; a one-line
        :class:`~dynlab.errors.DynlabInputError` naming the bad key and the allowed keys."""
        try:
            return cls.model_validate(dict(options.extra), context={"preset": options.preset})
        except ValidationError as exc:
            raise DynlabInputError(_one_line(exc, cls, study)) from None

    def recorded(self) -> dict[str, Any]:
        """The options as JSON for the study manifest: every value that differs from the
        field's default (preset-dependent values, filled by the validators, included)."""
        return self.model_dump(mode="json", exclude_defaults=True)


def _one_line(exc: ValidationError, cls: type[BaseModel], study: str) -> str:
    allowed = ", ".join(cls.model_fields) or "none"
    loc, msg, err = validation_errors(exc)[0]
    key = ".".join(loc)
    if err["type"] == "extra_forbidden":
        return f"study {study}: unknown option {key!r}; allowed: {allowed}"
    return f"study {study}: bad option {key!r} ({msg}); allowed options: {allowed}"


def override_field(spec_cls: type[Spec], *fixed: str) -> Callable[[Any], dict[str, Any]]:
    """A validator for an options field that overrides fields of ``spec_cls`` (a dict of
    field name -> value): every key must be a field of ``spec_cls`` other than ``fixed``
    (those the study sets itself); the values are checked when the spec is built."""
    allowed = tuple(f for f in spec_cls.model_fields if f not in fixed)

    def check(value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ValueError(f"expected a mapping of {spec_cls.__name__} fields, got {type(value).__name__}")
        for k in value:
            if k not in allowed:
                raise ValueError(f"unknown {spec_cls.__name__} field {k!r}; allowed: {', '.join(allowed)}")
        return dict(value)

    return check


class RunResult(BaseModel):
    """What a run reports (``result.json``): the fields every study has.

    Attributes:
        status: ``ok``, ``not-learned`` (trained, evaluated, did not reach its training
            target) or ``diverged`` (no weights, not evaluated); see :data:`EVALUATED_STATUSES`.
        reason: one line saying why a run is not ``ok`` ('' when it is).
        train_steps: optimiser steps taken.
        train_loss: training loss at the end (the study says how it is averaged).
        train_time: wall time of training in seconds (machine-dependent).
        wall_time_s: wall time of the whole work item per run in seconds, set by the runner.
        loss_curve_step, loss_curve: the training loss subsampled to at most 64 points
            (:func:`dynlab.training.loss_curve`: the mean over windows of steps, at each
            window's last step); absent where a study does not store it.
        converged: whether the training loss converged (:func:`dynlab.training.converged`,
            its rule in :data:`dynlab.training.CONVERGED_RULE`); absent with the curve.

    Subclasses add the study's measurements; every added field is optional (a diverged
    run has none).  ``extra="forbid"``: a result with an undeclared key does not load.
    """

    model_config = ConfigDict(extra="forbid")

    status: str
    reason: str = ""
    train_steps: int | None = None
    train_loss: float | None = None
    train_time: float | None = None
    wall_time_s: float | None = None
    loss_curve_step: list[int] | None = None
    loss_curve: list[float] | None = None
    converged: bool | None = None

    @property
    def evaluated(self) -> bool:
        """True for runs that have weights and measurements (:data:`EVALUATED_STATUSES`)."""
        return self.status in EVALUATED_STATUSES

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored as ``result.json`` (fields that are None are left out)."""
        return self.model_dump(mode="json", exclude_none=True)


@dataclass
class RunOutcome:
    """What ``run_one`` returns: the typed ``result`` and the weights (None when diverged)."""

    result: RunResult
    state_dict: dict[str, torch.Tensor] | None

    def __post_init__(self) -> None:
        if not isinstance(self.result, RunResult):
            raise TypeError(f"RunOutcome.result must be a RunResult, got {type(self.result).__name__}")


@dataclass(frozen=True)
class Stacking:
    """How a study trains runs together, as one stack: specs of equal ``key(spec)`` share a
    work item, at most ``max_size`` of them, which ``run(specs, device, progress)`` trains
    (with ``resume_dir=`` in a resumable study); a work item of one spec goes to the study's
    ``run_one``."""

    key: Callable[[Spec], Hashable]
    run: Callable[..., list[RunOutcome]]
    max_size: int = 64

    def __post_init__(self) -> None:
        if isinstance(self.max_size, bool) or not isinstance(self.max_size, int) or self.max_size < 1:
            raise ValueError(f"Stacking.max_size={self.max_size!r}; allowed: an integer >= 1")


@dataclass(frozen=True)
class Study:
    name: str
    presets: tuple[str, ...]
    make_specs: Callable[[StudyOptions], list[Spec]]
    run_one: Callable[[Spec, torch.device, NullProgress], RunOutcome]
    assemble: Callable[[list[Spec], RunStore, StudyOptions], xr.Dataset]
    analyze_one: Callable[[Spec, RunStore, torch.device, NullProgress, StudyExtra], xr.Dataset] | None = None
    stacking: Stacking | None = None
    resumable: bool = False
    spec_type: type[Spec] = Spec
    result_type: type[RunResult] = RunResult
    options_type: type[StudyExtra] = StudyExtra
    #: The study's figures: dataset -> {name: dynlab.figures Panel or Table} (None: no figures).
    panels: Callable[[xr.Dataset], Mapping[str, Any]] | None = None
    #: The study's own reading of the selections, applied before its specs are made and its
    #: options recorded (e.g. names in canonical spelling); None: as given.
    prepare_options: Callable[[StudyOptions], StudyOptions] | None = None
    #: ``(study name, specs)`` -> None, refusing in one line, before anything runs, specs whose
    #: per-run analyses cannot be done (e.g. too large for them); None: no check.
    check_analyses: Callable[[str, list[Spec]], None] | None = None

    def prepared(self, options: StudyOptions) -> StudyOptions:
        """``options`` as the study reads them (:attr:`prepare_options`)."""
        return options if self.prepare_options is None else self.prepare_options(options)

    def work_items(self, specs: list[Spec]) -> list[list[Spec]]:
        """Split ``specs`` into work items: specs of equal ``stacking.key`` in groups of at most
        ``stacking.max_size`` (singletons when the study does not stack)."""
        stack = self.stacking
        if stack is None:
            return [[s] for s in specs]
        by_key: dict[Hashable, list[Spec]] = {}
        for s in specs:
            by_key.setdefault(stack.key(s), []).append(s)
        return [members[i : i + stack.max_size] for members in by_key.values()
                for i in range(0, len(members), stack.max_size)]

    def check_preset(self, preset: str) -> str:
        if preset not in self.presets:
            raise DynlabInputError(f"unknown preset {preset!r} for study {self.name}; allowed: {', '.join(self.presets)}")
        return preset

    def parse_options(self, options: StudyOptions) -> StudyExtra:
        """``options.extra`` as the study's ``options_type`` (one-line error on an unknown
        or mistyped key), preset-dependent defaults filled in."""
        return self.options_type.parse(options, self.name)

    def load_result(self, store: RunStore, spec: Spec) -> RunResult:
        """The stored result of ``spec``'s run as ``result_type`` (one-line error when it
        does not fit)."""
        return read_result(self.result_type, store, spec)


def parse_result(result_type: type[R], raw: dict[str, Any]) -> tuple[R | None, str | None]:
    """``(raw as result_type, None)``, or ``(None, why)`` when it does not fit: ``"does not fit
    <type> (<field>: <pydantic's message>)"``, the words of every reader of a ``result.json``."""
    try:
        return result_type.model_validate(raw), None
    except ValidationError as exc:
        loc, _, err = validation_errors(exc)[0]
        return None, f"does not fit {result_type.__name__} ({'.'.join(loc) or 'result'}: {err['msg']})"


def read_result(result_type: type[R], store: RunStore, spec: Spec) -> R:
    """``spec``'s stored ``result.json`` as ``result_type``; one line naming the run on failure."""
    result, why = parse_result(result_type, store.load_result(spec))
    if result is None:
        raise DynlabInputError(f"run {spec.spec_hash()}: result.json {why}; rerun the study to redo it")
    return result


def select_names(
    values: Sequence[str] | None, default: tuple[str, ...], allowed: tuple[str, ...], what: str
) -> tuple[str, ...]:
    """The user's selection of ``what`` (e.g. mixers): ``default`` for None or ``("all",)``,
    else ``values`` with repeats collapsed (the first of each kept, in order), each checked
    against ``allowed``.  One-line :class:`~dynlab.errors.DynlabInputError` for an unknown
    name, for ``all`` together with names, and for an empty selection, each naming the
    allowed values."""
    choices = f"all, or a comma list of: {', '.join(allowed)}"
    if values is None:
        return default
    values = tuple(values)
    if not values:
        raise DynlabInputError(f"no {what} selected; allowed: {choices}")
    if "all" in values:
        if all(v == "all" for v in values):
            return default
        others = ", ".join(v for v in values if v != "all")
        raise DynlabInputError(f"'all' cannot be combined with other {what} names ({others}); allowed: {choices}")
    for v in values:
        if v not in allowed:
            raise DynlabInputError(f"unknown {what} {v!r}; allowed: all, {', '.join(allowed)}")
    return collapse_repeats(values)[0]
