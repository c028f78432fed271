"""``dynlab bench lm``: its rows recompute from their definitions; bad options exit 2."""

from __future__ import annotations

import pytest

from dynlab.bench.lm import bench_lm, lm_bench_markdown, lm_bench_model


def test_rows_follow_their_definitions():
    payload = bench_lm(widths=(16,), ensembles=(2,), steps=1, warmup=1, memory=False)
    (res,) = payload["results"]
    model = lm_bench_model(16)
    assert res["n_params"] == sum(p.numel() for p in model.parameters()) == 14_460  # the budget preset's model
    rows = {r["method"]: r for r in res["rows"]}
    assert set(rows) == {"loop", "stack-2", "no-op mixer", "floor"}
    floor = res["gemm_flops_per_s"] / (6 * res["n_params"])
    assert rows["floor"]["model_tokens_per_s"] == pytest.approx(floor)
    for r in rows.values():
        assert r["vs_loop"] == pytest.approx(r["model_tokens_per_s"] / rows["loop"]["model_tokens_per_s"])
        assert r["of_floor"] == pytest.approx(r["model_tokens_per_s"] / floor)
    md = lm_bench_markdown(payload)
    assert "| stack-2 |" in md and "14,460 parameters" in md


def test_the_quick_width_is_the_quick_preset_model():
    assert sum(p.numel() for p in lm_bench_model(64).parameters()) == 101_848


def test_another_mixer_is_benchmarked_in_the_same_layout():
    """``--mixer gla``: the same layout with GLA blocks, its stack through the stack engine; the
    setting records the mixer and the table names it."""
    payload = bench_lm(widths=(16,), ensembles=(2,), steps=1, warmup=1, memory=False, mixer="gla")
    (res,) = payload["results"]
    assert payload["setting"]["mixer"] == "gla"
    model = lm_bench_model(16, mixer="gla")
    assert res["n_params"] == sum(p.numel() for p in model.parameters())
    assert type(model.blocks[0].mixer).__name__ == "GLAMixer"
    assert {r["method"] for r in res["rows"]} == {"loop", "stack-2", "no-op mixer", "floor"}
    assert lm_bench_markdown(payload).startswith("LM training throughput: gla,")


@pytest.mark.parametrize("args, needle", [
    (["--widths", "12"], "--widths '12'"), (["--ensembles", "0"], "--ensembles '0'"), (["--steps", "0"], "--steps"),
    (["--mixer", "mamba3"], "--mixer 'mamba3': unknown mixer; allowed: mamba2, mamba1, gla"),
    (["--widths", "1024", "--ensembles", "1024", "--batch", "65536", "--length", "100000"],  # before any allocation
     "GiB of states per batch; allowed: at most 8 GiB"),
])
def test_bad_options_exit_2_with_one_line(args, needle, capsys):
    from dynlab.cli import main

    assert main(["bench", "lm", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_peak_memory_grows_with_the_stack():
    """Measured in a fresh child (its peak is not the parent's): 16 members need more than 1."""
    from dynlab.bench.lm import peak_memory_mb

    one, many = peak_memory_mb(16, 1, 16, 32), peak_memory_mb(16, 16, 16, 32)
    assert 0 < one < many
