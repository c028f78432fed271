"""Where a group-tracking run spends its time: training, evaluation, analysis, per architecture.

For each architecture, one run of the chosen preset (one group, one seed) in this process:

- ``step_s`` — seconds per training step and model at the curriculum's full length (60):
  the median of ``--steps`` timed steps with the curriculum held at 60 (the first step is
  not timed), trained as the study trains them: the preset's seeds as one ensemble
  (:func:`dynlab.tracking.train.ensemble.train_ensemble`, the step time divided by the members)
  where the study stacks them (a fused kernel computes the model), alone otherwise.  Early
  curriculum steps are shorter, so ``train_s = preset steps × step_s`` is an upper bound on
  a run's training time;
- ``eval_s`` — accuracy at every evaluation length and mp, as the study does it
  (:func:`dynlab.tracking.evaluate.evaluate_lengths` with the preset's sequences and lengths);
- ``analysis_s`` — the error-control analysis at the preset's analysis settings
  (:func:`dynlab.tracking.analysis.pipeline.analyze_tracker`: U, R, M, q to the longest evaluated
  length, return map, perturbation, Lyapunov spectrum).

Evaluation and analysis cost about the same whether or not the model learned (they run the
model over fixed numbers of sequences), so the briefly trained model stands in for a
finished one.  ``ratio = (eval_s + analysis_s) / train_s``.

A run that never learned (status ``not-learned``) trains every step at the short length
where its curriculum stopped and its q(t) is followed only to
:func:`~dynlab.tracking.run.not_learned_horizon` (2 × the training length):
``step_s_short`` is timed with the curriculum held at ``--short-length`` (default 4),
``train_s_short = preset steps × step_s_short``, ``analysis_s_not_learned`` is the
analysis at that horizon, and ``ratio_not_learned = (eval_s + analysis_s_not_learned) /
train_s_short``.

The extrapolation to the whole study: ``runs`` per architecture (groups × seeds of the
preset) × (train_s + eval_s + analysis_s), summed over the architectures, and divided by
``--workers`` (the Dask workers a user would run, one per core).  Dense RNN and Mamba seeds
train as ensembles, as fast per model as alone or faster, so the bound still holds.

    python benchmarks/bench_run_phases.py --preset paper --json paper_phases.json

Times are wall seconds on the machine it runs on, all measured in one process.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dynlab.tracking.analysis.pipeline import analyze_tracker
from dynlab.bench import write_bench_json
from dynlab.tracking.spec import CurriculumSpec
from dynlab.tracking.evaluate import evaluate_lengths
from dynlab.tracking.groups import get_group
from dynlab.tracking.models import BUILTIN_ARCHS
from dynlab.studies.group_tracking import ANALYSIS_PRESETS, PRESETS, STUDY
from dynlab.runner.protocol import StudyOptions
from dynlab.tracking.task import WordProblem
from dynlab.tracking.run import ensemble_group_key, not_learned_horizon
from dynlab.runtime import train_threads
from dynlab.tracking.train.ensemble import train_ensemble


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


def _step_time(specs: list, length: int, steps: int) -> tuple[float, object]:
    """Seconds per training step and model with the curriculum held at ``length`` (the
    median of ``steps`` timed steps, the first not timed) and the trained model."""
    held = [s.model_copy(update={"train": s.train.model_copy(update={
        "steps": steps + 1, "curriculum": CurriculumSpec(min_length=length, max_length=length)})}) for s in specs]
    clock = _Clock()
    res = train_ensemble(held, torch.device("cpu"), clock)[0]
    return statistics.median(b - a for a, b in zip(clock.times, clock.times[1:])) / len(held), res.model


def phases(arch: str, preset: str, group: str, steps: int, short: int) -> dict:
    specs = STUDY.make_specs(StudyOptions(preset=preset, models=(arch,), extra={"groups": (group,)}))  # the preset's seeds
    spec = specs[0]
    stacked = len({ensemble_group_key(s) for s in specs}) == 1 and len(specs) > 1
    members = specs if stacked else specs[:1]
    full = spec.train.curriculum.max_length
    step_s, model = _step_time(members, full, steps)
    step_short, _ = _step_time(members, short, steps)
    cpu = torch.device("cpu")
    task = WordProblem(get_group(spec.task.group))
    ev = spec.eval
    t0 = time.perf_counter()
    with train_threads(cpu):
        evaluate_lengths(model, task, ev.lengths, ev.n_samples, ev.batch_size, ev.chunk, ev.seed_offset, cpu)
    eval_s = time.perf_counter() - t0
    aspec = ANALYSIS_PRESETS[PRESETS[preset]["analysis"]]
    horizon = aspec.horizon or max(ev.lengths)
    t_ref = min(aspec.t_ref or full, horizon)
    times = []
    for h in (horizon, not_learned_horizon(horizon, t_ref, 0)):
        t0 = time.perf_counter()
        with train_threads(cpu):
            analyze_tracker(model.cpu(), task, aspec, horizon=h, t_ref=min(t_ref, h))
        times.append(time.perf_counter() - t0)
    analysis_s, analysis_nl = times
    train_s = spec.train.steps * step_s
    train_short = spec.train.steps * step_short
    return {"arch": arch, "ensemble": len(members), "step_s": step_s, "train_steps": spec.train.steps, "train_s": train_s,
            "eval_s": eval_s, "analysis_s": analysis_s, "ratio": (eval_s + analysis_s) / train_s,
            "short_length": short, "step_s_short": step_short, "train_s_short": train_short,
            "analysis_s_not_learned": analysis_nl, "ratio_not_learned": (eval_s + analysis_nl) / train_short}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="paper", choices=sorted(PRESETS))
    ap.add_argument("--models", default=",".join(BUILTIN_ARCHS))
    ap.add_argument("--group", default="S3")
    ap.add_argument("--steps", type=int, default=10, help="timed training steps at each held length")
    ap.add_argument("--short-length", type=int, default=4,
                    help="curriculum length of a run that never learned (the quick sweep's stopped at 2–6)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    preset = PRESETS[args.preset]
    runs_per_arch = len(preset["seeds"]) * 3  # the default groups C2, C6, S3
    rows = []
    print(f"{'arch':18s} {'ens':>3s} {'s/step':>7s} {'train s':>8s} {'eval s':>7s} {'analysis s':>10s} "
          f"{'(eval+an)/train':>15s} | not learned: {'train s':>7s} {'analysis s':>10s} {'(eval+an)/train':>15s}")
    for arch in args.models.split(","):
        r = phases(arch, args.preset, args.group, args.steps, args.short_length)
        rows.append(r)
        print(f"{arch:18s} {r['ensemble']:3d} {r['step_s']:7.3f} {r['train_s']:8.0f} {r['eval_s']:7.1f} {r['analysis_s']:10.1f} "
              f"{r['ratio']:15.2f} |               {r['train_s_short']:7.1f} {r['analysis_s_not_learned']:10.1f} "
              f"{r['ratio_not_learned']:15.2f}", flush=True)
    per_run = {r["arch"]: r["train_s"] + r["eval_s"] + r["analysis_s"] for r in rows}
    total_h = runs_per_arch * sum(per_run.values()) / args.workers / 3600
    print(f"extrapolated {args.preset} study ({runs_per_arch} runs per architecture, {len(rows)} architectures, "
          f"{args.workers} workers): {total_h:.1f} h (training bounded above by steps × the full-length step time)")
    if args.json:
        write_bench_json({"preset": args.preset, "group": args.group, "workers": args.workers,
                          "runs_per_arch": runs_per_arch, "rows": rows, "total_hours": total_h}, args.json)


if __name__ == "__main__":
    main()
