"""Mamba-1 selective scan: the fused scan (C kernel and torch loop) against the reference, split-and-carry, closed form."""

from __future__ import annotations

import math

import pytest
import torch

from dynlab.kernels.selective_scan import chunked as ss
from dynlab.kernels.selective_scan.chunked import selective_scan_fused, selective_scan_ref

TOL = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=2e-4, atol=2e-5)}


@pytest.fixture(params=["c", "c-recompute", "torch"], ids=["c-kernel", "c-kernel-recompute", "torch-loop"])
def fused_backend(request, monkeypatch):
    """Runs a test of :func:`selective_scan_fused` on the compiled C kernel (keeping the decays
    for the backward pass, and recomputing them there) and on the torch loop."""
    if request.param == "torch":
        monkeypatch.setenv(ss.C_KERNELS_ENV, "0")
    else:
        monkeypatch.delenv(ss.C_KERNELS_ENV, raising=False)
        if ss._c_library() is None:
            pytest.skip(f"compiled selective scan {ss.compiled_kernel_status()}")
        if request.param == "c-recompute":
            monkeypatch.setattr(ss, "SAVE_DECAYS_MAX_BYTES", 0)
    return request.param


def _inputs(dtype: torch.dtype, b: int = 2, t: int = 31, d: int = 5, n: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(b, t, d, generator=g, dtype=dtype)
    delta = torch.nn.functional.softplus(torch.randn(b, t, d, generator=g, dtype=dtype) - 1.0)
    A = -torch.exp(torch.randn(d, n, generator=g, dtype=dtype))
    B = torch.randn(b, t, n, generator=g, dtype=dtype)
    C = torch.randn(b, t, n, generator=g, dtype=dtype)
    h0 = torch.randn(b, d, n, generator=g, dtype=dtype)
    return [u, delta, A, B, C, h0]


@pytest.mark.parametrize("impl", [selective_scan_ref, selective_scan_fused], ids=["ref", "fused"])
@pytest.mark.parametrize("k", [1, 16, 30], ids=lambda k: f"split{k}")
def test_split_and_carry(impl, k):
    u, delta, A, B, C, h0 = _inputs(torch.float64)
    y, s = impl(u, delta, A, B, C, initial_state=h0, return_final_state=True)
    y1, s1 = impl(u[:, :k], delta[:, :k], A, B[:, :k], C[:, :k], initial_state=h0, return_final_state=True)
    y2, s2 = impl(u[:, k:], delta[:, k:], A, B[:, k:], C[:, k:], initial_state=s1, return_final_state=True)
    torch.testing.assert_close(torch.cat([y1, y2], dim=1), y, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s2, s, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", [selective_scan_ref, selective_scan_fused], ids=["ref", "fused"])
def test_closed_form_per_channel_decay(impl):
    """Two channels with decays a_d, constant input c, Δ = B = C = 1: h_T[d] = a_d^T h0 + c (1 − a_d^T)/(1 − a_d)."""
    decays, c, h0, T = [0.5, 0.95], 0.3, -1.0, 25
    u = torch.full((1, T, 2), c, dtype=torch.float64)
    A = torch.tensor([[math.log(a)] for a in decays], dtype=torch.float64)  # [D=2, N=1]
    ones = torch.ones(1, T, 1, dtype=torch.float64)
    _, s = impl(u, torch.ones(1, T, 2, dtype=torch.float64), A, ones, ones,
                initial_state=torch.full((1, 2, 1), h0, dtype=torch.float64), return_final_state=True)
    for d, a in enumerate(decays):
        assert s[0, d, 0].item() == pytest.approx(a**T * h0 + c * (1 - a**T) / (1 - a), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("impl", [selective_scan_ref, selective_scan_fused], ids=["ref", "fused"])
def test_bad_shape_raises(impl):
    u, delta, A, B, C, _ = _inputs(torch.float64)
    with pytest.raises(ValueError, match="A must be"):
        impl(u, delta, A[:2], B, C)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("with_init", [False, True], ids=["zero-init", "with-init"])
@pytest.mark.parametrize("outputs", ["y-and-state", "y-only", "state-only"])
def test_fused_matches_ref_outputs_states_gradients(dtype, with_init, outputs, nan_buffers, fused_backend):
    """The hand-written backward (C kernel and torch loop), with every buffer it allocates NaN-poisoned."""
    leaves = [a.requires_grad_() for a in _inputs(dtype)]
    u, delta, A, B, C, h0 = leaves
    init = h0 if with_init else None
    y_ref, s_ref = selective_scan_ref(u, delta, A, B, C, initial_state=init, return_final_state=True)
    g = torch.Generator().manual_seed(2)
    wy, ws = torch.randn(y_ref.shape, generator=g, dtype=dtype), torch.randn(s_ref.shape, generator=g, dtype=dtype)
    used = leaves if with_init else leaves[:-1]
    def loss_of(y, s):
        return ((y * wy).sum() if outputs != "state-only" else 0) + ((s * ws).sum() if outputs != "y-only" else 0)

    loss_ref = loss_of(y_ref, s_ref)
    g_ref = torch.autograd.grad(loss_ref, used, materialize_grads=True)  # C is unused when only the state counts
    nan_buffers()
    y, s = selective_scan_fused(u, delta, A, B, C, initial_state=init, return_final_state=True)
    torch.testing.assert_close(y, y_ref, **TOL[dtype])
    torch.testing.assert_close(s, s_ref, **TOL[dtype])
    loss = loss_of(y, s)
    for name, a, b in zip(("u", "delta", "A", "B", "C", "h0"), torch.autograd.grad(loss, used, materialize_grads=True), g_ref):
        torch.testing.assert_close(a, b, **TOL[dtype], msg=f"grad {name}")


def test_fused_empty_sequence_returns_the_initial_state(fused_backend):
    u, delta, A, B, C, h0 = _inputs(torch.float64, t=0)
    y, s = selective_scan_fused(u, delta, A, B, C, initial_state=h0, return_final_state=True)
    assert y.shape == (2, 0, 5)
    torch.testing.assert_close(s, h0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_fused_long_sequence_strided_inputs_and_lm_sizes(dtype, fused_backend):
    """Non-contiguous inputs, strong decays (Δ·A down to −60) and N = 64 (the vector loop's
    full width plus remainders at D = 7): values and gradients equal the reference."""
    g = torch.Generator().manual_seed(5)
    b, t, d, n = 3, 40, 7, 67
    u = torch.randn(b, d, t, generator=g, dtype=dtype).transpose(1, 2)  # strided [B, T, D]
    delta = torch.nn.functional.softplus(torch.randn(b, t, d, generator=g, dtype=dtype)) * 2.0
    A = -torch.exp(torch.randn(d, n, generator=g, dtype=dtype) * 1.5)
    B, C = (torch.randn(b, n, t, generator=g, dtype=dtype).transpose(1, 2) for _ in range(2))
    h0 = torch.randn(b, d, n, generator=g, dtype=dtype)
    leaves = [a.requires_grad_() for a in (u, delta, A, B, C, h0)]
    y_ref, s_ref = selective_scan_ref(*leaves, return_final_state=True)
    y, s = selective_scan_fused(*leaves, return_final_state=True)
    torch.testing.assert_close(y, y_ref, **TOL[dtype])
    torch.testing.assert_close(s, s_ref, **TOL[dtype])
    wy = torch.randn(y.shape, generator=g, dtype=dtype)
    for a, r in zip(torch.autograd.grad((y * wy).sum() + s.sum(), leaves),
                    torch.autograd.grad((y_ref * wy).sum() + s_ref.sum(), leaves)):
        torch.testing.assert_close(a, r, **TOL[dtype])


def test_c_kernel_exp_matches_torch_exp_to_two_ulp():
    """The C kernel's own float32 exp, read off a one-step scan (B = 0, h0 = 1: the final state
    is exp(Δ·A)): within 2 ulp of exp in float64 over [−87, 88], 0 below ln(FLT_MIN) ≈ −87.34
    (no denormals), inf above 88.73."""
    if ss._c_library() is None:
        pytest.skip(f"compiled selective scan {ss.compiled_kernel_status()}")
    x = torch.cat([torch.linspace(-87.0, 88.0, 100_001), torch.tensor([-110.0, -87.4, 88.8, 0.0])])
    m = x.numel()
    zeros = torch.zeros(1, 1, 1)
    _, s = selective_scan_fused(torch.zeros(1, 1, m), torch.ones(1, 1, m), x[:, None], zeros, zeros,
                                initial_state=torch.ones(1, m, 1), return_final_state=True)
    got, ref = s[0, :, 0].double(), torch.exp(x.double())
    ulp = torch.finfo(torch.float32).eps * ref[:-4]
    assert ((got[:-4] - ref[:-4]).abs() <= 2 * ulp).all()
    assert got[-4:-2].tolist() == [0.0, 0.0] and got[-2].item() == float("inf") and got[-1].item() == 1.0


def test_c_kernel_is_built_where_a_compiler_exists_and_can_be_turned_off(monkeypatch):
    """Where a C compiler is installed (this project's machines and CI) the compiled kernel is
    the one that runs, so its tests above do not skip; ``DYNLAB_C_KERNELS=0`` turns it off."""
    import shutil

    monkeypatch.delenv(ss.C_KERNELS_ENV, raising=False)
    if shutil.which("cc") or shutil.which("gcc") or shutil.which("clang"):
        assert ss.compiled_kernel_status().startswith("compiled: ")
    monkeypatch.setenv(ss.C_KERNELS_ENV, "0")
    assert ss.compiled_kernel_status() == f"disabled: {ss.C_KERNELS_ENV}=0"
    assert ss._c_library() is None


def test_without_a_compiler_the_torch_loop_takes_over(monkeypatch, tmp_path):
    """No C compiler: the status says why, and the fused scan still equals the reference."""
    from dynlab.kernels import compiled

    monkeypatch.setattr(compiled, "_LOADED", {})
    monkeypatch.delenv(ss.C_KERNELS_ENV, raising=False)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # nothing built there yet
    monkeypatch.setattr(compiled.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    status = ss.compiled_kernel_status()
    assert status.startswith("unavailable: ") and ss._c_library() is None
    u, delta, A, B, C, h0 = _inputs(torch.float64)
    y, s = selective_scan_fused(u, delta, A, B, C, initial_state=h0, return_final_state=True)
    y_ref, s_ref = selective_scan_ref(u, delta, A, B, C, initial_state=h0, return_final_state=True)
    torch.testing.assert_close(y, y_ref, **TOL[torch.float64])
    torch.testing.assert_close(s, s_ref, **TOL[torch.float64])


def test_c_kernel_keeps_the_decays_for_the_backward_pass_only_when_it_will_run(monkeypatch):
    """With gradients on, the forward pass keeps exp(Δ_t[d] A[d, n]) in [B, D, T, N] (checked
    against float64); above SAVE_DECAYS_MAX_BYTES it keeps nothing (the backward recomputes)."""
    if ss._c_library() is None:
        pytest.skip(f"compiled selective scan {ss.compiled_kernel_status()}")
    monkeypatch.delenv(ss.C_KERNELS_ENV, raising=False)
    u, delta, A, B, C, h0 = _inputs(torch.float32)
    delta.requires_grad_()
    y = selective_scan_fused(u, delta, A, B, C, initial_state=h0)
    decays = y.grad_fn.saved_tensors[-1]
    expected = torch.exp(delta.detach().double()[..., None] * A.double()).permute(0, 2, 1, 3)  # [B, D, T, N]
    torch.testing.assert_close(decays.double(), expected, rtol=3e-7, atol=0.0)
    monkeypatch.setattr(ss, "SAVE_DECAYS_MAX_BYTES", decays.numel() * 4 - 1)
    assert selective_scan_fused(u, delta, A, B, C, initial_state=h0).grad_fn.saved_tensors[-1].numel() == 0


def test_cache_directory_writable_by_others_is_refused(tmp_path):
    """The kernel's library is only loaded from a private directory (kernels.compiled)."""
    from dynlab.kernels import compiled

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PermissionError, match="not a private directory"):
        compiled._check_private(shared)
    shared.chmod(0o700)
    compiled._check_private(shared)


def _grouped_inputs(dtype: torch.dtype, g: int = 3, b: int = 2, t: int = 17, d: int = 5, n: int = 4):
    per = [_inputs(dtype, b, t, d, n, seed=10 + i) for i in range(g)]
    return [torch.stack([p[j] for p in per]) for j in range(6)]  # u, delta [G, B, T, D], A [G, D, N], ...


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_init", [False, True], ids=["zero-state", "init"])
def test_grouped_is_each_groups_fused_scan_bit_for_bit(dtype, with_init, fused_backend):
    """selective_scan_grouped (one C call over every group's rows, each reading its group's A)
    gives what selective_scan_fused gives group by group: outputs, final states and every
    gradient, A's included, bit for bit (the same loops in the same order); on the torch loop
    it is that loop group by group.  And both agree with the reference."""
    u, delta, A, B, C, h0 = _grouped_inputs(dtype)
    init = h0 if with_init else None
    leaves = [x.clone().requires_grad_() for x in (u, delta, A, B, C, h0)]
    y, fin = ss.selective_scan_grouped(*leaves[:5], leaves[5] if with_init else None)
    gy, gf = torch.randn_like(y), torch.randn_like(fin)
    torch.autograd.backward([y, fin], [gy, gf])
    for i in range(u.shape[0]):
        one = [x[i].clone().requires_grad_() for x in (u, delta, A, B, C, h0)]
        y_i, f_i = selective_scan_fused(*one[:5], initial_state=one[5] if with_init else None, return_final_state=True)
        torch.autograd.backward([y_i, f_i], [gy[i], gf[i]])
        assert torch.equal(y[i], y_i) and torch.equal(fin[i], f_i)
        for leaf, o in zip(leaves[:5], one[:5]):
            assert torch.equal(leaf.grad[i], o.grad)
        if with_init:
            assert torch.equal(leaves[5].grad[i], one[5].grad)
        y_r, f_r = selective_scan_ref(u[i], delta[i], A[i], B[i], C[i], None if init is None else init[i], True)
        torch.testing.assert_close(y_i, y_r, **TOL[dtype])
        torch.testing.assert_close(f_i, f_r, **TOL[dtype])


def test_grouped_bad_shapes_raise():
    u, delta, A, B, C, h0 = _grouped_inputs(torch.float64)
    with pytest.raises(ValueError, match=r"A \[G, D, N\]"):
        ss.selective_scan_grouped(u, delta, A[0], B, C)
    with pytest.raises(ValueError, match="initial_state"):
        ss.selective_scan_grouped(u, delta, A, B, C, h0[:, :1])
    with pytest.raises(ValueError, match="B, C"):
        ss.selective_scan_grouped(u, delta, A, B[..., :2], C)
    with pytest.raises(ValueError, match="delta"):  # the groups and the batch swapped
        ss.selective_scan_grouped(u, delta.transpose(0, 1), A, B, C)
    with pytest.raises(ValueError, match=r"A \(3, 5, 4\)"):  # one channel short
        ss.selective_scan_grouped(u, delta, A[:, :-1], B, C)
