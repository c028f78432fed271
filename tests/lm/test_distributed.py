"""One LM over two processes (``torchrun``, gloo on the CPU) equals one process with the
doubled batch, and a run killed midway resumes to the same end.

Each case runs ``tests/helpers/ddp_train.py`` (8 steps of 2 micro-batches, float64) in fresh
processes. Tolerances: the two ranks' gradients are summed by the all-reduce, the one
process sums the rows of its batch in another order, so parameters agree to rounding
(1e-10 relative after 8 AdamW steps in float64); a resumed run is the same computation
and agrees exactly.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dynlab.errors import DynlabInputError
from dynlab.lm.train.distributed import accum_for_tokens

HELPER = Path(__file__).parents[1] / "helpers" / "ddp_train.py"
pytestmark = pytest.mark.slow


def _launch(script: Path, args: list[str], world: int, home: Path) -> subprocess.CompletedProcess:
    """``script`` with ``args`` in a fresh process (``world`` 1) or under ``torchrun`` with ``world`` processes."""
    launcher = [sys.executable] if world == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
    return subprocess.run([*launcher, str(script), *args], capture_output=True, text=True, timeout=300,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(home)})


def _run(out: Path, batch: int, arm: str, world: int, resume: Path | None = None, crash_at: int = -1,
         expect: int = 0, seed: int = 5) -> dict:
    args = [str(out), str(batch), arm, str(resume) if resume else "-", str(crash_at), str(seed)]
    done = _launch(HELPER, args, world, out.parent)
    assert (done.returncode == 0) == (expect == 0), done.stderr[-3000:]
    if expect == 0 and world > 1:  # the group was left and gloo's threads stopped before the teardown
        assert done.stdout.count("gloo threads at exit: 0") == world, done.stdout
    return torch.load(out, weights_only=True) if expect == 0 else {}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


@pytest.mark.parametrize("arm", ["zero", "tbtt"])
def test_two_processes_equal_one_with_the_doubled_batch(tmp_path, arm):
    one = _run(tmp_path / "one.pt", 4, arm, world=1)
    two = _run(tmp_path / "two.pt", 2, arm, world=2)
    assert two["world"] == 2 and one["world"] == 1 and one["status"] == two["status"] == "ok"
    start = RecurrentLM_params()
    moved = max(_rel(one["params"][k], start[k]) for k in start)
    assert moved > 1e-3, "training must move the parameters for the comparison to mean anything"
    for k in one["params"]:
        assert _rel(two["params"][k], one["params"][k]) < 1e-10, k
    torch.testing.assert_close(two["losses"], one["losses"], rtol=1e-10, atol=0)


def RecurrentLM_params() -> dict[str, torch.Tensor]:  # noqa: N802 - the helper's starting model
    from dynlab.lm.models.model import RecurrentLM

    model = RecurrentLM("mamba2", d_model=16, n_layers=2, n_heads=2, head_dim=8, d_state=8, chunk_size=8,
                        generator=torch.Generator().manual_seed(1)).double()
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_a_two_process_run_killed_midway_resumes_to_the_same_end(tmp_path):
    whole = _run(tmp_path / "whole.pt", 2, "state-passing", world=2)
    state = tmp_path / "train.state"
    _run(tmp_path / "crashed.pt", 2, "state-passing", world=2, resume=state, crash_at=5, expect=3)
    assert state.exists() and sorted(p.name for p in tmp_path.glob("train.state.rank*")) == [
        "train.state.rank0.step4", "train.state.rank1.step4"]
    resumed = _run(tmp_path / "resumed.pt", 2, "state-passing", world=2, resume=state)
    for k in whole["params"]:
        torch.testing.assert_close(resumed["params"][k], whole["params"][k], rtol=0, atol=0)
    torch.testing.assert_close(resumed["losses"], whole["losses"], rtol=0, atol=0)
    assert not state.exists() and not list(tmp_path.glob("train.state.rank*"))  # removed once the outputs are saved


def test_a_run_killed_after_its_last_step_resumes_without_training(tmp_path):
    """The state of the last step is kept until the outputs are saved: a kill in between costs no step."""
    whole = _run(tmp_path / "whole.pt", 4, "zero", world=1)
    state = tmp_path / "train.state"
    _run(tmp_path / "crashed.pt", 4, "zero", world=1, resume=state, crash_at=8, expect=3)  # after training
    assert sorted(p.name for p in tmp_path.glob("train.state.rank*")) == ["train.state.rank0.step8"]
    resumed = _run(tmp_path / "resumed.pt", 4, "zero", world=1, resume=state)
    assert whole["steps_run"] == 8 and resumed["steps_run"] == 0  # nothing trained again
    torch.testing.assert_close(resumed["losses"], whole["losses"], rtol=0, atol=0)
    for k in whole["params"]:
        torch.testing.assert_close(resumed["params"][k], whole["params"][k], rtol=0, atol=0)


def test_a_state_is_refused_by_a_run_with_another_seed(tmp_path):
    state = tmp_path / "train.state"
    _run(tmp_path / "crashed.pt", 4, "zero", world=1, resume=state, crash_at=5, expect=3)
    _run(tmp_path / "other.pt", 4, "zero", world=1, resume=state, expect=1, seed=999)
    assert state.exists()


def test_a_state_saved_by_two_processes_is_refused_by_one(tmp_path):
    state = tmp_path / "train.state"
    _run(tmp_path / "crashed.pt", 2, "zero", world=2, resume=state, crash_at=3, expect=3)
    _run(tmp_path / "one.pt", 4, "zero", world=1, resume=state, expect=1)
    assert state.exists()  # kept: the refusal changed nothing


def test_a_joined_group_is_left_before_the_interpreter_tears_down(tmp_path):
    """A gloo group left to finalisation can abort the process after its work is done
    (SIGABRT, "terminate called without an active exception"): init_world leaves it at exit,
    and leaving it stops gloo's threads even after a DDP step (which imports torch._dynamo, a
    module that, imported after the group exists, kept it alive past destroy_process_group)."""
    if not Path("/proc/self/task").is_dir():
        pytest.skip("counts native threads through /proc (Linux)")
    done = _launch(HELPER.with_name("ddp_exit.py"), [], 2, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("sum [3.0, 3.0, 3.0]") == 2, done.stdout
    assert done.stdout.count("joined at exit: False") == 2, done.stdout
    joined = [int(n) for n in re.findall(r"gloo threads while joined: (\d+)", done.stdout)]
    assert len(joined) == 2 and min(joined) > 0, done.stdout  # the count sees gloo's threads
    assert done.stdout.count("gloo threads at exit: 0") == 2, done.stdout


def test_accum_for_tokens_divides_exactly():
    assert accum_for_tokens(524288, 8, 2048, 8) == 4
    assert accum_for_tokens(4096, 4, 512, 2) == 1
    with pytest.raises(DynlabInputError, match=r"--batch-tokens 5000 .* 4096 tokens; allowed: 4096, 8192"):
        accum_for_tokens(5000, 4, 512, 2)
    with pytest.raises(DynlabInputError, match="--batch-tokens 2048"):
        accum_for_tokens(2048, 4, 512, 2)
