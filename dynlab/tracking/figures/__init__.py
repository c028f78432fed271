"""Paper A's figure panels, pure ``(ds, ax) -> ax`` functions on the shared machinery of
:mod:`dynlab.figures` (panels that declare their variables, the house style, legends that
cover no data):

- :mod:`~dynlab.tracking.figures.panels` — along the sequence: the accuracy heatmap, q(t),
  T_cross against mp, the horizon forecast, R∥ and R⊥;
- :mod:`~dynlab.tracking.figures.dynamics` — the trackers' dynamics: return-map and
  fixed-point eigenvalues, perturbation recovery, failure modes, margins;
- :mod:`~dynlab.tracking.figures.ablation` — the nonlinearity ablation: mp per φ and its table;
- :mod:`~dynlab.tracking.figures.runs` — which runs a panel draws, in which order and colour;
- :mod:`~dynlab.tracking.figures.sets` — the panels each study declares (``Study.panels``).

Nothing is imported here, so that the study-level statistics load without matplotlib.
"""
