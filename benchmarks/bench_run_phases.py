"""Where a group-tracking run spends its time: training, evaluation, analysis, per architecture.

For each architecture, one run of the chosen preset (one group, one seed) in this process:

- ``step_s`` — seconds per training step and model at the curriculum's full length (60):
  the median of ``--steps`` timed steps with the curriculum held at 60 (the first step is
  not timed), trained as the study trains them: the preset's seeds as one ensemble
  (:func:`dynlab.train.ensemble.train_ensemble`, the step time divided by the members)
  where the study stacks them (a fused kernel computes the model), alone otherwise.  Early
  curriculum steps are shorter, so ``train_s = preset steps × step_s`` is an upper bound on
  a run's training time;
- ``eval_s`` — accuracy at every evaluation length and mp, as the study does it
  (:func:`dynlab.evaluate.evaluate_lengths` with the preset's sequences and lengths);
- ``analysis_s`` — the error-control analysis at the preset's analysis settings
  (:func:`dynlab.analysis.tracking.analyze_tracker`: U, R, M, q to the longest evaluated
  length, return map, perturbation, Lyapunov spectrum).

Evaluation and analysis cost about the same whether or not the model learned (they run the
model over fixed numbers of sequences), so the briefly trained model stands in for a
finished one.  ``ratio = (eval_s + analysis_s) / train_s``.

The extrapolation to the whole study: ``runs`` per architecture (groups × seeds of the
preset) × (train_s + eval_s + analysis_s), summed over the architectures, and divided by
``--workers`` (the Dask workers a user would run, one per core).  Dense RNN and Mamba seeds
train as ensembles, as fast per model as alone or faster, so the bound still holds.

    python benchmarks/bench_run_phases.py --preset paper --json paper_phases.json

Times are wall seconds on the machine it runs on, all measured in one process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from dynlab.analysis.tracking import analyze_tracker
from dynlab.config import CurriculumSpec
from dynlab.evaluate import evaluate_lengths
from dynlab.groups import get_group
from dynlab.models import BUILTIN_ARCHS
from dynlab.studies.group_tracking import ANALYSIS_PRESETS, PRESETS, STUDY
from dynlab.study import StudyOptions
from dynlab.tasks import WordProblem
from dynlab.studies.group_tracking import ensemble_group_key
from dynlab.train.engine import train_threads
from dynlab.train.ensemble import train_ensemble


class _Clock:
    """Progress sink that records the time of every finished training step."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def add(self, *args, **kwargs):
        return 0

    def update(self, *args, **kwargs) -> None:
        self.times.append(time.perf_counter())

    def remove(self, *args) -> None:
        pass


def phases(arch: str, preset: str, group: str, steps: int) -> dict:
    specs = STUDY.make_specs(StudyOptions(preset=preset, models=(arch,), groups=(group,)))  # the preset's seeds
    spec = specs[0]
    stacked = len({ensemble_group_key(s) for s in specs}) == 1 and len(specs) > 1
    full = spec.train.curriculum.max_length
    held = [s.model_copy(update={"train": s.train.model_copy(update={
        "steps": steps + 1, "curriculum": CurriculumSpec(min_length=full, max_length=full)})})
        for s in (specs if stacked else specs[:1])]
    cpu = torch.device("cpu")
    clock = _Clock()
    res = train_ensemble(held, cpu, clock)[0]
    step_s = statistics.median(b - a for a, b in zip(clock.times, clock.times[1:])) / len(held)
    task = WordProblem(get_group(spec.task.group))
    ev = spec.eval
    t0 = time.perf_counter()
    with train_threads(cpu):
        evaluate_lengths(res.model, task, ev.lengths, ev.n_samples, ev.batch_size, ev.chunk, ev.seed_offset, cpu)
    eval_s = time.perf_counter() - t0
    aspec = ANALYSIS_PRESETS[PRESETS[preset]["analysis"]]
    horizon = aspec.horizon or max(ev.lengths)
    t0 = time.perf_counter()
    analyze_tracker(res.model.cpu(), task, aspec, horizon=horizon, t_ref=min(aspec.t_ref or full, horizon))
    analysis_s = time.perf_counter() - t0
    train_s = spec.train.steps * step_s
    return {"arch": arch, "ensemble": len(held), "step_s": step_s, "train_steps": spec.train.steps, "train_s": train_s,
            "eval_s": eval_s, "analysis_s": analysis_s, "ratio": (eval_s + analysis_s) / train_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="paper", choices=sorted(PRESETS))
    ap.add_argument("--models", default=",".join(BUILTIN_ARCHS))
    ap.add_argument("--group", default="S3")
    ap.add_argument("--steps", type=int, default=10, help="timed training steps at the full length")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    preset = PRESETS[args.preset]
    runs_per_arch = len(preset["seeds"]) * 3  # the default groups C2, C6, S3
    rows = []
    print(f"{'arch':18s} {'ens':>3s} {'s/step':>7s} {'train s':>8s} {'eval s':>7s} {'analysis s':>10s} "
          f"{'(eval+an)/train':>15s}")
    for arch in args.models.split(","):
        r = phases(arch, args.preset, args.group, args.steps)
        rows.append(r)
        print(f"{arch:18s} {r['ensemble']:3d} {r['step_s']:7.3f} {r['train_s']:8.0f} {r['eval_s']:7.1f} {r['analysis_s']:10.1f} {r['ratio']:15.2f}",
              flush=True)
    per_run = {r["arch"]: r["train_s"] + r["eval_s"] + r["analysis_s"] for r in rows}
    total_h = runs_per_arch * sum(per_run.values()) / args.workers / 3600
    print(f"extrapolated {args.preset} study ({runs_per_arch} runs per architecture, {len(rows)} architectures, "
          f"{args.workers} workers): {total_h:.1f} h (training bounded above by steps × the full-length step time)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "group": args.group, "workers": args.workers,
                       "runs_per_arch": runs_per_arch, "rows": rows, "total_hours": total_h}, f, indent=2)


if __name__ == "__main__":
    main()
