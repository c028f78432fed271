"""``dynlab bench train`` and ``dynlab bench lm``: their options (declared once, for the
command line's help), checked, then the measurements printed as the tables of ``dynlab
report FILE.json``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Optional

from dynlab.app.checks import (cell_names, check_device, in_range, nonempty_path, parse_list,
                               parse_numbers, say_notes)
from dynlab.app.checks import echo as plain_echo
from dynlab.errors import DynlabInputError, in_option_words
from dynlab.names import MIXER_NAMES


def bench_options(models: str, hidden: int, batch: int, length: int, ensembles: str, steps: int, repeats: int,
                  quick: bool, device: str,
                  json_out: str | None) -> tuple[tuple[str, ...], tuple[int, ...], int, int, Path | None]:
    """``dynlab bench train``'s options checked: ``(models, ensemble sizes, steps, repeats,
    JSON path)``, ``--quick`` applied, the JSON path probed before the benchmark runs."""
    from dynlab.spec import MAX_BATCH, MAX_ENSEMBLE, MAX_LENGTH, MAX_STEPS, MAX_WIDTH

    json_path = None if json_out is None else nonempty_path(json_out, "--json", "a file path, e.g. --json bench.json")
    if json_path is not None:
        from dynlab.outputs import check_json_path

        check_json_path(json_path)  # probed (a file made and removed beside it), before the benchmark runs
    names = parse_list(models, "--models") or ()
    cells = cell_names()
    for m in names:
        if m not in cells:
            raise DynlabInputError(f"unknown model {m!r}; allowed: a comma list of {', '.join(cells)}")
    allowed = f"a comma list of whole numbers from 1 to {MAX_ENSEMBLE}"
    sizes = parse_numbers(ensembles, "--ensembles", int, allowed) or ()
    if any(not 1 <= n <= MAX_ENSEMBLE for n in sizes):
        raise DynlabInputError(f"--ensembles {ensembles!r}: a size is out of range; allowed: {allowed}")
    in_range("--hidden", hidden, 1, MAX_WIDTH)
    in_range("--batch", batch, 1, MAX_BATCH)
    in_range("--length", length, 1, MAX_LENGTH, "tokens")
    in_range("--steps", steps, 2, MAX_STEPS, "(the first is not timed)")
    in_range("--repeats", repeats, 1)
    check_device(device)
    if quick:
        steps, sizes, repeats = 3, tuple(n for n in sizes if n <= 16) or (16,), 1
    return names, sizes, steps, repeats, json_path


def bench_lm_options(widths: str, ensembles: str, batch: int, length: int, steps: int,
                     json_out: str | None, mixer: str = "mamba2") -> tuple[tuple[int, ...], tuple[int, ...], Path | None]:
    """``dynlab bench lm``'s options checked: ``(widths, stack sizes, JSON path)``, the JSON
    path probed before the benchmark runs."""
    from dynlab.spec import MAX_BATCH, MAX_ENSEMBLE, MAX_LENGTH, MAX_STEPS

    if mixer not in MIXER_NAMES:
        raise DynlabInputError(f"--mixer {mixer!r}: unknown mixer; allowed: {', '.join(MIXER_NAMES)}")

    json_path = None if json_out is None else nonempty_path(json_out, "--json", "a file path, e.g. --json bench.json")
    if json_path is not None:
        from dynlab.outputs import check_json_path

        check_json_path(json_path)
    allowed_w = "a comma list of widths from 8 to 1024 divisible by 8"
    sizes = parse_numbers(widths, "--widths", int, allowed_w) or ()
    if not sizes or any(not 8 <= w <= 1024 or w % 8 for w in sizes):
        raise DynlabInputError(f"--widths {widths!r}: allowed: {allowed_w}")
    allowed_e = f"a comma list of whole numbers from 1 to {MAX_ENSEMBLE}"
    stacks = parse_numbers(ensembles, "--ensembles", int, allowed_e) or ()
    if not stacks or any(not 1 <= n <= MAX_ENSEMBLE for n in stacks):
        raise DynlabInputError(f"--ensembles {ensembles!r}: allowed: {allowed_e}")
    in_range("--batch", batch, 1, MAX_BATCH)
    in_range("--length", length, 2, MAX_LENGTH, "tokens")
    in_range("--steps", steps, 1, MAX_STEPS)
    from dynlab.spec import check_state_bytes

    # the largest stack's step, at the least: each token's logits (256) and its layers' 16·width
    # activations in float32, for every member (a stack of E holds E batches)
    check_state_bytes(f"--ensembles {max(stacks)} × --batch {batch} × --length {length} × (256 + 16 × width "
                      f"{max(sizes)}) × 4 bytes", max(stacks) * batch, length, 4 * (256 + 16 * max(sizes)))
    return sizes, stacks, json_path


# -- the benchmark commands ----------------------------------------------------------

#: ``dynlab bench train``'s options: parameter -> (flags, type, help).
BENCH_TRAIN_OPTIONS: dict[str, tuple[tuple[str, ...], type, str]] = {
    "models": (("--models", "-m"), str, "Comma list of architectures; the first is the headline."),
    "hidden": (("--hidden",), int, "Hidden width H."),
    "batch": (("--batch",), int, "Batch size B."),
    "length": (("--length",), int, "Sequence length T."),
    "ensembles": (("--ensembles",), str, "Comma list of ensemble sizes."),
    "steps": (("--steps",), int, "Training steps per measurement (the first is not timed)."),
    "repeats": (("--repeats",), int,
                "Rounds over all methods; each is reported at its fastest round (noisy machines)."),
    "quick": (("--quick",), bool, "About a minute: 3 steps, ensemble 16 only, one round."),
    "device": (("--device",), str, "auto (CUDA if present), cpu, cuda or cuda:N."),
    "compile": (("--compile",), bool, "Also time one model with torch.compile'd cell steps (slow to start)."),
    "json_out": (("--json",), Optional[str], "Also write the results as JSON to this file."),
}

#: ``dynlab bench lm``'s options: parameter -> (flags, type, help).
BENCH_LM_OPTIONS: dict[str, tuple[tuple[str, ...], type, str]] = {
    "widths": (("--widths",), str,
               "Comma list of model widths d_model (16: the budget preset's model, else the quick layout)."),
    "ensembles": (("--ensembles",), str, "Comma list of stack sizes."),
    "batch": (("--batch",), int, "Batch size B."),
    "length": (("--length",), int, "Sequence length T."),
    "steps": (("--steps",), int, "Timed training steps per measurement (after 2 untimed ones)."),
    "memory": (("--memory/--no-memory",), bool, "Measure each stack's peak memory in a child process."),
    "mixer": (("--mixer",), str, f"The blocks' mixer (the same layout): {', '.join(MIXER_NAMES)}."),
    "json_out": (("--json",), Optional[str], "Also write the results as JSON to this file."),
}


def run_bench_train(models: str = "tanh-rnn,mamba", hidden: int = 128, batch: int = 256, length: int = 60,
                    ensembles: str = "16,64", steps: int = 4, repeats: int = 2, quick: bool = False,
                    device: str = "auto", compile: bool = False, json_out: str | None = None,  # noqa: A002
                    echo: Callable[..., None] = plain_echo) -> None:
    """``dynlab bench train``: check the options, measure, print the tables with ``echo`` (and
    write the JSON)."""
    names, sizes, steps, repeats, json_path = bench_options(models, hidden, batch, length, ensembles, steps, repeats,
                                                            quick, device, json_out)
    say_notes(echo)
    from dynlab.bench import bench_train, train_payload, write_json
    from dynlab.report import bench_markdown

    with in_option_words({"hidden": "--hidden", "batch_size": "--batch", "min_length": "--length",
                          "max_length": "--length", "steps": "--steps"}):
        results = [bench_train(m, hidden, batch, length, sizes, steps=steps, device=device, compile=compile,
                               repeats=repeats) for m in names]
    echo(bench_markdown(train_payload(results)), nl=False)  # the tables of `dynlab report FILE.json`
    if json_path is not None:
        echo(f"json: {write_json(results, json_path)}")


def run_bench_lm(widths: str = "16,64,128,256", ensembles: str = "8,16,32", batch: int = 16, length: int = 32,
                 steps: int = 8, memory: bool = True, json_out: str | None = None,
                 echo: Callable[..., None] = plain_echo, mixer: str = "mamba2") -> None:
    """``dynlab bench lm``: check the options, measure (a line per measurement on stderr), print the tables."""
    sizes, stacks, json_path = bench_lm_options(widths, ensembles, batch, length, steps, json_out, mixer)
    from dynlab.bench import write_bench_json
    from dynlab.bench.lm import bench_lm, lm_bench_markdown

    payload = bench_lm(sizes, stacks, batch, length, steps, memory=memory, say=lambda line: echo(line, err=True),
                       mixer=mixer)
    echo(lm_bench_markdown(payload), nl=False)
    if json_path is not None:
        echo(f"json: {write_bench_json(payload, json_path)}")
