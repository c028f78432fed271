"""length-generalization --preset pretrained: paper B's Fig. 5 protocol on a pretrained
checkpoint read with its own tokenizer; gradient accumulation equal to the larger batch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import xarray as xr
from helpers.optional import need_transformers
from helpers.tokenizer import tiny_mamba2, train_bpe, word_text

from dynlab.cli import main
from dynlab.lm.train.interventions import make_intervention
from dynlab.lm.models.model import RecurrentLM
from dynlab.lm.train.engine import fit

KNOBS = ["--seq-len", "16", "--batch-size", "2", "--steps", "2", "--lr", "1e-3", "--seeds", "0,1", "--quiet"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    need_transformers()
    from dynlab.lm.data.tokenizer import HFTokenizer
    from dynlab.lm.data.tokens import prepare_tokens

    root = tmp_path_factory.mktemp("pre")
    text = word_text(3000, seed=3)
    (root / "text.txt").write_text(text)
    train_bpe(root / "ckpt", text, 300)
    tiny_mamba2(root / "ckpt", 300)
    folder, _ = prepare_tokens([root / "text.txt"], HFTokenizer(root / "ckpt"), root / "tokens", val_fraction=0.1)
    return {"root": root, "ckpt": str(root / "ckpt"), "tokens": str(folder)}


def _config(tmp_path, accum: int = 2):
    path = tmp_path / "small.toml"
    path.write_text(f"[train]\naccum = {accum}\n[eval]\nlength_multiple = 4\nn_samples = 3\neffrem_samples = 2\n"
                    "effrem_points = 2\nstate_points = 4\n")
    return str(path)


def test_the_pretrained_protocol_runs_end_to_end_and_resumes(world, tmp_path):
    out = tmp_path / "out"
    args = ["study", "length-generalization", "--preset", "pretrained", "--checkpoint", world["ckpt"],
            "--source", world["tokens"], "--config", _config(tmp_path), "--out", str(out), *KNOBS]
    assert main(args) == 0
    folder = out / "length-generalization"
    ds = xr.open_dataset(folder / "dataset.nc")
    assert ds.attrs["preset"] == "pretrained"
    phases = ds["phase"].values.astype(str).tolist()
    assert phases.count("base") == 2 and phases.count("post") == 10  # 2 seeds × (checkpoint + 5 arms)
    arms = set(ds["intervention"].values.astype(str)[ds["phase"].values.astype(str) == "post"])
    assert arms == {"zero", "random-noise", "fitted-noise", "state-passing", "tbtt"}
    spec = json.loads(ds.attrs["specs_json"])[0]["fields"]
    assert spec["data"]["tokenizer"]["kind"] == "hf" and spec["model"]["vocab_size"] == 300
    assert spec["train"]["accum"] == 2 and spec["post"]["steps"] == 2 and spec["post"]["lr"] == 1e-3
    assert "far_contrast_p" in ds or any(v.startswith("far_contrast") for v in ds.data_vars)

    # the base rows are the untouched checkpoint, the same in every seed: PPL(t) of a direct evaluation
    from dynlab.lm.train.posttrain import load_checkpoint
    from dynlab.lm.run.text import data_corpus, evaluate_lm
    from dynlab.lm.spec import LMRunSpec

    run_spec = LMRunSpec.model_validate(spec)
    model, _ = load_checkpoint(world["ckpt"])
    direct = evaluate_lm(model, run_spec.eval, run_spec.train.seq_len, data_corpus(run_spec.data))
    base = ds["ppl"].values[np.array(phases) == "base"]
    np.testing.assert_allclose(base[0], direct["ppl"], rtol=1e-6)
    np.testing.assert_allclose(base[1], direct["ppl"], rtol=1e-6)
    ds.close()

    results = sorted((folder / "runs").glob("*/result.json"))
    stamps = [p.stat().st_mtime_ns for p in results]
    assert main(args) == 0  # a rerun reuses the finished runs
    assert [p.stat().st_mtime_ns for p in sorted((folder / "runs").glob("*/result.json"))] == stamps


@pytest.mark.parametrize("args, words", [
    ([], "needs --checkpoint"),
    (["--checkpoint", "CKPT"], "needs --lr"),
], ids=["no-checkpoint", "no-lr"])
def test_the_preset_refuses_what_it_lacks(world, tmp_path, capsys, args, words):
    out = tmp_path / "o"
    args = [a.replace("CKPT", world["ckpt"]) for a in args]
    code = main(["study", "length-generalization", "--preset", "pretrained", "--source", world["tokens"],
                 "--out", str(out), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0], err
    assert not (out / "length-generalization").exists()


def test_a_checkpoint_belongs_to_the_pretrained_preset_only(world, tmp_path, capsys):
    code = main(["study", "length-generalization", "--preset", "smoke", "--checkpoint", world["ckpt"],
                 "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "preset 'pretrained'" in err[0], err
    code = main(["study", "copying", "--checkpoint", world["ckpt"], "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--checkpoint is not an option of copying" in err[0], err


def _model() -> RecurrentLM:
    return RecurrentLM("mamba2", d_model=16, n_layers=1, n_heads=2, head_dim=8, d_state=4, chunk_size=8,
                       generator=torch.Generator().manual_seed(0)).double()


def test_accumulated_micro_batches_equal_the_whole_batch():
    """accum = 2 on the two halves of a batch of 8 is the update of that batch of 8 (a
    stateless intervention: the mean loss over equal halves is the mean over the whole)."""
    batches = [torch.randint(0, 256, (8, 17), generator=torch.Generator().manual_seed(i)) for i in range(3)]
    fresh = torch.ones(8, dtype=torch.bool)

    def whole():
        it = iter(batches)
        return lambda: (next(it), None, fresh)

    def halves():
        it = iter([h for b in batches for h in (b[:4], b[4:])])
        return lambda: (next(it), None, fresh[:4])

    a, b = _model(), _model()
    kw = dict(steps=3, lr=1e-2, device="cpu", warmup_frac=0.0)
    ra = fit(a, whole(), make_intervention("zero"), torch.Generator(), batch_size=8, **kw)
    rb = fit(b, halves(), make_intervention("zero"), torch.Generator(), batch_size=4, accum=2, **kw)
    np.testing.assert_allclose(ra.losses, rb.losses, rtol=1e-12)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-9, atol=1e-12, msg=name)
    with pytest.raises(ValueError, match="accum"):
        fit(_model(), whole(), make_intervention("zero"), torch.Generator(), batch_size=8, accum=0, **kw)
