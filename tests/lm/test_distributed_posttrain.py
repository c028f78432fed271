"""`dynlab lm post-train` under torchrun: two gloo processes with half the batch each post-train
the checkpoint to the weights one process reaches with the whole batch (float32: to 1e-5
relative after 4 AdamW steps), with gradient accumulation to `--batch-tokens`; rank 0 alone
writes the run. A `--batch-tokens` that the batch does not divide is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.lm_runs import tiny_lm_run
from safetensors.torch import load_file

from dynlab.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    return tiny_lm_run(tmp_path_factory.mktemp("lg"))


def _post_train(run: Path, out: Path, batch: int, processes: int) -> Path:
    args = ["lm", "post-train", "--checkpoint", str(run), "--intervention", "zero", "--steps", "4", "--seq-len", "16",
            "--batch-size", str(batch), "--batch-tokens", "128", "--lr", "3e-3", "--samples", "2",
            "--eval-multiple", "2", "--device", "cpu", "--out", str(out)]
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    # run from `out`: the checkout's dynlab/ folder on sys.path would shadow the installed package
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([*launch, "-m", "dynlab.cli", *args], capture_output=True, text=True, timeout=300, cwd=out,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(out)})
    assert done.returncode == 0, done.stderr[-3000:]
    runs = list((out / "post-train" / "runs").iterdir())
    assert len(runs) == 1, runs  # one run, written once
    return runs[0]


def test_two_processes_post_train_as_one_with_the_whole_batch(run_folder, tmp_path):
    one = _post_train(run_folder, tmp_path / "one", batch=4, processes=1)  # 128 tokens = 4 × 16 × 2 micro-batches
    two = _post_train(run_folder, tmp_path / "two", batch=2, processes=2)  # 2 × 16 × 2 processes × 2 micro-batches
    spec_one, spec_two = (json.loads((r / "spec.json").read_text())["fields"]["train"] for r in (one, two))
    assert (spec_one.get("accum", 1), spec_one.get("processes", 1)) == (2, 1)
    assert (spec_two["accum"], spec_two["processes"]) == (2, 2)
    w1, w2, w0 = load_file(one / "model.safetensors"), load_file(two / "model.safetensors"), load_file(
        run_folder / "model.safetensors")
    assert max(float((w1[k] - w0[k]).abs().max()) for k in w0) > 1e-3  # post-training moved the weights
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-5, atol=1e-6, msg=k)
    assert (two / "dataset.nc").is_file() and json.loads((two / "result.json").read_text())["status"] == "ok"


def test_batch_tokens_that_the_batch_does_not_divide_is_one_line(run_folder, tmp_path, capsys):
    code = main(["lm", "post-train", "--checkpoint", str(run_folder), "--steps", "2", "--seq-len", "16",
                 "--batch-size", "4", "--batch-tokens", "100", "--out", str(tmp_path / "o"), "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--batch-tokens 100" in err[0] and "allowed: 64, 128" in err[0]
    assert not (tmp_path / "o").exists()


def test_a_killed_post_training_resumes_from_its_last_save(run_folder, tmp_path, monkeypatch):
    """Killed at step 5 of 8 (saves every 2 steps), the rerun continues from step 4 and stores the
    weights of the uninterrupted run; its training state is removed once the run is stored."""
    import dynlab.lm.train.posttrain as pt

    args = ["lm", "post-train", "--checkpoint", str(run_folder), "--intervention", "state-passing", "--steps", "8",
            "--seq-len", "16", "--batch-size", "4", "--lr", "3e-3", "--samples", "2", "--eval-multiple", "2",
            "--device", "cpu"]
    monkeypatch.setattr(pt, "SAVE_EVERY", 2)
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    train_lm, calls, kill = pt.train_lm, [], [True]

    def watched(*a, progress=None, **kw):
        def step(i, loss):
            calls.append(i)
            if i == 5 and kill[0]:
                raise KeyboardInterrupt
        return train_lm(*a, progress=step, **kw)

    monkeypatch.setattr(pt, "train_lm", watched)
    assert main([*args, "--out", str(tmp_path / "killed")]) == 130
    assert list((tmp_path / "killed" / "post-train" / "resume").glob("*.rank0.step4"))
    calls.clear()
    kill[0] = False
    assert main([*args, "--out", str(tmp_path / "killed")]) == 0
    assert calls == [4, 5, 6, 7]  # only the steps after the last save
    (a,), (b,) = ((tmp_path / x / "post-train" / "runs").iterdir() for x in ("whole", "killed"))
    w1, w2 = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert not (tmp_path / "killed" / "post-train" / "resume").exists()
