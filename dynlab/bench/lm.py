"""LM training throughput (``dynlab bench lm``): the one-model loop, stacks of E models,
the no-op-mixer floor and the FLOP floor, per model width, measured in one process.

For each width ``d_model`` (the layout of the length-generalization presets: width 16 is
the ``budget`` preset's model, 64 the ``quick`` preset's, 128 and 256 the quick layout
made wider; Mamba-2 blocks, or with ``mixer`` the same layout with Mamba-1 or GLA blocks)
it times full training steps on a random byte stream (batch B, length T, zero initial
states; forward, cross-entropy, backward, clipping, AdamW) of:

- ``loop`` — :func:`dynlab.lm.train.engine.fit`, one model (what the studies ran before stacks);
- ``stack-E`` — :func:`dynlab.lm.train.ensemble.fit_ensemble` with E members;
- ``no-op mixer`` — the largest stack with every mixer replaced by zeros: what the rest of
  the step (embedding, norms, MLPs, head, loss, optimiser) costs; a stack cannot beat it
  without making those faster;
- ``floor`` — GEMM rate / (6 · P) model-tokens/s: every parameter used once forward (2 FLOPs
  per multiply-add) and twice backward per token, at the rate of a ``[B·T, 256] @
  [256, 256]`` product in the same process and thread count. It counts neither the
  scans' own arithmetic nor the elementwise work, so it is a lower bound of the work.

Definitions (what the table prints):

- throughput (model-tokens/s) = members · B · T · timed steps / wall time of those steps
  (a stack's tokens count for every member); the first ``warmup`` steps are not timed;
- ``vs loop`` = throughput / the loop's throughput at that width, measured in the same run;
- ``of floor`` = throughput / floor;
- ``peak MB`` (stacks only) = the growth of the peak resident memory (``VmHWM``) while the
  stack trains 2 steps, in a fresh child process per stack (so earlier measurements do not
  hide it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

from dynlab.report.bench import lm_bench_markdown  # one renderer for every benchmark

__all__ = ["LM_WIDTHS", "bench_lm", "lm_bench_markdown", "lm_bench_model", "peak_memory_mb"]

#: The widths ``dynlab bench lm`` measures by default.
LM_WIDTHS = (16, 64, 128, 256)


def lm_bench_model(d_model: int, seed: int = 0, mixer: str = "mamba2"):
    """The benchmark's LM at width ``d_model``: the ``budget`` preset's model at 16, else
    the ``quick`` preset's layout at that width (Mamba-2 blocks without MLP; ``mixer``: the
    same layout with that mixer's blocks, as the studies build them)."""
    from dynlab.lm.run.text import build_model
    from dynlab.lm.spec import BUDGET_LM_LAYOUT, QUICK_LM_LAYOUT, LMModelSpec, LMRunSpec, anchor_model_fields

    layout = {**(BUDGET_LM_LAYOUT if d_model == 16 else QUICK_LM_LAYOUT), "d_model": d_model}
    return build_model(LMRunSpec(model=LMModelSpec(**anchor_model_fields(mixer, **layout)), seed=seed))


def _sources(n: int, data: torch.Tensor, batch: int, length: int):
    from dynlab.lm.train.interventions import make_intervention
    from dynlab.lm.train.engine import batch_source, make_loader

    out = []
    for seed in range(n):
        g = torch.Generator().manual_seed(seed)
        iv = make_intervention("zero")
        out.append((batch_source(make_loader(iv, data, batch, length, g)), iv, g))
    return out


def _time_loop(d_model: int, data: torch.Tensor, batch: int, length: int, steps: int, warmup: int,
               mixer: str = "mamba2") -> float:
    """Seconds per step of the one-model loop."""
    from dynlab.lm.train.engine import fit

    model = lm_bench_model(d_model, mixer=mixer)
    (nb, iv, g), = _sources(1, data, batch, length)
    fit(model, nb, iv, g, steps=warmup, batch_size=batch, threads=1)
    t0 = time.perf_counter()
    fit(model, nb, iv, g, steps=steps, batch_size=batch, threads=1)
    return (time.perf_counter() - t0) / steps


def _time_stack(d_model: int, members: int, data: torch.Tensor, batch: int, length: int, steps: int, warmup: int,
                noop_mixer: bool = False, mixer: str = "mamba2") -> float:
    """Seconds per step of a stack of ``members`` models."""
    from dynlab.lm.train.ensemble import fit_ensemble

    models = [lm_bench_model(d_model, seed, mixer) for seed in range(members)]
    src = _sources(members, data, batch, length)
    args = ([s[0] for s in src], [s[1] for s in src], [s[2] for s in src])
    kw = dict(batch_size=batch, threads=1, sync_every=max(steps, warmup), noop_mixer=noop_mixer)
    fit_ensemble(models, *args, steps=warmup, **kw)
    t0 = time.perf_counter()
    fit_ensemble(models, *args, steps=steps, **kw)
    return (time.perf_counter() - t0) / steps


def peak_memory_mb(d_model: int, members: int, batch: int, length: int, steps: int = 2, mixer: str = "mamba2") -> float:
    """Growth of peak resident memory (MB) while a stack of ``members`` trains ``steps`` steps,
    in a fresh child process (module docstring)."""
    code = (
        "import json, torch\n"
        "from dynlab.bench.lm import _peak_rss_mb, _time_stack\n"
        "data = torch.randint(0, 256, (200_000,), generator=torch.Generator().manual_seed(0))\n"
        "before = _peak_rss_mb()\n"
        f"_time_stack({d_model}, {members}, data, {batch}, {length}, {steps}, 1, mixer={mixer!r})\n"
        "print(json.dumps(_peak_rss_mb() - before))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=tempfile.gettempdir())  # not a checkout, whose dynlab/ folder would come first
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def _peak_rss_mb() -> float:
    """This process's peak resident memory in MB: ``VmHWM`` of /proc/self/status (Linux;
    fresh at exec, unlike ``ru_maxrss``, which a child inherits from the parent that
    forked it), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_lm(widths: tuple[int, ...] = LM_WIDTHS, ensembles: tuple[int, ...] = (8, 16, 32), batch: int = 16,
             length: int = 32, steps: int = 8, warmup: int = 2, memory: bool = True,
             say=lambda line: None, mixer: str = "mamba2") -> dict[str, Any]:
    """Measure every row of the module docstring at each width; returns the JSON payload
    ``{"setting": ..., "results": [{"d_model", "n_params", "rows": [...]}, ...]}``.
    ``say`` receives one line per finished measurement (progress)."""
    from dynlab.bench.machine import gemm_rate
    from dynlab.lm.run.text import count_parameters
    from dynlab.runtime import train_threads

    data = torch.randint(0, 256, (200_000,), generator=torch.Generator().manual_seed(0))
    results = []
    with train_threads("cpu", threads=1):
        for d in widths:
            n_params = count_parameters(lm_bench_model(d, mixer=mixer))
            rate = gemm_rate(batch * length, 256, torch.device("cpu"))
            floor = rate / (6.0 * n_params)
            tokens = batch * length
            rows = [{"method": "loop", "members": 1, "model_tokens_per_s": tokens / _time_loop(d, data, batch, length, steps, warmup, mixer)}]
            say(f"d_model {d}: loop {rows[-1]['model_tokens_per_s']:,.0f} model-tokens/s")
            for e in ensembles:
                row = {"method": f"stack-{e}", "members": e,
                       "model_tokens_per_s": e * tokens / _time_stack(d, e, data, batch, length, steps, warmup,
                                                                       mixer=mixer)}
                if memory:
                    row["peak_mb"] = peak_memory_mb(d, e, batch, length, mixer=mixer)
                rows.append(row)
                say(f"d_model {d}: stack-{e} {row['model_tokens_per_s']:,.0f} model-tokens/s")
            e = max(ensembles) if ensembles else 1
            rows.append({"method": "no-op mixer", "members": e, "model_tokens_per_s":
                         e * tokens / _time_stack(d, e, data, batch, length, steps, warmup, noop_mixer=True, mixer=mixer)})
            rows.append({"method": "floor", "members": None, "model_tokens_per_s": floor})
            loop = rows[0]["model_tokens_per_s"]
            for row in rows:
                row["vs_loop"] = row["model_tokens_per_s"] / loop
                row["of_floor"] = row["model_tokens_per_s"] / floor
            results.append({"d_model": d, "n_params": n_params, "gemm_flops_per_s": rate, "rows": rows})
    return {"setting": {"mixer": mixer, "batch": batch, "length": length, "steps": steps, "warmup": warmup,
                        "threads": 1}, "results": results}
