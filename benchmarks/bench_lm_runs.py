"""Training time of whole quick-preset LM runs per mixer, as ratios to Mamba-2.

Each mixer trains the length-generalization study's quick preset (``studies/length_generalization.py``:
2 layers, width 64, 1500 AdamW steps of batch 16 × 32 bytes of Shakespeare, one thread, zero
initial states) through :func:`dynlab.lm.train.engine.train_lm`.  The runs are interleaved so that
all mixers see the same conditions of a shared box: each round trains every model for
``--chunk`` more steps (a new ``train_lm`` call, so the learning-rate schedule restarts each
round; the work per step is the same as in one long call).  Printed: the summed CPU time of
each mixer's steps (``time.process_time``, which other jobs disturb far less than wall time),
its ratio to Mamba-2's, and the median and interquartile range of the per-round ratios.
Evaluation is not timed; a few warm-up steps per mixer run first.

    python benchmarks/bench_lm_runs.py [--steps 1500] [--chunk 100] [--mixers mamba2 mamba1 gla]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dynlab.kernels.selective_scan.chunked import compiled_kernel_status
from dynlab.lm.data.corpus import load_corpus
from dynlab.lm.train.interventions import ZeroInit
from dynlab.lm.models.model import RecurrentLM
from dynlab.lm.spec import LMModelSpec
from dynlab.lm.train.engine import train_lm
from dynlab.studies.length_generalization_presets import PRESETS


def main() -> None:
    quick = PRESETS["quick"]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=quick["train"]["steps"], help="training steps per mixer")
    parser.add_argument("--chunk", type=int, default=100, help="steps per mixer and round")
    parser.add_argument("--mixers", nargs="+", default=["mamba2", "mamba1", "gla"], choices=["mamba2", "mamba1", "gla"])
    args = parser.parse_args()
    mixers = ["mamba2", *[m for m in args.mixers if m != "mamba2"]]
    torch.set_num_threads(1)
    data = load_corpus("shakespeare").train
    tr = quick["train"]

    def build(mixer: str) -> RecurrentLM:
        spec = LMModelSpec(mixer=mixer, **quick["model"])
        return RecurrentLM(mixer, d_model=spec.d_model, n_layers=spec.n_layers, mlp_ratio=spec.mlp_ratio,
                           generator=torch.Generator().manual_seed(0), **spec.mixer_kwargs())

    models = {m: build(m) for m in mixers}
    for mixer in mixers:  # warm-up (first-call costs, the C kernel's build) outside the timings
        train_lm(build(mixer), data, ZeroInit(), steps=3, batch_size=tr["batch_size"], seq_len=tr["seq_len"], threads=1)
    cpu: dict[str, list[float]] = {m: [] for m in mixers}
    losses: dict[str, float] = {}
    done, rnd = 0, 0
    while done < args.steps:
        steps = min(args.chunk, args.steps - done)
        for mixer in mixers:
            c0 = time.process_time()
            res = train_lm(models[mixer], data, ZeroInit(), steps=steps, batch_size=tr["batch_size"],
                           seq_len=tr["seq_len"], lr=tr["lr"], threads=tr["threads"], seed=rnd)
            cpu[mixer].append(time.process_time() - c0)
            if res.status != "ok":
                raise SystemExit(f"{mixer} diverged: {res.reason}")
            losses[mixer] = res.losses[-1]
        done += steps
        rnd += 1
    print(f"C kernel: {compiled_kernel_status()}")
    print(f"{args.steps} steps per mixer in {rnd} interleaved rounds of {args.chunk}")
    print(f"{'mixer':8s} {'CPU s':>8s} {'× mamba2':>9s} {'per round':>10s} {'IQR':>11s} {'last loss':>10s}")
    ref = sum(cpu["mamba2"])
    for mixer in mixers:
        ratios = sorted(a / b for a, b in zip(cpu[mixer], cpu["mamba2"]))
        q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
        print(f"{mixer:8s} {sum(cpu[mixer]):8.1f} {sum(cpu[mixer]) / ref:9.2f} {statistics.median(ratios):10.2f} "
              f"{q1:5.2f}–{q3:<5.2f} {losses[mixer]:10.3f}")


if __name__ == "__main__":
    main()
