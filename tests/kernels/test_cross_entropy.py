"""The fused per-token cross-entropy (C loops) against F.cross_entropy and a log-sum-exp form."""

from __future__ import annotations

import pytest
import torch

from dynlab.kernels.compiled import C_KERNELS_ENV
from dynlab.kernels.cross_entropy import loss as ce
from dynlab.kernels.cross_entropy import token_nll, token_nll_ref

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12)}


@pytest.fixture(params=["c", "torch"], ids=["c-kernel", "reference"])
def backend(request, monkeypatch):
    if request.param == "torch":
        monkeypatch.setenv(C_KERNELS_ENV, "0")
    else:
        monkeypatch.delenv(C_KERNELS_ENV, raising=False)
        if ce._c_library() is None:
            pytest.skip(f"compiled cross-entropy {ce.compiled_kernel_status()}")
    return request.param


def _inputs(dtype, n=40, v=256, scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, v, generator=g, dtype=dtype) * scale).requires_grad_(True)
    return logits, torch.randint(0, v, (n,), generator=g)


def test_gradcheck_float64(backend):
    logits, targets = _inputs(torch.float64, n=6, v=7)
    assert torch.autograd.gradcheck(lambda x: token_nll(x, targets), (logits,))


@pytest.mark.parametrize("scale", [1.0, 30.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_and_gradients_equal_the_reference(backend, dtype, scale):
    logits, targets = _inputs(dtype, scale=scale)
    go = torch.randn(logits.shape[0], generator=torch.Generator().manual_seed(3), dtype=dtype)
    out, ref = token_nll(logits, targets), token_nll_ref(logits, targets)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    torch.testing.assert_close(torch.autograd.grad(out, logits, go)[0], torch.autograd.grad(ref, logits, go)[0],
                               **TOL[dtype])


def test_reference_is_logsumexp_minus_the_target_logit():
    logits, targets = _inputs(torch.float64)
    want = torch.logsumexp(logits, dim=1) - logits.gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(token_nll_ref(logits, targets), want, rtol=1e-12, atol=1e-12)


def test_out_of_range_targets_and_bad_shapes_are_one_clear_error(backend):
    logits, targets = _inputs(torch.float32)
    with pytest.raises(ValueError, match="token_nll: need"):
        token_nll(logits, targets[:-1])
    if backend == "c":
        with pytest.raises(ValueError, match="targets must lie in"):
            token_nll(logits, targets + 256)


def test_c_kernel_is_built_where_a_compiler_exists(monkeypatch):
    import shutil

    monkeypatch.delenv(C_KERNELS_ENV, raising=False)
    if shutil.which("cc") or shutil.which("gcc") or shutil.which("clang"):
        assert ce.compiled_kernel_status().startswith("compiled: ")
    monkeypatch.setenv(C_KERNELS_ENV, "0")
    assert ce._c_library() is None
