"""Paper B's analysis, on the shared analyses of :mod:`dynlab.analysis`:

- :mod:`~dynlab.lm.analysis.metrics` — length generalization as numbers: PPL(t) and its
  bins, Definition 3.2's verdict, in-range and far PPL, Effective Remembrance, the state
  statistics;
- :mod:`~dynlab.lm.analysis.recurrence` — the LM as a one-token recurrence: its Jacobians,
  spectra and fixed points under a filler token;
- :mod:`~dynlab.lm.analysis.contraction` — how fast the state forgets (the state map's
  contraction) for the forget-threshold map;
- :mod:`~dynlab.lm.analysis.state_geometry` — paper A's geometry of the state (U, R, M, q,
  T_cross) on the task models.

Nothing is imported here.
"""
