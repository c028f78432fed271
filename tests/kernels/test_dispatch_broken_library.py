"""A kernel library that is installed but fails to import is one warning naming it, not a silent fallback."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

from dynlab.kernels import dispatch


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(dispatch, "_MAMBA", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in [m for m in sys.modules if m == "mamba_ssm" or m.startswith("mamba_ssm.")]:
        monkeypatch.delitem(sys.modules, name)


def test_an_installed_mamba_ssm_that_fails_to_import_is_said(fresh, tmp_path, monkeypatch):
    pkg = tmp_path / "mamba_ssm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('raise ImportError("selective_scan_cuda.so: undefined symbol: _ZN3c104cuda9SetDevice")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(RuntimeWarning, match=r"mamba-ssm is installed but does not import \(ImportError: .*undefined symbol"):
        assert dispatch.mamba_ssm_available() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dispatch.mamba_ssm_available() is False  # said once per process


def test_an_absent_mamba_ssm_is_silent(fresh, monkeypatch):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "mamba" not in p])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dispatch.mamba_ssm_available() is False
