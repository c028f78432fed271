"""How fast the command line refuses bad input, and whether it loaded torch to do so.

Each case runs ``dynlab …`` as a fresh subprocess (the interpreter's start-up included,
as a user meets it) in an empty temporary folder, ``--repeats`` times; the table gives the
fastest wall time, the exit code, whether ``torch`` and ``matplotlib`` were imported by
the time the process ended, and the first line of stderr.  ``--help`` and ``study list``
are in the table too: they are not refusals, but they should be as light.

    python benchmarks/bench_refusals.py                 # the table
    python benchmarks/bench_refusals.py --json r.json   # and {"machine": …, "rows": […]} as JSON

The ``lm post-train`` cases need a checkpoint: a tiny dynlab LM run (3 training steps)
is trained once in the temporary folder unless ``--checkpoint`` names one.  Every case
runs with ``--device cpu`` where it takes a device, under a time limit (``--timeout``);
a case that runs past it is reported with exit code ``timeout``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dynlab.bench import write_bench_json

#: Runs ``dynlab.cli.main`` on argv and, at exit, writes which heavy modules were loaded.
WRAPPER = r"""
import atexit, json, os, sys
def _report():
    with open(os.environ["DYNLAB_BENCH_REPORT"], "w") as f:
        json.dump({m: m in sys.modules for m in ("torch", "matplotlib")}, f)
atexit.register(_report)
from dynlab.cli import main
sys.exit(main(sys.argv[1:]))
"""

#: (case, argv); ``{ckpt}`` is the checkpoint, ``{out}`` an output folder that must stay absent.
CASES: list[tuple[str, list[str]]] = [
    ("--help", ["--help"]),
    ("study list", ["study", "list"]),
    ("post-train --seq-len 0", ["lm", "post-train", "--checkpoint", "{ckpt}", "--seq-len", "0", "--out", "{out}"]),
    ("post-train --samples 0", ["lm", "post-train", "--checkpoint", "{ckpt}", "--samples", "0", "--out", "{out}"]),
    ("post-train --source ''", ["lm", "post-train", "--checkpoint", "{ckpt}", "--source", "", "--out", "{out}"]),
    ("bench train --length 1e9", ["bench", "train", "--quick", "--length", "1000000000", "--device", "cpu"]),
    ("babilong --kinds qa4", ["study", "babilong", "--kinds", "qa4", "--out", "{out}"]),
    ("babilong --kinds ,", ["study", "babilong", "--kinds", ",", "--out", "{out}"]),
    ("group-tracking --models all,tanh-rnn", ["study", "group-tracking", "--models", "all,tanh-rnn", "--out", "{out}"]),
    ("group-tracking --models lstm9000", ["study", "group-tracking", "--models", "lstm9000", "--out", "{out}"]),
    ("group-tracking --groups Q8", ["study", "group-tracking", "--groups", "Q8", "--out", "{out}"]),
    ("group-tracking --preset huge", ["study", "group-tracking", "--preset", "huge", "--out", "{out}"]),
    ("group-tracking --seeds x", ["study", "group-tracking", "--seeds", "x", "--out", "{out}"]),
    ("group-tracking --device tpu", ["study", "group-tracking", "--device", "tpu", "--out", "{out}"]),
    ("group-tracking --out ''", ["study", "group-tracking", "--models", "tanh-rnn", "--groups", "C2",
                                 "--preset", "smoke", "--device", "cpu", "-q", "--out", ""]),
    ("length-generalization --source ''", ["study", "length-generalization", "--source", "", "--out", "{out}"]),
]


def tiny_checkpoint(folder: Path) -> Path:
    """A finished dynlab LM run folder (3 training steps of a tiny Mamba-2)."""
    from dynlab.runner.driver import run_study
    from dynlab.runner.protocol import StudyOptions
    from dynlab.studies.length_generalization import STUDY

    tiny = {"model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 4, "d_state": 4, "chunk_size": 8},
            "train": {"steps": 3, "batch_size": 2, "seq_len": 16},
            "eval": {"length_multiple": 4, "n_samples": 3, "chunk_len": 16, "bin_width": 8, "effrem_points": 4,
                     "effrem_samples": 2, "state_points": 8}, "interventions": ["zero"]}
    options = StudyOptions(preset="quick", extra=tiny)
    run_study(STUDY, options, out=folder, device="cpu")
    return folder / "length-generalization" / "runs" / STUDY.make_specs(options)[0].spec_hash()


def run_case(argv: list[str], cwd: Path, timeout: float) -> dict:
    """One subprocess: exit code, wall seconds, heavy modules loaded, stderr's first line."""
    report = cwd / "modules.json"
    report.unlink(missing_ok=True)
    env = {**os.environ, "DYNLAB_BENCH_REPORT": str(report)}
    env.pop("DYNLAB_DEBUG", None)
    start = time.perf_counter()
    try:
        res = subprocess.run([sys.executable, "-c", WRAPPER, *argv], cwd=cwd, env=env, capture_output=True,
                             text=True, timeout=timeout)
        rc: int | str = res.returncode
        err = res.stderr.strip().splitlines()
    except subprocess.TimeoutExpired as exc:
        rc, err = "timeout", (exc.stderr or b"").decode(errors="replace").strip().splitlines()
    wall = time.perf_counter() - start
    modules = json.loads(report.read_text()) if report.is_file() else {"torch": None, "matplotlib": None}
    return {"rc": rc, "wall_s": round(wall, 3), **modules, "stderr": err[0] if err else "", "stderr_lines": len(err)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, help="An LM checkpoint for the post-train cases (default: a tiny run).")
    parser.add_argument("--repeats", type=int, default=3, help="Runs per case; the fastest is reported.")
    parser.add_argument("--timeout", type=float, default=120.0, help="Seconds before a case is stopped.")
    parser.add_argument("--json", type=Path, help="Also write the rows as JSON.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        ckpt = args.checkpoint or tiny_checkpoint(tmp_path / "ckpt")
        rows = []
        for case, argv in CASES:
            best = None
            for _ in range(args.repeats):
                cwd = Path(tempfile.mkdtemp(dir=tmp))  # an empty folder: a write into it would show
                out = cwd / "out"
                row = run_case([a.replace("{ckpt}", str(ckpt)).replace("{out}", str(out)) for a in argv], cwd,
                               args.timeout)
                row["wrote"] = sorted(p.name for p in cwd.iterdir() if p.name != "modules.json")
                if best is None or row["wall_s"] < best["wall_s"]:
                    best = row
            rows.append({"case": case, **best})
    w = max(len(r["case"]) for r in rows)
    print(f"{'case':{w}s}  {'rc':>7s}  {'wall s':>6s}  {'torch':5s}  {'mpl':5s}  {'wrote':5s}  stderr (first line)")
    for r in rows:
        print(f"{r['case']:{w}s}  {r['rc']!s:>7s}  {r['wall_s']:6.2f}  {str(r['torch']):5s}  "
              f"{str(r['matplotlib']):5s}  {'yes' if r['wrote'] else 'no':5s}  {r['stderr'][:110]}")
    if args.json is not None:
        write_bench_json({"rows": rows}, args.json)


if __name__ == "__main__":
    main()
