"""Paper B's training engine, the twin of :mod:`dynlab.tracking.train`:

- :mod:`~dynlab.lm.train.engine` — :func:`~dynlab.lm.train.engine.fit`, the one loop (AdamW,
  cosine schedule, accumulation, precision, resuming), and :func:`~dynlab.lm.train.engine.train_lm`;
- :mod:`~dynlab.lm.train.interventions` — the initial states: zero, random noise, fitted
  noise, state passing, TBTT;
- :mod:`~dynlab.lm.train.distributed` — one model over several processes (``torchrun``) and
  the training state a killed run resumes from;
- :mod:`~dynlab.lm.train.stack` and :mod:`~dynlab.lm.train.ensemble` — many LMs trained as
  one stack;
- :mod:`~dynlab.lm.train.memory` — what a step will allocate, checked before building;
- :mod:`~dynlab.lm.train.posttrain` — post-training a checkpoint under an intervention.

Nothing is imported here (tests/house/test_lazy_imports.py).
"""
