"""``benchmarks/gpu_compare.py`` (dynlab against mamba-ssm on a GPU), on the CPU: its tiny mode
measures dynlab's side and skips mamba-ssm's naming why; tokens are counted as the sizes say;
the verdicts follow the targets; mamba-ssm's side runs through a stand-in of mamba-ssm's API
(the library itself needs CUDA); the full sizes are the ones the script states."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import math
import sys
import types

import pytest
import torch

from helpers.paths import REPO

STEPS, BATCH, SEQ_LEN = 2, 3, 16  # this test's sizes for (a) (--steps also sets the stack's timed steps)
MEMBERS, STACK_BATCH, STACK_SEQ_LEN = 16, 2, 8  # the tiny stack: 16 members of batch 2 x 8 tokens


def _load():
    spec = importlib.util.spec_from_file_location("gpu_compare", REPO / "benchmarks" / "gpu_compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gc():
    return _load()


def _run(gc, out, *args: str) -> tuple[int, dict, str]:
    """main(args) writing into ``out``: (exit code, compare.json strictly parsed, what it printed)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = gc.main([*args, "--out", str(out)])
    data = json.loads((out / "compare.json").read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    return rc, data, printed.getvalue()


def _tiny(gc, out) -> tuple[int, dict, str]:
    return _run(gc, out, "--device", "cpu", "--tiny", "--steps", str(STEPS), "--batch", str(BATCH),
                "--seq-len", str(SEQ_LEN))


@pytest.fixture(scope="module")
def tiny(gc, tmp_path_factory):
    return _tiny(gc, tmp_path_factory.mktemp("compare"))


def _expected_tokens(comparison: str) -> int:
    if comparison.startswith("stack-"):
        return MEMBERS * STEPS * STACK_BATCH * STACK_SEQ_LEN
    return STEPS * BATCH * SEQ_LEN


def _check_measured(row: dict) -> None:
    assert row["status"] == "ok" and row["reason"] is None, row
    assert row["tokens"] == _expected_tokens(row["comparison"]), row
    assert math.isfinite(row["tokens_per_s"]) and row["tokens_per_s"] > 0 and row["seconds"] > 0
    assert row["tokens_per_s"] == pytest.approx(row["tokens"] / row["seconds"])
    assert row["peak_memory_bytes"] is None  # the CPU: no CUDA allocator to ask


def test_the_cpu_tiny_mode_measures_dynlab_and_skips_mamba_ssm_naming_why(tiny):
    rc, data, printed = tiny
    assert rc == 0
    rows = data["rows"]
    assert [(r["comparison"], r["side"]) for r in rows] == [
        (c, s) for c in ("lm-mamba2", "lm-mamba1", f"stack-{MEMBERS}") for s in ("dynlab", "mamba-ssm")]
    for row in rows[0::2]:
        _check_measured(row)
        assert row["models"] == (MEMBERS if row["comparison"].startswith("stack") else 1)
    assert {k for r in rows[:4:2] for k in r["backends"]} >= {"ssd", "selective_scan"}  # each mixer's scan ran
    for row in rows[1::2]:
        assert row["status"] == "skipped" and row["tokens_per_s"] is None
        assert row["reason"] == "mamba-ssm runs on CUDA only (--device cpu)"
    for c in data["comparisons"]:
        assert c["verdict"] == "skipped" and c["ratio"] is None and "CUDA only" in c["reason"]
    skipped = [line for line in printed.splitlines() if line.startswith("gpu_compare: skipped")]
    assert skipped == ["gpu_compare: skipped mamba-ssm lm-mamba2, mamba-ssm lm-mamba1, mamba-ssm stack-16: "
                       "mamba-ssm runs on CUDA only (--device cpu)"]
    assert printed.rstrip().endswith(f"gpu_compare: {data['summary']}")
    assert "lm-mamba2 dynlab " in data["summary"] and "mamba-ssm skipped" in data["summary"]
    assert data["setting"]["size"] == "tiny" and data["setting"]["steps"] == STEPS


def test_without_cuda_every_row_is_skipped_and_the_script_exits_0(gc, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, data, printed = _run(gc, tmp_path)  # the default device: cuda
    assert rc == 0
    assert len(data["rows"]) == 6 and all(r["status"] == "skipped" for r in data["rows"])
    assert all("no CUDA device" in r["reason"] for r in data["rows"])
    assert [c["verdict"] for c in data["comparisons"]] == ["skipped"] * 3
    assert printed.count("gpu_compare: skipped") == 1 and "no CUDA device" in printed


def test_a_dynlab_row_that_raises_is_an_error_and_exits_1(gc, monkeypatch, tmp_path):
    def broken(*args):
        raise RuntimeError("CUDA out of memory\nsecond line")

    monkeypatch.setattr(gc, "dynlab_lm", broken)
    monkeypatch.setattr(gc, "dynlab_stack", broken)
    rc, data, _ = _tiny(gc, tmp_path)
    assert rc == 1
    dyn = data["rows"][0::2]
    assert [r["status"] for r in dyn] == ["error"] * 3 and dyn[0]["reason"] == "RuntimeError: CUDA out of memory"
    assert [c["verdict"] for c in data["comparisons"]] == ["error"] * 3
    assert data["comparisons"][0]["reason"] == "dynlab raised RuntimeError: CUDA out of memory"


def _row(gc, side: str, tokens_per_s: float | None, peak: int | None = None) -> dict:
    if tokens_per_s is None:
        return gc._skipped("lm-mamba2", side, "mamba-ssm is not installed")
    return gc._row("lm-mamba2", side, tokens=1000, seconds=1000 / tokens_per_s, peak_memory_bytes=peak)


@pytest.mark.parametrize("dyn, ref, verdict, ratio", [
    (950.0, 1000.0, "PASS", 0.95), (900.0, 1000.0, "PASS", 0.9), (800.0, 1000.0, "FAIL", 0.8),
    (2000.0, 1000.0, "PASS", 2.0), (950.0, None, "skipped", None),
])
def test_the_verdict_is_the_ratio_against_the_target(gc, dyn, ref, verdict, ratio):
    c = gc.compare(_row(gc, "dynlab", dyn, 3 * 2**30), _row(gc, "mamba-ssm", ref, 2 * 2**30), 0.9)
    assert c["verdict"] == verdict
    if ratio is None:
        assert c["ratio"] is None and c["reason"] == "mamba-ssm is not installed"
    else:
        assert c["ratio"] == pytest.approx(ratio) and c["memory_ratio"] == pytest.approx(1.5) and c["reason"] is None


# -- mamba-ssm's side through a stand-in of its API (mamba-ssm 2.2+: MambaConfig, MambaLMHeadModel) ----------

#: The keyword arguments mamba-ssm's Mamba2 and Mamba (Mamba-1) mixers take (mamba_ssm/modules/).
MAMBA2_ARGS = {"d_state", "d_conv", "conv_init", "expand", "headdim", "d_ssm", "ngroups", "A_init_range", "D_has_hdim",
               "rmsnorm", "norm_before_gate", "dt_min", "dt_max", "dt_init_floor", "dt_limit", "bias", "conv_bias",
               "chunk_size", "use_mem_eff_path"}
MAMBA1_ARGS = {"d_state", "d_conv", "expand", "dt_rank", "dt_min", "dt_max", "dt_init", "dt_scale", "dt_init_floor",
               "conv_bias", "bias", "use_fast_path"}


@dataclasses.dataclass
class _MambaConfig:
    """mamba_ssm/models/config_mamba.py's fields and defaults."""

    d_model: int = 2560
    d_intermediate: int = 0
    n_layer: int = 64
    vocab_size: int = 50277
    ssm_cfg: dict = dataclasses.field(default_factory=dict)
    attn_layer_idx: list = dataclasses.field(default_factory=list)
    attn_cfg: dict = dataclasses.field(default_factory=dict)
    rms_norm: bool = True
    residual_in_fp32: bool = True
    fused_add_norm: bool = True
    pad_vocab_size_multiple: int = 8
    tie_embeddings: bool = True


def _stand_in(seen: list) -> dict[str, types.ModuleType]:
    """Modules standing in for mamba-ssm's: its config and a tied embedding-head LM that checks
    the mixer's arguments against the real ones (``seen`` collects every config)."""

    class MambaLMHeadModel(torch.nn.Module):
        def __init__(self, config, initializer_cfg=None, device=None, dtype=None):
            super().__init__()
            ssm = dict(config.ssm_cfg)
            layer = ssm.pop("layer", "Mamba1")
            assert layer in ("Mamba1", "Mamba2") and set(ssm) <= (MAMBA2_ARGS if layer == "Mamba2" else MAMBA1_ARGS)
            seen.append(config)
            vocab = config.vocab_size + (-config.vocab_size) % config.pad_vocab_size_multiple
            self.embedding = torch.nn.Embedding(vocab, config.d_model, device=device)
            self.lm_head = torch.nn.Linear(config.d_model, vocab, bias=False, device=device)
            self.lm_head.weight = self.embedding.weight

        def forward(self, input_ids):
            return types.SimpleNamespace(logits=self.lm_head(self.embedding(input_ids)))

    mods = {n: types.ModuleType(n) for n in ("mamba_ssm", "mamba_ssm.models", "mamba_ssm.models.config_mamba",
                                             "mamba_ssm.models.mixer_seq_simple")}
    mods["mamba_ssm.models.config_mamba"].MambaConfig = _MambaConfig
    mods["mamba_ssm.models.mixer_seq_simple"].MambaLMHeadModel = MambaLMHeadModel
    return mods


def test_mamba_ssms_side_runs_its_api_on_the_same_sizes(gc, monkeypatch, tmp_path):
    seen: list = []
    for name, module in _stand_in(seen).items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(gc, "mamba_problem", lambda dev: None)
    monkeypatch.setattr(gc, "_has_causal_conv1d", lambda: False)
    rc, data, _ = _tiny(gc, tmp_path)
    assert rc == 0
    for row in data["rows"]:
        _check_measured(row)
    mamba = data["rows"][1::2]
    assert [r["models"] for r in mamba] == [1, 1, MEMBERS] and not any(r["fused"] for r in mamba)
    for c, (dyn, ref) in zip(data["comparisons"], zip(data["rows"][0::2], mamba)):
        assert c["ratio"] == pytest.approx(dyn["tokens_per_s"] / ref["tokens_per_s"])
        assert c["verdict"] == ("PASS" if c["ratio"] >= c["target"] else "FAIL")
    assert len(seen) == 2 + MEMBERS
    lm2, lm1, member = seen[0], seen[1], seen[2]
    assert lm2.ssm_cfg == {"layer": "Mamba2", "d_state": 16, "d_conv": 4, "expand": 2, "headdim": 32, "chunk_size": 16,
                           "dt_min": 1e-3, "dt_max": 1e-1, "use_mem_eff_path": False}  # no causal-conv1d: unfused
    assert lm1.ssm_cfg == {"d_state": 16, "d_conv": 4, "expand": 2}  # mamba-ssm's default layer: Mamba-1
    assert (member.d_model, member.n_layer, member.vocab_size, member.d_intermediate) == (16, 2, 256, 0)
    assert member.ssm_cfg["dt_min"] == 1e-5 and member.ssm_cfg["headdim"] == 16


def test_the_full_sizes_are_the_stated_130m_layouts_and_the_quick_preset(gc):
    full = gc.SIZES["full"]
    assert (full["vocab"], full["batch"], full["seq_len"]) == (50280, 8, 2048)
    assert gc.mamba_config(gc._spec(full, "mamba2"), True) == {  # mamba2-130m's layout, mamba-ssm's defaults
        "d_model": 768, "n_layer": 24, "vocab_size": 50280, "d_intermediate": 0,
        "ssm_cfg": {"layer": "Mamba2", "d_state": 128, "d_conv": 4, "expand": 2, "headdim": 64, "chunk_size": 256,
                    "dt_min": 1e-3, "dt_max": 1e-1}}
    assert gc.mamba_config(gc._spec(full, "mamba1"), True)["ssm_cfg"] == {"d_state": 16, "d_conv": 4, "expand": 2}
    from dynlab.lm.run.text import build_model
    from dynlab.lm.spec import LMRunSpec

    member = build_model(LMRunSpec(model=gc._spec(full), seed=0))
    assert sum(p.numel() for p in member.parameters()) == 101_848  # the quick preset's model
    assert (gc.MEMBERS, full["stack_batch"], full["stack_seq_len"]) == (16, 16, 32)
    assert gc.TARGETS == {"lm-mamba2": 0.9, "lm-mamba1": 0.9, "stack-16": 5.0}
    tiny = gc.SIZES["tiny"]
    assert (tiny["stack_batch"], tiny["stack_seq_len"]) == (STACK_BATCH, STACK_SEQ_LEN)
