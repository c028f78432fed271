"""An LM spec's model is checked against the memory it would take before it is built:
the parameter bound holds every built model's count, and a model beyond 8 GiB of training
state is one line, exit code 2, before anything is built or written."""

from __future__ import annotations

import itertools

import pytest

from dynlab.lm.run.text import build_model
from dynlab.lm.spec import LMModelSpec, LMRunSpec

LAYOUTS = [  # d_model, n_layers, n_heads, head_dim, d_state, mlp_ratio, conv_kernel
    (16, 2, 2, 16, 32, 0, 4), (64, 2, 4, 32, 64, 2, 4), (8, 1, 1, 1, 1, 0, 0), (32, 3, 8, 4, 2, 4, 2),
    (48, 1, 2, 24, 16, 1, 8), (256, 1, 1, 8, 1, 0, 4), (64, 1, 16, 2, 64, 0, 4),
]


@pytest.mark.parametrize("mixer, layout", list(itertools.product(["mamba2", "mamba1", "gla"], LAYOUTS)))
def test_the_parameter_bound_holds_the_built_models_count(mixer, layout):
    d, layers, heads, head_dim, state, mlp, kernel = layout
    spec = LMModelSpec(mixer=mixer, d_model=d, n_layers=layers, n_heads=heads, head_dim=head_dim, d_state=state,
                       mlp_ratio=mlp, conv_kernel=kernel, chunk_size=8)
    count = sum(p.numel() for p in build_model(LMRunSpec(model=spec)).parameters())
    assert count <= spec.parameter_bound() <= 8 * count


def test_a_model_too_large_to_train_is_refused_before_it_is_built(tmp_path, capsys):
    from dynlab.cli import main

    with pytest.raises(ValueError, match=r"needs \d+\.\d GiB for its weights, gradients and AdamW moments; "
                                                "allowed: at most 80 GiB"):
        LMModelSpec(d_model=8192, n_layers=64)
    # the quick preset's GLA (4 heads x 32 channels, N = 64, its MLP) at width 8192 and 64 layers
    assert main(["study", "length-generalization", "--models", "gla", "--d-model", "8192", "--n-layers", "64",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GiB for its weights" in err[0], err
    assert not (tmp_path / "o").exists()
