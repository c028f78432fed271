"""The fused diagonal (Mamba-style) tracker loss equals the same model written with plain autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dynlab.tracking.spec import ModelSpec
from dynlab.kernels.tracker_loss import diagonal as diagonal_tracker
from dynlab.kernels.tracker_loss.diagonal import diagonal_tracker_loss, diagonal_tracker_loss_ref
from dynlab.kernels.tracker_loss.common import BUFFERS
from dynlab.tracking.train.engine import build_tracker, fused_kind, tracker_logits, tracker_loss

D = torch.float64


@pytest.fixture(params=["compiled", "torch"], autouse=True)
def loops(request, monkeypatch):
    """Every test runs twice: with the compiled C loops (when a compiler is here) and with
    the torch loops (``DYNLAB_C_KERNELS=0``), which must compute the same function."""
    if request.param == "torch":
        monkeypatch.setenv("DYNLAB_C_KERNELS", "0")
    elif diagonal_tracker._c_kernels() is None:
        pytest.skip("no C compiler here: only the torch loops run")
    return request.param


def test_the_compiled_loops_are_built_where_a_compiler_exists(loops, monkeypatch):
    """Where a C compiler is installed (this project's machines and CI) the compiled path is
    the one that runs; ``DYNLAB_C_KERNELS=0`` turns it off."""
    import shutil

    from dynlab.kernels.compiled import c_library_status

    if loops == "compiled":
        pytest.skip("checked once")
    assert c_library_status("diagonal_tracker", diagonal_tracker._C_SOURCE).startswith("disabled")
    monkeypatch.delenv("DYNLAB_C_KERNELS")
    if shutil.which("cc") or shutil.which("gcc") or shutil.which("clang"):
        assert c_library_status("diagonal_tracker", diagonal_tracker._C_SOURCE).startswith("compiled: ")


def _problem(n=3, b=5, t=7, v=4, h=6, k=3, c=5, seed=0, dtype=D):
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, v, (n, b, t), generator=g)
    lab = torch.randint(0, c, (n, b, t), generator=g)
    lab[min(1, n - 1), :, 5:] = -100  # padding, as a member with a shorter curriculum has
    lab[0, 0, :2] = -100
    a = torch.rand(n, v, h, k, generator=g, dtype=dtype) * 2 - 1  # any sign (negative-mamba)
    b_ = torch.randn(n, v, h, k, generator=g, dtype=dtype)
    C = torch.randn(n, v, k, generator=g, dtype=dtype)
    gate = torch.randn(n, v, h, generator=g, dtype=dtype)
    e = torch.randn(n, v, h, generator=g, dtype=dtype)
    W = torch.randn(n, c, h, generator=g, dtype=dtype)
    cb = torch.randn(n, c, generator=g, dtype=dtype)
    return tok, lab, [x.requires_grad_() for x in (a, b_, C, gate, e, W, cb)]


def _complex_problem(n=3, b=5, t=7, v=4, h=6, c=5, seed=0, dtype=torch.complex128):
    g = torch.Generator().manual_seed(seed)
    real = torch.float64 if dtype == torch.complex128 else torch.float32
    tok = torch.randint(0, v, (n, b, t), generator=g)
    lab = torch.randint(0, c, (n, b, t), generator=g)
    lab[min(1, n - 1), :, 5:] = -100
    rot = torch.polar(torch.rand(n, v, h, generator=g, dtype=real), torch.rand(n, v, h, generator=g, dtype=real) * 6)
    parts = [rot.to(dtype)] + [torch.randn(n, v, h, generator=g, dtype=dtype) for _ in range(2)]  # a, b, C
    parts += [torch.randn(n, v, h, generator=g, dtype=real) for _ in range(2)]  # g, e
    parts += [torch.randn(n, c, h, generator=g, dtype=real), torch.randn(n, c, generator=g, dtype=real)]
    return tok, lab, [x.requires_grad_() for x in parts]


@pytest.mark.parametrize("form", ["real", "complex"])
@pytest.mark.parametrize("together", [False, True])
def test_fused_loss_and_gradients_match_autograd(form, together, monkeypatch):
    """Members one by one (the CPU's groups) and the whole stack as one group (a GPU's);
    real states (mamba) and complex states (mamba3, aussm; gradients of complex tensors as
    torch defines them, ∂L/∂Re + i·∂L/∂Im)."""
    if together:
        monkeypatch.setattr(diagonal_tracker, "member_groups", lambda n, device: [slice(0, n)])
    tok, lab, params = _problem() if form == "real" else _complex_problem()
    weights = torch.tensor([1.0, -2.0, 0.5], dtype=D)  # a different upstream gradient per model
    loss, hits = diagonal_tracker_loss(tok, lab, *params)
    got = torch.autograd.grad((loss * weights).sum(), params)
    ref_loss, ref_hits = diagonal_tracker_loss_ref(tok, lab, *params)
    want = torch.autograd.grad((ref_loss * weights).sum(), params)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    assert torch.equal(hits, ref_hits)
    for name, x, y in zip("a b C g e W c".split(), got, want):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12, msg=name)


def test_single_model_form_and_finite_differences():
    tok, lab, params = _problem(n=1, b=3, t=5, v=3, h=2, k=2, c=3, seed=1)
    single = [p[0].detach().requires_grad_() for p in params]
    loss, hits = diagonal_tracker_loss(tok[0], lab[0], *single)
    assert loss.dim() == 0 and hits.dim() == 0
    grads = torch.autograd.grad(loss, single)
    g = torch.Generator().manual_seed(3)
    dirs = [torch.randn(p.shape, generator=g, dtype=D) for p in single]  # a random direction
    eps = 1e-6
    with torch.no_grad():
        up = diagonal_tracker_loss(tok[0], lab[0], *(p + eps * d for p, d in zip(single, dirs)))[0]
        down = diagonal_tracker_loss(tok[0], lab[0], *(p - eps * d for p, d in zip(single, dirs)))[0]
    slope = sum((x * d).sum() for x, d in zip(grads, dirs))
    torch.testing.assert_close((up - down) / (2 * eps), slope, rtol=1e-6, atol=1e-8)


@pytest.fixture
def threads():
    """Set the intra-op thread count inside a test; restored afterwards."""
    old = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(old)


@pytest.mark.parametrize("stack_threads", [1, 2])
def test_members_of_a_stack_are_bit_identical_to_each_alone(threads, stack_threads):
    """One member after another (one thread), or on two Python threads (two intra-op
    threads, each member on one core): every member's loss and gradients are exactly those
    of the member run alone on one thread."""
    tok, lab, params = _problem(n=5, b=16, t=9, v=6, h=8, k=4, c=6, seed=2, dtype=torch.float32)
    threads(stack_threads)
    loss, hits = diagonal_tracker_loss(tok, lab, *params)
    grads = torch.autograd.grad(loss.sum(), params)
    assert torch.get_num_threads() == stack_threads  # restored after the parallel section
    threads(1)
    for i in range(5):
        own = [p[i].detach().requires_grad_() for p in params]
        l_i, h_i = diagonal_tracker_loss(tok[i], lab[i], *own)
        g_i = torch.autograd.grad(l_i, own)
        assert torch.equal(l_i, loss[i]) and torch.equal(h_i, hits[i])
        assert all(torch.equal(x, y[i]) for x, y in zip(g_i, grads)), i


def test_empty_batches_and_bad_input():
    tok, lab, params = _problem()
    loss, hits = diagonal_tracker_loss(tok[:, :, :0], lab[:, :, :0], *params)
    assert torch.equal(loss, torch.zeros(3, dtype=D)) and torch.equal(hits, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids must lie in"):
        diagonal_tracker_loss(tok + 10, lab, *params)
    with pytest.raises(ValueError, match=r"a/b \[N, V, H, K\]"):
        diagonal_tracker_loss(tok, lab, params[0], params[1][:, :, :2], *params[2:])
    loss, _ = diagonal_tracker_loss(tok, lab, *params)
    loss.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        loss.sum().backward()
    loss, _ = diagonal_tracker_loss(tok, lab, *params)
    with pytest.raises(RuntimeError, match="first derivatives only"):
        torch.autograd.grad(loss.sum(), params, create_graph=True)
    BUFFERS.clear()


@pytest.mark.parametrize("arch", ["mamba", "negative-mamba", "mamba3", "aussm"])
def test_tracker_loss_runs_the_kernel_and_equals_the_models_own_loss(arch):
    """For a Mamba tracker ``tracker_loss`` (the kernel) equals cross-entropy of the model's
    logits, value and gradients of every parameter (its readout, decay and input
    projections): the tables carry the cell's own precompute and readout."""
    model = build_tracker(ModelSpec(arch=arch, hidden=8, d_state=3), 6, 6, seed=4).double()
    assert fused_kind(model).startswith("diagonal")
    g = torch.Generator().manual_seed(5)
    tok, lab = torch.randint(0, 6, (4, 12), generator=g), torch.randint(0, 6, (4, 12), generator=g)
    loss, acc = tracker_loss(model, tok, lab)
    got = torch.autograd.grad(loss, list(model.parameters()))
    logits = model(tok).logits
    ref = F.cross_entropy(logits.flatten(0, 1), lab.flatten())
    want = torch.autograd.grad(ref, list(model.parameters()))
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    assert acc.item() == (logits.argmax(-1) == lab).double().mean().item()
    for (name, _), x, y in zip(model.named_parameters(), got, want):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12, msg=name)
    torch.testing.assert_close(tracker_logits(model, tok), logits, rtol=1e-12, atol=1e-12)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("form", ["real", "complex"])
def test_cuda_runs_the_whole_stack_and_agrees_with_the_cpu(form):
    if form == "real":
        tok, lab, params = _problem(dtype=torch.float32)
    else:
        tok, lab, params = _complex_problem(dtype=torch.complex64)
    loss, _ = diagonal_tracker_loss(tok, lab, *params)
    grads = torch.autograd.grad(loss.sum(), params)
    cuda = [p.detach().cuda().requires_grad_() for p in params]
    loss_c, _ = diagonal_tracker_loss(tok.cuda(), lab.cuda(), *cuda)
    grads_c = torch.autograd.grad(loss_c.sum(), cuda)
    torch.testing.assert_close(loss_c.cpu(), loss, rtol=1e-4, atol=1e-4)
    for x, y in zip(grads_c, grads):
        torch.testing.assert_close(x.cpu(), y, rtol=1e-3, atol=1e-4)


def test_complex_form_finite_differences_and_stack_identity(threads):
    threads(1)
    tok, lab, params = _complex_problem(n=1, b=3, t=5, v=3, h=2, c=3, seed=1)
    single = [p[0].detach().requires_grad_() for p in params]
    loss, _ = diagonal_tracker_loss(tok[0], lab[0], *single)
    grads = torch.autograd.grad(loss, single)
    g = torch.Generator().manual_seed(3)
    dirs = [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in single]
    eps = 1e-6
    with torch.no_grad():
        up = diagonal_tracker_loss(tok[0], lab[0], *(p + eps * d for p, d in zip(single, dirs)))[0]
        down = diagonal_tracker_loss(tok[0], lab[0], *(p - eps * d for p, d in zip(single, dirs)))[0]
    slope = sum((x.conj() * d).real.sum() if x.is_complex() else (x * d).sum() for x, d in zip(grads, dirs))
    torch.testing.assert_close((up - down) / (2 * eps), slope, rtol=1e-6, atol=1e-8)
    tok, lab, params = _complex_problem(n=3, b=8, t=6, v=5, h=4, c=4, seed=2, dtype=torch.complex64)
    loss, hits = diagonal_tracker_loss(tok, lab, *params)
    grads = torch.autograd.grad(loss.sum(), params)
    for i in range(3):
        own = [p[i].detach().requires_grad_() for p in params]
        l_i, h_i = diagonal_tracker_loss(tok[i], lab[i], *own)
        assert torch.equal(l_i, loss[i]) and torch.equal(h_i, hits[i])
        assert all(torch.equal(x, y[i]) for x, y in zip(torch.autograd.grad(l_i, own), grads)), i


@pytest.mark.parametrize("form", ["real", "complex"])
def test_no_unwritten_memory_is_read(nan_buffers, form):
    """Every scratch buffer starts as NaN; two passes (the second on buffers handed back by
    the first) still give the reference's loss and gradients."""
    tok, lab, params = _problem() if form == "real" else _complex_problem()
    ref_loss, ref_hits = diagonal_tracker_loss_ref(tok, lab, *params)
    want = torch.autograd.grad(ref_loss.sum(), params)
    nan_buffers()
    for _ in range(2):
        loss, hits = diagonal_tracker_loss(tok, lab, *params)
        got = torch.autograd.grad(loss.sum(), params)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
        assert torch.equal(hits, ref_hits)
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


def test_an_input_changed_in_place_before_backward_is_refused():
    """The kernel keeps its inputs as plain references; changing one in place between
    forward and backward is refused, as autograd refuses it for saved tensors."""
    tok, lab, params = _problem()
    W = params[5]
    loss, _ = diagonal_tracker_loss(tok, lab, *params)
    with torch.no_grad():
        W.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        loss.sum().backward()
    BUFFERS.clear()


# --- evaluation stream: logits and final state from a given state, no gradient ---------------


@pytest.mark.parametrize("form, k", [("real", 3), ("real", 1), ("complex", None)])
def test_logits_kernel_equals_the_plain_loop_and_carries_state(form, k):
    """``diagonal_tracker_logits`` (compiled or torch loop) equals the reference written out
    here (one step at a time from the given state), and streaming two pieces with the
    state carried equals one whole piece."""
    tok, _, parts = _complex_problem(n=1, b=4, t=9) if form == "complex" else _problem(n=1, b=4, t=9, k=k)
    a, b, C, g, e, W, c = (x.detach()[0] for x in parts)
    tok = tok[0]
    gen = torch.Generator().manual_seed(3)
    if form == "complex":
        h0 = torch.randn(4, a.shape[1], generator=gen, dtype=torch.complex128)
    else:
        h0 = torch.randn(4, *a.shape[1:], generator=gen, dtype=D)
    keep = h0.clone()
    state, ref, ref_h, ref_y = h0.clone(), [], [], []
    for t in range(tok.shape[1]):
        x = tok[:, t]
        state = a[x] * state + b[x]
        read = (C[x] * state).real if form == "complex" else (state * C[x][:, None, :]).sum(-1)
        ref.append((g[x] * read + e[x]) @ W.T + c)
        ref_h.append(state)
        ref_y.append(g[x] * read + e[x])
    ref = torch.stack(ref, 1)
    z, final = diagonal_tracker.diagonal_tracker_logits(tok, a, b, C, g, e, W, c, h0)
    torch.testing.assert_close(z, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(final, state, rtol=1e-12, atol=1e-12)
    out = diagonal_tracker.diagonal_tracker_stream(tok, a, b, C, g, e, W, c, h0, logits=False, states=True, features=True)
    assert out.logits is None
    torch.testing.assert_close(out.states, torch.stack(ref_h, 1), rtol=1e-12, atol=1e-12)  # the cell's layout
    torch.testing.assert_close(out.features, torch.stack(ref_y, 1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.final, state, rtol=1e-12, atol=1e-12)
    z1, mid = diagonal_tracker.diagonal_tracker_logits(tok[:, :4], a, b, C, g, e, W, c, h0)
    z2, end = diagonal_tracker.diagonal_tracker_logits(tok[:, 4:], a, b, C, g, e, W, c, mid)
    torch.testing.assert_close(torch.cat([z1, z2], 1), z, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(end, final, rtol=1e-12, atol=1e-12)
    assert torch.equal(h0, keep)  # the caller's state is not written
    with pytest.raises(ValueError, match="state must be"):
        diagonal_tracker.diagonal_tracker_logits(tok, a, b, C, g, e, W, c, h0[:, :1])


@pytest.mark.parametrize("arch, hidden, d_state", [
    ("mamba", 8, 3), ("mamba", 8, 1), ("mamba", 1, 3), ("negative-mamba", 8, 3), ("mamba3", 8, 3), ("mamba3", 1, 3),
    ("aussm", 8, 3), ("tanh-rnn", 8, 3),
])
def test_tracker_stream_equals_the_models_forward(arch, hidden, d_state, loops):
    """``tracker_stream`` is ``model(tokens, state)``: logits and the final state in the
    cell's own layout, from a nonzero state (what evaluation carries from chunk to chunk);
    ``tracker_states`` gives its states and readout features (what the analyses stream),
    ``tracker_features`` the features without the states; the caller's state is left as it was."""
    from dynlab.tracking.models import streams
    from dynlab.tracking.models.streams import tracker_features, tracker_states, tracker_stream

    model = build_tracker(ModelSpec(arch=arch, hidden=hidden, d_state=d_state), 5, 5, seed=1).double()
    gen = torch.Generator().manual_seed(0)
    tok = torch.randint(0, 5, (6, 23), generator=gen)
    s0 = torch.randn(6, model.state_size, generator=gen, dtype=D) * 0.5
    keep = s0.clone()
    compiled = streams._diagonal_stream(model, tok, s0.clone()) is not None
    assert compiled == (loops == "compiled" and arch != "tanh-rnn")  # the compiled stream is what ran
    out = model(tok, s0, return_states=True, return_features=True)
    z, final = tracker_stream(model, tok, s0)
    torch.testing.assert_close(z, out.logits, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, out.final_state, rtol=1e-10, atol=1e-10)
    states, feats, final = tracker_states(model, tok, s0)
    torch.testing.assert_close(states, out.states, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(feats, out.features, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, out.final_state, rtol=1e-10, atol=1e-10)
    feats, final = tracker_features(model, tok, s0)
    torch.testing.assert_close(feats, out.features, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, out.final_state, rtol=1e-10, atol=1e-10)
    assert torch.equal(s0, keep)  # also where the state's transpose is already contiguous (H or K = 1)
    z0, f0 = tracker_stream(model, tok[:0], s0[:0])  # an empty batch, as the forward takes it
    assert z0.shape == (0, 23, 5) and f0.shape == (0, model.state_size)


def test_evaluation_is_the_same_through_the_stream_kernel(monkeypatch):
    """``evaluate_lengths`` of a Mamba tracker gives the same accuracies through the
    compiled stream as through the model's forward (float64, so no argmax tie can differ)."""
    from dynlab.tracking.evaluate import evaluate_lengths
    from dynlab.tracking.groups import get_group
    from dynlab.tracking.models import streams
    from dynlab.tracking.task import WordProblem

    task = WordProblem(get_group("S3"))
    model = build_tracker(ModelSpec(arch="mamba", hidden=8), task.n_tokens, task.n_classes, seed=2).double()
    fast = evaluate_lengths(model, task, [3, 10, 40], n_samples=20, batch_size=8, chunk=7, seed=0)
    calls = []

    def forward_only(m, tokens, state=None):
        calls.append(1)
        out = m(tokens, state)
        return out.logits, out.final_state

    monkeypatch.setattr(streams, "tracker_stream", forward_only)
    import dynlab.tracking.evaluate as ev

    monkeypatch.setattr(ev, "tracker_stream", forward_only)
    slow = evaluate_lengths(model, task, [3, 10, 40], n_samples=20, batch_size=8, chunk=7, seed=0)
    assert calls  # the second run went through the forward
    for name in ("acc_final", "acc_all", "acc_dense"):
        assert (getattr(fast, name) == getattr(slow, name)).all(), name
