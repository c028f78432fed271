"""Paper A's fixed-point analysis of the trackers, on the shared finder
(:mod:`dynlab.analysis.fixed_points`, a fixed-point finder for any map):

- :mod:`~dynlab.tracking.analysis.fixed_points.per_state` — the fixed points of a tracker's return
  maps per symbolic state, for the state-preserving words of a group's generators (the
  ``fp_*`` variables of a run's analysis);
- :mod:`~dynlab.tracking.analysis.fixed_points.drift` — Corollary 1 from the return maps: the drift
  along U and the crossing of q∥ it predicts (``fp_drift``, ``T_cross_fp``);
- :mod:`~dynlab.tracking.analysis.fixed_points.mechanism` — across the runs of a study dataset: does
  the geometry at the fixed points predict error control (the correlations of
  docs/results.md).

Nothing is imported here: the mechanism statistics load without torch.
"""
