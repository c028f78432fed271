"""The stack's AdamW (C loops) against its torch form bit for bit, against torch.optim.AdamW with
clipping run on each member alone, and on frozen members."""

from __future__ import annotations

import math

import pytest
import torch

from dynlab.kernels.adamw import adamw_step_, adamw_step_ref
from dynlab.kernels.adamw import step as step_module
from dynlab.kernels.compiled import C_KERNELS_ENV

BETAS, EPS = (0.9, 0.95), 1e-8


def _needs_c():
    if step_module.c_library() is None:
        pytest.skip(f"compiled AdamW {step_module.compiled_kernel_status()}")


def _state(dtype, e=3, n=37, seed=0):
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(e, n, generator=gen, dtype=dtype)
    m1 = 0.1 * torch.randn(e, n, generator=gen, dtype=dtype)
    m2 = torch.rand(e, n, generator=gen, dtype=dtype) * 1e-2
    decay = (torch.rand(n, generator=gen) > 0.4).to(dtype) * 0.1
    return p, m1, m2, decay


def _grads(dtype, e=3, n=37, seed=1):
    return torch.randn(e, n, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _run(fn, dtype, steps=6, alive=(True, False, True), coefs=(1.0, 0.3, 0.25), shape=(3, 37)):
    p, m1, m2, decay = _state(dtype, *shape)
    coef = torch.tensor(coefs, dtype=dtype)
    live = torch.tensor(alive)
    for k in range(steps):
        fn(p, _grads(dtype, *shape, seed=k), m1, m2, coef, live, 3e-3, decay, k + 1, BETAS, EPS)
    return p, m1, m2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [(3, 37), (16, 14460), (5, 1001)])
def test_c_loops_equal_the_torch_form_bit_for_bit(dtype, size):
    """Same operations, same order, FMAs where torch's vectorised CPU loops use them (x86
    with AVX2 or newer, which every CI machine of this project is), torch's own sqrt."""
    _needs_c()
    e, n = size
    got, want = (_run(fn, dtype, alive=[k % 4 != 1 for k in range(e)], coefs=[0.2 + 0.1 * k for k in range(e)],
                      shape=size) for fn in (adamw_step_, adamw_step_ref))
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("fn", [adamw_step_, adamw_step_ref], ids=["c-or-torch", "torch"])
def test_a_frozen_member_keeps_its_parameters_exactly(fn):
    p0, *_ = _state(torch.float32)
    p, _, _ = _run(fn, torch.float32)
    assert torch.equal(p[1], p0[1])
    assert not torch.equal(p[0], p0[0])


def test_a_frozen_member_with_a_non_finite_gradient_stays_put():
    p, m1, m2, decay = _state(torch.float32)
    before = p.clone()
    g = _grads(torch.float32)
    g[1, 3] = math.nan
    coef = torch.tensor([1.0, math.nan, 0.5])
    adamw_step_(p, g, m1, m2, coef, torch.tensor([True, False, True]), 1e-3, decay, 1, BETAS, EPS)
    assert torch.equal(p[1], before[1]) and torch.isfinite(p).all() and torch.isfinite(m1).all()


@pytest.mark.parametrize("use_c", [True, False], ids=["c-loop", "torch-form"])
def test_each_member_follows_torch_optim_adamw_with_clipping(use_c, monkeypatch):
    """Independent: torch.optim.AdamW (foreach off) after torch.nn.utils.clip_grad_norm_,
    one member at a time, equals the stack's step for that member (float64)."""
    if use_c:
        _needs_c()
    else:
        monkeypatch.setenv(C_KERNELS_ENV, "0")
    dtype, e, n, clip, lr, wd = torch.float64, 3, 29, 0.7, 2e-3, 0.1
    p, _, _, _ = _state(dtype, e, n)
    matrix = torch.zeros(n, dtype=torch.bool)
    matrix[:20] = True  # the first 20 entries stand for matrices (decayed), the rest for vectors
    decay = matrix.to(dtype) * wd
    m1, m2 = torch.zeros_like(p), torch.zeros_like(p)
    stack = p.clone()
    solo = [(p[i, :20].clone().requires_grad_(True), p[i, 20:].clone().requires_grad_(True)) for i in range(e)]
    opts = [torch.optim.AdamW([{"params": [a], "weight_decay": wd}, {"params": [b], "weight_decay": 0.0}],
                              lr=lr, betas=BETAS, eps=EPS, foreach=False) for a, b in solo]
    for k in range(5):
        grads = _grads(dtype, e, n, seed=10 + k) * (1 + 3 * k)  # growing: clipping bites from the second step
        coef = torch.clamp(clip / (torch.linalg.vector_norm(grads, dim=1) + 1e-6), max=1.0)
        adamw_step_(stack, grads, m1, m2, coef, torch.ones(e, dtype=torch.bool), lr, decay, k + 1, BETAS, EPS)
        for i, ((a, b), opt) in enumerate(zip(solo, opts)):
            a.grad, b.grad = grads[i, :20].clone(), grads[i, 20:].clone()
            torch.nn.utils.clip_grad_norm_([a, b], clip)
            opt.step()
    for i, (a, b) in enumerate(solo):
        torch.testing.assert_close(stack[i], torch.cat([a.detach(), b.detach()]), rtol=1e-12, atol=1e-14)


def test_without_c_kernels_the_torch_form_runs(monkeypatch):
    monkeypatch.setenv(C_KERNELS_ENV, "0")
    assert step_module.c_library() is None
    got, want = _run(adamw_step_, torch.float32), _run(adamw_step_ref, torch.float32)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_a_stack_trains_the_same_with_the_c_loops_and_the_torch_form(monkeypatch):
    """fit_ensemble's optimiser step through the C loops changes no number of a stack's training."""
    _needs_c()
    from dynlab.bench.lm import _sources, lm_bench_model
    from dynlab.lm.train.ensemble import fit_ensemble

    data = torch.randint(0, 256, (20_000,), generator=torch.Generator().manual_seed(0))

    def train():
        models = [lm_bench_model(16, seed) for seed in range(3)]
        src = _sources(3, data, 4, 16)
        fit_ensemble(models, [s[0] for s in src], [s[1] for s in src], [s[2] for s in src], steps=4, batch_size=4,
                     threads=1, lr=1e-2)
        return [torch.cat([q.detach().reshape(-1) for q in m.parameters()]) for m in models]

    with_c = train()
    monkeypatch.setattr(step_module, "c_library", lambda: None)
    with_torch = train()
    for a, b in zip(with_c, with_torch):
        assert torch.equal(a, b)
