"""Markdown tables of benchmark results (JSON): ``dynlab bench train`` files and run-phases files, headed by the machine line."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynlab.errors import DynlabInputError
from dynlab.report.format import fmt_number

__all__ = ["bench_machine_line", "bench_markdown", "bench_tables", "lm_bench_markdown"]


_MACHINE_KEYS = (("cpu_model", "CPU {}"), ("cores", "{} cores"), ("torch", "torch {}"),
                 ("created_utc", "recorded {}"), ("date", "recorded {}"))


def bench_machine_line(data: dict) -> str:
    """One line naming the machine a benchmark file records: CPU model, cores (and how many
    the run could use, where fewer), torch version, GPUs and date (from a ``machine`` object,
    :func:`dynlab.results.provenance.machine_record`, or top-level keys), the device and
    thread counts of its rows, and which of these the file does not record."""
    machine = dict(data.get("machine") or {})
    machine.update({k: data[k] for k, _ in _MACHINE_KEYS if data.get(k) is not None and k not in machine})
    parts, missing = [], []
    for key, fmt in _MACHINE_KEYS:
        if machine.get(key) is not None:
            if not (key == "date" and machine.get("created_utc") is not None):
                parts.append(fmt.format(machine[key]))
            if key == "cores" and machine.get("cores_available") not in (None, machine["cores"]):
                parts[-1] += f" ({machine['cores_available']} available to the run)"
            if key == "torch" and machine.get("cuda_devices"):
                parts.append("GPU " + ", ".join(map(str, machine["cuda_devices"])))
        elif key in ("cpu_model", "cores", "torch"):
            missing.append({"cpu_model": "CPU model", "cores": "core count", "torch": "torch version"}[key])
    if machine.get("created_utc") is None and machine.get("date") is None:
        missing.append("date")
    rows = data.get("results") or []
    devices = sorted({str(r["device"]) for r in rows if r.get("device")})
    threads = sorted({int(r["threads"]) for r in rows if r.get("threads") is not None})
    if devices:
        parts.append("device " + ", ".join(devices))
    if threads:
        parts.append(f"{', '.join(map(str, threads))} thread{'s' if threads != [1] else ''}")
    if not parts:
        return "Machine: not recorded in the file (" + ", ".join(missing) + ")."
    line = "Machine: " + "; ".join(parts)
    if missing:
        line += f" ({', '.join(missing)} not recorded in the file)"
    return line + "."


def _kilo(x: float | None) -> str:
    """Model-tokens/s in thousands, thin-space grouped: ``1 065 K``."""
    return "—" if x is None or not np.isfinite(x) else f"{x / 1e3:,.0f} K".replace(",", " ")


def _floor_text(res: dict) -> str:
    threads = str(res.get("threads"))
    if res.get("floor_kind") == "bandwidth":
        bw = (res.get("memory_bandwidth_bytes") or {}).get(threads)
        return (f"`bandwidth`: {fmt_number(bw / 1e9, 1) if bw else '—'} GB/s ÷ "
                f"{fmt_number(res['bytes_per_token'] / 1e3, 1)} KB per token")
    rate = (res.get("gemm_rate_flops") or {}).get(threads)
    return f"`gemm`: {fmt_number(rate / 1e9, 0) if rate else '—'} GFLOP/s ÷ {res['flops_per_token']:,.0f} FLOPs per token".replace(",", " ")


def _train_bench_tables(data: dict) -> list[str]:
    """The Markdown of ``dynlab bench train`` results (``data["results"]``): per setting its
    floor, a table of the methods, then the summary facts."""
    out: list[str] = []
    for res in data["results"]:
        out += [f"**{res['setting']}** (floor {_floor_text(res)}, at {res.get('threads')} threads)", "",
                "| method | models | model-tokens/s | of floor | s per step |",
                "| --- | --- | --- | --- | --- |"]
        for row in res["rows"]:
            step = row.get("seconds_per_step")
            out.append(f"| {row['method']} | {row['models']} | {_kilo(row['tokens_per_s'])} | "
                       f"{fmt_number(row['fraction_of_floor'])} | {'—' if step is None else fmt_number(step, 3)} |")
        out.append("")
        facts = [f"best dynlab row {_kilo(res.get('best_dynlab_tokens_per_s'))}",
                 f"{fmt_number(res.get('speedup_vs_baseline'), 1)}× the baseline",
                 f"{fmt_number(res.get('fraction_of_floor'))} of the floor"]
        if res.get("ensemble_vs_solo_per_model") is not None:
            facts.append(f"best ensemble per model {fmt_number(res['ensemble_vs_solo_per_model'])}× one model alone")
        pair = res.get("ensemble_large_vs_small")
        if pair:
            facts.append(f"ensemble of {pair['large']} against {pair['small']} per model, paired over "
                         f"{pair['rounds']} rounds: median {fmt_number(pair['median'])} "
                         f"({fmt_number(pair['min'])}–{fmt_number(pair['max'])}; above 1: {pair['large']} is faster)")
        if res.get("skipped"):
            facts.append("skipped: " + ", ".join(map(str, res["skipped"])))
        out += ["- " + "; ".join(facts) + ".", ""]
    return out


def _sec(x: float) -> str:
    """Seconds: one decimal below 10 s, whole seconds above."""
    return fmt_number(x, 1 if x < 10 else 0)


def _phases_tables(data: dict) -> list[str]:
    rows = data["rows"]
    steps = sorted({int(r["train_steps"]) for r in rows})
    short = sorted({int(r["short_length"]) for r in rows})
    out = [f"Preset `{data['preset']}`, group {data['group']}, one run per architecture; seconds of wall time.", "",
           f"| architecture | seeds per ensemble | s per step and model at length 60 | training bound "
           f"({', '.join(map(str, steps))} steps) | evaluation | analysis | (evaluation + analysis) / training | "
           f"not learned: training at length {', '.join(map(str, short))} | not learned: analysis | "
           "not learned: ratio |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append(f"| {r['arch']} | {r['ensemble']} | {fmt_number(r['step_s'], 3)} | {_sec(r['train_s'])} | "
                   f"{_sec(r['eval_s'])} | {_sec(r['analysis_s'])} | {fmt_number(r['ratio'])} | "
                   f"{_sec(r['train_s_short'])} | {_sec(r['analysis_s_not_learned'])} | "
                   f"{fmt_number(r['ratio_not_learned'])} |")
    h = float(data["total_hours"])
    hours = f"{fmt_number(h, 1)} h" if h >= 1 else f"{fmt_number(60 * h, 1)} min"
    out += ["", f"- Whole-study bound: {data['runs_per_arch']} runs per architecture on {data['workers']} workers, "
                f"every run trained for all its steps at length 60: {hours}.", ""]
    return out


def bench_tables(path: str | Path) -> str:
    """Markdown tables of a benchmark result file (module docstring), headed by the machine
    line (:func:`bench_machine_line`)."""
    import json

    p = Path(path).expanduser()
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DynlabInputError(f"no benchmark file at {str(path)!r}; allowed: a JSON file written by "
                               "`dynlab bench train --json`, `dynlab bench lm --json` or benchmarks/bench_run_phases.py") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DynlabInputError(f"{str(p)!r} is not a readable benchmark JSON file ({type(exc).__name__})") from None
    if not isinstance(data, dict) or not (isinstance(data.get("results"), list) or {"preset", "rows"} <= data.keys()):
        raise DynlabInputError(f"{str(p)!r} is not a benchmark result dynlab knows; allowed: a file written by "
                               "`dynlab bench train --json`, `dynlab bench lm --json` or benchmarks/bench_run_phases.py --json")
    try:
        return bench_markdown(data)
    except (KeyError, TypeError, AttributeError) as exc:  # a key missing, or of another type, in a file edited by hand
        what = f"its entry {exc.args[0]!r} is missing" if isinstance(exc, KeyError) else "an entry has the wrong type"
        raise DynlabInputError(f"{str(p)!r} is an incomplete benchmark result ({what}); allowed: a file written by "
                               "`dynlab bench train --json`, `dynlab bench lm --json` or "
                               "benchmarks/bench_run_phases.py --json, unedited") from None


def bench_markdown(data: dict) -> str:
    """The Markdown of one benchmark result (module docstring): the machine line
    (:func:`bench_machine_line`), then the tables of ``dynlab bench train`` results
    (``data["results"]``, :func:`dynlab.bench.train_payload`; the command prints this) or of a
    run-phases file (``preset`` and ``rows``)."""
    if isinstance(data.get("setting"), dict) and "mixer" in data["setting"]:  # dynlab bench lm
        body = lm_bench_markdown(data).splitlines()
    else:
        body = _train_bench_tables(data) if isinstance(data.get("results"), list) else _phases_tables(data)
    return "\n".join([bench_machine_line(data), "", *body]).rstrip("\n") + "\n"


def lm_bench_markdown(payload: dict) -> str:
    """A ``dynlab bench lm`` result as Markdown: its setting, then one table per width
    (the command prints it; ``dynlab report FILE.json`` prints it after the machine line)."""
    s = payload["setting"]
    lines = [f"LM training throughput: {s.get('mixer', 'mamba2')}, batch {s['batch']} x length {s['length']}, {s['threads']} thread, "
             f"{s['steps']} timed steps after {s['warmup']}", ""]
    for r in payload["results"]:
        lines += [f"### d_model {r['d_model']} ({r['n_params']:,} parameters; GEMM {r['gemm_flops_per_s'] / 1e9:.1f} GFLOP/s)", "",
                  "| method | model-tokens/s | vs loop | of floor | peak MB |", "|---|---:|---:|---:|---:|"]
        for row in r["rows"]:
            peak = row.get("peak_mb")
            lines.append(f"| {row['method']} | {row['model_tokens_per_s']:,.0f} | {row['vs_loop']:.2f} | "
                         f"{row['of_floor']:.3f} | {'' if peak is None else f'{peak:,.0f}'} |")
        lines.append("")
    return "\n".join(lines)
