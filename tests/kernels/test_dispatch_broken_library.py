"""A kernel library that is installed but fails to import is one warning naming it, not a silent fallback."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

from dynlab.kernels import dispatch


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(dispatch, "_LIBS", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in [m for m in sys.modules if m.split(".")[0] in dispatch.LIBRARIES]:
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


@pytest.mark.parametrize(("module", "package"), [("fla", "fla-core"), ("causal_conv1d", "causal-conv1d")])
def test_every_kernel_library_that_fails_to_import_is_said(fresh, tmp_path, monkeypatch, module, package):
    pkg = tmp_path / module
    pkg.mkdir()
    (pkg / "__init__.py").write_text('raise OSError("libcudart.so.12: cannot open shared object file")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(RuntimeWarning, match=rf"{package} is installed but does not import \(OSError: libcudart"):
        assert dispatch.library_available(module) is False
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    monkeypatch.setattr(dispatch, "HAS_TRITON", False)
    if module == "fla":
        assert dispatch.choose_backend("gla", "cuda") == "torch"
    else:
        assert dispatch.conv_backend("cuda", torch.float32, 4, 64) == "torch"
