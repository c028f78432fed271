"""DYNLAB_* variables: an unknown name is one warning naming the known switches; a kernel
backend forced where this machine cannot run it is one line, exit 2, nothing written."""

from __future__ import annotations

import pytest
import torch

from dynlab.cli import main
from dynlab.errors import ENV_SWITCHES, unknown_environment


def test_an_unknown_dynlab_variable_is_said_once(capsys, monkeypatch):
    monkeypatch.setenv("DYNLAB_C_KERNEL", "0")  # a typo of DYNLAB_C_KERNELS
    assert main(["study", "list"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "DYNLAB_C_KERNEL " in warnings[0] + " "
    assert all(name in warnings[0] for name in ENV_SWITCHES)
    assert unknown_environment({"DYNLAB_DEBUG": "1", "DYNLAB_MAMBA_REF": "/x", "PATH": "/bin"}) is None


@pytest.mark.parametrize("backend", ["triton", "mamba_ssm"])
def test_a_backend_this_machine_cannot_run_is_bad_input(tmp_path, capsys, monkeypatch, backend):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.setenv("DYNLAB_KERNEL_BACKEND", backend)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert main(["study", "length-generalization", "--preset", "smoke", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: DYNLAB_KERNEL_BACKEND={backend} but"), err
    assert not (tmp_path / "o" / "length-generalization").exists()
