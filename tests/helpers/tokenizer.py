"""A tiny byte-level BPE tokenizer trained here (no download), and text to train it on."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = "the cat sat on a mat while dogs ran far away and birds sang over green hills under blue skies".split()


def word_text(lines: int = 2000, seed: int = 0) -> str:
    """``lines`` lines of 5–15 random words of :data:`WORDS`."""
    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 15))) for _ in range(lines))


def train_bpe(folder: Path, text: str, vocab_size: int = 300) -> Path:
    """Train a byte-level BPE tokenizer of ``vocab_size`` ids (``<|endoftext|>`` is id 0) on
    ``text`` and save it as ``folder/tokenizer.json``; the folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def tiny_mamba2(folder: Path, vocab: int, tokenizer: Path | None = None, dtype=None) -> str:
    """A random ``Mamba2ForCausalLM`` of ``vocab`` ids (width 32, one layer, 4 heads of 16,
    N = 8) saved in ``folder`` with ``save_pretrained``, the ``tokenizer.json`` of the folder
    ``tokenizer`` beside it when given; the folder, as a string."""
    import torch
    import transformers

    cfg = transformers.Mamba2Config(vocab_size=vocab, hidden_size=32, num_hidden_layers=1, num_heads=4, head_dim=16,
                                    expand=2, state_size=8, n_groups=1, chunk_size=8)
    torch.manual_seed(0)  # transformers initialises from the global RNG
    model = transformers.Mamba2ForCausalLM(cfg)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(str(folder))
    if tokenizer is not None:
        (Path(folder) / "tokenizer.json").write_bytes((Path(tokenizer) / "tokenizer.json").read_bytes())
    return str(folder)
