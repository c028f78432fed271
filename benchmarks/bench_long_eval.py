"""Peak memory of a long-context evaluation (PPL(t), Definition 3.2, EffRem, state
statistics) at 8K against 128K tokens, each in a fresh process.

    python benchmarks/bench_long_eval.py [--lengths 8192,131072] [--model dynlab|hf]

Each length runs ``dynlab.lm.run.text.evaluate_lm`` from the zero state, in chunks of 2048
tokens carried through the model's state (and, for the Hugging Face Mamba-2, its cache),
on windows read from a memory-mapped token file (``dynlab data prepare``'s format). It
prints the peak resident memory (``ru_maxrss``) of the process, the resident memory once
the model and the data are set up, and the wall time, under three allocator settings:
dynlab's (:func:`dynlab.runtime.keep_freed_memory`, what every run uses), glibc's defaults
(``DYNLAB_KEEP_FREED_MEMORY=0``), and ``MALLOC_MMAP_THRESHOLD_=1048576`` besides (every
allocation of 1 MiB or more mapped, and returned to the system when freed). What dynlab
holds does not grow with the length; how much freed heap the allocator keeps, and how it
fragments over many chunks, does.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(length: int, model_kind: str, folder: str) -> None:
    import numpy as np
    import torch

    from dynlab.lm.data.corpus import Corpus
    from dynlab.lm.run.text import evaluate_lm
    from dynlab.lm.spec import LMEvalSpec

    torch.set_num_threads(1)
    val = np.memmap(Path(folder) / "val.bin", dtype=np.uint16, mode="r")
    corpus = Corpus("bench", train=val, val=val)
    if model_kind == "dynlab":
        from dynlab.lm.models.model import RecurrentLM

        model = RecurrentLM("mamba2", d_model=64, n_layers=2, mlp_ratio=0, n_heads=4, head_dim=32, d_state=64,
                            chunk_size=64, vocab_size=512, generator=torch.Generator().manual_seed(0))
    else:
        import transformers

        from dynlab.lm.hub.hf import HFRecurrentLM

        cfg = transformers.Mamba2Config(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_heads=4, head_dim=32,
                                        expand=2, state_size=64, n_groups=1, chunk_size=64)
        torch.manual_seed(0)
        model = HFRecurrentLM(transformers.Mamba2ForCausalLM(cfg))
    model.eval()
    ev = LMEvalSpec(length_multiple=length // 1024, n_samples=4, chunk_len=2048, bin_width=64, effrem_points=4,
                    effrem_samples=2, state_points=16)
    from dynlab.runtime import train_threads

    setup = _rss_mb()
    t0 = time.perf_counter()
    with train_threads("cpu", threads=1):  # as every dynlab run evaluates (its allocator settings included)
        result = evaluate_lm(model, ev, 1024, corpus)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"length": length, "model": model_kind, "setup_mb": round(setup, 1), "peak_mb": round(peak, 1),
                      "wall_s": round(wall, 1), "positions": len(result["ppl"])}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="8192,131072")
    ap.add_argument("--model", default="dynlab", choices=("dynlab", "hf"))
    ap.add_argument("--child", nargs=3)
    args = ap.parse_args()
    if args.child:
        child(int(args.child[0]), args.child[1], args.child[2])
        return
    import numpy as np

    with tempfile.TemporaryDirectory() as folder:
        np.random.default_rng(0).integers(0, 512, 600_000).astype(np.uint16).tofile(Path(folder) / "val.bin")
        for label, env in (("dynlab's allocator settings", {}),
                           ("glibc's defaults", {"DYNLAB_KEEP_FREED_MEMORY": "0"}),
                           ("MALLOC_MMAP_THRESHOLD_=1048576", {"DYNLAB_KEEP_FREED_MEMORY": "0",
                                                               "MALLOC_MMAP_THRESHOLD_": "1048576"})):
            rows = []
            for length in (int(x) for x in args.lengths.split(",")):
                out = subprocess.run([sys.executable, __file__, "--child", str(length), args.model, folder],
                                     capture_output=True, text=True, check=True, env={**os.environ, **env})
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            base = rows[0]["peak_mb"]
            for r in rows:
                print(f"{label}: {r['model']} length {r['length']:>7}: peak {r['peak_mb']:.0f} MB "
                      f"({r['peak_mb'] / base:.3f} of the first), after set-up {r['setup_mb']:.0f} MB, {r['wall_s']} s",
                      flush=True)


if __name__ == "__main__":
    main()
