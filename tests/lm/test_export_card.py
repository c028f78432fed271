"""``dynlab lm export`` writes a byte-level tokenizer that ``AutoTokenizer`` loads (ids = the
text's UTF-8 bytes, as dynlab tokenises) and a model card README.md with the layout, the
training budget, the data and the evaluation of the run."""

from __future__ import annotations

import json

import pytest
from helpers.lm_runs import smoke_lm_run
import torch
from helpers.optional import need_transformers

transformers = need_transformers()

from dynlab.cli import main  # noqa: E402
from dynlab.lm.data.corpus import decode, encode  # noqa: E402
from dynlab.lm.train.posttrain import load_checkpoint  # noqa: E402

TEXTS = ["To be, or not to be, that is the question:\n", "  two leading spaces, a\ttab and a trailing one ",
         "é, ∀, Ā (U+0100, a byte character of the table), 🙂 and a NUL \x00 .", " . , ; ' \" ?! ~"]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    return smoke_lm_run(tmp_path_factory.mktemp("lg"), steps=7)


def _export(run, dest):
    assert main(["lm", "export", str(run), str(dest)]) == 0
    return dest


def test_tokenizer_round_trips_and_matches_dynlab(lm_run, tmp_path, capsys):
    out = _export(lm_run, tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert len(tok) == 256 and tok.all_special_ids == []
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert ids == encode(text).tolist() == list(text.encode("utf-8"))
        assert tok.decode(ids) == text == decode(torch.tensor(ids, dtype=torch.uint8))
    assert len(set(tok.convert_ids_to_tokens(list(range(256))))) == 256  # one token per byte
    # the ids fit the model: the exported HF model on the tokenizer's ids gives dynlab's logits on its own ids
    text = TEXTS[0]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    model, _ = load_checkpoint(lm_run)
    with torch.no_grad():
        got = hf(tok(text, return_tensors="pt").input_ids).logits.float()
        want, _ = model(encode(text).long()[None])
    assert torch.allclose(got, want.float(), atol=1e-4, rtol=1e-4)
    _export(lm_run, out)  # an earlier export (tokenizer and card included) is replaced
    assert sorted(p.name for p in out.iterdir()) == [".dynlab-export", "README.md", "config.json", "generation_config.json",
                                                     "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def test_model_card_of_an_lm_run(lm_run, tmp_path, capsys):
    card = (_export(lm_run, tmp_path / "hf") / "README.md").read_text()
    spec = json.loads((lm_run / "spec.json").read_text())["fields"]
    result = json.loads((lm_run / "result.json").read_text())
    assert f"# dynlab run {lm_run.name}: a byte-level Mamba2ForCausalLM" in card
    assert card.startswith("---\nlicense: unknown\nlibrary_name: transformers\npipeline_tag: text-generation\n"
                           "tags: [dynlab, mamba2, byte-level]\n---\n")  # the Hub's metadata
    tokens = 7 * spec["train"]["batch_size"] * spec["train"]["seq_len"]  # --steps 7, batch 8, T_train 16
    assert "| steps | 7 |" in card and f"| training tokens (steps × batch × T_train) | {tokens} |" in card
    assert f"| d_model | {spec['model']['d_model']} |" in card and "| n_layers | 1 |" in card
    n_params = sum(p.numel() for p in load_checkpoint(lm_run)[0].parameters())
    assert f"| parameters | {n_params:,} |".replace(",", " ") in card
    assert "Shakespeare plays" in card and "## Evaluation" in card
    for t, p in zip(result["ppl_binned_t"], result["ppl_binned"]):  # the stored evaluation, every bin
        assert f"| {t} | {p:.4g} |" in card
    block = card.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(block) == spec


def test_model_card_of_a_task_run(tmp_path, capsys):
    argv = ["study", "passkey", "--preset", "smoke", "--steps", "5", "--interventions", "state-passing",
            "--out", str(tmp_path / "runs"), "--device", "cpu", "-q"]
    assert main(argv) == 0
    (run,) = (tmp_path / "runs" / "passkey" / "runs").iterdir()
    card = (_export(run, tmp_path / "hf") / "README.md").read_text()
    result = json.loads((run / "result.json").read_text())
    assert "Task `passkey`" in card and "| sample length | 112–128 tokens |" in card
    assert "| training samples (steps × batch) | 40 |" in card  # 5 steps of batch 8
    assert "this export holds the trained model, not an arm" in card
    assert "| length | depth 0.0 | depth 1.0 |" in card
    for n, row in zip(result["lengths"], result["accuracy"]):
        assert f"| {n} | " + " | ".join(f"{a:.3f}" for a in row) + " |" in card


def test_export_of_a_model_in_memory_has_a_card_without_a_run(tmp_path):
    from dynlab.lm.hub.export import export_hf
    from dynlab.lm.run.text import build_model
    from dynlab.lm.spec import LMModelSpec, LMRunSpec

    model = build_model(LMRunSpec(model=LMModelSpec(mixer="mamba2", mlp_ratio=0, d_model=16, n_layers=1, n_heads=2,
                                                    head_dim=16, d_state=8, chunk_size=8)))
    out = export_hf(model, tmp_path / "hf")
    card = (out / "README.md").read_text()
    assert "# a dynlab model: a byte-level Mamba2ForCausalLM" in card and "| d_model | 16 |" in card
    assert "no run record" in card and "## Training" not in card
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tok(TEXTS[2])["input_ids"] == list(TEXTS[2].encode("utf-8"))
