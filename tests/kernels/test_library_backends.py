"""The CUDA library backends' adapters (fla's ``chunk_gla``, causal-conv1d's
``causal_conv1d_fn``) through CPU twins that take the libraries' own arguments and make
their layout checks (:mod:`helpers.library_twins`): each adapter equals dynlab's torch form,
forward and gradients, and the LM mixers and stacks routed through them give the same
losses and gradients as on the torch path. (mamba-ssm's adapters are tested the same way
against mamba-ssm's own references in ``test_mamba_ref.py``.)"""

from __future__ import annotations

import pytest
import torch
from helpers.library_twins import causal_conv1d_fn_twin, chunk_gla_twin

from dynlab.kernels import dispatch
from dynlab.kernels.gla.chunked import gla_chunked
from dynlab.lm.models.mixers import causal_conv
from dynlab.lm.models.model import RecurrentLM
from dynlab.lm.train.stack import LMStack
from dynlab.lm.models.states import CarriedStates

TOL = dict(rtol=2e-4, atol=2e-5)


@pytest.fixture
def twins(monkeypatch):
    """The libraries' kernels replaced by their CPU twins; backends are picked as on CUDA."""
    monkeypatch.setattr(dispatch, "_LIBS", {"fla": {"gla": chunk_gla_twin()},
                                            "causal_conv1d": {"causal_conv": causal_conv1d_fn_twin}})
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)


def _grads(out, leaves, seed=7):
    g = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in out)
    return torch.autograd.grad(loss, [x for x in leaves if x is not None])


@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("with_init", [False, True])
def test_fla_chunk_gla_adapter_equals_dynlab_gla(twins, scale, with_init):
    g = torch.Generator().manual_seed(0)
    b, t, h, k, v = 2, 37, 3, 8, 4
    q, kk = torch.randn(b, t, h, k, generator=g), torch.randn(b, t, h, k, generator=g)
    vv = torch.randn(b, t, h, v, generator=g)
    gk = torch.nn.functional.logsigmoid(torch.randn(b, t, h, k, generator=g) + 2)
    h0 = torch.randn(b, h, k, v, generator=g) if with_init else None
    leaves = [x.requires_grad_() for x in (q, kk, vv, gk, h0) if x is not None]
    o, s = dispatch._gla_fla(q, kk, vv, gk, scale, h0, True)
    o_ref, s_ref = gla_chunked(q, kk, vv, gk, scale, h0, True)
    torch.testing.assert_close(o, o_ref, **TOL)
    torch.testing.assert_close(s, s_ref, **TOL)
    for a, r in zip(_grads((o, s), leaves), _grads((o_ref, s_ref), leaves)):
        torch.testing.assert_close(a, r, **TOL)


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("with_window", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_causal_conv1d_adapter_equals_the_mixers_convolution(twins, width, with_window, with_bias):
    g = torch.Generator().manual_seed(width)
    b, t, c = 3, 11, 16
    x = torch.randn(b, t, c, generator=g)
    w = torch.randn(c, 1, width, generator=g)
    bias = torch.randn(c, generator=g) if with_bias else None
    window = torch.randn(b, c, width - 1, generator=g) if with_window else None
    leaves = [z.requires_grad_() for z in (x, w, bias, window) if z is not None]
    y, new = dispatch.causal_conv1d_silu(x, w, bias, window)
    y_ref, new_ref = causal_conv(x, w, bias, window)
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(new, new_ref, **TOL)
    for a, r in zip(_grads((y, new), leaves), _grads((y_ref, new_ref), leaves)):
        torch.testing.assert_close(a, r, **TOL)


def test_causal_conv1d_adapter_keeps_float32_weights_with_bf16_inputs(twins):
    """Under autocast the projections give bfloat16 inputs and the weights stay float32: the
    kernel takes them so (its bias in the weights' dtype), and their gradients stay float32."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 9, 8, generator=g).bfloat16()
    w, bias, window = torch.randn(8, 1, 4, generator=g), torch.randn(8, generator=g), torch.randn(2, 8, 3, generator=g)
    w.requires_grad_()
    y, new = dispatch.causal_conv1d_silu(x, w, bias, window)
    y_ref, _ = causal_conv(x.float(), w, bias, window)
    assert y.dtype == torch.bfloat16 and new.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), y_ref, rtol=3e-2, atol=3e-2)
    (grad,) = torch.autograd.grad(y.float().sum(), [w])
    assert grad.dtype == torch.float32


def test_causal_conv1d_adapter_gives_the_kernel_standard_strides_for_one_token(twins):
    """A ``[1, 1, C]`` slice of a wider projection is "contiguous" to torch whatever its
    strides; the kernel reads them, so the adapter copies it to the standard ones."""
    g = torch.Generator().manual_seed(4)
    wide = torch.randn(1, 1, 20, generator=g)
    x = wide[..., 4:12]  # strides (20, 20, 1): contiguous, yet stride(0) is not 8's multiple
    w, window = torch.randn(8, 1, 4, generator=g), torch.randn(1, 8, 3, generator=g)
    y, new = dispatch.causal_conv1d_silu(x, w, None, window)
    y_ref, new_ref = causal_conv(x, w, None, window)
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(new, new_ref, **TOL)


def test_conv_backend_is_chosen_only_where_the_kernel_applies(twins, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert dispatch.conv_backend("cuda", torch.bfloat16, 4, 64) == "causal_conv1d"
    assert dispatch.conv_backend("cuda", torch.float32, 5, 64) == "torch"  # width beyond 4
    assert dispatch.conv_backend("cuda", torch.float32, 4, 12) == "torch"  # channels not a multiple of 8
    assert dispatch.conv_backend("cuda", torch.float64, 4, 64) == "torch"
    assert dispatch.conv_backend("cpu", torch.float32, 4, 64) == "torch"
    with dispatch.record_backends() as seen:
        dispatch.conv_backend("cuda", torch.float32, 4, 64)
    assert seen == {"causal_conv": {"causal_conv1d"}}


KW = {
    "mamba2": {"n_heads": 2, "head_dim": 8, "d_state": 8, "chunk_size": 8},
    "mamba1": {"d_inner": 16, "d_state": 8, "n_heads": 2, "chunk_size": 8},
    "gla": {"n_heads": 2, "key_dim": 8, "value_dim": 8, "chunk_size": 8},
}


def _route_to_libraries(monkeypatch):
    """Pick the libraries' backends on this CPU, as CUDA with fla and causal-conv1d would."""
    choose = dispatch._choose
    monkeypatch.setattr(dispatch, "_choose", lambda op, device, dtype, grad: "fla" if op == "gla" else
                        choose(op, device, dtype, grad))
    conv = dispatch.conv_backend
    monkeypatch.setattr(dispatch, "conv_backend", lambda device, dtype, width, channels: dispatch._record(
        "causal_conv", "causal_conv1d") if 2 <= width <= 4 and channels % 8 == 0 else conv(device, dtype, width, channels))


def _loss_and_grads(run, params):
    loss = run()
    return loss.detach(), torch.autograd.grad(loss, params)


@pytest.mark.parametrize("mixer", sorted(KW))
def test_one_model_on_the_library_backends_equals_the_torch_path(twins, monkeypatch, mixer):
    model = RecurrentLM(mixer, d_model=16, n_layers=2, generator=torch.Generator().manual_seed(1), **KW[mixer])
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 256, (2, 21), generator=g)
    init = CarriedStates([torch.randn(2, *s, generator=g) for s in model.state_shapes()],
                         [torch.randn(2, *c, generator=g) for c in model.conv_shapes()])

    def run():
        logits, _ = model(tokens, init)
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 256), tokens[:, 1:].reshape(-1))

    params = list(model.parameters())
    loss_ref, grads_ref = _loss_and_grads(run, params)
    _route_to_libraries(monkeypatch)
    with dispatch.record_backends() as seen:
        loss, grads = _loss_and_grads(run, params)
    assert seen["causal_conv"] == {"causal_conv1d"}
    assert mixer != "gla" or seen["gla"] == {"fla"}
    torch.testing.assert_close(loss, loss_ref, **TOL)
    for a, r in zip(grads, grads_ref):
        torch.testing.assert_close(a, r, **TOL)


@pytest.mark.parametrize("mixer", ["mamba2", "gla"])
def test_a_stack_on_the_library_backends_equals_its_torch_path(twins, monkeypatch, mixer):
    """Members become channels of one causal-conv1d call and heads of one chunk_gla call."""
    models = [RecurrentLM(mixer, d_model=16, n_layers=2, generator=torch.Generator().manual_seed(s), **KW[mixer])
              for s in (0, 1, 2)]
    stack = LMStack(models)
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, 256, (3, 2, 18), generator=g)
    states = [torch.randn(3, 2, *s, generator=g) for s in models[0].state_shapes()]
    windows = [torch.randn(3, 2, *c, generator=g) for c in models[0].conv_shapes()]

    def run():
        losses, _, _ = stack.losses(tokens, states, windows, None)
        return losses.sum()

    loss_ref, grads_ref = _loss_and_grads(run, [stack.flat])
    _route_to_libraries(monkeypatch)
    loss, grads = _loss_and_grads(run, [stack.flat])
    torch.testing.assert_close(loss, loss_ref, **TOL)
    torch.testing.assert_close(grads[0], grads_ref[0], **TOL)
