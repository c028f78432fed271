"""``dynlab analyze``: recompute the analyses of a study folder without retraining."""

from __future__ import annotations

from pathlib import Path

from dynlab.app.checks import check_device, nonempty_path, quiet_libraries
from dynlab.app.folders import check_study_folder
from dynlab.errors import DynlabInputError


def study_folder_to_analyze(text: str, device: str, quiet: bool = False) -> Path:
    """``dynlab analyze``'s folder, refused when it is an empty path, no study folder, or
    cannot be written (``quiet``: :func:`quiet_libraries`)."""
    study_dir = nonempty_path(text, "STUDY_DIR", "a study folder written by `dynlab study`")
    check_device(device)
    quiet_libraries(quiet)
    if not (study_dir / "manifest.json").exists():  # the words of dynlab.runner.driver.analyze_study
        raise DynlabInputError(f"{study_dir} is not a dynlab study folder (no manifest.json); "
                               "run `dynlab study ...` first")
    if (study_dir / "manifest.json").is_file():  # else analyze_study says why it cannot read it
        check_study_folder(study_dir, probe=False)  # analyze_study probes its files once the manifest is checked
    return study_dir


def analyze(study_dir: str | Path, device: str = "auto", quiet: bool = False) -> tuple[Path, str]:
    """Recompute the analyses of the study in ``study_dir``: the path of its dataset and the
    T_cross–mp correlation table (``""`` when the study has none), the checks of ``dynlab
    analyze`` first."""
    folder = study_folder_to_analyze(str(study_dir), device, quiet)
    from dynlab.analysis.correlation import format_correlation_report
    from dynlab.runner.driver import analyze_study, open_study
    from dynlab.studies import get_study

    path = analyze_study(folder, get_study, device=device, progress=not quiet)
    return path, format_correlation_report(open_study(path))
