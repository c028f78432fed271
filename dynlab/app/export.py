"""``dynlab lm export``: a dynlab LM run as a Hugging Face model folder."""

from __future__ import annotations

from pathlib import Path

from dynlab.app.checks import nonempty_path
from dynlab.app.folders import check_out
from dynlab.errors import DynlabInputError


def export_places(run: Path, out: str, dtype: str | None) -> tuple[Path, Path]:
    """``dynlab lm export``'s run folder and output folder (``~`` expanded), checked with
    ``--dtype``."""
    dtypes = ("float32", "float64", "bfloat16")
    if dtype is not None and dtype not in dtypes:
        raise DynlabInputError(f"--dtype {dtype!r} is not a dtype dynlab exports; allowed: {', '.join(dtypes)}")
    out_dir = nonempty_path(out, "OUT", "a folder (made when missing)")
    run = nonempty_path(run, "RUN", "a dynlab LM run folder (runs/<id>)")
    if not run.is_dir():
        raise DynlabInputError(f"RUN {str(run)!r} is not a folder; allowed: a dynlab LM run folder (runs/<id>)")
    from dynlab.lm.hub.export import check_export_folder

    check_export_folder(out_dir, "OUT")  # before anything is loaded
    check_out(out_dir, flag="OUT")
    return run, out_dir


def export(run: str | Path, out: str, dtype: str | None = None, license: str = "unknown") -> Path:  # noqa: A002
    """Export the LM run in ``run`` to the folder ``out`` (``dtype``: float32, float64 or
    bfloat16; None: the run's; ``license``: the model card's, a Hub identifier), after
    ``dynlab lm export``'s checks; the folder written."""
    from dynlab.lm.hub.card import check_license

    try:
        check_license(license)  # before anything is read or written
    except DynlabInputError as exc:
        raise DynlabInputError(f"--{exc}") from None
    run, out_dir = export_places(Path(run), out, dtype)
    import torch

    from dynlab.lm.hub.export import export_hf

    return export_hf(run, out_dir, dtype=None if dtype is None else getattr(torch, dtype), license=license)
