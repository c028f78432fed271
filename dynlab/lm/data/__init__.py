"""Paper B's data: the text, its tokens and the long-context tasks.

- :mod:`~dynlab.lm.data.corpus` — the built-in corpus ``shakespeare`` (its text ships here,
  ``shakespeare.txt.gz``, with ``NOTICE.md``: what it is, where it comes from, its license)
  and the byte encoding;
- :mod:`~dynlab.lm.data.tokenizer` — a checkpoint's own tokenizer (``tokenizers``), or bytes;
- :mod:`~dynlab.lm.data.tokens` — token files and text sources streamed into one token stream;
- :mod:`~dynlab.lm.data.loaders` — random windows and sequential chunks of a token stream;
- :mod:`~dynlab.lm.data.tasks` — passkey, copying and the bAbI-style tasks.

Nothing is imported here; the text is package data (pyproject.toml's
``[tool.setuptools.package-data]``).
"""
