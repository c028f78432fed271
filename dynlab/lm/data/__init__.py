"""Paper B's data: the text, its tokens and the long-context tasks.

- :mod:`~dynlab.lm.data.corpus` — the built-in corpus ``shakespeare`` (its text ships here,
  ``shakespeare.txt.gz``, with ``NOTICE.md``: what it is, where it comes from, its license)
  and the byte encoding;
- :mod:`~dynlab.lm.data.tokenizer` — a checkpoint's own tokenizer (``tokenizers``), or bytes;
- :mod:`~dynlab.lm.data.tokens` — token folders: text tokenized once, read as memory maps;
- :mod:`~dynlab.lm.data.sources` — the text sources a token folder is made from;
- :mod:`~dynlab.lm.data.loaders` — random windows and sequential chunks of a token stream;
- :mod:`~dynlab.lm.data.tasks` — passkey, copying and every task's format (:func:`make_task`);
- :mod:`~dynlab.lm.data.babi` — the bAbI-style tasks;
- :mod:`~dynlab.lm.data.task_text` — what the tasks share: a batch and its loss mask, the
  text through bytes or a tokenizer, filler windows.

Nothing is imported here; the text is package data (pyproject.toml's
``[tool.setuptools.package-data]``).
"""
