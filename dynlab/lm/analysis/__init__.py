"""Paper B's analysis beyond perplexity, on the shared analyses of :mod:`dynlab.analysis`:

- :mod:`~dynlab.lm.analysis.recurrence` — the LM as a one-token recurrence: its Jacobians,
  spectra and fixed points under a filler token;
- :mod:`~dynlab.lm.analysis.contraction` — how fast the state forgets (the state map's
  contraction) for the forget-threshold map;
- :mod:`~dynlab.lm.analysis.state_geometry` — paper A's geometry of the state (U, R, M, q,
  T_cross) on the task models.

(PPL(t), Effective Remembrance and the state statistics: :mod:`dynlab.analysis.lm_metrics`.)
Nothing is imported here.
"""
