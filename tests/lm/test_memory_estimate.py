"""What an LM's training step and evaluation allocate is estimated before anything is built
(dynlab.lm.train.memory), every tensor counted: the estimate holds the peak measured in a child
process (torch's allocations from its profiler, Python's and numpy's from tracemalloc)
from above, within a stated factor, for each mixer, a stack and an evaluation; a setting
whose SSM states would not fit (64 heads x 64 channels x N = 1024 at batch 64 x 1024
tokens) is one line, exit code 2, before anything is built or written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dynlab.errors import DynlabInputError
from dynlab.lm.train.memory import WITHIN, check_train_memory, eval_bytes, train_step_bytes
from dynlab.spec import MAX_LM_MEMORY_BYTES
from dynlab.lm.spec import LMModelSpec, LMRunSpec, LMTaskRunSpec, LMTaskSpec, LMTrainSpec, TaskTrainSpec

#: Peak bytes of each case of argv[1] (a JSON list), one JSON line each: the training of a
#: model (or a stack of ``members``) for 2 steps from its making, or an evaluation. Each
#: case runs once first (imports, compiled kernels), then once under torch's profiler (the
#: peak of the live tensors, from its allocation and free events in time order) and once
#: under tracemalloc (Python's objects and numpy's arrays: the state statistics).
_MEASURE = r"""
import json, sys, tracemalloc
import torch
from torch.profiler import ProfilerActivity, profile
from dynlab.lm.data.corpus import Corpus
from dynlab.lm.run.text import build_model, evaluate_lm
from dynlab.lm.spec import LMEvalSpec, LMModelSpec, LMRunSpec, LMTrainSpec
from dynlab.lm.train.engine import batch_source, fit, make_loader

torch.set_num_threads(1)

def work(case, data, corpus):
    spec = LMRunSpec(model=LMModelSpec(**case["model"]), train=LMTrainSpec(**case["train"]),
                     eval=LMEvalSpec(**case.get("eval", {})))
    tr, g = spec.train, torch.Generator().manual_seed(0)
    if case["kind"] == "eval":
        return evaluate_lm(build_model(spec), spec.eval, tr.seq_len, corpus)
    members = case.get("members", 1)
    models = [build_model(spec) for _ in range(members)]
    ivs = [spec.intervention.make() for _ in models]
    gens = [torch.Generator().manual_seed(i) for i in range(members)]
    sources = [batch_source(make_loader(iv, data, tr.batch_size, tr.seq_len, gen)) for iv, gen in zip(ivs, gens)]
    if members == 1:
        return fit(models[0], sources[0], ivs[0], gens[0], steps=2, batch_size=tr.batch_size, device="cpu", threads=1)
    from dynlab.lm.train.ensemble import fit_ensemble
    return fit_ensemble(models, sources, ivs, gens, steps=2, batch_size=tr.batch_size, device="cpu", threads=1)

g = torch.Generator().manual_seed(0)
data = torch.randint(0, 256, (200_000,), generator=g, dtype=torch.uint8)
corpus = Corpus("random", data, torch.randint(0, 256, (100_000,), generator=g, dtype=torch.uint8))
for case in json.loads(sys.argv[1]):
    work(case, data, corpus)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        work(case, data, corpus)
    live = peak = 0
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    tracemalloc.start()
    work(case, data, corpus)
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(json.dumps(peak + traced), flush=True)
"""

_SMALL = {"d_model": 32, "n_layers": 2, "n_heads": 4, "head_dim": 16, "d_state": 16, "chunk_size": 16, "mlp_ratio": 0}
#: (what, model fields, batch, length, members or "eval"): every mixer small, with a large
#: state (where the states and the scan dominate), with an MLP, a stack, evaluations.
CASES = [
    ("mamba2", {**_SMALL, "mixer": "mamba2"}, 8, 64, 1),
    ("mamba2, large state", {**_SMALL, "mixer": "mamba2", "n_heads": 8, "d_state": 256}, 8, 128, 1),
    ("mamba1", {**_SMALL, "mixer": "mamba1", "d_state": 64}, 8, 64, 1),
    ("gla, MLP", {**_SMALL, "mixer": "gla", "d_state": 64, "mlp_ratio": 2}, 8, 64, 1),
    ("gla, large state", {**_SMALL, "mixer": "gla", "n_heads": 8, "head_dim": 32, "d_state": 128}, 4, 128, 1),
    ("mamba2 stack of 3", {**_SMALL, "mixer": "mamba2", "d_state": 64}, 8, 64, 3),
    ("mamba2 evaluation", {**_SMALL, "mixer": "mamba2", "n_heads": 8, "d_state": 256}, 32, 32, "eval"),
    ("gla evaluation", {**_SMALL, "mixer": "gla", "d_state": 64}, 32, 32, "eval"),
]


def _case(model: dict, batch: int, length: int, members: int | str) -> dict:
    if members == "eval":  # evaluated at 8 x 32 tokens in pieces of `length`, states at the pieces' ends
        return {"kind": "eval", "model": model, "train": {"batch_size": 8, "seq_len": 32},
                "eval": {"n_samples": batch, "chunk_len": length, "length_multiple": 8, "bin_width": 16,
                         "state_points": 0}}
    return {"kind": "train", "model": model, "members": members,
            "train": {"batch_size": batch, "seq_len": length, **({"engine": "stack"} if members > 1 else {})}}


def test_the_estimate_bounds_the_measured_peak_within_its_factor(tmp_path):
    """Measured with the torch forms of the scans (``DYNLAB_C_KERNELS=0``), what the
    estimate counts: the compiled C loops keep less (their estimate is still an upper bound)."""
    cases = [_case(model, batch, length, members) for _, model, batch, length, members in CASES]
    env = {**os.environ, "DYNLAB_C_KERNELS": "0", "PYTHONPATH": ""}
    proc = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps(cases)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    peaks = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(peaks) == len(CASES)
    for (what, model, batch, length, members), peak in zip(CASES, peaks):
        spec = LMModelSpec(**model)
        estimate = (eval_bytes(spec, batch, length) if members == "eval"
                    else train_step_bytes(spec, batch, length, members)).total
        assert peak <= estimate <= WITHIN * peak, (what, estimate / 2**20, peak / 2**20)


#: The setting of the issue: 64 heads x 64 channels, N = 1024, at batch 64 x 1024 tokens.
_OVERSIZED = "[model]\nn_heads = 64\nhead_dim = 64\nd_state = 1024\n[train]\nbatch_size = 64\nseq_len = 1024\n"


@pytest.mark.parametrize("mixer", ["mamba2", "mamba1", "gla"])
def test_an_oversized_state_is_refused_in_one_line_before_anything_is_written(tmp_path, mixer):
    """Through the command line, in a child process whose address space is capped at 6 GiB
    (were the check missing, it would fail there instead of taking the machine's memory)."""
    config = tmp_path / "big.toml"
    config.write_text(_OVERSIZED)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "dynlab.cli", "study", "length-generalization", "--preset", "smoke", "--models",
            mixer, "--config", str(config), "--out", str(out), "-q"]
    cap = "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30)); "
    proc = subprocess.run([sys.executable, "-c", cap + "sys.argv = sys.argv[1:]; runpy.run_module('dynlab.cli', "
                           "run_name='__main__')", *argv[2:]], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": ""})
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-2000:])
    assert lines[0].startswith("error: invalid LMRunSpec: a training step of train.batch_size 64 × train.seq_len "
                               f"1024 tokens with model.mixer {mixer}, model.n_layers 1 × model.n_heads 64 × "
                               "model.head_dim 64 × model.d_state 1024 needs about "), lines[0]
    assert "GiB (SSM states and scan intermediates" in lines[0] and "allowed: at most 80 GiB" in lines[0]
    assert not out.exists() and proc.stdout == ""


def test_a_stack_counts_every_member_and_a_task_its_longest_sample():
    model = LMModelSpec(mixer="mamba2", d_model=64, n_layers=2, n_heads=8, head_dim=32, d_state=128, chunk_size=64,
                        mlp_ratio=0)
    spec = LMRunSpec(model=model, train=LMTrainSpec(batch_size=64, seq_len=512, engine="stack"))
    one = train_step_bytes(model, 64, 512)
    assert one.total < MAX_LM_MEMORY_BYTES < train_step_bytes(model, 64, 512, members=32).total == 32 * one.total
    LMRunSpec.check_work_item([spec])  # one run: fits
    with pytest.raises(DynlabInputError, match=r"^a training step of train\.batch_size 64 × train\.seq_len 512 tokens "
                                               r"with .* × 32 runs trained at once \(train\.engine 'stack'\) needs "
                                               r"about \d+\.\d GiB .*; allowed: at most 80 GiB"):
        LMRunSpec.check_work_item([spec.model_copy(update={"seed": s}) for s in range(32)])
    loop = spec.model_copy(update={"train": spec.train.model_copy(update={"engine": "loop"})})
    LMRunSpec.check_work_item([loop] * 32)  # the loop engine trains them one after another
    with pytest.raises(ValueError, match=r"train\.batch_size 64 × \(the longest sample of task\.train_max 8000\) "
                                         r"16003 tokens .* needs about"):
        LMTaskRunSpec(model=model, task=LMTaskSpec(kind="copying", train_min=10, train_max=8000, eval_lengths=(50,)),
                      train=TaskTrainSpec(batch_size=64))
    with pytest.raises(DynlabInputError, match="allowed: at most 1 GiB"):
        check_train_memory(model, 64, 512, limit=2**30)
