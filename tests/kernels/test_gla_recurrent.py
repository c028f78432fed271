"""GLA's recurrence in C loops (the LM stacks' GLA layer) against the step-by-step reference."""

from __future__ import annotations

import pytest
import torch

from dynlab.kernels.compiled import C_KERNELS_ENV
from dynlab.kernels.gla import recurrent as rc
from dynlab.kernels.gla.chunked import gla_chunked, gla_ref

TOL = {torch.float64: dict(rtol=1e-11, atol=1e-11), torch.float32: dict(rtol=2e-5, atol=2e-5)}


@pytest.fixture(params=["c", "torch"], ids=["c-loops", "fallback"])
def backend(request, monkeypatch):
    """The C loops, and without them (``DYNLAB_C_KERNELS=0``) the chunked torch form."""
    if request.param == "torch":
        monkeypatch.setenv(C_KERNELS_ENV, "0")
    else:
        monkeypatch.delenv(C_KERNELS_ENV, raising=False)
        if rc.c_library() is None:
            pytest.skip(f"compiled GLA recurrence {rc.compiled_kernel_status()}")
    return request.param


def _inputs(dtype, b=3, t=11, h=2, dk=6, dv=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(b, t, h, dk, generator=g, dtype=dtype), torch.randn(b, t, h, dk, generator=g, dtype=dtype)
    v = torch.randn(b, t, h, dv, generator=g, dtype=dtype)
    gk = torch.nn.functional.logsigmoid(torch.randn(b, t, h, dk, generator=g, dtype=dtype))
    h0 = torch.randn(b, h, dk, dv, generator=g, dtype=dtype)
    return [q, k, v, gk, h0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("with_init", [False, True], ids=["zero-init", "with-init"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "slices"])
def test_outputs_states_and_gradients_match_the_reference(backend, dtype, with_init, strided):
    """Outputs, final states and the gradients of every input (the initial state's too)
    against gla_ref through autograd, with q, k, v read in place as slices of one wider
    tensor (the split of a projection) or contiguous."""
    q, k, v, gk, h0 = _inputs(dtype)
    if strided:  # q | k | v as slices of one [B, T, H·(2K + V) + 3] tensor, as the stack's split gives
        b, t, h, dk = q.shape
        wide = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2), torch.zeros(b, t, 3, dtype=dtype)], dim=-1)
        q, k, v = (wide[..., a:a + n].unflatten(-1, (h, -1)) for a, n in ((0, h * dk), (h * dk, h * dk),
                                                                          (2 * h * dk, h * v.shape[-1])))
        assert q.stride(1) == wide.shape[-1] and not q.is_contiguous()
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, gk, h0)]
    refs = [x.detach().clone().requires_grad_() for x in (q, k, v, gk, h0)]
    o, s = rc.gla_recurrent(*leaves[:4], None, leaves[4] if with_init else None, True)
    o_ref, s_ref = gla_ref(*refs[:4], None, refs[4] if with_init else None, True)
    torch.testing.assert_close(o, o_ref, **TOL[dtype])
    torch.testing.assert_close(s, s_ref, **TOL[dtype])
    g = torch.Generator().manual_seed(1)
    wo, ws = torch.randn(o.shape, generator=g, dtype=dtype), torch.randn(s.shape, generator=g, dtype=dtype)
    ((o * wo).sum() + (s * ws).sum()).backward()
    ((o_ref * wo).sum() + (s_ref * ws).sum()).backward()
    for a, r in zip(leaves[:4] + ([leaves[4]] if with_init else []), refs[:4] + ([refs[4]] if with_init else [])):
        torch.testing.assert_close(a.grad, r.grad, **TOL[dtype])


def test_only_the_output_or_only_the_final_state_used(backend):
    """An unused output gets no gradient (a null one in the C loops): each alone still
    matches the reference's gradients."""
    q, k, v, gk, h0 = _inputs(torch.float64)
    for pick in (0, 1):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, gk, h0)]
        refs = [x.clone().requires_grad_() for x in (q, k, v, gk, h0)]
        rc.gla_recurrent(*leaves[:4], 0.5, leaves[4], True)[pick].square().sum().backward()
        gla_ref(*refs[:4], 0.5, refs[4], True)[pick].square().sum().backward()
        for a, r in zip(leaves, refs):  # q does not reach the final state: None or zeros
            got, want = (torch.zeros_like(a) if x.grad is None else x.grad for x in (a, r))
            torch.testing.assert_close(got, want, **TOL[torch.float64])


def test_gradcheck(backend):
    q, k, v, gk, h0 = (x[:1, :5].double().requires_grad_() if x.dim() == 4 and x.shape[1] == 11
                       else x[:1].double().requires_grad_() for x in _inputs(torch.float64))
    assert torch.autograd.gradcheck(lambda *a: rc.gla_recurrent(*a[:4], 0.7, a[4], True), (q, k, v, gk, h0))


def test_a_decay_of_one_sums_and_of_zero_forgets():
    """Closed forms: with gk = 0 the state is h0 + Σ k_s v_sᵀ; with gk = −inf it is k_t v_tᵀ."""
    q, k, v, gk, h0 = _inputs(torch.float64, t=4)
    _, s = rc.gla_recurrent(q, k, v, torch.zeros_like(gk), None, h0, True)
    torch.testing.assert_close(s, h0 + torch.einsum("bthk,bthv->bhkv", k, v), rtol=1e-12, atol=1e-12)
    o, s = rc.gla_recurrent(q, k, v, torch.full_like(gk, -float("inf")), 1.0, h0, True)
    torch.testing.assert_close(s, torch.einsum("bhk,bhv->bhkv", k[:, -1], v[:, -1]), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(o, torch.einsum("bthk,bthk,bthv->bthv", q, k, v), rtol=1e-12, atol=1e-12)


def test_bad_initial_state_is_named():
    q, k, v, gk, h0 = _inputs(torch.float64)
    with pytest.raises(ValueError, match=r"initial_state must be \[B, H, K, V\]"):
        rc.gla_recurrent(q, k, v, gk, None, h0[:, :1])


def test_an_empty_batch_or_sequence(backend):
    """No sequences: empty outputs and states; no steps: the initial state comes back."""
    q, k, v, gk, h0 = _inputs(torch.float64)
    o, s = rc.gla_recurrent(*(x[:, :0] for x in (q, k, v, gk)), None, h0, True)
    assert o.shape == (3, 0, 2, 5) and torch.equal(s, h0)
    o, s = rc.gla_recurrent(*(x[:0] for x in (q, k, v, gk)), None, h0[:0], True)
    assert o.shape == (0, 11, 2, 5) and s.shape == (0, 2, 6, 5)


def test_each_input_read_with_its_own_row_stride(backend):
    """q, k, v and gk as slices of four tensors of different widths (four row strides): a
    kernel that read one input with another's stride would not match the reference."""
    q, k, v, gk, h0 = _inputs(torch.float64)
    b, t, h = q.shape[:3]
    slices = []
    for x, extra in zip((q, k, v, gk), (1, 4, 7, 10)):
        wide = torch.cat([torch.zeros(b, t, extra, dtype=x.dtype), x.flatten(2)], dim=-1)
        slices.append(wide[..., extra:].unflatten(-1, (h, -1)))
    assert len({s.stride(1) for s in slices}) == 4
    leaves = [s.detach().clone().requires_grad_() for s in slices]
    refs = [x.clone().requires_grad_() for x in (q, k, v, gk)]
    o, s = rc.gla_recurrent(*leaves, 0.6, h0, True)
    o_ref, s_ref = gla_ref(*refs, 0.6, h0, True)
    torch.testing.assert_close(o, o_ref, **TOL[torch.float64])
    torch.testing.assert_close(s, s_ref, **TOL[torch.float64])
    (o.square().sum() + s.sum()).backward()
    (o_ref.square().sum() + s_ref.sum()).backward()
    for a, r in zip(leaves, refs):
        torch.testing.assert_close(a.grad, r.grad, **TOL[torch.float64])


@pytest.mark.parametrize("form", ["recurrent", "chunked", "ref"])
def test_mixed_dtypes_are_promoted(backend, form):
    """float32 inputs with a float64 initial state, or a float64 v: computed in float64
    (torch's promotion), by every GLA form alike."""
    fn = {"recurrent": rc.gla_recurrent, "chunked": gla_chunked, "ref": gla_ref}[form]
    q, k, v, gk, h0 = _inputs(torch.float32)
    for args in ((q, k, v, gk, None, h0.double()), (q, k, v.double(), gk, None, h0)):
        o, s = fn(*args, True)
        o_ref, s_ref = gla_ref(*(x.double() for x in args[:4]), None, args[5].double(), True)
        assert o.dtype == s.dtype == torch.float64
        torch.testing.assert_close(o, o_ref, **TOL[torch.float64])
        torch.testing.assert_close(s, s_ref, **TOL[torch.float64])
