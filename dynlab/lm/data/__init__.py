"""The text of the corpus ``shakespeare`` (:func:`dynlab.lm.corpus.shakespeare_text`):
``shakespeare.txt.gz``, and ``NOTICE.md`` (what it is, where it comes from, its license).

A package (nothing to import) so that a wheel ships these files as its package data
(pyproject.toml's ``[tool.setuptools.package-data]``).
"""
