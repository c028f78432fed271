"""Training time of whole quick-preset LM runs per mixer, as ratios to Mamba-2.

Each mixer trains the length-generalization study's quick preset (``studies/length_generalization.py``:
2 layers, width 64, 1500 AdamW steps of batch 16 × 32 bytes of Shakespeare, one thread, zero
initial states) through :func:`dynlab.lm.train.train_lm`, one run after the other in this
process.  The ratio uses the process's CPU time of each training (``time.process_time``),
which other jobs on a shared box disturb far less than wall time (printed too).  Evaluation
is not timed; a few warm-up steps per mixer run first.

    python benchmarks/bench_lm_runs.py [--steps 1500] [--mixers mamba2 mamba1 gla]
"""

from __future__ import annotations

import argparse
import time

import torch

from dynlab.kernels.selective_scan import compiled_kernel_status
from dynlab.lm.corpus import load_corpus
from dynlab.lm.interventions import ZeroInit
from dynlab.lm.model import RecurrentLM
from dynlab.lm.spec import LMModelSpec
from dynlab.lm.train import train_lm
from studies.length_generalization import PRESETS


def main() -> None:
    quick = PRESETS["quick"]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=quick["train"]["steps"], help="training steps per run")
    parser.add_argument("--mixers", nargs="+", default=["mamba2", "mamba1", "gla"], choices=["mamba2", "mamba1", "gla"])
    args = parser.parse_args()
    if args.mixers[0] != "mamba2":
        args.mixers = ["mamba2", *[m for m in args.mixers if m != "mamba2"]]
    torch.set_num_threads(1)
    data = load_corpus("shakespeare").train
    tr = quick["train"]
    print(f"C kernel: {compiled_kernel_status()}")
    print(f"{'mixer':8s} {'CPU s':>8s} {'wall s':>8s} {'CPU × mamba2':>13s} {'final loss':>11s}")
    def build(mixer: str) -> RecurrentLM:
        spec = LMModelSpec(mixer=mixer, **quick["model"])
        return RecurrentLM(mixer, d_model=spec.d_model, n_layers=spec.n_layers, mlp_ratio=spec.mlp_ratio,
                           generator=torch.Generator().manual_seed(0), **spec.mixer_kwargs())

    for mixer in args.mixers:  # warm-up (first-call costs, the C kernel's build) outside the timings
        train_lm(build(mixer), data, ZeroInit(), steps=3, batch_size=tr["batch_size"], seq_len=tr["seq_len"], threads=1)
    ref = None
    for mixer in args.mixers:
        model = build(mixer)
        c0 = time.process_time()
        res = train_lm(model, data, ZeroInit(), steps=args.steps, batch_size=tr["batch_size"], seq_len=tr["seq_len"],
                       lr=tr["lr"], threads=tr["threads"], seed=0)
        cpu = time.process_time() - c0
        ref = cpu if ref is None else ref
        loss = sum(res.losses[-max(1, len(res.losses) // 20):]) / max(1, len(res.losses[-max(1, len(res.losses) // 20):]))
        print(f"{mixer:8s} {cpu:8.1f} {res.seconds:8.1f} {cpu / ref:13.2f} {loss:11.3f}  ({res.status})")


if __name__ == "__main__":
    main()
