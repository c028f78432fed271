"""Tiny finished LM runs for the tests that post-train or export one."""

from __future__ import annotations

from pathlib import Path

#: A length-generalization run of one small Mamba-2 layer trained for 2 steps (the quick
#: preset's recipe otherwise), evaluated at 32 tokens.
TINY = {"model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 4, "d_state": 4, "chunk_size": 8},
        "train": {"steps": 2, "batch_size": 2, "seq_len": 16},
        "eval": {"length_multiple": 2, "n_samples": 2, "chunk_len": 16, "bin_width": 8, "effrem_points": 2,
                 "effrem_samples": 2, "state_points": 2}, "interventions": ["zero"]}


def tiny_lm_run(out: Path) -> Path:
    """The folder of the :data:`TINY` run, trained under ``out``."""
    from dynlab.runner.driver import run_study
    from dynlab.studies.length_generalization import STUDY
    from dynlab.runner.protocol import StudyOptions

    options = StudyOptions(preset="quick", extra=TINY)
    run_study(STUDY, options, out=out, device="cpu")
    return out / "length-generalization" / "runs" / STUDY.make_specs(options)[0].spec_hash()


def smoke_lm_run(out: Path, steps: int) -> Path:
    """The folder of a smoke-preset run of the zero arm trained for ``steps`` steps under ``out``, through the CLI."""
    from dynlab.cli import main

    argv = ["study", "length-generalization", "--preset", "smoke", "--interventions", "zero", "--steps", str(steps),
            "--out", str(out), "--device", "cpu", "-q"]
    assert main(argv) == 0
    (run,) = (out / "length-generalization" / "runs").iterdir()
    return run
