"""Paper B's models: the sequence mixers (Mamba-1, Mamba-2, GLA, each with its short
convolution; :mod:`~dynlab.lm.models.mixers`), the language model around them
(:mod:`~dynlab.lm.models.model`) and its carried state (:mod:`~dynlab.lm.models.states`).

Nothing is imported here (tests/house/test_lazy_imports.py).
"""
