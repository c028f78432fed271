"""``dynlab bench train``: strict JSON, the two kinds of floor, per-row fractions of the floor."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re

import pytest

from dynlab.bench import bench_train, bytes_per_token, floor_kind, strict_json, write_bench_json, write_json
from dynlab.report import bench_machine_line
from dynlab.results.provenance import cpu_features


@pytest.fixture(scope="module")
def payload(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    results = [bench_train(arch, 8, 4, 5, (2,), steps=2, threads=(1,)) for arch in ("tanh-rnn", "mamba")]
    text = write_json(results, out).read_text()
    return text, json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


def test_bench_json_is_strict_with_null_for_missing_numbers(payload):
    text, data = payload
    assert "NaN" not in text and "Infinity" not in text
    floor_rows = [r for res in data["results"] for r in res["rows"] if r["method"].startswith("floor")]
    assert len(floor_rows) == 2 and all(r["seconds_per_step"] is None for r in floor_rows)


def test_bench_every_row_reports_floor_kind_and_fraction(payload):
    _, data = payload
    kinds = {res["arch"]: res["floor_kind"] for res in data["results"]}
    assert kinds == {"tanh-rnn": "gemm", "mamba": "bandwidth"}
    for res in data["results"]:
        floor = res["floor_tokens_per_s"]
        for r in res["rows"]:
            assert r["floor_kind"] == res["floor_kind"]
            assert r["fraction_of_floor"] == pytest.approx(r["tokens_per_s"] / floor)
        threads = str(res["threads"])
        if res["floor_kind"] == "gemm":
            assert floor == pytest.approx(res["gemm_rate_flops"][threads] / res["flops_per_token"])
            assert res["bytes_per_token"] is None
        else:
            assert floor == pytest.approx(res["memory_bandwidth_bytes"][threads] / res["bytes_per_token"])
        rows = {r["method"]: r for r in res["rows"]}
        solo, ens = rows["dynlab"]["tokens_per_s"], rows["dynlab ensemble-2"]["tokens_per_s"]  # model-tokens/s
        assert res["ensemble_vs_solo_per_model"] == pytest.approx(ens / solo)


def test_bench_json_records_the_machine(payload):
    """CPU model, cores, torch version and the date it was written, and the report's machine line names them."""
    import torch

    _, data = payload
    machine = data["machine"]
    assert machine["cpu_model"] == cpu_features()[0] and machine["cpu_model"]
    assert machine["cores"] == os.cpu_count()
    assert machine["torch"] == torch.__version__
    made = dt.datetime.fromisoformat(machine["created_utc"])
    assert made.tzinfo is not None and abs(dt.datetime.now(dt.timezone.utc) - made) < dt.timedelta(hours=1)
    line = bench_machine_line(data)
    assert line.startswith(f"Machine: CPU {machine['cpu_model']}; {machine['cores']} cores")
    assert f"torch {torch.__version__}" in line and f"recorded {machine['created_utc']}" in line
    assert "not recorded" not in line


def test_every_benchmark_script_writes_its_json_through_write_bench_json(repo_root):
    """A script with a ``--json`` option writes the file with write_bench_json (so it records
    the machine), never with a bare json.dump or write_text."""
    scripts = sorted((repo_root / "benchmarks").glob("*.py"))
    writers = [p for p in scripts if re.search(r"""add_argument\(\s*["']--json""", p.read_text())]
    assert {p.name for p in writers} >= {"bench_run_phases.py", "bench_lm_mixers.py", "bench_refusals.py"}
    for path in writers:
        text = path.read_text()
        assert "write_bench_json(" in text, f"{path.name} writes --json without write_bench_json"
        assert not re.search(r"json\.dump\((?!\{m: m in sys\.modules)|\.write_text\(json", text), path.name


def test_write_bench_json_keeps_the_payload_and_adds_the_machine(tmp_path):
    payload = {"preset": "quick", "rows": [{"x": math.nan}]}
    data = json.loads(write_bench_json(payload, tmp_path / "b.json").read_text())
    assert data["preset"] == "quick" and data["rows"] == [{"x": None}]
    assert set(data["machine"]) >= {"cpu_model", "cores", "torch", "created_utc"}


def test_bench_bytes_per_token_counts_eleven_state_streams():
    """44·S bytes: S = H·N for mamba (real), 2H for the complex cells' (re, im) pairs."""
    assert bytes_per_token("mamba", 8, 4) == 44 * 8 * 4
    assert bytes_per_token("mamba3", 8, 4) == 44 * 2 * 8
    assert floor_kind("tanh-rnn") == "gemm" and floor_kind("state-gated-rnn") == "gemm"
    assert floor_kind("mamba") == "bandwidth" and floor_kind("aussm") == "bandwidth"


def test_strict_json_replaces_non_finite_numbers(tmp_path):
    assert strict_json({"a": [1.0, math.nan, (math.inf, 2)], "b": -math.inf, "c": "nan"}) == {
        "a": [1.0, None, [None, 2]], "b": None, "c": "nan"
    }
    res = {"speedup_vs_baseline": math.nan, "fraction_of_floor": 0.5, "rows": [{"seconds_per_step": math.nan}]}
    path = write_json([res], tmp_path / "x.json")
    data = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(c))
    assert data["speedup_vs_baseline"] is None and data["results"][0]["rows"][0]["seconds_per_step"] is None


def test_paired_ensemble_ratio_is_per_model_and_by_round():
    """Small / large seconds per step and model, round by round (above 1: the large ensemble
    trains each model faster); a slow round for both cancels out."""
    from dynlab.bench import paired_ensembles

    per_round = {"dynlab": [1.0, 1.0, 1.0], "dynlab ensemble-16": [0.50, 1.00, 0.40],
                 "dynlab ensemble-64": [0.25, 1.25, 0.40]}
    got = paired_ensembles(per_round)
    assert got == {"small": 16, "large": 64, "rounds": 3, "median": 1.0, "min": 0.8, "max": 2.0}
    assert paired_ensembles({"dynlab ensemble-16": [1.0]}) is None


def test_bench_reports_the_paired_ensemble_ratio(payload):
    _, data = payload
    assert all(res["ensemble_large_vs_small"] is None for res in data["results"])  # one ensemble size
    res = bench_train("tanh-rnn", 8, 4, 5, (2, 3), steps=2, threads=(1,), repeats=2)
    pair = res["ensemble_large_vs_small"]
    assert (pair["small"], pair["large"], pair["rounds"]) == (2, 3, 2)
    assert pair["min"] <= pair["median"] <= pair["max"] and pair["min"] > 0
