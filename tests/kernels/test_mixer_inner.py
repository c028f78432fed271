"""Mamba-2's mixer between its projections as one op (``kernels.ssd.mixer_inner``) against
the autograd reference built from the ops' references, against the same ops called one by
one, against gradcheck, and inside the LM stack."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dynlab.kernels.compiled import C_KERNELS_ENV
from dynlab.kernels.gated_norm import gated_rms_norm
from dynlab.kernels.short_conv import causal_conv_silu
from dynlab.kernels.ssd import mixer_inner as mi
from dynlab.kernels.ssd.grouped import ssd_grouped

# float32: sums of up to T·N and T·H·P terms of size ~1 rounded in another order than the reference's
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float64: dict(rtol=1e-11, atol=1e-11)}


def _needs_c():
    if not mi.mamba2_inner_applies(torch.zeros(1, 1, 1, 1)):
        pytest.skip("the C libraries of the mixer's ops are not available here")


def _inputs(dtype, e=2, b=3, t=9, h=2, p=5, n=6, k=4, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    di, cc = h * p, h * p + 2 * n

    def r(*shape, scale=1.0, shift=0.0):
        return (shift + scale * torch.randn(*shape, generator=gen, dtype=dtype)).requires_grad_(True)

    zx = r(e, b, t, di + cc + h)
    conv_w = r(e, k, cc, scale=0.5)
    conv_b = r(e, cc, scale=0.1) if bias else None
    dt_bias = r(e, h, scale=0.5, shift=-1.0)
    a_log = r(e, h, scale=0.3)
    d = r(e, h)
    norm_w = r(e, di, scale=0.2, shift=1.0)
    return [zx, conv_w, conv_b, dt_bias, a_log, d, norm_w], (h, p, n)


def _separate_ops(zx, conv_w, conv_b, dt_bias, a_log, d, norm_w, eps, h, p, n):
    """The stack's layer as it runs without the fused op: three C-backed ops glued by autograd."""
    e, b, t, _ = zx.shape
    di = h * p
    z, xbc, dt = torch.split(zx, [di, di + 2 * n, h], dim=-1)
    xbc = causal_conv_silu(xbc, conv_w, conv_b, None)
    xs, B, C = torch.split(xbc, [di, n, n], dim=-1)
    dt = F.softplus(dt + dt_bias[:, None, None, :])
    A = -torch.exp(a_log)
    y, _ = ssd_grouped(xs.reshape(e * b, t, h, p), dt.reshape(e * b, t, h), A[:, None, :].expand(e, b, h).reshape(e * b, h),
                       B.reshape(e * b, t, n), C.reshape(e * b, t, n), None, chunk_size=max(t, 1), need_final=False)
    return gated_rms_norm(y.reshape(e, b, t, di), z, norm_w, eps, xs.reshape(e, b, t, di), d.repeat_interleave(p, dim=1))


def _value_and_grads(fn, tensors, sizes, eps=1e-5, seed=7):
    h, p, n = sizes
    out = fn(*tensors, eps, h, p, n)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    leaves = [x for x in tensors if x is not None]
    grads = torch.autograd.grad((out * w).sum(), leaves)
    return [out.detach(), *grads]


SIZES = [dict(), dict(t=32, h=2, p=16, n=32), dict(e=1, b=1, t=1, h=1, p=1, n=1, k=2), dict(t=5, k=7), dict(bias=False),
         dict(e=1, b=4)]  # one member, several sequences: A's rows must not be a stride-0 view


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sizes", SIZES)
def test_values_and_gradients_match_the_reference(dtype, sizes):
    _needs_c()
    tensors, shape = _inputs(dtype, **sizes)
    got = _value_and_grads(mi.mamba2_inner, tensors, shape)
    want = _value_and_grads(mi.mamba2_inner_ref, tensors, shape)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL[dtype])


@pytest.mark.parametrize("sizes", [SIZES[0], SIZES[1], SIZES[-1]])
def test_equals_the_separate_ops_bit_for_bit(sizes, nan_buffers):
    """Same loops, same order of every sum: the fused op changes no number of a stack's training
    (buffers it forgets to write would show up as NaN)."""
    _needs_c()
    tensors, shape = _inputs(torch.float32, **sizes)
    want = _value_and_grads(_separate_ops, tensors, shape)
    nan_buffers()
    got = _value_and_grads(mi.mamba2_inner, tensors, shape)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("block_bytes", [1, 100_000, 1 << 40], ids=["one-sequence", "two-sequences", "whole-member"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_block_size_changes_no_number(block_bytes, dtype, monkeypatch, nan_buffers):
    """Blocks of one, two (the last one short: 5 sequences a member) or all of a member's
    sequences: every value and gradient is the separate ops' bit for bit, the weight
    gradients included (they accumulate across blocks)."""
    _needs_c()
    sizes = dict(e=2, b=5, t=32, h=2, p=16, n=32)  # 32 · (130 + 192 + 64) · 4 bytes = 49 KB a float32 sequence
    tensors, shape = _inputs(dtype, **sizes)
    want = _value_and_grads(_separate_ops, tensors, shape)
    monkeypatch.setattr(mi, "CACHE_BLOCK_BYTES", block_bytes)
    blk = mi._sequences_per_block(32, 130, 96, 32, tensors[0].element_size(), 5)
    assert blk == {1: 1, 100_000: 2 if dtype == torch.float32 else 1, 1 << 40: 5}[block_bytes]
    nan_buffers()
    got = _value_and_grads(mi.mamba2_inner, tensors, shape)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_gradcheck():
    _needs_c()
    tensors, (h, p, n) = _inputs(torch.float64, e=2, b=2, t=6, h=2, p=3, n=4, k=3)
    assert torch.autograd.gradcheck(lambda *a: mi.mamba2_inner(*a, 1e-5, h, p, n), tuple(tensors), eps=1e-6, atol=1e-6)


def test_without_c_kernels_it_is_the_reference(monkeypatch):
    monkeypatch.setenv(C_KERNELS_ENV, "0")
    tensors, shape = _inputs(torch.float64)
    assert not mi.mamba2_inner_applies(tensors[0])
    for g, w in zip(_value_and_grads(mi.mamba2_inner, tensors, shape), _value_and_grads(mi.mamba2_inner_ref, tensors, shape)):
        assert torch.equal(g, w)


def test_shapes_that_do_not_fit_are_named():
    tensors, (h, p, n) = _inputs(torch.float64)
    with pytest.raises(ValueError, match="norm_w"):
        mi.mamba2_inner(*tensors[:6], tensors[6][:, :-1], None, h, p, n)


def test_the_stack_trains_through_it_and_equals_the_separate_ops(monkeypatch):
    """A stack of budget-layout models trained from zero states runs the fused op, and its
    steps equal those of the separate ops bit for bit."""
    _needs_c()
    import dynlab.lm.train.stack as stack_module
    from dynlab.bench.lm import _sources, lm_bench_model
    from dynlab.lm.train.ensemble import fit_ensemble

    data = torch.randint(0, 256, (20_000,), generator=torch.Generator().manual_seed(0))
    calls = []
    fused = stack_module.mamba2_inner

    def counted(*a, **k):
        calls.append(1)
        return fused(*a, **k)

    def train(use_fused: bool):
        monkeypatch.setattr(stack_module, "mamba2_inner", counted)
        if not use_fused:
            monkeypatch.setattr(stack_module, "mamba2_inner_applies", lambda *a: False)
        models = [lm_bench_model(16, seed) for seed in range(3)]
        src = _sources(3, data, 4, 16)
        fit_ensemble(models, [s[0] for s in src], [s[1] for s in src], [s[2] for s in src], steps=3, batch_size=4, threads=1)
        monkeypatch.undo()
        return [torch.cat([q.detach().reshape(-1) for q in m.parameters()]) for m in models]

    plain = train(False)
    assert not calls
    with_fused = train(True)
    assert calls  # the path was taken
    for a, b in zip(with_fused, plain):
        assert torch.equal(a, b)
