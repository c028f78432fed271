"""`dynlab.report`: the Markdown tables hold the dataset's own numbers."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from dynlab.analysis.contrasts import paired_contrasts
from dynlab.errors import DynlabInputError
from dynlab.report import far_in_ratio, lm_tables, report, task_tables


def _copying() -> xr.Dataset:
    rows = [("zero", "base", 0, [0.95, 0.2]), ("zero", "post", 0, [0.96, 0.25]), ("state-passing", "post", 0, [0.97, 0.45]),
            ("zero", "base", 1, [0.93, 0.1]), ("zero", "post", 1, [0.94, 0.15]), ("state-passing", "post", 1, [0.9, 0.35])]
    ds = xr.Dataset(
        {"accuracy": (("run", "length"), np.array([r[3] for r in rows])), "status": ("run", ["ok"] * 6),
         "in_range_accuracy": ("run", [0.95, 0.95, 0.95, 0.93, 0.93, 0.93])},
        coords={"length": [16, 48], "arch": ("run", ["mamba2"] * 6), "intervention": ("run", [r[0] for r in rows]),
                "phase": ("run", [r[1] for r in rows]), "seed": ("run", [r[2] for r in rows]),
                "train_max": ("run", [16] * 6)},
        attrs={"study": "copying", "preset": "quick"})
    return ds.merge(paired_contrasts(ds))


def test_task_table_holds_means_ranges_and_the_paired_difference():
    text = task_tables(_copying())
    assert "2 of 2 trained models learned" in text
    row48 = next(line for line in text.splitlines() if line.startswith("| 48 "))
    # control 0.25, 0.15 -> 0.20 (0.15–0.25); SP 0.45, 0.35 -> 0.40 (0.35–0.45); difference +0.20 both seeds (no spread)
    assert "0.20 (0.15–0.25)" in row48 and "0.40 (0.35–0.45)" in row48 and "+0.20" in row48
    row16 = next(line for line in text.splitlines() if line.startswith("| 16 (trained)"))
    assert "0.95 (0.94–0.96)" in row16


def test_far_in_ratio_and_the_lm_table():
    t_bin = np.arange(8, 65, 8)
    ppl = np.array([[5.0] * 8, [4.0] * 8])
    ppl[0, -1], ppl[1, -1] = 10.0, 4.0  # the last eighth (56, 64] holds one bin end: t = 64
    ds = xr.Dataset({"ppl_binned": (("run", "t_bin"), ppl), "lg_p_star": ("run", [5.0, 4.0]),
                     "lg_passed": ("run", [False, True])},
                    coords={"t_bin": t_bin, "intervention": ("run", ["zero", "state-passing"]), "seed": ("run", [0, 0]),
                            "arch": ("run", ["mamba2", "mamba2"]), "train_length": ("run", [16, 16])},
                    attrs={"study": "length-generalization"})
    np.testing.assert_allclose(far_in_ratio(ds).values, [2.0, 1.0], rtol=1e-12, atol=0)  # 10/5 and 4/4
    text = lm_tables(ds)
    assert "| mamba2 | zero | 0 | 2.000 (2.000–2.000)" in text and "| 1 of 1 |" in text


def test_report_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(DynlabInputError, match=f"^no dataset at {tmp_path / 'dataset.nc'}; allowed: a study folder"):
        report(tmp_path)
    (tmp_path / "dataset.nc").write_text("not netcdf")
    with pytest.raises(DynlabInputError, match=f"^unreadable dataset {tmp_path / 'dataset.nc'} \\(.*\\); allowed: a study folder") as exc:
        report(tmp_path)
    assert len(str(exc.value).splitlines()) == 1
    partial = xr.Dataset({"converged": ("run", [True])}, attrs={"study": "length-generalization"})
    partial.to_netcdf(tmp_path / "partial.nc")  # a study's dataset without the variables its tables read
    with pytest.raises(DynlabInputError, match="partial.nc lacks what its length-generalization tables need "
                                               r"\(No variable named 'ppl_binned'.*; allowed: ") as exc:
        report(tmp_path / "partial.nc")
    assert len(str(exc.value).splitlines()) == 1


def _sweep(mp: list[float], status: list[str]) -> xr.Dataset:
    n = len(mp)
    return xr.Dataset({"mp": ("run", mp), "status": ("run", status)},
                      coords={"run_id": ("run", [f"r{i}" for i in range(n)]), "arch": ("run", ["mamba"] * 2 + ["tanh-rnn"] * (n - 2)),
                              "group": ("run", ["C2"] * n)}, attrs={"study": "group-tracking"})


def test_tracking_table_counts_learned_runs_and_spreads_their_mp():
    from dynlab.report import tracking_tables

    text = tracking_tables(_sweep([12, 30, 1000, 1000, 5], ["ok", "ok", "ok", "ok", "not-learned"]))
    assert "| mamba | C2 | 2 of 2 | 21 (12–30) |" in text and "| tanh-rnn | C2 | 2 of 3 | 1000 (1000–1000) |" in text


def test_reproduction_table_compares_two_sweeps_run_by_run():
    from dynlab.report import reproduction_tables

    a = _sweep([12, 30, 1000, 1000, 5], ["ok", "ok", "ok", "ok", "not-learned"])
    b = _sweep([12, 60, 1000, 1000, 5], ["ok", "ok", "ok", "not-learned", "not-learned"])
    text = reproduction_tables(a, b, "C", "torch")
    assert "5 runs in both; status the same in 4; among the 3 learned in both, mp identical in 2" in text
    assert "max 1.00" in text  # 30 vs 60: one octave
    assert "| mamba | C2 | 2 / 2 of 2 | 21 / 36 | 1 of 2 |" in text


@pytest.mark.parametrize("arch, learns", [
    ("mamba", set()), ("linear-rnn", set()), ("negative-mamba", {"C2", "C2xC2", "C2xC2xC2"}),
    ("mamba3", {"C2", "C2xC2", "C2xC2xC2", "C4", "C6", "C12", "C2xC4"}),
    ("aussm", {"C2", "C2xC2", "C2xC2xC2", "C4", "C6", "C12", "C2xC4"}),
    ("tanh-rnn", {"C2", "C2xC2", "C2xC2xC2", "C4", "C6", "C12", "C2xC4", "S3", "D4", "A4", "C2xS3", "A5"}),
])
def test_theory_by_architecture_and_group(arch, learns):
    """Written out by hand: C2^k are the elementary abelian 2-groups; C4, C6, C12, C2xC4 are
    abelian with an element of order > 2; S3, D4, A4, C2xS3, A5 are not abelian."""
    from dynlab.report import theory_learns

    groups = ["C2", "C2xC2", "C2xC2xC2", "C4", "C6", "C12", "C2xC4", "S3", "D4", "A4", "C2xS3", "A5"]
    assert {g for g in groups if theory_learns(arch, g)} == learns
    assert theory_learns("my-cell", "C2") is None


def test_tracking_table_names_the_theory():
    from dynlab.report import tracking_tables

    text = tracking_tables(_sweep([12, 30, 1000, 1000, 5], ["ok", "ok", "ok", "ok", "not-learned"]))
    assert "| mamba | C2 | 2 of 2 | 21 (12–30) | no |" in text and "| tanh-rnn | C2 | 2 of 3 | 1000 (1000–1000) | yes |" in text


def test_intervention_table_holds_holm_p_the_arms_order_and_what_tbtt_reads(repo_root):
    from scipy import stats

    from dynlab.analysis.contrasts import holm
    from dynlab.report import intervention_tables
    from dynlab.results.schema import open_dataset

    ds = open_dataset(repo_root / "benchmarks/results/datasets/"
                      "length-generalization-interventions.nc")
    text = intervention_tables(ds)
    arms = ["random-noise", "fitted-noise", "state-passing", "tbtt"]
    raw = [float(ds[f"{k}_contrast_p"].sel(contrast=a).isel(mixer=0)) for k in ("far", "in") for a in arms]
    adjusted = holm(raw)
    row = next(line for line in text.splitlines() if line.startswith("| post-trained: random-noise "))
    assert f"p {raw[0]:.3f} (Holm {adjusted[0]:.3f})" in row and f"p {raw[4]:.3f} (Holm {adjusted[4]:.3f})" in row
    assert "over the 8 tests of this table" in text
    pairs = [line for line in text.splitlines() if line.startswith("| ") and " − " in line.split("|")[1]][1:]  # after the header
    assert len(pairs) == 6  # every pair of the 4 arms
    post = (ds["phase"].values.astype(str) == "post")
    far = {a: ds["ppl_far"].values[post & (ds["intervention"].values.astype(str) == a)] for a in arms}
    p = stats.ttest_rel(far["random-noise"], far["fitted-noise"]).pvalue
    assert any(line.startswith("| random-noise − fitted-noise ") and f"| {p:.3f} |" in line for line in pairs)
    assert "TBTT does not read the control's batches: it reads 16 runs of 300 consecutive 32-token chunks" in text
