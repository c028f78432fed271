"""The one tokenizer of every LM path: UTF-8 bytes, or a Hugging Face tokenizer.

Every LM path (training, post-training, evaluation, token corpora, export) turns text
into ids through a :class:`Tokenizer`:

- :class:`ByteTokenizer` — the UTF-8 bytes of a text, ids 0–255: dynlab's own models
  and the CPU presets (the default);
- :class:`HFTokenizer` — any Hugging Face *fast* tokenizer: a ``tokenizer.json`` file or a
  folder holding one (a checkpoint's own folder, e.g. GPT-NeoX's for Mamba), read with the
  ``tokenizers`` library. Its batch encoding runs on every core.

A run's spec records the tokenizer as a :class:`TokenizerSpec` (kind, the path of its
``tokenizer.json``, the number of ids it can produce, the SHA-256 of the file), so a run id
changes with the tokenizer (and with where its file lies). :func:`check_fits` refuses a tokenizer whose ids reach beyond a model's
vocabulary before anything is built.

"One token" is one byte under the byte tokenizer and one subword under a Hugging Face
tokenizer; every length (training length, evaluation positions, PPL(t)) counts tokens.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from dynlab.errors import DynlabInputError
from dynlab.spec import Spec

__all__ = ["BYTE_VOCAB", "ByteTokenizer", "HFTokenizer", "Tokenizer", "TokenizerSpec", "check_fits",
           "load_tokenizer", "make_tokenizer", "tokenizer_file"]

#: The byte tokenizer's vocabulary (ids 0–255).
BYTE_VOCAB = 256

#: A tokenizer that the options may name, as the refusals say it.
ALLOWED_TOKENIZERS = "'byte' (UTF-8 bytes), a tokenizer.json file, or a folder holding a tokenizer.json"


class TokenizerSpec(Spec):
    """Which tokenizer a run reads its text with (part of the run id unless it is the byte tokenizer).

    ``kind``: ``byte`` or ``hf``; ``path``: the ``tokenizer.json`` of an ``hf`` tokenizer
    (absolute); ``n_ids``: one more than the largest id it can produce (added tokens
    included) — a model's vocabulary must hold that many ids; ``sha256``: of the
    ``tokenizer.json`` bytes (an edited tokenizer gives new runs).
    """

    kind: Literal["byte", "hf"] = "byte"
    path: str | None = None
    n_ids: int = Field(BYTE_VOCAB, ge=1, le=2**32)
    sha256: str | None = None

    def make(self) -> Tokenizer:
        """The tokenizer this spec names (an ``hf`` one read from ``path``, its hash checked)."""
        if self.kind == "byte":
            return ByteTokenizer()
        tok = HFTokenizer(Path(str(self.path)))
        if self.sha256 is not None and tok.sha256 != self.sha256:
            raise DynlabInputError(f"tokenizer {self.path!r} changed since the run was made (SHA-256 "
                                   f"{tok.sha256[:12]}…, the run's {self.sha256[:12]}…); allowed: the run's own tokenizer")
        return tok

    @property
    def label(self) -> str:
        """Short words for tables and progress lines: ``byte`` or ``hf:<folder of its file>@<hash>``."""
        return "byte" if self.kind == "byte" else f"hf:{Path(str(self.path)).parent.name}@{str(self.sha256)[:8]}"


class Tokenizer:
    """Text ↔ ids. ``encode`` gives a 1-D ``int64`` array; ``n_ids`` bounds every id."""

    kind: str = "byte"
    n_ids: int = BYTE_VOCAB
    eos_id: int | None = None
    unk_id: int | None = None

    def encode(self, text: str) -> np.ndarray:
        raise NotImplementedError

    def encode_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, offsets [n, 2])``: each id's character span ``[start, end)`` in ``text``."""
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        raise NotImplementedError

    def spec(self) -> TokenizerSpec:
        raise NotImplementedError

    def save(self, folder: Path) -> tuple[Path, ...]:
        """Write this tokenizer as Hugging Face files into ``folder``; the files written."""
        raise NotImplementedError


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0–255 (no special tokens; decoding replaces invalid sequences)."""

    kind = "byte"
    n_ids = BYTE_VOCAB

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def encode_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        spans = [(i, i + 1) for i, ch in enumerate(text) for _ in ch.encode("utf-8")]
        return self.encode(text), np.asarray(spans, dtype=np.int64).reshape(-1, 2)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def spec(self) -> TokenizerSpec:
        return TokenizerSpec()

    def save(self, folder: Path) -> tuple[Path, ...]:
        from dynlab.lm.hub.card import write_byte_tokenizer

        return write_byte_tokenizer(Path(folder))


#: Names a tokenizer's end-of-document token commonly has, tried when its
#: ``tokenizer_config.json`` names none (GPT-NeoX / GPT-2, Llama / T5, others).
_EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")


def tokenizer_file(path: str | Path) -> Path:
    """The ``tokenizer.json`` that ``path`` names (the file itself or a folder holding one);
    a one-line :class:`DynlabInputError` otherwise."""
    p = Path(path).expanduser()
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        why = "a folder without tokenizer.json" if p.is_dir() else "no such file"
        raise DynlabInputError(f"tokenizer {str(p)!r} cannot be read ({why}); allowed: {ALLOWED_TOKENIZERS}")
    return f.resolve()


class HFTokenizer(Tokenizer):
    """A Hugging Face fast tokenizer read from its ``tokenizer.json`` with the ``tokenizers`` library.

    No special tokens are added when encoding (a text is a stream, not a prompt);
    ``eos_id`` is the end-of-document token that separates documents in a token corpus:
    the ``eos_token`` of a ``tokenizer_config.json`` beside the file, else the first of
    the usual names the vocabulary holds, else None.
    """

    kind = "hf"

    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import Tokenizer as _Tok
        except ImportError as err:
            raise DynlabInputError("a Hugging Face tokenizer needs the package 'tokenizers' (pip install tokenizers)") from err
        self.file = tokenizer_file(path)
        raw = self.file.read_bytes()
        try:
            self.tok = _Tok.from_str(raw.decode("utf-8"))
        except Exception as exc:  # noqa: BLE001 - the Rust library raises its own exception type
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DynlabInputError(f"tokenizer {str(self.file)!r} does not load ({why[:120]}); "
                                   f"allowed: {ALLOWED_TOKENIZERS}") from None
        self.sha256 = hashlib.sha256(raw).hexdigest()
        vocab = self.tok.get_vocab(with_added_tokens=True)
        self.n_ids = (max(vocab.values()) + 1) if vocab else 0
        if self.n_ids < 1:
            raise DynlabInputError(f"tokenizer {str(self.file)!r} has an empty vocabulary; allowed: {ALLOWED_TOKENIZERS}")
        self.eos_id = self._eos(vocab)
        unk = getattr(self.tok.model, "unk_token", None)
        self.unk_id = self.tok.token_to_id(unk) if isinstance(unk, str) else None

    def _eos(self, vocab: dict[str, int]) -> int | None:
        cfg = self.file.parent / "tokenizer_config.json"
        name: Any = None
        if cfg.is_file():
            try:
                name = json.loads(cfg.read_text()).get("eos_token")
            except (OSError, ValueError, AttributeError):
                name = None
            if isinstance(name, dict):  # an AddedToken written out: {"content": "...", ...}
                name = name.get("content")
        for candidate in ((name,) if isinstance(name, str) else ()) + _EOS_NAMES:
            if candidate in vocab:
                return int(vocab[candidate])
        return None

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def encode_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        enc = self.tok.encode(text, add_special_tokens=False)
        return np.asarray(enc.ids, dtype=np.int64), np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Every text at once: the library spreads the batch over every core."""
        return [np.asarray(e.ids, dtype=np.int64) for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def spec(self) -> TokenizerSpec:
        return TokenizerSpec(kind="hf", path=str(self.file), n_ids=self.n_ids, sha256=self.sha256)

    def save(self, folder: Path) -> tuple[Path, ...]:
        """Copy ``tokenizer.json`` (and the ``tokenizer_config.json`` and
        ``special_tokens_map.json`` beside it, when there) into ``folder``; a config naming
        ``PreTrainedTokenizerFast`` is written when there is none, so transformers'
        ``AutoTokenizer`` loads the folder."""
        folder = Path(folder)
        written = []
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            src = self.file if name == "tokenizer.json" else self.file.parent / name
            if src.is_file():
                (folder / name).write_bytes(src.read_bytes())
                written.append(folder / name)
        if not (folder / "tokenizer_config.json").exists():
            cfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
            if self.eos_id is not None:
                cfg["eos_token"] = self.tok.id_to_token(self.eos_id)
            (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
            written.append(folder / "tokenizer_config.json")
        return tuple(written)


def load_tokenizer(name: str | Path | None) -> Tokenizer:
    """The tokenizer an option names: None or ``"byte"`` -> :class:`ByteTokenizer`; a
    ``tokenizer.json`` or a folder holding one -> :class:`HFTokenizer`."""
    if name is None or str(name) == "byte":
        return ByteTokenizer()
    return HFTokenizer(name)


@lru_cache(maxsize=8)
def make_tokenizer(spec: TokenizerSpec | None) -> Tokenizer:
    """:meth:`TokenizerSpec.make`, None meaning the byte tokenizer; cached (a run's specs
    and samples read one tokenizer file once per process)."""
    return ByteTokenizer() if spec is None else spec.make()


def check_fits(tokenizer: Tokenizer | TokenizerSpec, vocab_size: int, model: str = "the model") -> None:
    """Refuse a tokenizer that can produce an id at or beyond ``vocab_size`` (the model's
    embedding rows): one line naming both sizes."""
    n_ids = int(tokenizer.n_ids)
    if n_ids > vocab_size:
        kind = tokenizer.kind
        what = "the byte tokenizer (256 ids)" if kind == "byte" else f"tokenizer with ids up to {n_ids - 1}"
        raise DynlabInputError(f"{what} does not fit {model}'s vocabulary of {vocab_size} ids; allowed: a tokenizer "
                               f"whose ids are all below {vocab_size} (the one the model was trained with)")
