"""One dataset vocabulary: a read-only registry, one labelling helper, no registration on import."""

from __future__ import annotations

import ast
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

from dynlab.results.vocabulary import VARIABLES, annotate, attrs_of, check_dataset, unregistered, var

from helpers.paths import REPO as ROOT


@pytest.mark.slow
def test_registry_is_read_only_and_complete_on_import(tmp_path):
    with pytest.raises(TypeError):
        VARIABLES["new"] = ("x", "1", "")  # type: ignore[index]
    # importing every study adds nothing (the old registry grew when a study was imported)
    code = ("from dynlab.results.vocabulary import VARIABLES; n = len(VARIABLES); "
            "import dynlab.studies; print(n == len(VARIABLES))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert res.stdout.strip() == "True"


def test_every_entry_has_a_long_name_and_a_units_string():
    for name, v in VARIABLES.items():
        assert v.long_name and isinstance(v.units, str) and isinstance(v.description, str), name


def test_no_module_defines_its_own_long_names():
    """Labels come from the registry only: no ``"long_name": ...`` literals and no calls
    adding to a registry anywhere in the library or the studies."""
    offenders = []
    for path in [*(ROOT / "dynlab").rglob("*.py"), *(ROOT / "studies").glob("*.py")]:
        if path.name == "vocabulary.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "long_name" for k in node.keys):
                offenders.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "register_variables":
                offenders.append(f"{path.name}:{node.lineno} register_variables")
    assert not offenders, offenders


def test_annotate_sets_the_registry_labels_and_keeps_other_attrs():
    ds = xr.Dataset({"q": ("t", np.zeros(3), {"long_name": "stale", "representation": "state"})},
                    coords={"t": np.arange(1, 4), "odd": ("t", np.zeros(3))})
    annotate(ds)
    assert ds["q"].attrs == {**attrs_of("q"), "representation": "state"}
    assert ds["t"].attrs["units"] == "tokens" and ds["t"].attrs["long_name"] == "position t"
    assert unregistered(ds) == ["odd"]
    assert check_dataset(ds) == ["odd: not in the vocabulary"]
    ds["q"].attrs["units"] = "state units"
    assert "q: units 'state units', vocabulary '1'" in check_dataset(ds)


def test_attrs_of_names_an_unregistered_variable():
    with pytest.raises(KeyError, match="'no_such_variable' is not in the dataset vocabulary"):
        attrs_of("no_such_variable")
    dims, values, attrs = var("mp", "run", [1.0], threshold=0.9)
    assert dims == "run" and attrs["units"] == "tokens" and attrs["threshold"] == 0.9


def test_one_meaning_per_index_name():
    """``k`` indexes return-map eigenvalues and ``k_lyap`` Lyapunov exponents, in the
    per-run analyses and in the study dataset alike."""
    import torch

    from dynlab.analysis.jacobian import lyapunov_exponents

    class Contract(torch.nn.Module):
        state_size, n_classes = 2, 2

        def init_state(self, b):
            return torch.ones(b, 2, dtype=torch.float64)

        def step(self, h, x):
            return torch.zeros(h.shape[0], 2, dtype=h.dtype), 0.5 * h

    ds = lyapunov_exponents(Contract(), torch.zeros(2, 5, dtype=torch.long))
    assert ds["lyap"].dims == ("sample", "k_lyap") and ds["lyap_mean"].dims == ("k_lyap",)
    np.testing.assert_allclose(ds["lyap_mean"].values, np.log(0.5), rtol=1e-7, atol=1e-12)  # h -> h/2: both exponents log ½
    assert check_dataset(ds) == []


def test_analysis_outputs_speak_the_vocabulary():
    from dynlab.analysis.geometry import geometry_over_time
    from dynlab.lm.analysis.metrics import binned_ppl, effective_remembrance, position_ppl, state_statistics
    from dynlab.analysis.margin import binary_signed_error, decision_margin

    rng = np.random.default_rng(0)
    states, labels = rng.normal(size=(16, 6, 3)), rng.integers(0, 2, size=(16, 6))
    for ds in (geometry_over_time(states, labels, n_classes=2), decision_margin(states, labels, n_classes=2),
               binary_signed_error(states, labels), state_statistics(rng.normal(size=(2, 1, 2, 3, 4)), np.arange(3))):
        assert check_dataset(ds) == [], check_dataset(ds)
    nll = rng.uniform(1, 2, size=(4, 8))
    p = rng.dirichlet(np.ones(5), size=(3,))
    for da in (position_ppl(nll), binned_ppl(nll, 2),
               *(effective_remembrance(p, np.stack([p, p], 1), np.array([0, 1]), kind) for kind in ("tv", "js", "cos"))):
        assert check_dataset(da.to_dataset()) == [], da.name
    assert binned_ppl(nll, 2).name == "ppl_binned"
    assert effective_remembrance(p, np.stack([p, p], 1), np.array([0, 1]), "js").attrs["units"] == "bit"
