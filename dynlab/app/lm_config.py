"""The common knobs of the language-model study commands (``--steps``, ``--d-model``, …) and
their ``--config`` TOML file: each key and value checked against the field of the spec it
sets, the options typed winning over the file.  Torch is imported only when a knob or a
file is given (the spec classes say what a field takes)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dynlab.app.checks import check_source_option, nonempty_path, parse_names
from dynlab.errors import DynlabInputError
from dynlab.names import SOURCES

#: The common knobs of the LM study commands: option -> (section of the study's options, spec field).
LM_KNOBS = {"--steps": ("train", "steps"), "--d-model": ("model", "d_model"), "--n-layers": ("model", "n_layers"),
            "--batch-size": ("train", "batch_size"), "--lr": ("train", "lr"), "--seq-len": ("train", "seq_len"),
            "--precision": ("train", "precision")}
#: The knob options of the LM study commands: parameter -> (option, type, help).
LM_KNOB_OPTIONS: dict[str, tuple[str, type, str]] = {
    "steps": ("--steps", int, "Training steps (default: the preset's)."),
    "d_model": ("--d-model", int, "Model width d_model (default: the preset's)."),
    "n_layers": ("--n-layers", int, "Number of blocks (default: the preset's)."),
    "batch_size": ("--batch-size", int, "Training batch size (default: the preset's)."),
    "lr": ("--lr", float, "Peak learning rate (default: the preset's)."),
    "seq_len": ("--seq-len", int, "length-generalization: training length T_train (default: the preset's)."),
    "precision": ("--precision", str, "fp32 (default) or bf16: autocast, float32 weights, optimiser, loss and scans."),
    "config": ("--config", Path, "A TOML file of study options: the knobs above by field name (steps, d_model, …) "
               "and tables (model, train, eval, …) of spec fields; options typed here win."),
}
#: Fields a study sets itself, which neither a knob nor ``--config`` may set.
_FIXED_FIELDS = {"model": ("mixer",), "intervention": ("kind",), "task": ("kind",), "post": ("interventions",)}
#: Where the value of a fixed field is chosen instead, said when a file sets it.
_FIXED_HINTS = {("post", "interventions"): " (the post-training arms are the top-level interventions, or "
                                           "--interventions)"}


def _is_task_study(entry: Any) -> bool:
    """The task studies (copying, passkey, babilong) are those that take task options."""
    return bool(entry.task_options)


def lm_config_specs(entry: Any) -> dict[str, type]:
    """Section of an LM study's options -> the spec class whose fields it overrides (imports torch)."""
    from dynlab.lm import spec as s

    common = {"model": s.LMModelSpec, "intervention": s.InterventionSpec}
    if _is_task_study(entry):
        return {**common, "task": s.LMTaskSpec, "train": s.TaskTrainSpec, "eval": s.TaskEvalSpec,
                "post": s.TaskPostSpec}
    return {**common, "train": s.LMTrainSpec, "eval": s.LMEvalSpec, "post": s.LMPostSpec}


def check_spec_value(spec_cls: type, section: str, field: str, value: Any, where: str) -> None:
    """Refuse ``value`` for ``field`` of ``spec_cls`` (section ``section`` of the options)
    unless the field exists, is not one the study sets itself, and takes the value (its
    range as the spec checks it, its type strictly: ``true`` is no number, ``1`` no bool,
    ``"0.01"`` no number; an integer is a float; an array is a tuple); ``where``: the
    option or config key as the user wrote it."""
    from pydantic import TypeAdapter, ValidationError

    fixed = _FIXED_FIELDS.get(section, ())
    allowed = [f for f in spec_cls.model_fields if f not in fixed]
    info = spec_cls.model_fields.get(field)
    if info is None or field in fixed:
        hint = _FIXED_HINTS.get((section, field), "")
        raise DynlabInputError(f"{where}: unknown key {field!r} in [{section}]{hint}; allowed: {', '.join(allowed)}")
    from typing import Annotated

    kind = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    try:  # strict: a bool is not a number, a number not a bool, a string neither (TOML says which it wrote)
        TypeAdapter(kind).validate_python(_as_tuples(value), strict=True)
    except ValidationError as exc:
        msg = "; ".join(dict.fromkeys(e["msg"] for e in exc.errors()))
        said = f"{where} = {value!r}" if where.startswith("--config") else f"{where} {value!r}"
        raise DynlabInputError(f"{said}: {msg}") from None


def _as_tuples(value: Any) -> Any:
    """``value`` with its lists (TOML arrays) as tuples, the sequences the spec fields take
    in strict validation."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list) else value


#: The largest ``--config`` file read, in bytes, and the deepest nesting of its tables and arrays.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_DEPTH = 8


def read_config(path: Path) -> dict[str, Any]:
    """The table of a TOML file (``tomllib``); a file that is missing, not a regular file
    (a FIFO, a device, a folder), larger than :data:`MAX_CONFIG_BYTES`, not TOML, or nested
    deeper than :data:`MAX_CONFIG_DEPTH` is refused in one line, without reading past the
    bound."""
    import stat
    import tomllib

    toml_file = f"a UTF-8 TOML file of at most {MAX_CONFIG_BYTES // 1024} KiB"
    allowed = f"allowed: {toml_file}"
    p = nonempty_path(path, "--config", toml_file)  # a path of an unknown ~user, or not UTF-8: refused here
    try:
        info = p.stat()
        if not stat.S_ISREG(info.st_mode):
            raise DynlabInputError(f"--config {str(path)!r} is not a regular file; {allowed}")
        if info.st_size > MAX_CONFIG_BYTES:
            raise DynlabInputError(f"--config {str(path)!r} has {info.st_size} bytes; {allowed}")
        with p.open("rb") as f:
            text = f.read(MAX_CONFIG_BYTES + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise DynlabInputError(f"--config {str(path)!r} cannot be read ({why}); {allowed}") from None
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DynlabInputError(f"--config {str(path)!r} is not TOML ({exc}); allowed: a TOML file") from None
    except RecursionError:
        table = None
    try:
        too_deep = table is None or _depth(table) > MAX_CONFIG_DEPTH
    except RecursionError:  # dotted headers nest without tomllib recursing
        too_deep = True
    if too_deep:
        raise DynlabInputError(f"--config {str(path)!r} nests tables or arrays deeper than {MAX_CONFIG_DEPTH}; "
                               f"allowed: the study's tables of spec fields ({MAX_CONFIG_DEPTH} levels at most)")
    return table


def _depth(value: Any) -> int:
    """How deep tables and arrays nest in ``value`` (a scalar: 0)."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def lm_knob_options(entry: Any, knobs: Mapping[str, Any], config: Path | None) -> dict[str, Any]:
    """Overrides of an LM study's options (``StudyOptions.extra``) from the common knobs
    (``knobs``: option as typed -> value, None when not given; :data:`LM_KNOBS`) and a
    ``--config`` TOML file, each key and value checked against the field of the spec it
    sets.  The file holds the knobs by field name at the top (``steps``, ``d_model``,
    ``n_layers``, ``batch_size``, ``lr``, ``seq_len``, ``precision``), ``interventions`` (a list),
    ``source``, and tables ``[model]``, ``[train]``, ``[eval]``, ``[intervention]``,
    ``[post]`` (task studies also ``[task]``) of spec fields.  An option on the command
    line wins over the file."""
    given = {flag: v for flag, v in knobs.items() if v is not None}
    cfg = read_config(config) if config is not None else {}
    if not given and not cfg:
        return {}
    specs = lm_config_specs(entry)
    knob_keys = {field: flag for flag, (_, field) in LM_KNOBS.items()
                 if not (field == "seq_len" and _is_task_study(entry))}
    sections = tuple(specs)
    allowed_top = ", ".join([*knob_keys, "interventions", "source", *(f"[{s}]" for s in sections)])
    where = f"--config {config}"
    extra: dict[str, Any] = {}

    def put(section: str, field: str, value: Any, said: str) -> None:
        if field == "seq_len" and section == "train" and _is_task_study(entry):
            raise DynlabInputError(f"{said}: study {entry.name} trains on its task's lengths, not a seq_len; "
                                   "allowed: task.train_min and task.train_max in --config ([task])")
        check_spec_value(specs[section], section, field, value, said)
        extra.setdefault(section, {})[field] = value

    for key, value in cfg.items():
        if key in knob_keys:
            section = LM_KNOBS[knob_keys[key]][0]
            if key in cfg.get(section, {}):
                raise DynlabInputError(f"{where}: {key} is given twice (at the top and in [{section}]); "
                                       "allowed: one of them")
            put(section, key, value, f"{where}: {key}")
        elif key in sections:
            if not isinstance(value, dict):
                raise DynlabInputError(f"{where}: {key} = {value!r} is not a table; allowed: a [{key}] table of "
                                       f"{specs[key].__name__} fields")
            for field, v in value.items():
                put(key, field, v, f"{where}: {key}.{field}")
        elif key == "interventions":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise DynlabInputError(f"{where}: interventions = {value!r}; allowed: a list of names of "
                                       f"{', '.join(entry.interventions)}")
            extra["interventions"] = list(parse_names(",".join(value), f"{where}: interventions",
                                                      entry.interventions, "intervention"))
        elif key == "source":
            if not isinstance(value, str):
                raise DynlabInputError(f"{where}: source = {value!r}; allowed: {', '.join(SOURCES)} or a text file")
            extra["source"] = check_source_option(value, f"{where}: source")
        else:
            raise DynlabInputError(f"{where}: unknown key {key!r}; allowed: {allowed_top}")
    for flag, value in given.items():  # the command line wins over the file
        section, field = LM_KNOBS[flag]
        put(section, field, value, flag)
    return extra


def option_words(knobs: Mapping[str, Any], typed: Mapping[str, Any], config: Path | None) -> dict[str, str]:
    """Spec field -> the words that set it, for an error found when the specs are made
    (:func:`dynlab.errors.in_option_words`): the option typed (``knobs``: option ->
    value, :data:`LM_KNOBS`; ``typed``: field -> its option and value, e.g.
    ``{"eval_lengths": ("--lengths", "64,128")}``), else the ``--config`` key that set it
    (``--config FILE: task.eval_lengths``); a field neither sets is left out."""
    words: dict[str, str] = {}
    for key, value in (read_config(config) if config is not None else {}).items():
        for field in value if isinstance(value, dict) else (key,):
            words[field] = f"--config {config}: {key}.{field}" if isinstance(value, dict) else f"--config {config}: {key}"
    words.update({field: flag for flag, (_, field) in LM_KNOBS.items() if knobs.get(flag) is not None})
    words.update({field: flag for field, (flag, value) in typed.items() if value is not None})
    return words


def merge_extra(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with the keys of ``over`` (dicts merged one level deep, ``over`` winning)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
