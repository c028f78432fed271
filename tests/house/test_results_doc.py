"""docs/results.md and README.md's headline tables are what benchmarks/make_results.py writes
from the committed datasets (they cannot drift, and a number edited by hand fails)."""

from __future__ import annotations

import importlib.util
import re

import pytest

from results_tables.common import DATA, dataset, minus, wall_time
from results_tables.fixed_points import sweep_sets
from results_tables.lm_interventions import tbtt_coverage
from results_tables.paper_b import PAPER_B_WALL_TIMES

from helpers.paths import REPO as ROOT


@pytest.fixture(scope="module")
def make_results():
    spec = importlib.util.spec_from_file_location("make_results", ROOT / "benchmarks" / "make_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def readme_text() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def detail_text(make_results) -> str:
    """docs/results.md's table of paper B's claims with all their numbers."""
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    return text.split(f"## {make_results.PAPER_B_DETAIL}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.slow
def test_results_document_is_generated_from_the_committed_datasets(make_results):
    assert (ROOT / "docs" / "results.md").read_text() == make_results.document(), \
        "docs/results.md is stale: run python benchmarks/make_results.py"


@pytest.mark.slow
def test_readme_tables_are_generated_from_the_committed_datasets(make_results, readme_text):
    assert set(make_results.README_SECTIONS) >= {"paper-a", "paper-b", "paper-a-reproduction", "paper-b-notes"}
    for name in make_results.README_SECTIONS:
        assert readme_text.count(f"<!-- results:{name} -->") == 1 and readme_text.count(f"<!-- /results:{name} -->") == 1
    assert make_results.stale_sections(readme_text) == [], "README.md is stale: run python benchmarks/make_results.py"
    assert make_results.readme(readme_text) == readme_text


def _section(text: str, name: str) -> str:
    return re.search(rf"<!-- results:{name} -->\n(.*?)\n<!-- /results:{name} -->", text, re.S).group(1)


@pytest.mark.parametrize(("name", "number"), [("paper-a", "+0.93 [+0.85, +0.97]"), ("paper-a", "4/5, 1000"),
                                              ("paper-b", "1.043 ± 0.080"), ("paper-b", "0.55 / 0.30"),
                                              ("paper-a-reproduction", "117 of 120"),
                                              ("paper-a-reproduction", "15 of their 18"),
                                              ("paper-b-notes", "within 14 %")])
@pytest.mark.slow
def test_a_hand_edited_number_in_a_readme_table_is_stale(make_results, readme_text, name, number):
    """Each number is one the datasets give (found in the section); changing a digit of it
    makes exactly that section stale."""
    body = _section(readme_text, name)
    assert number in body
    edited_number = re.sub(r"\d(?=\D*$)", lambda m: str((int(m.group()) + 1) % 10), number)
    edited = readme_text.replace(body, body.replace(number, edited_number, 1), 1)
    assert make_results.stale_sections(edited) == [name]
    assert make_results.readme(edited) == readme_text


def test_the_readme_sections_carry_the_datasets_numbers(make_results, readme_text):
    """Numbers read from the datasets independently of the table code (xarray directly)."""
    import numpy as np

    ds = dataset("group-tracking-sweep")
    rows = (ds["arch"] == "token-gated-rnn") & (ds["group"] == "S3") & (ds["status"] == "ok")
    mp = ds["mp"].values[rows.values]
    cell = f"{mp.size}/5, {np.median(mp):.0f} ({mp.min():.0f}–{mp.max():.0f})"
    assert "| token-gated-rnn | " in _section(readme_text, "paper-a") and cell in _section(readme_text, "paper-a")
    r = float(ds["corr_r"].sel(variant="q_dec", censoring="drop"))
    assert "| `q_dec` (trained decoder; the default) | " in readme_text and f"{r:+.2f} [" in readme_text
    lg = dataset("length-generalization-no-conv")
    last = lg["t_bin"].values.max()  # binned PPL sits on its bin ends
    far = lg["ppl_binned"].where(lg["t_bin"] > last - last / 8).mean("t_bin") / lg["lg_p_star"]
    zero = far.values[lg["intervention"].values.astype(str) == "zero"]
    assert f"{zero.mean():.3f} ± {zero.std(ddof=1):.3f}" in _section(readme_text, "paper-b")


def test_the_held_out_forecast_is_the_datasets_and_recomputes(make_results, readme_text):
    """README's held-out forecast r is the dataset's, and the dataset's equals a recomputation on seeds 2-4."""
    import numpy as np

    from dynlab.analysis.correlation import tcross_mp_correlation

    ds = dataset("group-tracking-sweep")
    r = float(ds["corr_forecast_heldout_r"].sel(forecast="forecast_horizon", censoring="drop"))
    assert f"under 'drop' r = {r:+.2f} [" in _section(readme_text, "paper-a")
    ok = (ds["status"].values.astype(str) == "ok") & np.isfinite(ds["mp"].values) & (ds["seed"].values >= 2)
    res = tcross_mp_correlation(ds["T_horizon"].values[ok], ds["mp"].values[ok], horizon=ds["horizon"].values[ok],
                                mp_censored=ds["mp_censored"].values[ok].astype(bool), censoring="drop", n_boot=1,
                                rng=np.random.default_rng(0))
    assert res.pearson_r == pytest.approx(r, rel=0, abs=1e-9)
    assert int(ds["corr_forecast_heldout_n"].sel(forecast="forecast_horizon", censoring="drop")) == res.n_used


def test_readme_stays_short_and_names_its_generator(readme_text):
    assert len(readme_text.splitlines()) <= 300
    assert readme_text.count("python benchmarks/make_results.py") >= 2


def test_a_readme_without_the_markers_is_refused(make_results, readme_text):
    with pytest.raises(ValueError, match="results:paper-b"):
        make_results.readme(readme_text.replace("<!-- /results:paper-b -->", ""))


def test_the_reproduction_paragraph_carries_the_two_sweeps_numbers(make_results, readme_text):
    """Counted from the two datasets directly (runs matched by run_id), not by the generator."""
    import numpy as np

    a, b = dataset("group-tracking-sweep"), dataset("group-tracking-sweep-torch-loops")
    status_b = dict(zip(b["run_id"].values.astype(str), b["status"].values.astype(str)))
    mp_b = dict(zip(b["run_id"].values.astype(str), b["mp"].values))
    ids, status_a = a["run_id"].values.astype(str), a["status"].values.astype(str)
    same = sum(status_b[r] == s for r, s in zip(ids, status_a))
    both = [i for i, r in enumerate(ids) if status_a[i] == "ok" and status_b[r] == "ok"]
    moved = [i for i in both if a["mp"].values[i] != mp_b[ids[i]]]
    moved_archs = sorted({str(a["arch"].values[i]) for i in moved})
    cells = {(str(a["arch"].values[i]), str(a["group"].values[i])) for i in moved}
    moved_of = sum((str(a["arch"].values[i]), str(a["group"].values[i])) in cells for i in both)
    body = _section(readme_text, "paper-a-reproduction")
    flat = " ".join(body.split())
    assert f"the same status in {same} of {len(ids)} runs" in flat
    assert f"in {len(moved)} of their {moved_of} runs learned in both" in flat
    assert all(arch in flat for arch in moved_archs)
    r_drop = float(b["corr_r"].sel(variant="q_dec", censoring="drop"))
    assert f"`q_dec` r = {float(b['corr_r'].sel(variant='q_dec', censoring='replace')):+.2f} / {r_drop:+.2f}" in flat
    # the within-family r, recomputed with scipy over the learned affine runs: 'replace' sets a
    # crossing that never happened to its run's horizon, 'drop' leaves out every censored run
    from scipy.stats import pearsonr

    affine = (status_a == "ok") & (a["family"].values.astype(str) == "affine")
    tc, mp = a["T_cross_dec"].values[affine], a["mp"].values[affine]
    horizon, mp_cens = a["horizon"].values[affine], a["mp_censored"].values[affine].astype(bool)
    r_rep = pearsonr(np.where(np.isnan(tc), horizon, tc), mp).statistic
    keep = ~np.isnan(tc) & ~mp_cens
    r_keep = pearsonr(tc[keep], mp[keep]).statistic
    assert f"Within the {affine.sum()} learned runs of the affine cells" in flat
    assert f"`q_dec` gives r = {r_rep:+.2f} [" in flat
    assert f"and {r_keep:+.2f} [" in flat and f"over its {keep.sum()} uncensored runs ('drop')" in flat


def test_the_state_statistics_are_the_datasets(make_results, readme_text):
    """The state-std growth recomputed from the raw array with numpy."""
    import numpy as np

    lg = dataset("length-generalization")
    t = list(lg["t_state"].values)  # the positions the state statistics were recorded at
    std = lg["state_std"].transpose("run", "layer", "head", "t_state").values.mean(axis=(1, 2))  # [run, t]
    growth = std[:, t.index(512)] / std[:, t.index(32)]
    iv = lg["intervention"].values.astype(str)
    zero, sp = growth[iv == "zero"], growth[iv == "state-passing"]
    flat = " ".join(_section(readme_text, "paper-b-notes").split())
    assert "From t = 32 to 512" in flat and f"grows {zero.min():.1f}–{zero.max():.1f}×" in flat
    assert f"within {100 * np.abs(sp - 1).max():.0f} %" in flat


def test_wall_times_come_from_the_runner_attribute_or_say_not_recorded(make_results, readme_text):
    """A dataset with ``study_wall_time_s`` prints its minutes; one without prints the
    phrase and no number; README has one entry per committed dataset it names."""
    import xarray as xr

    ds = xr.Dataset(coords={"run": [0, 1, 2]}, attrs={
        "study_wall_time_s": 384.0, "study_runs_trained": 2, "study_workers": 2, "study_invocation": "study",
        "specs_json": "[{}, {}, {}]", "provenance_json": '{"written_by": {"cpu_model": "Some CPU"}}'})
    assert wall_time(ds) == "6.4 min (2 of 3 runs trained, 2 workers, Some CPU)"
    ds.attrs.update(study_invocation="analyze", study_runs_trained=0, study_workers=1)
    assert wall_time(ds) == "6.4 min (analyses of 3 runs, none trained, 1 worker, Some CPU)"
    ds.attrs.update(study_wall_time_s=42.4)
    assert wall_time(ds).startswith("42 s (")
    assert wall_time(xr.Dataset(coords={"run": [0]})) == "wall time not recorded"
    notes = " ".join(_section(readme_text, "paper-b-notes").split())
    for label in PAPER_B_WALL_TIMES:
        if not (DATA / f"{label}.nc").is_file():  # a preset whose dataset is not committed yet
            assert f"{label} " not in notes, label
            continue
        recorded = "study_wall_time_s" in dataset(label).attrs
        assert (f"{label} wall time not recorded" in notes) != recorded, label
        assert f"{label} " in notes, label
    assert "shared with another job" not in readme_text and "4.4 min" not in readme_text


@pytest.mark.slow
def test_an_empty_readme_section_is_filled(make_results, readme_text):
    body = _section(readme_text, "paper-b-notes")
    emptied = readme_text.replace(body, "", 1)
    assert make_results.stale_sections(emptied) == ["paper-b-notes"]
    assert make_results.readme(emptied) == readme_text


def test_the_fresh_section_carries_the_fixed_point_datasets_numbers(make_results, readme_text):
    """README's fixed-point lines: the found count over the sweep's fixed-point seeds, and Corollary 1's
    r against the q∥ crossing recomputed from the dataset's own run variables."""
    import numpy as np

    from dynlab.analysis.correlation import tcross_mp_correlation

    seeds, ds = sweep_sets()[-1]
    text = " ".join(_section(readme_text, "paper-a-fresh").split())
    ok = (ds["status"].values.astype(str) == "ok") & np.isfinite(ds["mp"].values)
    sd = ok & (ds["family"].values.astype(str) == "state-dependent")
    res = ds["fp_residual"].values[sd]
    found = int((np.isfinite(res).any(1) & np.all(~np.isfinite(res) | (res <= 1e-8), axis=1)).sum())
    assert f"Seeds {seeds}: {found} of {int(sd.sum())} learned state-dependent runs" in text
    if "T_cross_fp" in ds:
        par = ds["T_cross_par"].values[ok]
        r = tcross_mp_correlation(ds["T_cross_fp"].values[ok], np.where(np.isfinite(par), par, ds["horizon"].values[ok]),
                                  horizon=ds["horizon"].values[ok], mp_censored=~np.isfinite(par), censoring="drop",
                                  n_boot=1, rng=np.random.default_rng(0))
        assert f"gives r = {r.pearson_r:+.2f} [" in text


def _step_down_holm(p: list[float]) -> list[float]:
    """Holm's adjusted p written out once more: the k-th smallest times (m - k), kept monotone."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    out, running = [0.0] * len(p), 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - k) * p[i]))
        out[i] = running
    return out


def _per_seed(ds, variable: str, arm: str):
    import numpy as np

    rows = (ds["phase"].values.astype(str) == "post") & (ds["intervention"].values.astype(str) == arm)
    return ds[variable].values[rows][np.argsort(ds["seed"].values[rows])]


ARMS = ("random-noise", "fitted-noise", "state-passing", "tbtt")


@pytest.mark.parametrize("label", ["length-generalization-interventions", "length-generalization-interventions-no-conv"])
def test_the_interventions_rows_carry_holm_p_recomputed_from_the_runs(make_results, readme_text, detail_text, label):
    """Raw p from scipy's paired t-test on the per-seed PPL, Holm over the 8 tests of 4 arms x
    {far, in-range}, as the detailed interventions rows print them; README's verdict per arm
    ("yes" exactly when the far drop holds after Holm, with that Holm p) and its prose hold."""
    from scipy import stats

    ds = dataset(label)
    tests = [(v, arm) for v in ("ppl_far", "ppl_in") for arm in ARMS]
    raw = [stats.ttest_rel(_per_seed(ds, v, arm), _per_seed(ds, v, "zero")).pvalue for v, arm in tests]
    held = dict(zip(tests, _step_down_holm(raw)))
    for (v, arm), p, h in zip(tests, raw, held.values()):
        assert f"p {p:.2g} (Holm {h:.2g})" in detail_text, (v, arm)
    for arm in ARMS:
        row = next(line for line in _section(readme_text, "paper-b").splitlines()
                   if line.startswith(f"| post-training with {arm.replace('-', ' ').replace('tbtt', 'TBTT')} "))
        cell = row.split(" | ")[2]
        verdict = (cell.split("; without")[0] if label.endswith("interventions")
                   else cell.split("without the convolution (seeds ")[1].split(") ", 1)[1])
        far = ("ppl_far", arm)
        lower = (_per_seed(ds, "ppl_far", arm) - _per_seed(ds, "ppl_far", "zero")).mean() < 0
        word = "not shown" if held[far] >= 0.05 else "yes" if lower else "no, the opposite"
        assert verdict.startswith(word + ":"), (arm, verdict)
        assert f"(Holm p {held[far]:.2g})" in verdict, (arm, verdict)
    far_kept = {arm for (v, arm), h in held.items() if v == "ppl_far" and h < 0.05}
    pairs = [(a, b) for i, a in enumerate(ARMS) for b in ARMS[i + 1:]]
    pair_p = _step_down_holm([stats.ttest_rel(_per_seed(ds, "ppl_far", a), _per_seed(ds, "ppl_far", b)).pvalue
                              for a, b in pairs])
    in_kept = {arm for (v, arm), h in held.items() if v == "ppl_in" and h < 0.05}
    # "With the convolution ... at a price in range: state passing, TBTT and random noise raise the in-range PPL
    # significantly after Holm; random noise's far drop and all gaps between arms miss 0.05; paper B's order is
    # not shown; without the convolution, every far drop does." (README's What this says)
    assert min(pair_p) >= 0.05
    if label.endswith("no-conv"):
        assert far_kept == set()
    else:
        assert far_kept == {"fitted-noise", "state-passing", "tbtt"}
        assert in_kept == {"state-passing", "tbtt", "random-noise"}
    prose = " ".join(readme_text.split())
    assert "random noise's far drop and all gaps between arms miss 0.05" in prose
    assert "state passing, TBTT and random noise raise the in-range PPL significantly after Holm" in prose


def test_the_tbtt_row_states_the_text_its_loader_reads(make_results, detail_text):
    """The fraction of the training text that TBTT's post-training reads, counted by running its loader."""
    import json

    from dynlab.lm.data.corpus import load_corpus
    from dynlab.lm.data.loaders import SequentialChunkLoader

    ds = dataset("length-generalization-interventions")
    spec = json.loads(ds.attrs["specs_json"])[0]["fields"]
    text = load_corpus(spec["data"]["source"], spec["data"]["val_fraction"]).train
    loader = SequentialChunkLoader(text, spec["train"]["batch_size"], spec["train"]["seq_len"])
    seen = set()
    for _ in range(spec["post"]["steps"]):
        seen.update(int(i) for start in next(loader).offsets for i in range(start, start + spec["train"]["seq_len"] + 1))
    assert tbtt_coverage(ds) == (len(seen), len(text))
    row = next(line for line in detail_text.splitlines() if line.startswith("| tbtt,"))
    assert f"{100 * len(seen) / len(text):.1f} % of the training text, the same in every seed" in row
    assert "on the same batches" not in detail_text


def test_the_order_row_is_arm_order_of_the_dataset(make_results, readme_text, detail_text):
    """The arms' order row: bootstrap intervals from scipy over seeds, pairs tested, Holm over the pairs."""
    import numpy as np
    from scipy import stats

    ds = dataset("length-generalization-interventions")
    row = next(line for line in detail_text.splitlines() if line.startswith("| the arms' order"))
    verdict = next(line for line in _section(readme_text, "paper-b").splitlines() if line.startswith("| the arms' order"))
    zero = _per_seed(ds, "ppl_far", "zero")
    sp = _per_seed(ds, "ppl_far", "state-passing") - zero
    ci = stats.bootstrap((sp,), np.mean, method="percentile", rng=np.random.default_rng(0)).confidence_interval
    cell = minus
    assert f"state passing {cell(sp.mean(), 2, sign=True)} [{cell(ci.low)}, {cell(ci.high)}]" in row
    rn, fn = _per_seed(ds, "ppl_far", "random-noise"), _per_seed(ds, "ppl_far", "fitted-noise")
    assert f"random noise − fitted noise {cell((rn - fn).mean(), 2, sign=True)} (p {stats.ttest_rel(rn, fn).pvalue:.2g})" in row
    assert "none below 0.05" in row and "| not shown: no pair of arms differs after Holm" in verdict


def test_the_dataset_commands_configs_exist_and_validate(make_results):
    """A committed dataset's command that reads ``--config FILE`` names a file of the
    repository that the study's own option checks accept (so the command runs as printed)."""
    from dynlab.app.lm_config import lm_knob_options
    from dynlab.app.study import entry_of

    seen = 0
    for label, _, command, _ in make_results.DATASETS:
        match = re.search(r"--config (\S+)", command)
        if match is None:
            continue
        path = ROOT / match.group(1)
        assert path.is_file(), f"{label}: {match.group(1)} is not in the repository"
        study = command.split()[2]
        assert lm_knob_options(entry_of(study, "lm"), {}, path), f"{label}: {path.name} sets nothing"
        seen += 1
    assert seen >= 3  # copying-state128 and the two no-conv datasets


def test_the_annealed_count_in_readme_prose_is_the_datasets(readme_text):
    """"of 9 trained alone to their budget 4 hold": the in-run rises (most seeds above the
    threshold) that have a run trained alone, and how many of those rise alone, from the
    size and size-annealed datasets read with xarray directly."""
    import numpy as np

    size, alone = dataset("length-generalization-size"), dataset("length-generalization-size-annealed")
    runs = {}
    for ds in (size, alone):
        for i in range(ds.sizes["run"]):
            r = ds.isel(run=i)
            key = (int(r["d_model"]), int(r["train_length"]), bool(r["annealed"]))
            for b, v in zip(r["budget"].values, r["far_over_in"].values):
                if np.isfinite(v):
                    runs.setdefault((*key, float(b)), []).append(float(v))
    cells = [(d, t, b) for (d, t, a, b), v in runs.items() if not a and 2 * sum(x > 1.05 for x in v) > len(v)
             and (d, t, True, b) in runs]
    held = [c for c in cells if 2 * sum(x > 1.05 for x in runs[(c[0], c[1], True, c[2])]) > 3]  # of the 3 seeds
    flat = " ".join(readme_text.split())
    assert f"of {len(cells)} trained alone to their budget {len(held)} hold" in flat


def test_the_state_map_row_carries_the_pre_registered_verdicts(readme_text):
    """When the state map's dataset is committed, README's row says the two verdicts that
    dynlab.lm.report.forget.state_verdicts gives it (the rule fixed before the seeds ran); until
    then README has no such row."""
    from dynlab.lm.report.forget import state_verdicts

    body = _section(readme_text, "paper-b")
    rows = [line for line in body.splitlines() if "learns to forget" in line]
    if not (DATA / "length-generalization-state.nc").is_file():
        assert rows == []
        return
    verdicts = state_verdicts(dataset("length-generalization-state"))
    assert len(rows) == 1
    assert f"threshold {verdicts['threshold']}:" in rows[0] and f"Contraction {verdicts['contraction']}:" in rows[0]
