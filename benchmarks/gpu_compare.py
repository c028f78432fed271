"""dynlab against mamba-ssm on a CUDA GPU: LM training throughput (tokens/s) and peak memory.

Every row trains on random tokens (windows drawn as a run draws them, zero initial states): untimed
warm-up steps, then the timed steps; the two sides of a comparison read the same batches.

(a) ``lm-mamba2``, ``lm-mamba1``: one 130M-class LM (d_model 768, 24 Mamba blocks without MLP,
    expand 2; Mamba-2: 24 heads × 64, N = 128, chunks of 256; Mamba-1: N = 16; the vocabulary 50277
    padded to a multiple of 8 as mamba-ssm pads it: 50280), batch 8 × 2048 tokens, bf16 autocast
    with float32 weights, gradients and AdamW moments. dynlab: :func:`dynlab.lm.train.engine.fit` with
    ``precision="bf16"`` (``--precision bf16``'s step) on :func:`dynlab.lm.run.text.build_model`'s model.
    mamba-ssm: ``MambaLMHeadModel`` (``MambaConfig``, ``ssm_cfg={"layer": "Mamba2", ...}`` or
    Mamba-1's default) in the same step written plainly (:func:`plain_step`: autocast forward,
    float32 cross-entropy, backward, clipping to norm 1, torch's AdamW with betas 0.9/0.95 and decay
    on matrices, TF32 on as ``fit`` sets it). Target: dynlab ≥ 0.9 × mamba-ssm's tokens/s.
(b) ``stack-16``: 16 models of the length-generalization quick preset (2 layers, width 64, Mamba-2;
    batch 16 × 32) trained as one stack (:func:`dynlab.lm.train.ensemble.fit_ensemble`, float32, as
    studies train stacks) against 16 ``MambaLMHeadModel`` of that layout stepped one after another
    (float32, one AdamW each), in model-tokens/s (every member's tokens count). Target: ≥ 5 ×.
(c) each row's peak memory: ``torch.cuda.max_memory_allocated`` from a reset with the earlier rows
    freed, through its warm-up and timed steps.

Timing: a CUDA event pair around the timed steps only, after a synchronize; nothing synchronizes
between steps (dynlab's calls read their losses back once, at their end). dynlab's time includes its
call's set-up (optimizer, stack); mamba-ssm's loop has none. tokens/s = B × L × timed steps
(× members) / that time. dynlab's head is not tied to its embedding (mamba-ssm's is): 38.6 M more
parameters at 130M, which its AdamW updates too. Without causal-conv1d, mamba-ssm's Mamba-2 runs
unfused (``use_mem_eff_path=False``) and Mamba-1 its slow path (the JSON's ``fused`` says so).

Without CUDA or mamba-ssm (``GPU_CHECK_MAMBA=1 bash benchmarks/gpu_check.sh`` installs it) the rows
that need them are skipped, one line says why, and the script exits 0; so it does after a missed
target (FAIL in the table and the JSON) or a mamba-ssm row that raised (error). A dynlab row that
raised exits 1. ``--device cpu --tiny``: dynlab's side of (a) and (b) at a tiny size on the CPU, in
seconds (tests/bench/test_gpu_compare.py). Writes OUT/compare.json; gpu_check.sh's step 5 runs it.

    python benchmarks/gpu_compare.py [--out DIR] [--device cuda|cpu] [--tiny] [--steps N] [--batch B] [--seq-len L]
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata  # binds importlib too
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from dynlab.bench import write_bench_json
from dynlab.kernels.dispatch import record_backends
from dynlab.lm.train.ensemble import fit_ensemble
from dynlab.lm.train.interventions import make_intervention
from dynlab.lm.run.text import build_model
from dynlab.lm.spec import BUDGET_LM_LAYOUT, QUICK_LM_LAYOUT, LMModelSpec, LMRunSpec, anchor_model_fields
from dynlab.lm.train.engine import ADAM_BETAS, ADAM_EPS, batch_source, fit, make_loader
from dynlab.studies.length_generalization_presets import PRESETS, STACK_MAX

MAMBA_VOCAB = 50277  # GPT-NeoX's, mamba-ssm's pretrained LMs'
VOCAB = -(-MAMBA_VOCAB // 8) * 8  # padded to a multiple of 8 (MambaConfig.pad_vocab_size_multiple): 50280
LM_130M = {"d_model": 768, "n_layers": 24, "n_heads": 24, "head_dim": 64}
LAYOUTS = {"mamba2": {**LM_130M, "d_state": 128, "chunk_size": 256}, "mamba1": {**LM_130M, "d_state": 16}}
TINY_LAYOUTS = {m: {"d_model": 32, "n_layers": 2, "n_heads": 2, "head_dim": 32, "d_state": 16, "chunk_size": 16}
                for m in LAYOUTS}
QUICK_TRAIN = PRESETS["quick"]["train"]
SIZES: dict[str, dict[str, Any]] = {
    "full": {"lm": LAYOUTS, "vocab": VOCAB, "batch": 8, "seq_len": 2048, "warmup": 3, "steps": 20,
             "stack": QUICK_LM_LAYOUT, "stack_batch": QUICK_TRAIN["batch_size"], "stack_seq_len": QUICK_TRAIN["seq_len"],
             "stack_warmup": 5, "stack_steps": 100},
    "tiny": {"lm": TINY_LAYOUTS, "vocab": 256, "batch": 2, "seq_len": 32, "warmup": 1, "steps": 3,
             "stack": BUDGET_LM_LAYOUT, "stack_batch": 2, "stack_seq_len": 8, "stack_warmup": 1, "stack_steps": 2},
}
MEMBERS = STACK_MAX  # the most runs a study trains in one stack
TARGETS = {"lm-mamba2": 0.9, "lm-mamba1": 0.9, f"stack-{MEMBERS}": 5.0}
LR = 1e-4  # the speed does not depend on it; small, so that no step diverges
STREAM = 100_000  # the fewest tokens of a random stream the windows are drawn from


def _spec(size: dict, mixer: str | None = None) -> LMModelSpec:
    """(a)'s LM of ``mixer``, or (None) (b)'s member: :func:`dynlab.bench.lm.lm_bench_model`'s (the quick preset's)."""
    if mixer is None:
        return LMModelSpec(**anchor_model_fields("mamba2", **size["stack"]))
    return LMModelSpec(**anchor_model_fields(mixer, vocab_size=size["vocab"], **size["lm"][mixer]))


def _source(vocab: int, batch: int, seq_len: int, seed: int) -> tuple[Callable, Any, torch.Generator]:
    """A run's batch source over random tokens: random windows, the zero intervention and its generator."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab, (max(STREAM, 64 * batch * (seq_len + 1)),), generator=g)  # >= 64 batches
    iv = make_intervention("zero")
    return batch_source(make_loader(iv, data, batch, seq_len, g)), iv, g


@contextmanager
def _timed(dev: torch.device) -> Iterator[dict[str, float]]:
    """``out["seconds"]``: the block's time, a CUDA event pair after a synchronize (the CPU: wall time)."""
    out: dict[str, float] = {}
    if dev.type != "cuda":
        t0 = time.perf_counter()
        yield out
        out["seconds"] = time.perf_counter() - t0
        return
    torch.cuda.synchronize(dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    yield out
    end.record()
    end.synchronize()
    out["seconds"] = start.elapsed_time(end) / 1e3


@contextmanager
def _peak_memory(dev: torch.device) -> Iterator[dict[str, int | None]]:
    """The block's ``torch.cuda.max_memory_allocated`` from a reset with the earlier rows freed (None on the CPU)."""
    out: dict[str, int | None] = {"peak_memory_bytes": None, "memory_before_bytes": None}
    gc.collect()
    if dev.type != "cuda":
        yield out
        return
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    out["memory_before_bytes"] = torch.cuda.memory_allocated(dev)
    yield out
    out["peak_memory_bytes"] = torch.cuda.max_memory_allocated(dev)


def _row(comparison: str, side: str, *, tokens: int, seconds: float, **fields: Any) -> dict[str, Any]:
    return {"comparison": comparison, "side": side, "status": "ok", "reason": None, "tokens": tokens,
            "seconds": seconds, "tokens_per_s": tokens / seconds, **fields}


def _skipped(comparison: str, side: str, reason: str, status: str = "skipped") -> dict[str, Any]:
    return {"comparison": comparison, "side": side, "status": status, "reason": reason, "tokens": None,
            "seconds": None, "tokens_per_s": None, "peak_memory_bytes": None}


def dynlab_lm(mixer: str, size: dict, dev: torch.device) -> dict[str, Any]:
    """(a), dynlab: :func:`fit` in bf16 on the 130M-class model (warm-up call, then the timed call)."""
    b, l, steps = size["batch"], size["seq_len"], size["steps"]
    nb, iv, g = _source(size["vocab"], b, l, 0)
    kw = dict(batch_size=b, lr=LR, device=str(dev), precision="bf16")
    with _peak_memory(dev) as mem, record_backends() as used:
        model = build_model(LMRunSpec(model=_spec(size, mixer), seed=0))
        n_params = sum(p.numel() for p in model.parameters())
        fit(model, nb, iv, g, steps=size["warmup"], sync_every=size["warmup"], **kw)
        with _timed(dev) as t:
            res = fit(model, nb, iv, g, steps=steps, sync_every=steps, **kw)
    if res.status != "ok":
        raise RuntimeError(f"training diverged: {res.reason}")
    return _row(f"lm-{mixer}", "dynlab", tokens=b * sum(res.lengths), seconds=t["seconds"], models=1,
                n_params=n_params, batch=b, seq_len=l, steps=steps, backends={k: sorted(v) for k, v in used.items()}, **mem)


def dynlab_stack(size: dict, dev: torch.device) -> dict[str, Any]:
    """(b), dynlab: :func:`fit_ensemble` on ``MEMBERS`` models of the quick preset (seeds 0, 1, ...)."""
    b, l, steps = size["stack_batch"], size["stack_seq_len"], size["stack_steps"]
    srcs = [_source(_spec(size).vocab_size, b, l, e) for e in range(MEMBERS)]
    args = ([s[0] for s in srcs], [s[1] for s in srcs], [s[2] for s in srcs])
    kw = dict(batch_size=b, lr=LR, device=str(dev))
    with _peak_memory(dev) as mem, record_backends() as used:
        models = [build_model(LMRunSpec(model=_spec(size), seed=e)) for e in range(MEMBERS)]
        n_params = sum(p.numel() for p in models[0].parameters())
        fit_ensemble(models, *args, steps=size["stack_warmup"], sync_every=size["stack_warmup"], **kw)
        with _timed(dev) as t:
            results = fit_ensemble(models, *args, steps=steps, sync_every=steps, **kw)
    if bad := [r.reason for r in results if r.status != "ok"]:
        raise RuntimeError(f"{len(bad)} members diverged: {bad[0]}")
    return _row(f"stack-{MEMBERS}", "dynlab", tokens=b * sum(sum(r.lengths) for r in results), seconds=t["seconds"],
                models=MEMBERS, n_params=n_params, batch=b, seq_len=l, steps=steps,
                backends={k: sorted(v) for k, v in used.items()}, **mem)


def mamba_config(spec: LMModelSpec, fused: bool) -> dict[str, Any]:
    """``MambaConfig``'s fields for the layout of ``spec`` (no MLP; Mamba-1: mamba-ssm's default
    layer; ``fused`` False: Mamba-2's unfused path, the one that runs without causal-conv1d)."""
    expand, rest = divmod(spec.n_heads * spec.head_dim, spec.d_model)
    if rest:
        raise ValueError(f"n_heads × head_dim = {spec.n_heads * spec.head_dim} is no multiple of d_model {spec.d_model}")
    ssm: dict[str, Any] = {"d_state": spec.d_state, "d_conv": spec.conv_kernel, "expand": expand}
    if spec.mixer == "mamba2":
        ssm = {"layer": "Mamba2", **ssm, "headdim": spec.head_dim, "chunk_size": spec.chunk_size,
               "dt_min": spec.dt_min, "dt_max": spec.dt_max, **({} if fused else {"use_mem_eff_path": False})}
    return {"d_model": spec.d_model, "n_layer": spec.n_layers, "vocab_size": spec.vocab_size, "d_intermediate": 0,
            "ssm_cfg": ssm}


def plain_step(model: torch.nn.Module, next_batch: Callable, dev: torch.device, bf16: bool) -> Callable[[], int]:
    """mamba-ssm's side: one training step of ``model`` per call, nothing read back; returns its target tokens."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=LR, betas=ADAM_BETAS, eps=ADAM_EPS)
    model.train()

    def step() -> int:
        tokens = next_batch()[0]  # [B, L + 1]
        tokens = tokens.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else tokens
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(tokens[:, :-1]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return tokens[:, 1:].numel()

    return step


@contextmanager
def _tf32(on: bool) -> Iterator[None]:
    """TF32 matrix products in the block when ``on`` (as :func:`dynlab.lm.train.engine.fit` trains on CUDA)."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    if on:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def mamba_rows(specs: list[LMModelSpec], size: dict, dev: torch.device, lm: bool, fused: bool) -> dict[str, Any]:
    """mamba-ssm's side: one ``MambaLMHeadModel`` per spec (the LM of (a) in bf16, or (b)'s
    members in float32), stepped one after another, warm-up steps first."""
    from mamba_ssm.models.config_mamba import MambaConfig
    from mamba_ssm.models.mixer_seq_simple import MambaLMHeadModel

    key = "" if lm else "stack_"
    b, l, steps = size[f"{key}batch"], size[f"{key}seq_len"], size[f"{key}steps"]
    with _peak_memory(dev) as mem, _tf32(lm and dev.type == "cuda"):
        models, fns = [], []
        for e, spec in enumerate(specs):
            torch.manual_seed(e)
            models.append(MambaLMHeadModel(MambaConfig(**mamba_config(spec, fused)), device=dev))
            fns.append(plain_step(models[-1], _source(spec.vocab_size, b, l, e)[0], dev, bf16=lm))
        for _ in range(size[f"{key}warmup"]):
            for fn in fns:
                fn()
        with _timed(dev) as t:
            tokens = sum(fn() for _ in range(steps) for fn in fns)
    name = f"lm-{specs[0].mixer}" if lm else f"stack-{MEMBERS}"
    return _row(name, "mamba-ssm", tokens=tokens, seconds=t["seconds"], models=len(specs),
                n_params=sum(p.numel() for p in models[0].parameters()), batch=b, seq_len=l, steps=steps,
                fused=fused, **mem)


def _attempt(comparison: str, side: str, fn: Callable[..., dict], *args: Any) -> dict[str, Any]:
    """``fn(*args)``'s row, or an error row naming what it raised in one line; its memory freed after."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported in the row and the table
        return _skipped(comparison, side, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}", "error")
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def mamba_problem(dev: torch.device) -> str | None:
    """Why mamba-ssm's side cannot run here, in words, or None."""
    if dev.type != "cuda":
        return f"mamba-ssm runs on CUDA only (--device {dev.type})"
    try:
        importlib.import_module("mamba_ssm.models.mixer_seq_simple")
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == "mamba_ssm":
            return "mamba-ssm is not installed (GPU_CHECK_MAMBA=1 bash benchmarks/gpu_check.sh installs it)"
        return f"mamba-ssm does not import: {exc}"
    except Exception as exc:  # noqa: BLE001 - a broken install is a reason to skip, said in one line
        return f"mamba-ssm does not import: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
    return None


def _has_causal_conv1d() -> bool:
    try:
        return importlib.import_module("causal_conv1d") is not None
    except Exception:  # noqa: BLE001 - absent or broken: mamba-ssm then takes its unfused path
        return False


def measure(size: dict, dev: torch.device) -> list[dict[str, Any]]:
    """Every row: per comparison dynlab's, then mamba-ssm's (or a skipped row)."""
    problem = mamba_problem(dev)
    fused = problem is None and _has_causal_conv1d()
    rows = []
    for mixer in LAYOUTS:
        name = f"lm-{mixer}"
        rows.append(_attempt(name, "dynlab", dynlab_lm, mixer, size, dev))
        rows.append(_skipped(name, "mamba-ssm", problem) if problem else
                    _attempt(name, "mamba-ssm", mamba_rows, [_spec(size, mixer)], size, dev, True, fused))
    name = f"stack-{MEMBERS}"
    rows.append(_attempt(name, "dynlab", dynlab_stack, size, dev))
    rows.append(_skipped(name, "mamba-ssm", problem) if problem else
                _attempt(name, "mamba-ssm", mamba_rows, [_spec(size)] * MEMBERS, size, dev, False, fused))
    return rows


def compare(dyn: dict[str, Any], ref: dict[str, Any], target: float) -> dict[str, Any]:
    """dynlab's tokens/s over mamba-ssm's against ``target``, and the ratio of their peak memory."""
    out = {"comparison": dyn["comparison"], "target": target, "ratio": None, "memory_ratio": None}
    if dyn["status"] != "ok" or ref["status"] != "ok":
        bad = dyn if dyn["status"] != "ok" else ref
        error = bad["status"] == "error"
        return {**out, "verdict": bad["status"], "reason": f"{bad['side']} raised {bad['reason']}" if error else bad["reason"]}
    ratio = dyn["tokens_per_s"] / ref["tokens_per_s"]
    mem = (dyn["peak_memory_bytes"] / ref["peak_memory_bytes"]
           if dyn["peak_memory_bytes"] and ref["peak_memory_bytes"] else None)
    return {**out, "ratio": ratio, "memory_ratio": mem, "verdict": "PASS" if ratio >= target else "FAIL", "reason": None}


def summary(rows: list[dict[str, Any]], comparisons: list[dict[str, Any]]) -> str:
    """One line for gpu_check.sh: each ratio and verdict, or why it was skipped and dynlab's own tokens/s."""
    parts = []
    for c in comparisons:
        dyn = next(r for r in rows if r["comparison"] == c["comparison"] and r["side"] == "dynlab")
        if c["ratio"] is not None:
            parts.append(f"{c['comparison']} {c['ratio']:.2f}x of mamba-ssm (target {c['target']:g}x: {c['verdict']})")
        elif dyn["status"] == "ok":
            parts.append(f"{c['comparison']} dynlab {dyn['tokens_per_s']:.3g} tok/s, mamba-ssm {c['verdict']}")
        else:
            parts.append(f"{c['comparison']} {c['verdict']}")
    reasons = sorted({c["reason"] for c in comparisons if c["reason"]})
    return "; ".join(parts) + (f" ({'; '.join(reasons)})" if reasons else "")


def table(rows: list[dict[str, Any]], comparisons: list[dict[str, Any]]) -> str:
    """The rows and the verdicts as printed."""
    widths = (11, 9, 6, 12, 9, 5, 10, 8)
    head = ("comparison", "side", "models", "params", "B x L", "steps", "tokens/s", "peak GiB", "status")
    lines = []
    for r in [None, *rows]:
        if r is None:
            cells = head
        elif r["status"] != "ok":
            cells = (r["comparison"], r["side"], *["-"] * 6, f"{r['status']}: {r['reason']}")
        else:
            peak = "-" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 2**30:.2f}"
            cells = (r["comparison"], r["side"], str(r["models"]), f"{r['n_params']:,}", f"{r['batch']}x{r['seq_len']}",
                     str(r["steps"]), f"{r['tokens_per_s']:.4g}", peak, "ok")
        lines.append(" ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
                     + "  " + cells[-1])
    for c in comparisons:
        ratio = "-" if c["ratio"] is None else f"{c['ratio']:.3f}x"
        mem = "" if c["memory_ratio"] is None else f", peak memory {c['memory_ratio']:.2f}x of mamba-ssm's"
        lines.append(f"{c['comparison']}: dynlab/mamba-ssm tokens/s {ratio} (target >= {c['target']:g}x): "
                     f"{c['verdict']}{mem}")
    return "\n".join(lines)


def _setting(size: dict, dev: torch.device, tiny: bool) -> dict[str, Any]:
    def version(dist: str) -> str | None:
        return next((d.version for d in importlib.metadata.distributions(name=dist)), None)

    return {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" and torch.cuda.is_available() else "cpu",
            "size": "tiny" if tiny else "full", "lm_precision": "bf16 autocast, float32 weights",
            "stack_precision": "float32", "members": MEMBERS, "targets": TARGETS, "lr": LR,
            "mamba_ssm": version("mamba-ssm"), "causal_conv1d": version("causal-conv1d"),
            **{k: v for k, v in size.items() if k not in ("lm", "stack")},
            "lm_layouts": size["lm"], "stack_layout": size["stack"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu-check", help="folder of compare.json")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="tiny sizes: dynlab's side in seconds on the CPU")
    ap.add_argument("--steps", type=int, help="timed steps of (a) and (b) (default: 20 and 100; tiny: 3 and 2)")
    ap.add_argument("--batch", type=int, help="(a)'s batch (default 8; tiny: 2)")
    ap.add_argument("--seq-len", type=int, help="(a)'s tokens per sequence (default 2048; tiny: 32)")
    args = ap.parse_args(argv)
    size = dict(SIZES["tiny" if args.tiny else "full"])
    size.update({k: v for k, v in (("steps", args.steps), ("stack_steps", args.steps), ("batch", args.batch),
                                   ("seq_len", args.seq_len)) if v is not None})
    if any(size[k] < 1 for k in ("steps", "batch", "seq_len")):
        ap.error("--steps, --batch and --seq-len must be positive")
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        why = "no CUDA device visible to torch (--device cpu --tiny runs dynlab's side on the CPU)"
        rows = [_skipped(name, side, why) for name in TARGETS for side in ("dynlab", "mamba-ssm")]
    else:
        rows = measure(size, dev)
    comparisons = [compare(rows[i], rows[i + 1], TARGETS[rows[i]["comparison"]]) for i in range(0, len(rows), 2)]
    for reason in sorted({r["reason"] for r in rows if r["status"] == "skipped"}):
        names = ", ".join(f"{r['side']} {r['comparison']}" for r in rows if r["reason"] == reason)
        print(f"gpu_compare: skipped {names}: {reason}")
    print(table(rows, comparisons))
    line = summary(rows, comparisons)
    print(f"gpu_compare: {line}")
    (out := Path(args.out)).mkdir(parents=True, exist_ok=True)
    write_bench_json({"benchmark": "gpu-compare", "setting": _setting(size, dev, args.tiny), "rows": rows,
                      "comparisons": comparisons, "summary": line}, out / "compare.json")
    return 1 if any(r["side"] == "dynlab" and r["status"] == "error" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
