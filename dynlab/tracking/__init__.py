"""Paper A: trackers on group word problems (state tracking), the twin of :mod:`dynlab.lm`.

- :mod:`~dynlab.tracking.spec` — the run spec (task, model, training, evaluation);
- :mod:`~dynlab.tracking.groups` — finite groups from permutation generators;
- :mod:`~dynlab.tracking.task` — the word-problem sampler;
- :mod:`~dynlab.tracking.models` — recurrent cells, their registry, the tracker, its streams;
- :mod:`~dynlab.tracking.train` — the training engine (curriculum, ensembles, budget);
- :mod:`~dynlab.tracking.evaluate` — accuracy against length, max-pass length;
- :mod:`~dynlab.tracking.analysis` — the error-control analysis of one tracker (U, R, M, q,
  crossings, return maps, perturbations, fixed points) and of a study's runs (T_horizon,
  the pre-registered forecast, the fixed-point mechanism);
- :mod:`~dynlab.tracking.run` — one run: train, evaluate, analyse, reload;
- :mod:`~dynlab.tracking.dataset` — the study dataset of the stored runs.

Nothing is imported here, so that ``dynlab.tracking.groups`` and ``dynlab.tracking.spec``
load without torch.  This package never imports :mod:`dynlab.lm`, nor the reverse
(tests/house/test_layering.py).
"""
