"""The dense kernels' float32 tanh (a C loop) against float64 tanh and torch's own."""

from __future__ import annotations

import pytest
import torch

from dynlab.kernels import fast_tanh
from dynlab.kernels.fast_tanh import tanh_


@pytest.fixture(autouse=True)
def compiled():
    if fast_tanh._lib() is None:
        pytest.skip("no C compiler here: tanh_ is torch's")


def _ulps(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Error of float32 ``x`` in units of the float32 spacing at float64 ``ref``."""
    spacing = torch.nextafter(ref.float().abs(), torch.tensor(float("inf"))).double() - ref.float().abs().double()
    return (x.double() - ref).abs() / spacing


def test_error_is_within_two_ulp_everywhere():
    """2 M points in [−12, 12], 10 k in [1e-8, 0.3] (the small-argument polynomial), and every
    float32 magnitude from 1e-38 to 1e38 with both signs."""
    grids = [
        torch.linspace(-12, 12, 2_000_001),
        torch.logspace(-8, -0.5, 10_001),
        torch.cat([torch.logspace(-38, 38, 20_001), -torch.logspace(-38, 38, 20_001)]),
    ]
    for x in grids:
        ref = torch.tanh(x.double())
        got = tanh_(x.clone())
        assert float(_ulps(got, ref).max()) <= 2.0
        # torch's float32 tanh, for scale: within an ulp too
        assert float(_ulps(torch.tanh(x), ref).max()) <= 1.0


def test_special_values_and_sign():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -1e-40, 3e38, -3e38])
    got = tanh_(x.clone())
    ref = torch.tanh(x)
    assert torch.isnan(got[0])
    assert torch.equal(got[1:], ref[1:])  # exact: ±1, ±0 with its sign, denormals pass through
    assert torch.equal(torch.signbit(got[1:]), torch.signbit(ref[1:]))
    near_one = torch.tensor([8.5, 9.0, -9.5, 20.0])  # the clamp at |x| = 9
    assert float(_ulps(tanh_(near_one.clone()), torch.tanh(near_one.double())).max()) <= 2.0


def test_a_time_step_slice_of_a_stacked_buffer_is_done_in_place():
    """What the kernels pass: ``hs[:, t]`` of a ``[N, T, B, S]`` buffer (blocks, not contiguous);
    the other steps are not touched; a layout that is not blocks falls back to torch."""
    gen = torch.Generator().manual_seed(0)
    hs = torch.randn(3, 5, 4, 7, generator=gen) * 3
    before = hs.clone()
    out = tanh_(hs[:, 2])
    assert out.data_ptr() == hs[:, 2].data_ptr()
    assert float(_ulps(hs[:, 2], torch.tanh(before[:, 2].double())).max()) <= 2.0
    assert torch.equal(hs[:, :2], before[:, :2]) and torch.equal(hs[:, 3:], before[:, 3:])
    x = torch.randn(6, 4, generator=gen).t()  # transposed: no blocks
    want = torch.tanh(x)
    assert torch.equal(tanh_(x), want)


def test_float64_and_disabled_kernels_are_torchs(monkeypatch):
    x = torch.randn(1000, dtype=torch.float64)
    assert torch.equal(tanh_(x.clone()), torch.tanh(x))
    monkeypatch.setenv("DYNLAB_C_KERNELS", "0")
    y = torch.randn(1000)
    assert torch.equal(tanh_(y.clone()), torch.tanh(y))
