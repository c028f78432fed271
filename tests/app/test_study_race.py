"""Two ``dynlab study`` commands started at once into one fresh ``--out``: one writes the
study, the other is refused in one line (exit 2, "being written by another dynlab
process"); never a ``FileNotFoundError`` (exit 1) from the folders the other one probes,
makes and removes, and the refused one removes nothing of the study that writes.

Each round sends one ``--out`` to two waiting processes at the same moment; both run the
whole command line (``dynlab.cli.main``: the folder checks, the write probe, the lock,
the marker), the study's training replaced by a pause that holds the lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from dynlab.results.folder import LOCK, MARKER

#: One process: reads an --out folder a line, runs `dynlab study group-tracking` into it,
#: answers its exit code and stderr as one JSON line.
_STUDY_PROCESS = r"""
import contextlib, io, json, sys, time
import dynlab.runner.driver
from dynlab.cli import main

class RunLoop:  # the lock is held for a moment, nothing is trained
    def __init__(self, *args, **kwargs):
        self.work = None

    def items(self):
        time.sleep(0.3)
        return []

    def finish(self):
        return {"trained": 0, "reused": 0, "analyzed": 0, "not_learned": 0, "failed": 0, "train_s": 0.0,
                "analysis_s": 0.0}

dynlab.runner.driver.RunLoop = RunLoop
dynlab.runner.driver._finish = lambda study, specs, store, *args, **kwargs: store.root / "dataset.nc"
argv = ["study", "group-tracking", "--models", "tanh-rnn", "--groups", "C2", "--preset", "smoke", "-q",
        "--device", "cpu", "--out"]
with contextlib.redirect_stdout(io.StringIO()):
    main(["study", "list"])  # the command line imported before the first round
print(json.dumps("ready"), flush=True)
for line in sys.stdin:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([*argv, line.strip()])
    print(json.dumps([code, err.getvalue()]), flush=True)
"""

ROUNDS = 10


def test_two_studies_started_at_once_one_writes_the_other_is_refused_in_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": "", "DYNLAB_DEBUG": "0"}
    procs = [subprocess.Popen([sys.executable, "-c", _STUDY_PROCESS], cwd=tmp_path, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    try:
        assert [json.loads(p.stdout.readline()) for p in procs] == ["ready", "ready"]
        for i in range(ROUNDS):
            out = tmp_path / f"out{i}"
            for p in procs:  # both start at once
                p.stdin.write(f"{out}\n")
            for p in procs:
                p.stdin.flush()
            results = sorted(json.loads(p.stdout.readline()) for p in procs)
            (won, won_err), (lost, lost_err) = results
            assert (won, won_err) == (0, ""), results
            if lost == 0:  # the other had finished first: one after the other, both fine
                continue
            root = out / "group-tracking"
            assert lost == 2 and lost_err == (f"error: --out {root} is being written by another dynlab process (it "
                                              f"holds {root / LOCK}); allowed: wait until it finishes, or another "
                                              "--out\n"), results
            assert (root / MARKER).is_file() and (root / LOCK).is_file()  # the refused one removed nothing
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=60)
            p.stdout.close()
