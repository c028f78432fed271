"""Fixed points of any recurrent map and their Jacobian spectra (float64; slow points:
:mod:`dynlab.analysis.slow_points`):

- :mod:`~dynlab.analysis.fixed_points.finder` — the finder, a pipeline of small steps (its
  docstring describes them), and the maps it solves on;
- :mod:`~dynlab.analysis.fixed_points.solve` — steps 1-4: the starts, the Levenberg-Marquardt
  solve with Newton polishing, the residual filter and the deduplication.

Paper A's reading of them on the trackers: :mod:`dynlab.tracking.analysis.fixed_points`;
paper B's on the LMs: :mod:`dynlab.lm.analysis.recurrence`.  Nothing is imported here.
"""
