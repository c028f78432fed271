"""Mixed input dtypes (float32 inputs with a float64 initial state or a float64 parameter)
are computed in torch's promoted dtype by every CPU form of every scan alike, reference
included: the result equals the same form run on inputs cast to float64."""

from __future__ import annotations

import pytest
import torch

from dynlab.kernels.compiled import promoted
from dynlab.kernels.gla.chunked import gla_chunked, gla_ref
from dynlab.kernels.gla.recurrent import gla_recurrent
from dynlab.kernels.selective_scan.chunked import selective_scan_fused, selective_scan_grouped, selective_scan_ref
from dynlab.kernels.ssd.chunked import ssd_chunked, ssd_ref
from dynlab.kernels.ssd.grouped import ssd_grouped

G = torch.Generator().manual_seed(0)


def _ssd():
    b, t, h, p, n = 2, 5, 2, 3, 4
    return [torch.randn(b, t, h, p, generator=G), torch.rand(b, t, h, generator=G), -torch.rand(h, generator=G),
            torch.randn(b, t, h, n, generator=G), torch.randn(b, t, h, n, generator=G), torch.randn(b, h, p, n, generator=G)]


def _ssd_grouped():  # B and C one per sequence, A one per (sequence, head)
    g, t, h, p, n = 2, 5, 2, 3, 4
    return [torch.randn(g, t, h, p, generator=G), torch.rand(g, t, h, generator=G), -torch.rand(g, h, generator=G),
            torch.randn(g, t, n, generator=G), torch.randn(g, t, n, generator=G), torch.randn(g, h, p, n, generator=G)]


def _selective():
    b, t, d, n = 2, 5, 3, 4
    return [torch.randn(b, t, d, generator=G), torch.rand(b, t, d, generator=G), -torch.rand(d, n, generator=G),
            torch.randn(b, t, n, generator=G), torch.randn(b, t, n, generator=G), torch.randn(b, d, n, generator=G)]


def _gla():
    b, t, h, k, v = 2, 5, 2, 3, 4
    return [torch.randn(b, t, h, k, generator=G), torch.randn(b, t, h, k, generator=G), torch.randn(b, t, h, v, generator=G),
            -torch.rand(b, t, h, k, generator=G), None, torch.randn(b, h, k, v, generator=G)]


FORMS = {  # name: (inputs, call(inputs with the state last) -> (out, final))
    "ssd_ref": (_ssd, lambda a: ssd_ref(*a[:5], a[5], True)),
    "ssd_chunked": (_ssd, lambda a: ssd_chunked(*a[:5], a[5], True, chunk_size=2)),
    "ssd_grouped": (_ssd_grouped, lambda a: ssd_grouped(*a[:5], a[5], chunk_size=2)),
    "selective_scan_ref": (_selective, lambda a: selective_scan_ref(*a[:5], a[5], True)),
    "selective_scan_fused": (_selective, lambda a: selective_scan_fused(*a[:5], a[5], True)),
    "selective_scan_grouped": (_selective, lambda a: selective_scan_grouped(  # two groups of the same inputs
        *(x[None].expand(2, *x.shape) for x in a[:5]), a[5][None].expand(2, *a[5].shape))),
    "gla_ref": (_gla, lambda a: gla_ref(*a[:4], None, a[5], True)),
    "gla_chunked": (_gla, lambda a: gla_chunked(*a[:4], None, a[5], True, chunk_size=2)),
    "gla_recurrent": (_gla, lambda a: gla_recurrent(*a[:4], None, a[5], True)),
}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("wide", [2, 5], ids=["float64-A-or-v", "float64-state"])
def test_every_form_promotes_mixed_dtypes(form, wide):
    make, call = FORMS[form]
    inputs = make()
    mixed = [x if x is None or i != wide else x.double() for i, x in enumerate(inputs)]
    out, final = call(mixed)
    want_out, want_final = call(list(promoted(*[x if x is None else x.double() for x in inputs])))
    assert out.dtype == final.dtype == torch.float64
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(final, want_final, rtol=1e-12, atol=1e-12)


def test_promoted_keeps_none_and_takes_the_widest_dtype():
    a, b = torch.ones(2, dtype=torch.float32), torch.ones(2, dtype=torch.float64)
    x, none, y = promoted(a, None, b)
    assert none is None and x.dtype == y.dtype == torch.float64
    assert promoted(a, None)[0] is a  # nothing to promote: the tensor itself


@pytest.mark.parametrize("op", ["ssd", "selective_scan", "gla", "linear_scan"])
def test_dispatch_picks_the_backend_of_the_promoted_dtype(op, monkeypatch):
    """The backend is chosen for the dtype the inputs compute in: float32 inputs with a float64
    state ask for a float64 kernel (on CUDA: the torch path, not a float32 Triton kernel)."""
    from dynlab.kernels import dispatch

    asked = []
    real = dispatch.get_kernel

    def spy(name, device, dtype, grad=False):
        asked.append(dtype)
        return real(name, device, dtype, grad)

    monkeypatch.setattr(dispatch, "get_kernel", spy)
    if op == "linear_scan":
        a, b = torch.rand(2, 5, 3, generator=G), torch.randn(2, 5, 3, generator=G)
        out = dispatch.linear_scan(a, b, torch.randn(2, 3, generator=G, dtype=torch.float64))
    else:
        inputs = {"ssd": _ssd, "selective_scan": _selective, "gla": _gla}[op]()
        state = inputs[5].double()
        args = (*inputs[:4], None) if op == "gla" else tuple(inputs[:5])
        out = getattr(dispatch, op)(*args, state, True)[0]
    assert asked == [torch.float64] and out.dtype == torch.float64
