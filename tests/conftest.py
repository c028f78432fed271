"""Shared test helpers: an exact permutation tracker registered as a user cell."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

import dynlab

if importlib.util.find_spec("dynlab.kernels") is None:
    # a non-editable install, and `python -m pytest` from the checkout, whose dynlab/ folder
    # (without kernels/ and studies/) comes first on sys.path: the installed package is shadowed
    pytest.exit(f"dynlab was imported from the source folder {os.path.dirname(dynlab.__file__)}, not the installed "
                "package: run the tests with `pytest` (not `python -m pytest`), or install with `pip install -e .`",
                returncode=4)

if not torch.cuda.is_available():
    # Triton kernels run on the CPU through Triton's interpreter, which triton picks when
    # it is first imported (tests/test_triton_kernels.py); on a GPU they run for real.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from dynlab.tracking.groups import get_group
from dynlab.tracking.models import Cell, Tracker, register_cell

#: Set to 1 (CI does, .ci/run) to make a test that needs ``transformers`` fail when it does
#: not import, instead of skipping: CI must run those tests.
REQUIRE_TRANSFORMERS_ENV = "DYNLAB_REQUIRE_TRANSFORMERS"


def need_transformers():
    """``transformers``, imported; without it the test skips, or fails when
    ``DYNLAB_REQUIRE_TRANSFORMERS=1`` (as ``DYNLAB_REQUIRE_MAMBA_REF=1`` does for the
    mamba-ssm references)."""
    try:
        import transformers
    except ImportError as exc:
        msg = f"transformers does not import ({exc}); pip install 'dynlab[test]'"
        if os.environ.get(REQUIRE_TRANSFORMERS_ENV) == "1":
            pytest.fail(f"{msg}; {REQUIRE_TRANSFORMERS_ENV}=1 requires it", pytrace=False)
        pytest.skip(msg, allow_module_level=True)
    return transformers


def permutation_matrices(group) -> torch.Tensor:
    """[G, G, G]: P[x] is the left-multiplication matrix of element x on one-hot states."""
    n = group.order
    p = torch.zeros(n, n, n, dtype=torch.float64)
    for x in range(n):
        for g in range(n):
            p[x, group.table[x, g], g] = 1.0
    return p


@register_cell("test-exact-perm")
class ExactPermutationCell(Cell):
    """h_t = P(x_t) h_{t-1} on one-hot group states: an exact affine tracker.

    The layer input must be a one-hot token embedding of size |G|; the transition picks
    the permutation matrix by the embedding (a linear map of u), so J = P(x) does not
    depend on h.  The initial state is the identity element's one-hot vector.
    """

    family = "affine"

    def __init__(self, d_in: int, hidden: int, nonlinearity=None, **_):
        super().__init__(d_in, hidden, hidden, hidden, nonlinearity)
        self.register_buffer("P", torch.zeros(d_in, hidden, hidden))

    def init_state(self, batch, device=None, dtype=None):
        h = torch.zeros(batch, self.state_size, device=device, dtype=dtype or self.P.dtype)
        h[:, 0] = 1.0
        return h

    def precompute(self, u):  # u [B, T, G] one-hot
        return {"P": torch.einsum("btx,xij->btij", u, self.P)}

    def transition(self, h, p):
        return torch.einsum("bij,bj->bi", p["P"], h)


def exact_tracker(group_name: str) -> Tracker:
    """A Tracker whose single cell tracks the group exactly; readout = identity logits."""
    g = get_group(group_name)
    n = g.order
    m = Tracker("test-exact-perm", n, n, hidden=n, d_embed=n).double()
    with torch.no_grad():
        m.embed.weight.copy_(torch.eye(n))
        m.cells[0].P.copy_(permutation_matrices(g))
        m.readout.weight.copy_(torch.eye(n))
        m.readout.bias.zero_()
    # the Tracker's zero initial state is replaced by the identity one-hot
    m.init_state = lambda batch, device=None, dtype=None: m.cells[0].init_state(batch, device, dtype)  # type: ignore[method-assign]
    return m


@pytest.fixture
def exact_s3() -> Tracker:
    return exact_tracker("S3")


@pytest.fixture
def nan_buffers(monkeypatch):
    """Call it to make every buffer a kernel allocates start as NaN (``torch.empty``,
    ``Tensor.new_empty``) and to empty the fused kernels' reuse cache, so that an entry a
    kernel forgets to write shows up in its outputs (docs/choices.md, "Poisoned buffers").  The cache
    is emptied again afterwards, so no NaN buffer outlives the test."""
    from dynlab.kernels.tracker_loss.common import BUFFERS

    def poison() -> None:
        empty, new_empty = torch.empty, torch.Tensor.new_empty
        monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))
        monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **k: new_empty(self, *a, **k).fill_(float("nan")))
        BUFFERS.clear()

    yield poison
    BUFFERS.clear()


@pytest.fixture
def used_lrs(monkeypatch) -> list[float]:
    """The learning rate AdamW used at every ``step`` call of the test, in order."""
    used: list[float] = []
    step = torch.optim.AdamW.step

    def recording_step(self, *a, **k):
        used.append(self.param_groups[0]["lr"])
        return step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording_step)
    return used
