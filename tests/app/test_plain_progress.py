"""Progress without a terminal: plain lines on stderr (one per finished run, a heartbeat at
most every 30 s of silence, the summary once), never rich bars or escape codes."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

from dynlab.runtime import HEARTBEAT_S, NullProgress, PlainProgress, Progress, make_progress


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_heartbeat_at_most_every_30_s_of_silence():
    out, clock = io.StringIO(), _Clock()
    p = PlainProgress(stream=out, clock=clock)  # not entered: no background thread, beats come from updates
    assert HEARTBEAT_S == 30.0
    bar = p.add("mamba2/zero", 1500)
    for step in range(1, 301):  # 300 steps, 0.25 s each: 75 s
        clock.now = step * 0.25
        p.update(bar, 1, loss=2.0 + 1.0 / step)
    lines = out.getvalue().splitlines()
    assert lines == ["… mamba2/zero 120/1500 loss=2.008 (30.0 s)", "… mamba2/zero 240/1500 loss=2.004 (1 min 00 s)"]
    clock.now = 85.0
    p.finished("study: run 1/1 abc ok")  # a printed line restarts the silence
    clock.now = 114.0
    p.beat()
    assert out.getvalue().splitlines()[-1] == "study: run 1/1 abc ok"
    clock.now = 115.0
    p.beat()
    assert out.getvalue().splitlines()[-1] == "… mamba2/zero 300/1500 loss=2.003 (1 min 55 s)"
    p.remove(bar)
    clock.now = 1000.0
    p.beat()  # nothing in progress: no heartbeat
    assert len(out.getvalue().splitlines()) == 4


def test_heartbeat_thread_speaks_for_silent_work():
    """Inside ``with``, a background thread prints the heartbeat even when no update comes
    (an evaluation, a remote worker), and stops at the end of the block."""
    import time

    out = io.StringIO()
    with PlainProgress(stream=out, heartbeat_s=0.2) as p:
        p.add("evaluating", None)
        time.sleep(1.0)
    lines = out.getvalue().splitlines()
    assert 1 <= len(lines) <= 6 and all(re.fullmatch(r"… evaluating 0 \(\d\.\d s\)", ln) for ln in lines), lines
    time.sleep(0.5)
    assert out.getvalue().splitlines() == lines  # the thread has stopped


def test_progress_kind_follows_stderr(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert type(make_progress(True)) is PlainProgress
    assert type(make_progress(False)) is NullProgress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Tty())
    assert type(make_progress(True)) is Progress


def _dynlab(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "dynlab.cli", *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=Path(__file__).parent)  # not the checkout's root (its dynlab/ folder)


def test_piped_study_prints_a_line_per_run_and_the_summary_once(tmp_path):
    """stderr a pipe: one plain line per finished run as it finishes, the summary once,
    no bars or escape codes; a rerun that reuses every run prints its summary only."""
    argv = ("study", "length-generalization", "--preset", "smoke", "--out", str(tmp_path), "--device", "cpu")
    res = _dynlab(*argv)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert "\x1b" not in res.stderr and "━" not in res.stderr
    runs = [ln for ln in lines if re.fullmatch(r"length-generalization: run [12]/2 [0-9a-f]{16} \[mamba2, "
                                               r"(zero|state-passing), seed 0\] ok, loss [\d.]+, [\d.]+ s", ln)]
    assert [r.split()[2] for r in runs] == ["1/2", "2/2"]  # each run named by its arm: mixer, intervention, seed
    assert sorted(r.split(", ")[1] for r in runs) == ["state-passing", "zero"]
    summary = "length-generalization: 2 trained, 0 reused, 0 analysed, 0 not learned, 0 failed"
    assert lines.count(summary) == 1 and lines[-1] == summary
    phase = [ln for ln in lines if re.fullmatch(r"length-generalization: training [\d.]+ s, analyses [\d.]+ s"
                                                r"( \([\d.]+ of training\))?", ln)]
    assert len(phase) == 1 and lines[-2] == phase[0], lines  # the two phases' times, once, before the summary
    assert all(ln in runs or ln == summary or ln in phase or ln.startswith("… ") for ln in lines), lines
    assert res.stdout.splitlines() == [f"dataset: {tmp_path / 'length-generalization' / 'dataset.nc'}"]
    again = _dynlab(*argv)
    assert again.returncode == 0, again.stderr
    assert again.stderr.splitlines() == ["length-generalization: 0 trained, 2 reused, 0 analysed, 0 not learned, 0 failed"]
